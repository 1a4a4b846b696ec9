"""A measurement in a fresh Python process, for figures that a warm process would spoil (peak
RSS, load time): the child's script reads its arguments as JSON from argv[1] and prints one JSON
object as its last line."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_json_child(script: str, args: dict, what: str, timeout: float = 600) -> dict:
    """The last stdout line of `python -c script json(args)`, run from the repository root, as
    JSON; a failed child raises with `what` and the end of its stderr."""
    done = subprocess.run([sys.executable, "-c", script, json.dumps(args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def medians(results: list[dict]) -> dict:
    """Key by key, the median over results that share their keys."""
    return {key: statistics.median(r[key] for r in results) for key in results[0]}
