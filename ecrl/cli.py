"""``ecrl``: the runtime's command line (thin: parsing here, work in the modules it calls).

Heavy modules (torch) are imported inside the command that needs them, so ``ecrl --help`` and
``ecrl bench sampler`` start fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from ecrl.errors import EcrlError

NOT_BUILT_EXIT = 2


def _not_built(name: str, issue: str) -> int:
    print(f"ecrl {name}: not built yet ({issue}); see README.md for what works today",
          file=sys.stderr)
    return NOT_BUILT_EXIT


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="TOML", help="read any of these flags from a TOML file")
    p.add_argument("--out", metavar="DIR", help="run directory (created; resumed if it exists)")
    p.add_argument("--nproc", type=int, metavar="N", help="processes per node for torchrun")
    p.add_argument("--world-sizes", metavar="W0,W1,…",
                   help="world size of attempt 0, 1, …; the last one repeats")
    p.add_argument("--dataset", choices=["fake", "cifar10", "cifar100", "imagefolder"])
    p.add_argument("--data-dir", metavar="DIR",
                   help="dataset root for cifar10, cifar100 and imagefolder")
    p.add_argument("--dataset-size", type=int, metavar="D", help="samples in the fake dataset")
    p.add_argument("--model", choices=["tiny-cnn", "resnet18", "resnet50"])
    p.add_argument("--global-batch", type=int, metavar="B", help="samples per step over all ranks")
    p.add_argument("--steps", type=int, metavar="T", help="committed steps to reach")
    p.add_argument("--epochs", type=int, metavar="E", help="alternative to --steps")
    p.add_argument("--ckpt-every", type=int, metavar="K", help="checkpoint every K steps")
    p.add_argument("--strategy", choices=["none", "blocking", "overlapped", "sharded", "jit"])
    p.add_argument("--max-inflight", type=int, metavar="N", help="overlapped: pending writes")
    p.add_argument("--fail-at", metavar="STEPS", help="inject a failure after these global steps")
    p.add_argument("--fail-rank", type=int, metavar="R", help="rank that fails (default 0)")
    p.add_argument("--seed", type=int)
    p.add_argument("--log-ids", action="store_true", help="log full sample IDs, not only hashes")
    p.add_argument("--max-restarts", type=int, metavar="N")
    p.add_argument("--deadline", metavar="TIME", help="take a final checkpoint before this time")


def _cmd_selfcheck(args: argparse.Namespace) -> int:
    from ecrl.selfcheck import run_selfcheck

    return run_selfcheck(verbose=True)


def _cmd_demo(args: argparse.Namespace) -> int:
    # Until the runtime lands the demo is the semantics self-check, which must never fail.
    print("ecrl demo: the DDP runtime is not built yet; showing the semantics self-check.")
    return _cmd_selfcheck(args)


def _cmd_bench(args: argparse.Namespace) -> int:
    from ecrl.bench import BENCHES
    from ecrl.bench._common import render_json, render_text, write_docs_section

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


def build_parser() -> argparse.ArgumentParser:
    from ecrl.bench import BENCHES

    parser = argparse.ArgumentParser(
        prog="ecrl",
        description="Fault-tolerant PyTorch DDP training with exact, verifiable recovery.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = sub.add_parser("demo", help="the embedded default: a small 2-rank run with failures")
    demo.set_defaults(func=_cmd_demo)

    run = sub.add_parser("run", help="one training run under the supervisor")
    _add_run_flags(run)
    run.set_defaults(func=lambda a: _not_built("run", "issue #3, runtime"))

    matrix = sub.add_parser("matrix", help="the experiment matrix (suites × variants)")
    matrix.add_argument("config", metavar="CONFIG")
    matrix.set_defaults(func=lambda a: _not_built("matrix", "issue #3, runtime"))

    advise = sub.add_parser("advise", help="checkpoint-interval advice from the seed models")
    advise.set_defaults(func=lambda a: _not_built("advise", "no issue yet"))

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
