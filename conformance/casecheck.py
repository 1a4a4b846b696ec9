"""Developer check: run the installed onnx release's node test generators against the reference.

    python -m conformance.casecheck Abs Add        # ops by name
    python -m conformance.casecheck --all          # every generated case

The full pinned corpora run through `onnx-parity test`; this is the quick loop while writing ops.
"""
from __future__ import annotations

import argparse
import re
import sys
import traceback

from onnx import TensorProto, numpy_helper

from reference.values import normalize

from .compare import Mismatch, Tolerance, compare_outputs


def _value(v):
    """Generators store some values (int4, float8, ...) as TensorProto."""
    return normalize(numpy_helper.to_array(v) if isinstance(v, TensorProto) else v)


def run_cases(cases, verbose: bool = False) -> tuple[int, list]:
    from reference import ReferenceEvaluator

    passed, failed = 0, []
    for case in cases:
        try:
            ev = ReferenceEvaluator(case.model)
            for inputs, outputs in case.data_sets:
                feeds = dict(zip([i.name for i in case.model.graph.input], map(_value, inputs)))
                got = ev.run(None, feeds)
                compare_outputs([_value(o) for o in outputs], got, Tolerance(case.rtol, case.atol), ev.output_names)
            passed += 1
        except Mismatch as e:
            failed.append((case.name, f"mismatch: {e}"))
        except Exception as e:  # noqa: BLE001 - report every failure and go on
            msg = f"{type(e).__name__}: {e}"
            if verbose:
                msg += "\n" + traceback.format_exc()
            failed.append((case.name, msg))
    return passed, failed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("ops", nargs="*", help="op types whose generated cases to run")
    parser.add_argument("--all", action="store_true", help="run every generated case")
    parser.add_argument("--filter", help="regex on the test name")
    parser.add_argument("-v", "--verbose", action="store_true", help="tracebacks for errors")
    args = parser.parse_args(argv)
    import onnx.backend.test.case.node as node_cases

    cases = list(node_cases.collect_testcases())
    if args.ops and not args.all:
        wanted = set(args.ops)
        cases = [c for c in cases if wanted & {n.op_type for n in c.model.graph.node}]
    if args.filter:
        cases = [c for c in cases if re.search(args.filter, c.name)]
    passed, failed = run_cases(cases, args.verbose)
    for name, msg in failed:
        print(f"FAIL {name}: {msg}")
    print(f"{passed}/{len(cases)} passed")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
