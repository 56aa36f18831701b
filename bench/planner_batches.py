"""Planner vs plain ``serial``: batches to roll 7,500 hosts over 3 uneven AZs at <= 125 per AZ at once.

``serial`` cannot see AZs, so to guarantee "at most 125 hosts of any one AZ at once" it must run
batches of 125 hosts in all: ceil(7500 / 125) = 60 batches. The planner runs every AZ in parallel
under a global cap of 5% (375 hosts) and needs only the lower bound. Run: python bench/planner_batches.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from fleetops.planner import Host, Plan, plan

SCENARIOS = {
    "uneven": {"us-east-1a": 3000, "us-east-1b": 2500, "us-east-1c": 2000},
    "even": {"us-east-1a": 2500, "us-east-1b": 2500, "us-east-1c": 2500},
}
GLOBAL_CAP = "5%"
PER_AZ_CAP = 125
CANARY = 3
RUNS = 7


def fleet(azs: dict[str, int]) -> list[Host]:
    return [Host(f"gpu-{az[-1]}-{i}", az) for az, n in azs.items() for i in range(1, n + 1)]


def check(result: Plan, hosts: list[Host]) -> None:
    """The plan is valid: every host once, no cap broken, and the lower bound reached."""
    az_of = {h.name: h.group for h in hosts}
    planned = [h for b in result.batches for h in b]
    assert sorted(planned) == sorted(az_of), "a host is missing or planned twice"
    assert len(result.batches[0]) == CANARY
    for batch in result.batches:
        assert len(batch) <= result.caps.max_parallel_hosts
        for az in set(az_of.values()):
            assert sum(az_of[h] == az for h in batch) <= PER_AZ_CAP
    assert len(result.batches) == result.lower_bound


def serial_batches(hosts: int) -> int:
    """Plain serial with the same canary: ``serial: [CANARY, PER_AZ_CAP]`` (it cannot see AZs)."""
    return (1 if CANARY else 0) + -(-(hosts - CANARY) // PER_AZ_CAP)


def bench(name: str, azs: dict[str, int]) -> float:
    hosts = fleet(azs)
    times: list[float] = []
    result: Plan | None = None
    for _ in range(RUNS):
        start = time.perf_counter()
        result = plan(hosts, max_parallel=GLOBAL_CAP, per_group_max=PER_AZ_CAP, canary=CANARY)
        times.append(time.perf_counter() - start)
    assert result is not None
    check(result, hosts)
    serial = serial_batches(len(hosts))
    planner = len(result.batches)
    median = statistics.median(times)
    print(
        f"[{name}] hosts: {len(hosts)} over {len(azs)} AZs ({', '.join(f'{a}={n}' for a, n in azs.items())})"
    )
    print(
        f"  caps: global {GLOBAL_CAP} = {result.caps.max_parallel_hosts} hosts, per AZ {PER_AZ_CAP}, canary {CANARY}"
    )
    print(f"  planner batches: {planner} (canary batch included)")
    print(f"  lower bound: {result.lower_bound}")
    print(f"  serial batches for the same per-AZ cap: {serial} (serial: [{CANARY}, {PER_AZ_CAP}])")
    print(
        f"  ratio serial/planner: {serial / planner:.2f}x "
        f"(at most {len(hosts) / max(azs.values()):.2f}x here: the largest AZ sets the floor)"
    )
    print(
        f"  planner run time: median {median * 1000:.1f} ms over {RUNS} runs (max {max(times) * 1000:.1f} ms)"
    )
    return median


def main() -> int:
    medians = [bench(name, azs) for name, azs in SCENARIOS.items()]
    return 0 if max(medians) < 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
