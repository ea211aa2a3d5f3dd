"""``ecrl``: the runtime's command line (thin: parsing here, work in the modules it calls).

Heavy modules (torch) are imported inside the command that needs them, so ``ecrl --help`` and
``ecrl bench sampler`` start fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ecrl.contract.cli import run_main
from ecrl.contract.errors import ConfigError
from ecrl.contract.extras import missing, require
from ecrl.runtime.runconfig import BUILT_STRATEGIES

if TYPE_CHECKING:
    from ecrl.runtime.runconfig import RunConfig, RunFlag

NOT_BUILT_EXIT = 2


def _not_built(name: str, instead: str) -> int:
    """One line: this feature is not in this version, and what works instead."""
    print(f"ecrl {name}: not available in this version; {instead}", file=sys.stderr)
    return NOT_BUILT_EXIT


_TYPES: dict[str, type] = {"int": int, "float": float, "str": str, "ints": str}


def _add_flags(p: argparse.ArgumentParser, flags: Sequence[RunFlag]) -> None:
    for f in flags:
        if f.kind == "bool":
            p.add_argument(f.flag, dest=f.name, action="store_true", default=None, help=f.help)
        else:
            p.add_argument(f.flag, dest=f.name, type=_TYPES[f.kind], metavar=f.metavar,
                           help=f.help)


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    # No defaults here (None = not given): defaults live in RunConfig, so that a TOML file given
    # with --config can set anything a flag can, and a flag given on the command line wins. The
    # flags themselves are RunConfig's documented fields (runconfig.run_flags).
    from ecrl.runtime.runconfig import run_flags

    p.add_argument("--config", metavar="TOML", help="read any of these flags from a TOML file")
    p.add_argument("--nproc", type=int, metavar="N",
                   help="processes per node, the same for every attempt")
    _add_flags(p, run_flags())


def _apply_nproc(args: argparse.Namespace, flags: dict[str, Any]) -> None:
    """``--nproc N``: world size ``N x nodes`` for every attempt (``ecrl run``, ``ecrl launch``);
    refused here, under its own name, rather than later as a world size the user never typed."""
    if args.nproc is None:
        return
    if args.world_sizes is not None:
        raise ConfigError("give --nproc (one world size for every attempt) or --world-sizes "
                          "(one per attempt), not both")
    if args.nproc < 1:
        raise ConfigError(f"--nproc must be a positive number of processes per node, got "
                          f"{args.nproc}")
    flags["world_sizes"] = [args.nproc * (args.nnodes or 1)]


def _run_config(args: argparse.Namespace) -> RunConfig:
    import time

    from ecrl.runtime.runconfig import load_config, run_flags

    flags = {f.name: getattr(args, f.name) for f in run_flags()}
    _apply_nproc(args, flags)
    default_out = time.strftime("runs/run-%Y%m%d-%H%M%S")
    return load_config(flags, config_file=args.config, default_out=default_out)


def _cmd_run(args: argparse.Namespace) -> int:
    require("torch")  # the supervisor is torch-free, its ranks are not: refuse before launching
    config = _run_config(args)
    if config.strategy not in BUILT_STRATEGIES:
        return _not_built(f"run --strategy {config.strategy}",
                          f"use {', '.join(BUILT_STRATEGIES[:-1])} or {BUILT_STRATEGIES[-1]}")
    from ecrl.apps.console import Console
    from ecrl.runtime.supervision.supervisor import Supervisor

    return Supervisor(config, reporter=Console()).run()


def _add_launch_flags(p: argparse.ArgumentParser) -> None:
    # The supervisor's settings and the checkpoint section only: data, model, batch and steps are
    # the script's. Generated from the same table as `ecrl run`'s (runconfig.launch_flags); no
    # defaults here either: a checkpoint flag not given leaves the script's own choice alone.
    from ecrl.runtime.runconfig import launch_flags

    p.add_argument("--out", metavar="DIR", help="run directory (created; continued if it exists)")
    p.add_argument("--nproc", type=int, metavar="N",
                   help="processes per node, the same for every attempt")
    flags = launch_flags()
    nodes = next(i for i, f in enumerate(flags) if f.name == "nnodes") + 1
    _add_flags(p, flags[:nodes])
    p.add_argument("--node-rank", type=int, metavar="K", default=0,
                   help="this node's number; node 0 keeps supervisor.json (default 0)")
    _add_flags(p, flags[nodes:])
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="-- python SCRIPT ARGS",
                   help="the training script and its arguments (omit to continue a run)")


def _cmd_launch(args: argparse.Namespace) -> int:
    require("torch")  # torchrun runs in this interpreter
    import time

    from ecrl.apps.console import Console
    from ecrl.runtime.runconfig import LAUNCH_KEYS
    from ecrl.runtime.supervision.launcher import launch_config, normalize_program, run_launch

    flags = {key: getattr(args, key) for key in LAUNCH_KEYS}
    flags["out"] = args.out
    _apply_nproc(args, flags)
    config = launch_config(flags, default_out=time.strftime("runs/launch-%Y%m%d-%H%M%S"))
    return run_launch(config, normalize_program(args.program), node_rank=args.node_rank,
                      reporter=Console())


def _cmd_selfcheck(args: argparse.Namespace) -> int:
    from ecrl.apps.selfcheck import run_selfcheck

    return run_selfcheck(verbose=True)


def _cmd_demo(args: argparse.Namespace) -> int:
    require("torch")
    from ecrl.apps.demo import run_demo

    return run_demo(out=args.out)


def _cmd_faults(args: argparse.Namespace) -> int:
    if args.jobs < 1:
        raise ConfigError(f"--jobs must be at least 1 (cases run at once), got {args.jobs}")
    require("torch")
    from ecrl.apps.faults import main as faults_main

    return faults_main(quick=args.quick, out=args.out, jobs=args.jobs, fmt=args.format)


def _cmd_bench(args: argparse.Namespace) -> int:
    from ecrl.apps.bench import BENCHES, TORCH_BENCHES
    from ecrl.apps.bench._common import render_json, render_text, write_docs_section

    names = list(BENCHES) if args.name == "all" else [args.name]
    status = 0
    for name in names:
        module_name, _ = BENCHES[name]
        if name in TORCH_BENCHES and (reason := missing("torch")):
            print(f"ecrl bench {name}: {reason}", file=sys.stderr)
            status = NOT_BUILT_EXIT
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            print(f"ecrl bench {name}: not available in this version; `ecrl bench --help` lists "
                  "the others", file=sys.stderr)
            status = NOT_BUILT_EXIT
            continue

        def progress(message: str, _name: str = name) -> None:
            print(f"[bench {_name}] {message}", file=sys.stderr, flush=True)

        result = module.run(quick=args.quick, progress=progress)
        print(render_json(result) if args.format == "json" else render_text(result))
        if args.write_docs:
            write_docs_section(args.write_docs, result)
            print(f"[bench {name}] wrote its section of {args.write_docs}", file=sys.stderr)
    return status


def _cmd_matrix(args: argparse.Namespace) -> int:
    require("torch")
    require("matplotlib")  # its figures come last, after hours of runs
    from pathlib import Path

    from ecrl.apps.matrix import default_out, load_matrix, resolve_config, run_matrix

    config = load_matrix(resolve_config(args.config), seeds=args.seeds)
    out = Path(args.out) if args.out else default_out(config.path)
    return run_matrix(config, out, progress=lambda line: print(line, file=sys.stderr,
                                                              flush=True)).exit_code


def _advise_measured(args: argparse.Namespace, rate: float) -> int:
    import json

    from ecrl.apps.matrix import _advice

    flags = _advice.Overrides(ckpt_cost=args.ckpt_cost, restore_cost=args.restore_cost,
                              step_time=args.step_time, gpu_failure_rate=rate, gpus=args.gpus,
                              overhead=args.overhead, job_seconds=args.job_hours * 3600.0)
    if args.from_run:
        one = _advice.from_run(args.from_run, flags)
        print(json.dumps(one.as_dict(), indent=2) if args.format == "json"
              else _advice.render_run(one))
    else:
        many = _advice.from_matrix(args.from_matrix, flags)
        print(json.dumps([r.as_dict() for r in many], indent=2) if args.format == "json"
              else _advice.render_matrix(many))
    return 0


def _cmd_advise(args: argparse.Namespace) -> int:
    import json

    from ecrl.apps.advise import SECONDS_PER_DAY, AdviceInput, advise, render_text

    if args.mtbf is not None:
        if not args.mtbf > 0:
            raise ConfigError(f"--mtbf must be a positive number of seconds, got {args.mtbf}")
        rate = 1.0 / args.mtbf
    else:
        rate = args.failures_per_gpu_day / SECONDS_PER_DAY
    if args.from_run or args.from_matrix:
        return _advise_measured(args, rate)
    if args.ckpt_cost is None or args.step_time is None:
        raise ConfigError("give --ckpt-cost and --step-time, or measure them with --from-run RUN "
                          "or --from-matrix DIR")
    given = AdviceInput(ckpt_cost=args.ckpt_cost,
                        restore_cost=args.restore_cost if args.restore_cost is not None else 0.0,
                        step_time=args.step_time, gpu_failure_rate=rate,
                        gpus=args.gpus if args.gpus is not None else 1,
                        overhead=args.overhead, job_seconds=args.job_hours * 3600.0)
    advice = advise(given)
    print(json.dumps(advice.as_dict(), indent=2) if args.format == "json"
          else render_text(given, advice))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from ecrl.apps.bench import BENCHES

    parser = argparse.ArgumentParser(
        prog="ecrl",
        description="Fault-tolerant PyTorch DDP training with exact, verifiable recovery.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = sub.add_parser("demo", help="the embedded default: a small 2-rank run with failures")
    demo.add_argument("--out", metavar="DIR", default="demo-run",
                      help="run directory (default ./demo-run, replaced on every demo)")
    demo.set_defaults(func=_cmd_demo)

    run = sub.add_parser("run", help="one training run under the supervisor")
    _add_run_flags(run)
    run.set_defaults(func=_cmd_run)

    launch = sub.add_parser(
        "launch", help="a user's own training script under the supervisor",
        description="Run SCRIPT under torchrun with failure injection, world-size schedule, "
        "relaunch and continue: ecrl launch [options] -- python train.py ARGS "
        "(see docs/library.md).")
    _add_launch_flags(launch)
    launch.set_defaults(func=_cmd_launch)

    faults = sub.add_parser(
        "faults", help="the crash campaign: every fault case, its outcome and verdict",
        description="Kill ranks at every phase of a step and of the checkpoint protocol, "
        "damage checkpoints and latest.json, fill the disk, hang a rank; each case must end "
        "in a run ecrl-verify passes or a clear refusal (docs/faults.md).")
    faults.add_argument("--quick", action="store_true", help="a small subset (a few minutes)")
    faults.add_argument("--out", metavar="DIR", default="faults-campaign",
                        help="work directory: runs, faults.json, faults.md (default "
                        "./faults-campaign)")
    faults.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="cases run at once (default 1)")
    faults.add_argument("--format", choices=["markdown", "json"], default="markdown")
    faults.set_defaults(func=_cmd_faults)

    matrix = sub.add_parser(
        "matrix", help="the experiment matrix (suites × variants), resume-safe",
        description="Run data sets × models × failure schedules, each with a reference and every "
        "checkpoint strategy, as `ecrl run` units judged by ecrl-verify; rerun to resume. "
        "See docs/experiments.md.")
    matrix.add_argument("config", metavar="CONFIG",
                        help="a matrix TOML file, or cpu / gpu for a shipped one")
    matrix.add_argument("--out", metavar="DIR",
                        help="output folder (default ./<config name>-results; rerun to resume)")
    matrix.add_argument("--seeds", type=int, metavar="N",
                        help="repeat every unit with N seeds, with 95%% confidence intervals")
    matrix.set_defaults(func=_cmd_matrix)

    advise = sub.add_parser(
        "advise", help="checkpoint-interval advice from the seed models",
        description="Young's and Daly's intervals, the optimal periodic frequency and wasted "
        "fraction against just-in-time checkpointing, and CheckHint's checkpoint budget.")
    measured = advise.add_mutually_exclusive_group()
    measured.add_argument("--from-run", metavar="RUN",
                          help="take step time, checkpoint stall and restore time from this "
                          "run's logs (flags given override them)")
    measured.add_argument("--from-matrix", metavar="DIR",
                          help="the same per workload and strategy of an `ecrl matrix` folder")
    advise.add_argument("--ckpt-cost", type=float, metavar="SECONDS",
                        help="training time lost to one checkpoint (required unless measured)")
    advise.add_argument("--restore-cost", type=float, metavar="SECONDS",
                        help="fixed cost of one recovery: relaunch and load (default 0)")
    advise.add_argument("--step-time", type=float, metavar="SECONDS",
                        help="duration of one training step (required unless measured)")
    rate = advise.add_mutually_exclusive_group(required=True)
    rate.add_argument("--failures-per-gpu-day", type=float, metavar="F",
                      help="failure rate of one GPU")
    rate.add_argument("--mtbf", type=float, metavar="SECONDS",
                      help="mean time between failures of one GPU")
    advise.add_argument("--gpus", type=int, metavar="N",
                        help="GPUs in the job (1; measured: the run's world size)")
    advise.add_argument("--overhead", type=float, default=0.05, metavar="O",
                        help="CheckHint allowance, a fraction of compute time (0.05)")
    advise.add_argument("--job-hours", type=float, default=24.0, metavar="H",
                        help="useful compute time of the job, for the budget (24)")
    advise.add_argument("--format", choices=["text", "json"], default="text")
    advise.set_defaults(func=_cmd_advise)

    bench = sub.add_parser("bench", help="side-by-side benchmarks (ratios measured in one run)",
                           description="Benchmarks: " + "; ".join(
                               f"{k}: {v[1]}" for k, v in BENCHES.items()))
    bench.add_argument("name", choices=[*BENCHES, "all"])
    bench.add_argument("--quick", action="store_true", help="small sizes (for smoke tests)")
    bench.add_argument("--format", choices=["text", "json"], default="text")
    bench.add_argument("--write-docs", metavar="FILE",
                       help="replace this benchmark's section of FILE (docs/benchmarks.md)")
    bench.set_defaults(func=_cmd_bench)

    check = sub.add_parser("selfcheck", help="check the sampling semantics on small cases")
    check.set_defaults(func=_cmd_selfcheck)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_main(f"ecrl {args.command}", lambda: int(args.func(args)))


if __name__ == "__main__":
    sys.exit(main())
