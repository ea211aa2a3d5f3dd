"""One rank of ``ecrl run`` in a worker forked from the attempt's agent
(:mod:`ecrl.runtime.trainer.agent`), which torchrun runs as a script (``--run-path``).

The worker behaves as the new interpreter it replaces would:

- **its signals**: torchrun's agent turns SIGTERM, SIGINT, SIGHUP and SIGQUIT (or the signals
  ``TORCHELASTIC_SIGNALS_TO_HANDLE`` names) into exceptions in itself, and a fork inherits that;
  they are put back as an interpreter starts with them (SIGTERM ends the rank unless the ``jit``
  strategy takes it, SIGINT raises ``KeyboardInterrupt``);
- **its uncaught exception**: printed by ``sys.excepthook`` (``torch.distributed``'s, which
  prefixes every line with ``[rankN]:`` once the process group exists: how the supervisor reads a
  crash from ``torchrun.log``), then exit status 1 (``KeyboardInterrupt``: death by SIGINT).
  torch's worker wrapper would instead send the traceback to the agent's log without the prefix,
  and end a ``KeyboardInterrupt`` as a success;
- **its name**: ``ecrl rank N`` in ``ps`` and ``/proc/PID/comm`` — its command line and initial
  environment in ``/proc`` are those of the last process that started an interpreter (the agent,
  or the supervisor the agent is forked from): :func:`ecrl.runtime.supervision.command.rank_pids`
  finds a rank by its name and its output, the attempt's torchrun log.
"""

from __future__ import annotations

import os
import signal
import sys

from ecrl.runtime._proc import NAME_BYTES, name_process, restore_started_signals
from ecrl.runtime.trainer.agent import RANK_NAME
from ecrl.runtime.trainer.trainer import main

_AGENT_HANDLES = "TORCHELASTIC_SIGNALS_TO_HANDLE"
"""torchrun's variable naming the signals its agent handles (default below)."""
_AGENT_DEFAULT = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"


def run() -> None:
    handled = (getattr(signal, name.strip(), None)
               for name in os.environ.get(_AGENT_HANDLES, _AGENT_DEFAULT).split(","))
    restore_started_signals(s for s in handled if isinstance(s, signal.Signals))
    name_process(RANK_NAME.format(os.environ.get("RANK", "?"))[:NAME_BYTES])
    try:
        code = main()
    except SystemExit:
        raise
    except BaseException as exc:  # the end an interpreter gives an uncaught exception
        sys.excepthook(type(exc), exc, exc.__traceback__)
        sys.stderr.flush()
        if isinstance(exc, KeyboardInterrupt):
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        code = 1
    raise SystemExit(code)


if __name__ == "__main__":
    run()
