"""Where a rank trains and how the ranks talk: its device and the process group's backend.

- No CUDA: the CPU and gloo.
- At least as many GPUs on the node as ranks: one GPU per rank (``cuda:LOCAL_RANK``) and nccl.
- Fewer GPUs than ranks on the node (a workstation or a one-GPU runner testing several ranks):
  the ranks share the GPUs round-robin and talk over gloo, whose all-reduce and broadcast take
  CUDA tensors. nccl is not an option there: it refuses two ranks of one communicator on the
  same device. The collectives then stage through host memory, which is slower but computes
  the same sums, so a run's data and checkpoints are those of a run with a GPU per rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = ["Placement", "choose_placement"]


@dataclass(frozen=True, slots=True)
class Placement:
    device: torch.device
    backend: str
    shared_device: bool
    """Several ranks of this node train on ``device``."""

    def describe(self) -> str:
        shared = ", shared with other ranks" if self.shared_device else ""
        return f"{self.device} over {self.backend}{shared}"

    def init_process_group(self, timeout: timedelta) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if self.backend == "nccl":
            dist.init_process_group("nccl", timeout=timeout, device_id=self.device)
        else:
            dist.init_process_group(self.backend, timeout=timeout)


def choose_placement(local_rank: int, local_world_size: int) -> Placement:
    """The device and backend of the rank with this local rank (see the module's docstring)."""
    if not torch.cuda.is_available():
        return Placement(torch.device("cpu"), "gloo", shared_device=False)
    gpus = torch.cuda.device_count()
    device = torch.device("cuda", local_rank % gpus)
    if local_world_size <= gpus:
        return Placement(device, "nccl", shared_device=False)
    return Placement(device, "gloo", shared_device=True)
