"""The integration suite's checked-in list of test ids (ids.txt), and the check that every listed test ran.

No real-host test may be dropped, skipped or lost to get a fast run: ``make integration`` records each
test's outcome (conftest.py, ``FLEETOPS_TEST_RECORD``), then ``python -m tests.integration.ids check
RECORD`` fails when a listed test did not run, when a test ran that the list lacks, or (under
``CI=true``) when a test was skipped. It prints the suite's count and wall time, for the trend.

``python -m tests.integration.ids write`` rewrites ids.txt from pytest's collection (after adding,
renaming or merging a test: the diff of ids.txt shows what moved).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
IDS_FILE = HERE / "ids.txt"

# Seconds each file took in a serial run (2026-12-02, this 2-core machine, CI's layout: junit times of
# setup, call and teardown): the parallel lane starts the longest files first. A file not listed: 60 s.
SECONDS = {
    "test_vm_lab.py": 438,
    "test_rollout_lab.py": 349,
    "test_auto_lab.py": 460,  # 209 + the pause and killed-pass tests (2026-12-03: 69 s each in CI) + the
    # killed pass without a store (2026-12-07: 111 s beside unit tests on this machine, 126 s with its lab)
    "test_ee.py": 209,
    "test_stop_start_lab.py": 172,
    "test_ucx_lab.py": 170,
    "test_detector_timer_lab.py": 145,  # measured 2026-12-03, alone on a named lab
    "test_eda_lab.py": 165,  # measured 2026-12-03 (100 and 124 s), alone on a named lab, other labs beside it
    "test_crashloop_lab.py": 130,
    "test_replace_lab.py": 122,
    "test_rollout_guards_lab.py": 115,
    "test_scan_scale.py": 98,
    "test_rollout_safety_lab.py": 90,
    "test_quarantine_lab.py": 67,
    "test_drift_lab.py": 54,
    "test_protected_units_lab.py": 49,
    "test_slurm_lab.py": 90,  # 64 s alone on 2026-12-05 with the --evict test and its cut-off re-run
    "test_doors_lab.py": 128,  # 2026-12-07, alone on a named lab (90 s the storm test, 29 s the floor's)
    "test_storm_lab.py": 56,  # 2026-12-03, in CI
    "test_auto_replace_lab.py": 41,
    "test_scan_leak.py": 35,
    "test_secrets_lab.py": 26,
    "test_scan_lab.py": 23,
    "test_scan_shards_lab.py": 22,
    "test_lab_named.py": 20,
    "test_lab.py": 17,
    "test_lab_aliases_lab.py": 15,  # 2026-12-05, alone
    "test_scan_zombies.py": 16,
    "test_lab_ec2.py": 10,
    "test_preflight_lab.py": 8,
    "test_collection_install.py": 130,  # 2026-12-07: the wheel installed as a user installs it (+128 s, a loaded machine)
    "test_memcg_kernel.py": 1,
}


def file_seconds(nodeid: str) -> float:
    return SECONDS.get(nodeid.split("::", 1)[0].rsplit("/", 1)[-1], 60)


def listed() -> list[str]:
    return [line for line in IDS_FILE.read_text().splitlines() if line and not line.startswith("#")]


def collected() -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly", "tests/integration"],
        cwd=REPO, capture_output=True, text=True, check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "FLEETOPS_"))},
    )  # fmt: skip
    found = sorted(line for line in proc.stdout.splitlines() if line.startswith("tests/integration/"))
    if proc.returncode != 0 or not found:
        raise SystemExit(
            f"ids: pytest could not collect tests/integration (exit {proc.returncode}):\n{proc.stdout}"
        )
    return found


def read_records(paths: list[Path]) -> dict[str, dict[str, object]]:
    """Each test's record: its last outcome and its CPU time (one JSON object a line, a test's lines
    merged: the outcome after its call, the CPU after its teardown)."""
    outcomes: dict[str, dict[str, object]] = {}
    for path in paths:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            try:
                record = json.loads(line)
                outcomes.setdefault(str(record["id"]), {}).update(record)
            except (ValueError, KeyError, TypeError, AttributeError):
                raise SystemExit(f"ids: {path}:{n}: not a test record: {line[:200]!r}") from None
    return outcomes


def cpu_jiffies(stat_line: str) -> tuple[int, int]:
    """(busy, all) clock ticks of the ``cpu`` line of /proc/stat: busy is all but idle and iowait."""
    fields = [int(f) for f in stat_line.split()[1:]]
    if stat_line.split()[:1] != ["cpu"] or len(fields) < 8:
        raise SystemExit(f"ids: not the cpu line of /proc/stat: {stat_line[:100]!r}")
    return sum(fields[:8]) - fields[3] - fields[4], sum(fields[:8])


def cpu_report(records: dict[str, dict[str, object]], since: str | None, seconds: float | None) -> list[str]:
    """Where the suite's CPU went: this machine's busy share since ``since`` (a /proc/stat cpu line),
    the tests' own CPU time, and the files that took most."""
    lines = []
    if since is not None:
        now = Path("/proc/stat").read_text().splitlines()[0]
        (busy0, all0), (busy1, all1) = cpu_jiffies(since), cpu_jiffies(now)
        ticks = os.sysconf("SC_CLK_TCK")
        cores = os.cpu_count() or 1
        share = (busy1 - busy0) / max(all1 - all0, 1)
        lines.append(
            f"integration CPU: {(busy1 - busy0) / ticks:.0f} core-s busy on this machine, {share:.0%} of "
            f"{cores} cores (a floor of {(busy1 - busy0) / ticks / cores:.0f} s wall on {cores} cores)"
        )
    per_file: Counter[str] = Counter()
    for test_id, record in records.items():
        cpu = record.get("cpu_seconds")
        if isinstance(cpu, int | float):
            per_file[test_id.split("::", 1)[0].rsplit("/", 1)[-1]] += cpu
    if per_file:
        top = ", ".join(f"{name} {cpu:.0f}" for name, cpu in per_file.most_common(10))
        lines.append(f"integration CPU of the tests: {sum(per_file.values()):.0f} core-s; most: {top}")
    return lines


def check(records: dict[str, dict[str, object]], ci: bool) -> list[str]:
    """What is wrong with a run whose outcomes are ``records``, against the list; empty when nothing is."""
    want = listed()
    problems = [f"listed but did not run: {i}" for i in want if "outcome" not in records.get(i, {})]
    problems += [
        f"ran but is not in tests/integration/ids.txt (python -m tests.integration.ids write): {i}"
        for i in records
        if i not in set(want)
    ]
    if ci:
        problems += [
            f"skipped under CI=true: {i} ({r.get('reason', '')})"
            for i, r in records.items()
            if r.get("outcome") == "skipped"
        ]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.integration.ids", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    write = sub.add_parser("write", help="rewrite ids.txt from pytest's collection")
    write.set_defaults(command="write")
    chk = sub.add_parser("check", help="check the records of a run against ids.txt")
    chk.add_argument("records", nargs="+", type=Path)
    chk.add_argument("--seconds", type=float, default=None, help="the suite's wall time, to print")
    chk.add_argument(
        "--cpu-since", type=Path, default=None, help="a file holding /proc/stat's cpu line at the start"
    )
    args = parser.parse_args(argv)
    if args.command == "write":
        ids = collected()
        IDS_FILE.write_text(
            "# Every integration test id (python -m tests.integration.ids write). CI fails when one of\n"
            "# these does not run, or is skipped under CI=true (tests/integration/ids.py).\n"
            + "\n".join(ids)
            + "\n"
        )
        print(f"ids: {len(ids)} integration tests listed in {IDS_FILE.relative_to(REPO)}")
        return 0
    records = read_records(args.records)
    problems = check(records, ci=os.environ.get("CI") == "true")
    for problem in problems:
        print(f"ids: {problem}", file=sys.stderr)
    counts = Counter(str(r.get("outcome")) for r in records.values())
    wall = f" in {args.seconds:.0f} s" if args.seconds is not None else ""
    print(f"integration suite: {len(records)} tests{wall} ({len(listed())} listed)")
    print(f"integration: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    since = args.cpu_since.read_text().strip() if args.cpu_since is not None else None
    for line in cpu_report(records, since, args.seconds):
        print(line)
    return 1 if problems or counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
