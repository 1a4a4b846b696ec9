"""The `onnx-parity` command: corpus, test, ops, run."""
from __future__ import annotations

import argparse
import os
import re
import sys
import time

from rich.console import Console

from .pins import CACHE_ENV, Cache, CorpusUnavailable, PinMismatch, load_pins, select_pins

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def _console() -> Console:
    # Off a terminal rich assumes 80 columns; tables of test ids need more.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 160)


def opset_arg(text: str) -> str:
    """argparse type of --opset: N, 'all', or a comma list of numbers and ranges lo-hi."""
    wrong = argparse.ArgumentTypeError(
        f"wants N, a list '7,13', a range '18-28' or 'all', got {text!r}")
    if text.strip() == "all":
        return "all"
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()) or (dash and int(lo) > int(hi)):
            raise wrong
    return text


def dim_arg(text: str) -> tuple[str, int]:
    """argparse type of --dim: name=integer, the integer 0 or more."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip().isdigit():
        raise argparse.ArgumentTypeError(f"wants name=integer (0 or more), got {text!r}")
    return name.strip(), int(value)


def positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"wants an integer of 1 or more, got {text!r}")
    return int(text)


def _add_pin_args(p: argparse.ArgumentParser, default: str = "all") -> None:
    p.add_argument("--opset", default=default, type=opset_arg,
                   help="pinned opset: N, a list '7,13', a range '18-28', or 'all' (default: %(default)s)")
    p.add_argument("--cache-dir", default=None,
                   help=f"corpus cache folder (default: ${CACHE_ENV} or ~/.cache/onnx-parity)")


class _Download:
    """Byte progress for a wheel download, on a terminal only."""

    def __init__(self, console: Console):
        self.console = console
        self.progress = None
        self.task = None

    def __call__(self, n: int, total: int) -> None:
        if not self.console.is_terminal:
            return
        if self.progress is None:
            from rich.progress import DownloadColumn, Progress, TransferSpeedColumn

            self.progress = Progress(*Progress.get_default_columns(), DownloadColumn(),
                                     TransferSpeedColumn(), console=self.console, transient=True)
            self.progress.start()
            self.task = self.progress.add_task("download", total=total or None)
        self.progress.advance(self.task, n)

    def close(self):
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


# corpus ---------------------------------------------------------------------------------------
def cmd_corpus(args) -> int:
    from rich.markup import escape
    from rich.table import Table

    from .corpus import forget_mismatch, is_cached, open_corpus, recorded_mismatch, verify_cached

    console = _console()
    cache = Cache(args.cache_dir)
    pins = select_pins(load_pins(), args.opset)
    table = Table(title=f"pinned corpora ({cache.root})")
    for col in ("opset", "onnx", "source", "state", "node", "other", "unavailable"):
        table.add_column(col, justify="left" if col in ("source", "state") else "right")
    failed = False
    fetch = args.action == "fetch" and not args.offline
    for pin in pins:
        source = "generated" if pin.generated else "wheel"
        download = _Download(console)
        try:
            if args.action == "list" and not is_cached(pin, cache):
                mismatch = pin.generated and recorded_mismatch(pin, cache)
                table.add_row(str(pin.opset), pin.onnx, source,
                              "[red]mismatch[/red]" if mismatch else "not cached",
                              str(pin.node_tests), "", "")
                failed = failed or bool(mismatch)
                continue
            if args.action == "verify":
                verify_cached(pin, cache)  # re-hashes what is cached; fetches nothing
            if fetch and pin.generated:
                forget_mismatch(pin, cache)  # an explicit fetch tries a recorded mismatch again
            corpus = open_corpus(pin, cache, fetch=fetch, progress=download,
                                 announce=lambda what, pin=pin: _announce(console, pin, what))
            state = "ok"
            if corpus.node_count != pin.node_tests:
                state, failed = f"{corpus.node_count} node tests, pin says {pin.node_tests}", True
            if args.action == "list" and args.tests:
                for t in corpus.tests:
                    console.print(t.id + (f"  (unavailable: {t.unavailable})" if t.unavailable else ""))
            other = sum(t.kind != "node" and not t.unavailable for t in corpus.tests)
            unavailable = sum(bool(t.unavailable) for t in corpus.tests)
            table.add_row(str(pin.opset), pin.onnx, source, state, str(corpus.node_count),
                          str(other), str(unavailable))
        except (CorpusUnavailable, PinMismatch) as e:
            failed = True
            state = ("mismatch" if isinstance(e, PinMismatch)
                     else "unavailable" if fetch else "not cached")
            table.add_row(str(pin.opset), pin.onnx, source, f"[red]{state}[/red]", "", "", "")
            console.print(f"[red]opset {pin.opset}:[/red] {escape(str(e))}")
        finally:
            download.close()
    if not (args.action == "list" and args.tests):
        console.print(table)
    return EXIT_FAIL if failed else EXIT_OK


def _announce(console: Console, pin, what: str) -> None:
    """Say what a first use waits for (a download also shows its bytes on a terminal)."""
    console.print(f"opset {pin.opset}: {what}")


# test -----------------------------------------------------------------------------------------
def cmd_test(args) -> int:
    from .backends import make_backend
    from .expectations import Expectations
    from .reports import (
        anchor_differences,
        print_summary,
        problems,
        write_json,
        write_junit,
        write_markdown,
    )
    from .runner import RunConfig, apply_expectations, collect_tests

    console = _console()
    options = {}
    if args.backend == "optimized":
        options = {"level": args.level, "provider": args.provider, "check_nodes": args.check_nodes}
    try:
        backend = make_backend(args.backend, **options)
        if args.compare_with:
            make_backend(args.compare_with)
        pattern = re.compile(args.filter) if args.filter else None
    except (ValueError, re.error) as e:
        from rich.markup import escape

        console.print(f"[red]error:[/red] {escape(str(e))}")
        return EXIT_USAGE
    cache = Cache(args.cache_dir)
    pins = select_pins(load_pins(), args.opset)
    download = _Download(console)
    try:
        tests, unusable = collect_tests(pins, cache, pattern, progress=download,
                                        announce=lambda pin, what: _announce(console, pin, what))
    finally:
        download.close()
    for bad in unusable:  # reported, and the run goes on with every other pin
        from rich.markup import escape

        console.print(f"[red]error:[/red] opset {bad.opset} cannot run: {escape(bad.message)}")
    if not tests and not unusable:
        console.print("[yellow]no tests match[/yellow]")
        return EXIT_USAGE
    expectations_name = args.backend if args.backend != "optimized" else f"optimized-{args.provider}"
    expectations = Expectations.load(expectations_name)
    config = RunConfig(args.backend, options, args.cache_dir, args.compare_with, args.timeout)
    start = time.perf_counter()
    results = (_run_with_progress(tests, config, args.jobs, console) if tests else []) + unusable
    elapsed = time.perf_counter() - start
    apply_expectations(results, expectations, strict=not backend.anchor)
    print_summary(results, console, args.compare_with, args.backend)
    for r in problems(results)[: args.show]:
        console.print(f"[red]{r.verdict}[/red] {r.id}: {(r.message or r.reason)[:400]}")
    hidden = len(problems(results)) - args.show
    if hidden > 0:
        console.print(f"... and {hidden} more (see --json / --markdown)")
    if args.compare_with:
        differ = anchor_differences(results)
        console.print(f"{len(differ)} tests differ between {args.backend} and {args.compare_with}"
                      + (":" if differ else ""))
        for r in differ[: args.show]:
            console.print(f"  {r.id}: {args.backend} {r.outcome}, {args.compare_with} {r.anchor_outcome}")
        if len(differ) > args.show:
            console.print(f"  ... and {len(differ) - args.show} more (see --json / --markdown)")
    console.print(f"{len(results)} tests in {elapsed:.1f} s with {args.jobs} jobs")
    meta = {"backend": args.backend, "options": options, "opsets": [p.opset for p in pins],
            "compare_with": args.compare_with, "seconds": elapsed,
            "expectations": expectations.source}
    if args.json:
        write_json(results, args.json, meta)
    if args.junit:
        write_junit(results, args.junit, args.backend)
    if args.markdown:
        write_markdown(results, args.markdown, args.backend, args.compare_with)
    if backend.anchor:
        return EXIT_OK
    return EXIT_FAIL if problems(results) else EXIT_OK


def _run_with_progress(tests, config, jobs, console: Console):
    from .runner import run_tests

    if console.is_terminal:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

        with Progress("[progress.description]{task.description}", BarColumn(),
                      MofNCompleteColumn(), TimeRemainingColumn(), console=console,
                      transient=True) as progress:
            task = progress.add_task(config.backend, total=len(tests))

            def advance(result):
                progress.update(task, advance=1, description=result.id[:40])

            return run_tests(tests, config, jobs, on_result=advance)
    done = [0]
    step = max(1, len(tests) // 10)

    def log(result):
        done[0] += 1
        if done[0] % step == 0 or done[0] == len(tests):
            console.print(f"{done[0]}/{len(tests)} tests run")

    return run_tests(tests, config, jobs, on_result=log)


# ops ------------------------------------------------------------------------------------------
def cmd_ops(args) -> int:
    from rich.table import Table

    from .coverage import coverage

    console = _console()
    rows = coverage(args.domain)
    table = Table(title="operator coverage of the reference (by onnx's schemas)")
    for col in ("domain", "op", "schema versions", "direct", "function body", "missing"):
        table.add_column(col)
    for row in rows:
        table.add_row(row.domain or "ai.onnx", row.op_type, ",".join(map(str, row.versions)),
                      ",".join(map(str, row.direct)), ",".join(map(str, row.function)),
                      ",".join(map(str, row.missing)))
    console.print(table)
    covered = sum(not r.missing for r in rows)
    console.print(f"{covered}/{len(rows)} ops covered at every version")
    return EXIT_OK


# run ------------------------------------------------------------------------------------------
def cmd_run(args) -> int:
    import numpy as np
    from rich.markup import escape

    from reference import ReferenceEvaluator
    from reference.errors import ReferenceError_

    console = _console()
    try:  # what the user gave: the model and its inputs (exit 2 when unusable)
        ev = ReferenceEvaluator(args.model)
        feeds = _run_inputs(args, ev)
        ev.check_feeds(feeds)
    except (OSError, ValueError, ReferenceError_) as e:
        console.print(f"[red]error:[/red] {escape(_named(e, args.model))}")
        return EXIT_USAGE
    try:
        outputs = ev.run(None, feeds)
    except Exception as e:  # noqa: BLE001 - the CLI reports, it does not trace back
        console.print(f"[red]error:[/red] {escape(f'{type(e).__name__}: {e}')}")
        return EXIT_FAIL
    for name, value in zip(ev.output_names, outputs):
        if isinstance(value, np.ndarray):
            console.print(f"{name}: {value.dtype}{list(value.shape)}")
            console.print(np.array2string(value, threshold=20))
        else:
            console.print(f"{name}: {value!r}")
    if args.save:
        np.savez(args.save, **{n: v for n, v in zip(ev.output_names, outputs)
                               if isinstance(v, np.ndarray)})
    return EXIT_OK


def _run_inputs(args, ev) -> dict:
    from .inputs import load_inputs, random_inputs

    if not args.inputs:
        return random_inputs(ev.model, args.seed, dict(args.dim or []))
    if not os.path.exists(args.inputs):
        raise FileNotFoundError(f"inputs not found: {args.inputs}")
    try:
        return load_inputs(args.inputs, ev)
    except Exception as e:  # np.load raises many kinds; all mean "not inputs"
        raise ValueError(f"cannot read inputs {args.inputs} (an .npz or a folder of "
                         f"input_N.pb files): {type(e).__name__}: {e}") from e


def _named(error: Exception, model: str) -> str:
    """The error's message, with the model's path in front unless it already names it."""
    message = str(error)
    return message if model in message else f"{model}: {message}"


# fuzz -----------------------------------------------------------------------------------------
def cmd_fuzz(args) -> int:
    from rich.markup import escape
    from rich.table import Table

    from .fuzz import campaign

    console = _console()
    counts = {"examples": 0, "batches": 0}
    start = time.perf_counter()

    def record(result):
        counts["examples"] += result.examples
        counts["batches"] += 1
        if result.outcome != "ok":
            console.print(f"[red]{result.outcome}[/red] in batch {result.batch}: "
                          f"{escape(result.problems[0][:300]) if result.problems else ''}"
                          + (f" (saved in {result.saved})" if result.saved else ""))

    if console.is_terminal:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

        with Progress("fuzz", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                      console=console, transient=True) as progress:
            task = progress.add_task("graphs", total=args.examples)

            def advance(result):
                record(result)
                progress.update(task, completed=min(args.examples, counts["examples"]))

            results = campaign(args.examples, args.seed, args.jobs, args.out,
                               onnxruntime=not args.no_onnxruntime, on_result=advance)
    else:
        step = max(1, args.examples // 10)

        def log(result):
            before = counts["examples"]
            record(result)
            if counts["examples"] // step > before // step or counts["examples"] >= args.examples:
                console.print(f"{counts['examples']}/{args.examples} graphs run")

        results = campaign(args.examples, args.seed, args.jobs, args.out,
                           onnxruntime=not args.no_onnxruntime, on_result=log)
    elapsed = time.perf_counter() - start
    bad = [r for r in results if r.outcome != "ok"]
    table = Table(title="fuzz campaign")
    for col in ("graphs run", "batches", "mismatches", "crashes/timeouts", "seconds", "jobs"):
        table.add_column(col, justify="right")
    table.add_row(str(counts["examples"]), str(len(results)),
                  str(sum(r.outcome == "mismatch" for r in bad)),
                  str(sum(r.outcome in ("crash", "timeout") for r in bad)), f"{elapsed:.1f}",
                  str(args.jobs))
    console.print(table)
    for r in bad:
        console.print(f"{r.outcome}: {escape(r.saved or '(not saved)')}")
        for line in r.problems[:5]:
            console.print(f"  {escape(line[:400])}")
    return EXIT_FAIL if bad else EXIT_OK


# entry point -----------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onnx-parity", description=(
        "Conformance-first ONNX runtime: score backends against the pinned ONNX test corpora."))
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("corpus", help="fetch, list or verify the pinned corpora")
    p.add_argument("action", choices=["fetch", "list", "verify"])
    _add_pin_args(p)
    p.add_argument("--tests", action="store_true", help="with list: print every test id")
    p.add_argument("--offline", action="store_true", help="never download; use the cache only")
    p.set_defaults(func=cmd_corpus)

    p = sub.add_parser("test", help="run a backend over the pinned corpora")
    p.add_argument("--backend", default="reference",
                   help="reference, optimized, onnxruntime or onnx-reference (default: %(default)s)")
    _add_pin_args(p)
    p.add_argument("--filter", help="regex on test ids such as opset21/test_abs")
    p.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 1,
                   help="worker processes (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per test (default: %(default)s)")
    p.add_argument("--compare-with", help="an anchor backend whose results go beside ours")
    p.add_argument("--level", type=int, default=99, help="optimized: graph optimization level")
    p.add_argument("--provider", default="cpu", choices=["cpu", "cuda"], help="optimized: provider")
    p.add_argument("--check-nodes", action="store_true",
                   help="optimized: compare every node with the reference op")
    p.add_argument("--json", help="write the full results as JSON")
    p.add_argument("--junit", help="write JUnit XML")
    p.add_argument("--markdown", help="write a Markdown summary")
    p.add_argument("--show", type=int, default=30, help="problems to print (default: %(default)s)")
    p.set_defaults(func=cmd_test)

    p = sub.add_parser("ops", help="operator coverage of the reference evaluator")
    p.add_argument("--domain", help="only this domain ('' or ai.onnx, ai.onnx.ml, ...)")
    p.set_defaults(func=cmd_ops)

    p = sub.add_parser("run", help="run a model with the reference evaluator", epilog=(
        "Exit status: 0 on success, 1 when the run fails at a node, 2 on a usage error (bad "
        "arguments, a file that is not a usable model, inputs that do not fit it)."))
    p.add_argument("model")
    p.add_argument("--inputs", help=".npz file, or a folder of TensorProto input_N.pb files")
    p.add_argument("--dim", action="append", type=dim_arg,
                   help="symbolic dimension value, e.g. batch=2")
    p.add_argument("--seed", type=int, default=0, help="seed for random inputs")
    p.add_argument("--save", help="write the outputs to this .npz")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("fuzz", help="compare the optimized runtime with the reference on random graphs",
                       epilog="Exit status: 0 when every graph agrees, 1 on any mismatch, crash "
                              "or timeout (each saved as a regression folder under --out).")
    p.add_argument("--examples", type=positive_int, default=1000,
                   help="random graphs to run (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="campaign seed (default: %(default)s)")
    p.add_argument("--jobs", "-j", type=positive_int, default=os.cpu_count() or 1,
                   help="worker processes (default: %(default)s)")
    p.add_argument("--out", default="fuzz-regressions",
                   help="folder for the shrunk models and inputs of mismatches (default: %(default)s)")
    p.add_argument("--no-onnxruntime", action="store_true",
                   help="do not compare with onnxruntime, even where it is installed")
    p.set_defaults(func=cmd_fuzz)

    from .diff.cli import add_diff_parser

    add_diff_parser(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:
        print(f"onnx-parity: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
