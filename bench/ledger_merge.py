"""Merging a fleet's fleetops.io/spent tags into an empty budget ledger (an AWX job's first step):
``BudgetLedger.merge_tag`` for every host, against the same merge done the way it was first written,
a scan of the whole ledger for each entry (quadratic). Both must end with the same ledger.
Run: python bench/ledger_merge.py
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from fleetops.policy import BudgetLedger

T0 = 1_800_000_000
SIZES = (1000, 2500, 7500)
TAG = f"fix:{T0 - 60};reboot:{T0 - 1800}"  # two budgeted actions within the hour on every host


def baseline(hosts: int) -> BudgetLedger:
    """The first version: for each tag entry, any() over every entry recorded so far."""
    ledger = BudgetLedger()
    for i in range(hosts):
        for part in TAG.split(";"):
            action, _, at = part.partition(":")
            if not any(
                e.host == f"h{i}" and e.action == action and abs(e.at - float(at)) < 1.0
                for e in ledger.entries
            ):
                ledger.record(action, f"h{i}", "az-a", float(at), controller="tag")
    return ledger


def indexed(hosts: int) -> BudgetLedger:
    ledger = BudgetLedger()
    for i in range(hosts):
        ledger.merge_tag(f"h{i}", "az-a", TAG, f"h{i}: tag fleetops.io/spent", T0)
    return ledger


def timed(fn: Callable[[int], BudgetLedger], hosts: int) -> tuple[float, BudgetLedger]:
    start = time.perf_counter()
    ledger = fn(hosts)
    return time.perf_counter() - start, ledger


def main() -> int:
    print(f"{'hosts':>6} {'entries':>8} {'baseline s':>11} {'merge_tag s':>12} {'ratio':>8}")
    for hosts in SIZES:
        base_s, base = timed(baseline, hosts)
        ours_s, ours = timed(indexed, hosts)
        key = [(e.host, e.action, e.at) for e in base.entries]
        assert key == [(e.host, e.action, e.at) for e in ours.entries], "the two merges disagree"
        print(f"{hosts:>6} {len(ours.entries):>8} {base_s:>11.2f} {ours_s:>12.3f} {base_s / ours_s:>7.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
