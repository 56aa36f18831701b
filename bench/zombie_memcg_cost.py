"""Cost of the zombie_memcg detector: per call, at the baseline and with N extra real zombies.

The detector must be O(1) in the number of zombie memory cgroups (design §3): it reads
/proc/cgroups and walks only the live directories, never memory.stat. This benchmark calls the
target-side ``collect()`` + ``evaluate()`` in-process many times on this host, takes the
median, then creates N real zombie memcgs (``fleetops_lab.faults``), measures again and prints
the ratio (target <= 1.2). Needs root and a cgroup v1 memory hierarchy.

    python bench/zombie_memcg_cost.py [--zombies 10000] [--iterations 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "collections"))
sys.path.insert(0, str(REPO / "src"))

from ansible_collections.fleetops.node.plugins.module_utils import memcg  # noqa: E402

from fleetops.errors import FleetopsError  # noqa: E402
from fleetops_lab import faults  # noqa: E402

TARGET_RATIO = 1.2
PARENT = "fleetops-bench"


def _one_call() -> dict[str, Any]:
    facts: dict[str, Any] = memcg.collect()
    memcg.evaluate(facts)
    return facts


def measure(iterations: int) -> tuple[float, dict[str, Any]]:
    """Median seconds of one collect() + evaluate(), and the last facts."""
    for _ in range(min(50, iterations)):
        _one_call()
    samples = []
    facts: dict[str, Any] = {}
    for _ in range(iterations):
        started = time.perf_counter()
        facts = _one_call()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples), facts


def _describe(label: str, median: float, facts: dict[str, Any]) -> str:
    return (
        f"{label:<22} median {median * 1e6:9.1f} us/call   "
        f"total {facts['total']:>6}  live {facts['live']:>4}  zombies {facts['zombies']}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--zombies", type=int, default=10000, help="extra real zombie memcgs (default 10000)")
    parser.add_argument("--iterations", type=int, default=2000, help="calls per measurement (default 2000)")
    args = parser.parse_args(argv)
    if args.zombies < 1 or args.iterations < 1:
        parser.error("--zombies and --iterations must be positive")

    if os.geteuid() != 0:
        print("zombie_memcg_cost: SKIPPED: needs root (creates real zombie memory cgroups)")
        return 0
    if memcg.collect()["cgroup_version"] != 1:
        print("zombie_memcg_cost: SKIPPED: needs a cgroup v1 memory hierarchy at /sys/fs/cgroup/memory")
        return 0

    # The batch's parent cgroup is one more live directory to walk: create it before the
    # baseline so the two measurements differ only by the zombies (release removes it).
    parent = faults.MEMORY_ROOT / PARENT
    parent.mkdir(exist_ok=True)
    base, base_facts = measure(args.iterations)
    print(_describe("baseline", base, base_facts))
    try:
        batch = faults.create_zombie_memcgs(args.zombies, parent=PARENT)
    except FleetopsError as err:
        parent.rmdir()
        print(f"zombie_memcg_cost: {err}", file=sys.stderr)
        return 2
    with batch:
        print(
            f"created {batch.count} zombie memcgs in {batch.created_seconds:.2f} s "
            f"({batch.count / max(batch.created_seconds, 1e-9):,.0f}/s)"
        )
        loaded, loaded_facts = measure(args.iterations)
        print(_describe(f"+{args.zombies} zombies", loaded, loaded_facts))
        release_started = time.monotonic()
    parent.rmdir()  # ours, not the batch's (it existed before the batch)
    freed_total = faults.wait_memcg_total(batch.baseline_total + max(10, args.zombies // 100), timeout=60)
    print(
        f"released in {time.monotonic() - release_started:.2f} s "
        f"(memory num_cgroups {loaded_facts['total']} -> {freed_total})"
    )

    ratio = loaded / base
    seen = (loaded_facts["zombies"] or 0) - (base_facts["zombies"] or 0)
    verdict = "PASS" if ratio <= TARGET_RATIO else "FAIL"
    print(f"ratio {ratio:.3f} (target <= {TARGET_RATIO}; detector saw +{seen} zombies)  {verdict}")
    return 0 if ratio <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
