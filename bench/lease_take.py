"""A rollout's EC2 lease in the shared store against the tag lease it replaces, on a real moto_server.

For each fleet size, on one moto_server (EC2 and DynamoDB on 127.0.0.1, loopback only), interleaved
``--runs`` times after one untimed warm-up of each:

- ``tags``: ``Ec2Lease`` without a store: read the tags, write ours, wait ``settle`` (2 s by default,
  what every CLI rollout waits), read again, then release;
- ``store``: ``Ec2Lease`` with the store: scan the store's lease and rollout items and the tags, write the
  rollout item and one lease item per instance (conditional puts), write the mirror tags, then release.

Prints the medians (wall seconds of take + release, and of a renewal) and the ratio store / tags. The
settle wait is most of the tag lease at small sizes. The store writes its items in transactions of 100
(TransactWriteItems): on DynamoDB one costs about two puts, but moto_server's cost grows with the
table (3.7 s for 100 writes into a table of 2,300 items, against 0.03 s into an empty one; a single put
stays at 6 ms), so past a few hundred instances this measures moto, not the lease. This prints figures;
it asserts nothing.

    python bench/lease_take.py [--sizes 3,100,500] [--runs 3] [--settle 2.0]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from fleetops.ansible.collection import module_utils
from fleetops.rollout.lease import Ec2Connection, Ec2Lease
from fleetops_lab.ec2sim import MotoServer, launch_many

REGION = "us-east-1"


def _lease(url: str, ids: list[str], rollout: str, store: bool, settle: float) -> Ec2Lease:
    conn = Ec2Connection(
        endpoint_url=url, aws_access_key="testing", aws_secret_key="testing", regions=(REGION,)
    )
    backend = module_utils("store").DynamoStore(conn.settings(), "bench-leases", REGION) if store else None
    instances = {f"host-{n}": {"instance": i, "region": REGION} for n, i in enumerate(ids)}
    return Ec2Lease(conn, instances, rollout, "bench@ctl", settle=settle, store=backend)


def _once(url: str, ids: list[str], store: bool, settle: float, n: int) -> tuple[float, float]:
    lease = _lease(url, ids, f"20260101T000000Z-{n:06x}", store, settle)
    started = time.perf_counter()
    lease.acquire()
    took = time.perf_counter() - started
    started = time.perf_counter()
    lease.renew()
    renewed = time.perf_counter() - started
    assert lease.check() is None
    started = time.perf_counter()
    lease.release()
    return took + time.perf_counter() - started, renewed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="3,100,500")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--settle", type=float, default=2.0)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    server = MotoServer()
    url = server.start()
    try:
        fleet = launch_many(url, REGION, max(sizes))
        print(f"{'instances':>9} {'tags take+release s':>20} {'store take+release s':>21} {'ratio':>6} "
              f"{'tags renew s':>13} {'store renew s':>14}")  # fmt: skip
        n = 0
        for size in sizes:
            ids = fleet[:size]
            samples: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
            for run in range(args.runs + 1):
                for store in (False, True):
                    n += 1
                    measured = _once(url, ids, store, args.settle, n)
                    if run:  # the first of each is the warm-up
                        samples[store].append(measured)
            tags = statistics.median(t for t, _r in samples[False])
            stored = statistics.median(t for t, _r in samples[True])
            print(
                f"{size:>9} {tags:>20.2f} {stored:>21.2f} {stored / tags:>6.2f} "
                f"{statistics.median(r for _t, r in samples[False]):>13.2f} "
                f"{statistics.median(r for _t, r in samples[True]):>14.2f}"
            )
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
