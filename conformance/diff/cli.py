"""`onnx-parity diff`: compare two executions value by value."""
from __future__ import annotations

import argparse
import os
import sys

from .metrics import DEFAULT_ATOL, DEFAULT_RTOL
from .sides import SIDE_KINDS

EXIT_DIVERGED, EXIT_USAGE = 1, 2


def add_diff_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "diff", help="find the node where two executions part, and whether the error is made there",
        description="Compare two executions value by value: one model on two sides (default: "
                    "reference vs optimized), two models, or a live run against a saved one.",
        epilog="Exit status: 0 when every graph output is within tolerance, 1 on a divergence, "
               "2 on a usage error.")
    p.add_argument("models", nargs="+", metavar="MODEL", help="one model, or two (A and B)")
    p.add_argument("--a", dest="side_a", default="reference", choices=SIDE_KINDS,
                   help="side A's backend (default: %(default)s)")
    p.add_argument("--b", dest="side_b", default=None, choices=SIDE_KINDS,
                   help="side B's backend (default: optimized for one model, --a for two)")
    p.add_argument("--level", type=int, default=99, help="optimized: graph optimization level")
    p.add_argument("--against-run", metavar="RUN.npz", help="side B is a run saved with --save-run")
    p.add_argument("--save-run", metavar="RUN.npz", help="save side A's run (every value)")
    p.add_argument("--inputs", help=".npz file, or a folder of TensorProto input_N.pb files")
    p.add_argument("--dim", action="append", help="symbolic dimension value, e.g. batch=2")
    p.add_argument("--seed", type=int, default=0, help="seed for random inputs (default: 0)")
    p.add_argument("--rtol", type=float, default=DEFAULT_RTOL, help="default: %(default)g")
    p.add_argument("--atol", type=float, default=DEFAULT_ATOL, help="default: %(default)g")
    p.add_argument("--keep", action="store_true",
                   help="keep every tensor in memory (default: spill to a temporary folder)")
    p.add_argument("--no-attribution", action="store_true",
                   help="skip re-running divergent nodes (no made-here / inherited verdicts)")
    p.add_argument("--extract", metavar="DIR", help="write a repro of the first node where error is made")
    p.add_argument("--json", metavar="FILE", help="write the full report as JSON")
    p.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")
    p.add_argument("--all", action="store_true", help="print every row, not only the notable ones")
    p.add_argument("--show", type=int, default=40, help="rows to print at most (0: no limit)")
    p.set_defaults(func=cmd_diff)
    return p


def cmd_diff(args) -> int:
    from rich.console import Console
    from rich.markup import escape

    from reference.errors import InvalidModelError, UnsupportedOpError

    from .api import diff_models
    from .sides import SavedRunSide, SideError

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    try:
        a, b = _models(args)
        if args.against_run:
            b = SavedRunSide(args.against_run, model=args.models[0])
        report = diff_models(
            a, b, side_a=args.side_a, side_b=args.side_b, inputs=args.inputs,
            dims=_dims(args.dim), seed=args.seed, rtol=args.rtol, atol=args.atol,
            keep=args.keep, attribute=not args.no_attribution, extract=args.extract,
            save_run_to=args.save_run, level=args.level)
    except (ValueError, FileNotFoundError, InvalidModelError, UnsupportedOpError) as e:
        console.print(f"[red]error:[/red] {escape(str(e))}")  # a model or input we cannot take
        return EXIT_USAGE
    except SideError as e:  # a side could not run the model: that is a divergence too
        console.print(f"[red]error:[/red] {escape(str(e))}")
        return EXIT_DIVERGED
    report.print(console, all_rows=args.all, limit=args.show)
    if args.json:
        report.to_json(args.json)
    if args.html:
        report.to_html(args.html)
    return report.exit_code


def _models(args):
    if len(args.models) > 2:
        raise ValueError(f"diff takes one or two models, got {len(args.models)}")
    if len(args.models) == 2 and args.against_run:
        raise ValueError("--against-run compares with one model's saved run; give one model")
    for path in args.models:
        if not os.path.exists(path):
            raise ValueError(f"model not found: {path}")
    return args.models[0], (args.models[1] if len(args.models) == 2 else None)


def _dims(pairs) -> dict:
    dims = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name or not value.strip().isdigit():
            raise ValueError(f"--dim wants name=integer (0 or more), got {pair!r}")
        dims[name] = int(value)
    return dims


def main(argv=None) -> int:
    """Run `diff` on its own (the onnx-parity entry point hooks add_diff_parser in)."""
    parser = argparse.ArgumentParser(prog="onnx-parity")
    add_diff_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
