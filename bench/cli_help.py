"""How long ``fleetops --help`` and each ``fleetops COMMAND --help`` take, as a new process each time
(what a user waits for), against two baselines measured in the same run: the interpreter's own
start-up (``python -c pass``) and the eager import every command paid before the CLI deferred its
imports (``python -c "import fleetops.api"``: boto3, ansible, pydantic, paramiko, ansible-runner).

Each is the median of RUNS runs after one warm-up run (the page cache warm, as for a user's second
command). Target: every help under TARGET_S. Run: python bench/cli_help.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

BIN = Path(sys.executable).parent
FLEETOPS = BIN / "fleetops"
PYTHON = sys.executable
RUNS = 5
TARGET_S = 0.3
# nested commands worth timing on their own: the ones whose options read the collection's defaults
NESTED = (("remediate", "reclaim"), ("remediate", "fix"), ("remediate", "auto"))


def commands() -> list[tuple[str, ...]]:
    """``()`` (the top level), every COMMAND, and NESTED: read from the parser, not a copy of it."""
    from fleetops.cli.app import build_parser

    found: list[tuple[str, ...]] = [()]
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            found += [(name,) for name in action.choices]
    return found + [c for c in NESTED if c[:1] in found]


def median_s(argv: Sequence[str]) -> float:
    """The median wall time of RUNS runs of ``argv`` (after one warm-up); each must exit 0."""
    env = {**os.environ, "COLUMNS": "100"}
    times: list[float] = []
    for i in range(RUNS + 1):
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        took = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}\n{proc.stderr}")
        if i:
            times.append(took)
    return statistics.median(times)


def main() -> int:
    if not FLEETOPS.exists():
        print(f"no {FLEETOPS}: install the package (pip install -e .) first", file=sys.stderr)
        return 2
    startup = median_s([PYTHON, "-c", "pass"])
    eager = median_s([PYTHON, "-c", "import fleetops.api"])
    print(f"median of {RUNS} runs each (after one warm-up); target: every help under {TARGET_S:g} s")
    print(f"{'':44} {'median s':>9} {'x start-up':>11} {'/ eager import':>15}")
    print(f"{'python -c pass (start-up)':44} {startup:>9.3f} {1:>10.1f}x {startup / eager:>15.2f}")
    print(f"{'python -c import fleetops.api (eager)':44} {eager:>9.3f} {eager / startup:>10.1f}x {1:>15.2f}")
    slowest = ("", 0.0)
    for command in commands():
        label = " ".join(("fleetops", *command, "--help"))
        took = median_s([str(FLEETOPS), *command, "--help"])
        print(f"{label:44} {took:>9.3f} {took / startup:>10.1f}x {took / eager:>15.2f}")
        slowest = max(slowest, (label, took), key=lambda pair: pair[1])
    verdict = "under" if slowest[1] < TARGET_S else "OVER"
    print(f"slowest: {slowest[0]}: {slowest[1]:.3f} s, {verdict} the target of {TARGET_S:g} s; "
          f"eager import / slowest help: {eager / slowest[1]:.1f}x")  # fmt: skip
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("(PYTHONDONTWRITEBYTECODE is set: modules without a cached .pyc are compiled on every run)")
    return 0 if slowest[1] < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
