"""failure.py: the rank's own exception out of a torchrun.log, and which errors are fatal."""

from __future__ import annotations

import errno

import pytest

from ecrl.runtime.failure import disk_error, fatal_reason, rank_errors

TORCHRUN_LOG = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/x/ecrl/runtime/trainer/trainer.py", line 233, in run
[rank1]:     loss.backward()
[rank1]: RuntimeError: Connection closed by peer [127.0.0.1]:29500
[rank0]: Traceback (most recent call last):
[rank0]:   File "/x/ecrl/runtime/trainer/datasets.py", line 199, in __getitem__
[rank0]:     image, label = self._ds[index]
[rank0]:   File "/v/lib/python3.11/site-packages/PIL/Image.py", line 3730, in open
[rank0]:     raise UnidentifiedImageError(msg)
[rank0]: PIL.UnidentifiedImageError: cannot identify image file 'broken.png'
E1123 08:25:30.499000 17350 torch/distributed/elastic/multiprocessing/api.py:1002] failed
Traceback (most recent call last):
  File "/v/lib/python3.11/site-packages/torch/distributed/run.py", line 1142, in <module>
    main()
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_08:25:30
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 17407)
"""


def test_the_root_cause_ranks_own_exception_comes_first() -> None:
    errors = rank_errors(TORCHRUN_LOG)
    assert [e.rank for e in errors] == [0, 1]  # torchrun's ChildFailedError is not a cause
    assert errors[0].exception == "PIL.UnidentifiedImageError: cannot identify image file " \
                                  "'broken.png'"
    assert errors[0].where is not None and "datasets.py" in errors[0].where


WORKER_LOG = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/x/train.py", line 40, in <module>
[rank0]:     for step, (ids, batch) in zip(range(start, steps), loader):
[rank0]:   File "/v/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 1502, in x
[rank0]:     data.reraise()
[rank0]: TypeError: Caught TypeError in DataLoader worker process 0.
[rank0]: Original Traceback (most recent call last):
[rank0]:   File "/v/lib/python3.11/site-packages/torch/utils/data/_utils/worker.py", line 349, in w
[rank0]:     data = fetcher.fetch(index)
[rank0]:   File "/x/train.py", line 12, in my_collate
[rank0]:     return torch.stack([x for x, _ in items])
[rank0]: TypeError: expected Tensor as element 0 in argument 0, but got int
"""


def test_a_loader_workers_error_is_its_own_not_the_wrapper_line() -> None:
    """A collate_fn failing inside a worker: the one line names the worker's real error and
    where, not "Caught TypeError in DataLoader worker process 0." (issue 25, item 7)."""
    error = rank_errors(WORKER_LOG)[0]
    assert error.exception == ("TypeError: expected Tensor as element 0 in argument 0, but got "
                               "int (in DataLoader worker process 0)")
    assert error.where is not None and "my_collate" in error.where


def test_the_ranks_own_report_wins_and_a_log_without_errors_has_none() -> None:
    log = "[rank0]: Traceback (most recent call last):\n[rank0]: ValueError: x\n" \
          "ecrl trainer (rank 0): error: the dataset now has 3 samples\n"
    assert rank_errors(log)[0].exception == "the dataset now has 3 samples"
    assert rank_errors("starting\nall fine\n") == []


def test_fatal_reasons() -> None:
    full = OSError(errno.ENOSPC, "No space left on device")
    assert disk_error(full, "/r/logs") == "no space left on device: /r/logs"
    assert fatal_reason(full, "/r/logs", ).startswith("no space left on device: /r/logs")
    ro = OSError(errno.EROFS, "Read-only file system", "/r/x")
    assert disk_error(ro) == "read-only file system: /r/x"
    huge = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                        f"{2**70} bytes. Error code 12")
    assert "can never succeed" in (fatal_reason(huge) or "")
    small = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                         "1024 bytes. Error code 12")
    assert fatal_reason(small) is None  # may succeed after a restart
    assert fatal_reason(OSError("broken data stream when reading image file")) is not None
    assert fatal_reason(FileNotFoundError(2, "No such file", "x.png")) is None
    assert fatal_reason(ValueError("x")) is None


def test_torchs_own_message_for_an_impossible_allocation_is_fatal() -> None:
    # The allocator's real words, not a copy of them: a torch that rewords them would make an
    # impossible allocation look like a crash worth a restart.
    import torch

    with pytest.raises(RuntimeError) as raised:
        torch.empty(2**62, dtype=torch.uint8)
    assert "can never succeed" in (fatal_reason(raised.value) or ""), str(raised.value)
