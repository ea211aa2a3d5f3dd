"""``ecrl``: the runtime's command line (thin: parsing here, work in the modules it calls).

Heavy modules (torch) are imported inside the command that needs them, so ``ecrl --help`` and
``ecrl bench sampler`` start fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ecrl.contract.errors import ConfigError, EcrlError
from ecrl.runtime.runconfig import BUILT_STRATEGIES

if TYPE_CHECKING:
    from ecrl.runtime.runconfig import RunConfig

NOT_BUILT_EXIT = 2


def _not_built(name: str, issue: str) -> int:
    print(f"ecrl {name}: not built yet ({issue}); see README.md for what works today",
          file=sys.stderr)
    return NOT_BUILT_EXIT


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    # No defaults here (None = not given): defaults live in RunConfig, so that a TOML file given
    # with --config can set anything a flag can, and a flag given on the command line wins.
    p.add_argument("--config", metavar="TOML", help="read any of these flags from a TOML file")
    p.add_argument("--out", metavar="DIR", help="run directory (created; resumed if it exists)")
    p.add_argument("--nproc", type=int, metavar="N",
                   help="processes per node, the same for every attempt")
    p.add_argument("--world-sizes", metavar="W0,W1,…",
                   help="world size of attempt 0, 1, …; the last one repeats (default 1)")
    p.add_argument("--dataset", metavar="NAME",
                   help="fake (generated, default), cifar10, cifar100 or imagefolder")
    p.add_argument("--data-dir", metavar="DIR",
                   help="dataset root for cifar10, cifar100 and imagefolder")
    p.add_argument("--dataset-size", type=int, metavar="D",
                   help="samples in the fake dataset (default 4096)")
    p.add_argument("--model", metavar="NAME", help="tiny-cnn (default), resnet18 or resnet50")
    p.add_argument("--global-batch", type=int, metavar="B",
                   help="samples per step over all ranks (default 32)")
    p.add_argument("--steps", type=int, metavar="T", help="committed steps to reach (default 200)")
    p.add_argument("--epochs", type=int, metavar="E", help="alternative to --steps")
    p.add_argument("--ckpt-every", type=int, metavar="K",
                   help="checkpoint after every K-th step (default 50; 0: never)")
    p.add_argument("--strategy", metavar="NAME",
                   help="none, blocking or overlapped (default); sharded and jit: not built yet")
    p.add_argument("--max-inflight", type=int, metavar="N",
                   help="overlapped: pending background writes before back-pressure (default 2)")
    p.add_argument("--fail-at", metavar="STEPS",
                   help="inject a failure after these global steps, e.g. 400,1200")
    p.add_argument("--fail-rank", type=int, metavar="R", help="rank that fails (default 0)")
    p.add_argument("--seed", type=int, help="seed of the sample order, weights and RNGs (0)")
    p.add_argument("--log-ids", action="store_true", default=None,
                   help="log full sample IDs, not only count and hash")
    p.add_argument("--max-restarts", type=int, metavar="N",
                   help="relaunches allowed after failures (default: failures injected + 3)")
    p.add_argument("--deadline", metavar="TIME",
                   help="take a final checkpoint before this time (not built yet)")
    p.add_argument("--keep-checkpoints", type=int, metavar="K",
                   help="retention: keep the newest K >= 2 checkpoints (default 2)")
    p.add_argument("--lr", type=float, help="peak learning rate (default 0.05)")
    p.add_argument("--image-size", type=int, metavar="PX",
                   help="input side for fake and imagefolder data (default 32)")
    p.add_argument("--threads", type=int, metavar="N",
                   help="torch CPU threads per rank (default: cores / ranks per node)")
    p.add_argument("--collective-timeout-s", type=float, metavar="S",
                   help="timeout of every collective (default 60)")
    p.add_argument("--nnodes", type=int, metavar="N", help="torchrun --nnodes (multi-node)")
    p.add_argument("--rdzv-backend", metavar="NAME", help="torchrun --rdzv-backend")
    p.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="torchrun --rdzv-endpoint")
    p.add_argument("--rdzv-id", metavar="ID", help="torchrun --rdzv-id")
    p.add_argument("--rdzv-conf", metavar="K=V,…", help="torchrun --rdzv-conf")


_RUN_KEYS = ("out", "world_sizes", "dataset", "data_dir", "dataset_size", "model",
             "global_batch", "steps", "epochs", "ckpt_every", "strategy", "max_inflight", "fail_at",
             "fail_rank", "seed", "log_ids", "max_restarts", "deadline", "keep_checkpoints", "lr",
             "image_size", "threads", "collective_timeout_s", "nnodes", "rdzv_backend",
             "rdzv_endpoint", "rdzv_id", "rdzv_conf")


def _run_config(args: argparse.Namespace) -> RunConfig:
    import time

    from ecrl.runtime.runconfig import load_config

    flags = {key: getattr(args, key) for key in _RUN_KEYS}
    if args.nproc is not None:
        if args.world_sizes is not None:
            raise ConfigError("give --nproc (one world size for every attempt) or --world-sizes "
                              "(one per attempt), not both")
        flags["world_sizes"] = [args.nproc * (args.nnodes or 1)]
    default_out = time.strftime("runs/run-%Y%m%d-%H%M%S")
    return load_config(flags, config_file=args.config, default_out=default_out)


def _cmd_run(args: argparse.Namespace) -> int:
    config = _run_config(args)
    if config.strategy not in BUILT_STRATEGIES:
        return _not_built(f"run --strategy {config.strategy}", "a later issue")
    if config.deadline is not None:
        return _not_built("run --deadline", "a later issue")
    from ecrl.runtime.supervisor import Supervisor

    return Supervisor(config).run()


def _add_launch_flags(p: argparse.ArgumentParser) -> None:
    # The supervisor's settings only: data, model, batch and steps are the script's own.
    p.add_argument("--out", metavar="DIR", help="run directory (created; continued if it exists)")
    p.add_argument("--nproc", type=int, metavar="N",
                   help="processes per node, the same for every attempt")
    p.add_argument("--world-sizes", metavar="W0,W1,…",
                   help="world size of attempt 0, 1, …; the last one repeats (default 1)")
    p.add_argument("--ckpt-every", type=int, metavar="K",
                   help="checkpoint after every K-th step (default 50; 0: never)")
    p.add_argument("--strategy", metavar="NAME", help="none, blocking or overlapped (default)")
    p.add_argument("--max-inflight", type=int, metavar="N",
                   help="overlapped: pending background writes before back-pressure (default 2)")
    p.add_argument("--fail-at", metavar="STEPS",
                   help="inject a failure after these global steps, e.g. 400,1200")
    p.add_argument("--fail-rank", type=int, metavar="R", help="rank that fails (default 0)")
    p.add_argument("--max-restarts", type=int, metavar="N",
                   help="relaunches allowed after failures (default: failures injected + 3)")
    p.add_argument("--keep-checkpoints", type=int, metavar="K",
                   help="retention: keep the newest K >= 2 checkpoints (default 2)")
    p.add_argument("--threads", type=int, metavar="N",
                   help="OMP_NUM_THREADS per rank (default: cores / ranks per node)")
    p.add_argument("--nnodes", type=int, metavar="N",
                   help="torchrun --nnodes; one ecrl launch per node (docs/library.md)")
    p.add_argument("--node-rank", type=int, metavar="K", default=0,
                   help="this node's number; node 0 keeps supervisor.json (default 0)")
    p.add_argument("--rdzv-backend", metavar="NAME", help="torchrun --rdzv-backend")
    p.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="torchrun --rdzv-endpoint")
    p.add_argument("--rdzv-id", metavar="ID", help="torchrun --rdzv-id (same on every node)")
    p.add_argument("--rdzv-conf", metavar="K=V,…", help="torchrun --rdzv-conf")
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="-- python SCRIPT ARGS",
                   help="the training script and its arguments (omit to continue a run)")


def _cmd_launch(args: argparse.Namespace) -> int:
    import time

    from ecrl.runtime.launcher import LAUNCH_KEYS, launch_config, normalize_program, run_launch

    flags = {key: getattr(args, key) for key in LAUNCH_KEYS}
    flags["out"] = args.out
    if args.nproc is not None:
        if args.world_sizes is not None:
            raise ConfigError("give --nproc (one world size for every attempt) or --world-sizes "
                              "(one per attempt), not both")
        flags["world_sizes"] = [args.nproc * (args.nnodes or 1)]
    config = launch_config(flags, default_out=time.strftime("runs/launch-%Y%m%d-%H%M%S"))
    return run_launch(config, normalize_program(args.program), node_rank=args.node_rank)


def _cmd_selfcheck(args: argparse.Namespace) -> int:
    from ecrl.apps.selfcheck import run_selfcheck

    return run_selfcheck(verbose=True)


def _cmd_demo(args: argparse.Namespace) -> int:
    from ecrl.apps.demo import run_demo

    return run_demo(out=args.out)


def _cmd_bench(args: argparse.Namespace) -> int:
    from ecrl.apps.bench import BENCHES
    from ecrl.apps.bench._common import render_json, render_text, write_docs_section

    names = list(BENCHES) if args.name == "all" else [args.name]
    status = 0
    for name in names:
        module_name, _ = BENCHES[name]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            print(f"ecrl bench {name}: not built yet", file=sys.stderr)
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


def _cmd_advise(args: argparse.Namespace) -> int:
    import json

    from ecrl.apps.advise import SECONDS_PER_DAY, AdviceInput, advise, render_text

    if args.mtbf is not None:
        if not args.mtbf > 0:
            raise ConfigError(f"--mtbf must be a positive number of seconds, got {args.mtbf}")
        rate = 1.0 / args.mtbf
    else:
        rate = args.failures_per_gpu_day / SECONDS_PER_DAY
    given = AdviceInput(ckpt_cost=args.ckpt_cost, restore_cost=args.restore_cost,
                        step_time=args.step_time, gpu_failure_rate=rate, gpus=args.gpus,
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

    matrix = sub.add_parser("matrix", help="the experiment matrix (suites × variants)")
    matrix.add_argument("config", metavar="CONFIG")
    matrix.set_defaults(func=lambda a: _not_built("matrix", "a later issue"))

    advise = sub.add_parser(
        "advise", help="checkpoint-interval advice from the seed models",
        description="Young's and Daly's intervals, the optimal periodic frequency and wasted "
        "fraction against just-in-time checkpointing, and CheckHint's checkpoint budget.")
    advise.add_argument("--ckpt-cost", type=float, required=True, metavar="SECONDS",
                        help="training time lost to one checkpoint")
    advise.add_argument("--restore-cost", type=float, default=0.0, metavar="SECONDS",
                        help="fixed cost of one recovery: relaunch and load (default 0)")
    advise.add_argument("--step-time", type=float, required=True, metavar="SECONDS",
                        help="duration of one training step")
    rate = advise.add_mutually_exclusive_group(required=True)
    rate.add_argument("--failures-per-gpu-day", type=float, metavar="F",
                      help="failure rate of one GPU")
    rate.add_argument("--mtbf", type=float, metavar="SECONDS",
                      help="mean time between failures of one GPU")
    advise.add_argument("--gpus", type=int, default=1, metavar="N", help="GPUs in the job (1)")
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
    try:
        return int(args.func(args))
    except EcrlError as exc:
        print(f"ecrl {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"ecrl {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
