"""The integration suite's set-up: one lab per pytest-xdist worker, a lane for machine-wide tests, and a
record of what ran.

- Each xdist worker ``gwN`` uses its own named lab (``FLEETOPS_LAB=gwN``: its own bridge, subnet,
  links, namespaces, cgroups, lock and state dir; fleetops_lab.names), so files run side by side; a
  run without xdist uses the default lab (or ``$FLEETOPS_LAB``).
- Tests marked ``exclusive`` read or change machine-wide kernel state (host-wide ``/proc/cgroups``
  counts, ``drop_caches``, timing-sensitive rates): ``make integration`` runs them in a lane of their
  own, alone, after the parallel lane (``-m exclusive``, no xdist). A parallel run refuses to run one.
- Files run longest first (``SECONDS`` in ids.py, measured), so the long ones do not end the run alone.
- ``FLEETOPS_TEST_RECORD=PATH`` appends each test's outcome to PATH (one JSON line each): ids.py checks
  that every listed test ran, and under ``CI=true`` a skipped lab test fails the run. Each test's CPU
  time goes with it (its setup, call and teardown: the worker, every process it waited for, and its
  lab's guests, read from the lab's cgroup), so the record says where the suite's CPU goes.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetops_lab.names import lab_names
from tests.integration import ids

WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if WORKER:
    # Set before any test module runs: Lab(), fleetops-lab and the lab's own processes read it.
    os.environ["FLEETOPS_LAB"] = WORKER
    os.environ.pop("FLEETOPS_LAB_DIR", None)  # one state dir per lab: the lab's own
# The product's own state (rollout state and locks, local stop files, the audit log) is machine-wide
# by default (/var/lib/fleetops as root): a worker's rollouts, `fleetops stop --all` and locks must
# not meet another worker's, and no run of the suite writes into the machine's. A test that passes
# its own (the `env` fixture) still wins.
STATE_DIR = tempfile.mkdtemp(prefix=f"fleetops-state-{WORKER or 'main'}-")
os.environ["FLEETOPS_STATE_DIR"] = STATE_DIR
os.environ.pop("FLEETOPS_AUDIT_LOG", None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Integration tests need root and this kernel's cgroups; say so plainly when they cannot run.
    Longest files first; an ``exclusive`` test refuses to run beside another worker."""
    items.sort(key=lambda item: -ids.file_seconds(item.nodeid))  # stable: order within a file kept
    for item in items:
        if WORKER and item.get_closest_marker("exclusive"):
            item.add_marker(
                pytest.mark.skip(
                    reason="machine-wide kernel state: run it alone (-m exclusive, no xdist; make integration)"
                )
            )
    reason = None
    if os.geteuid() != 0:
        reason = "integration tests need root (real memory cgroups, systemd-nspawn lab hosts)"
    elif not os.path.isdir("/sys/fs/cgroup/memory") and not os.path.exists(
        "/sys/fs/cgroup/cgroup.controllers"
    ):
        reason = "no memory cgroup hierarchy on this kernel"
    if reason is None and shutil.which("systemd-nspawn") is None:
        for item in items:
            if "lab" in item.keywords:
                item.add_marker(
                    pytest.mark.skip(reason="systemd-nspawn is not installed (apt: systemd-container)")
                )
        return
    if reason is not None:
        for item in items:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_sessionfinish(session: pytest.Session) -> None:
    shutil.rmtree(STATE_DIR, ignore_errors=True)


CPU_START = pytest.StashKey[tuple[float, float]]()


def _cpu_seconds() -> tuple[float, float]:
    """(CPU time of this process and of every process it waited for, CPU time of its lab's guests so
    far: the lab's cgroup in the unified hierarchy, 0 when no lab is up)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    waited = resource.getrusage(resource.RUSAGE_CHILDREN)
    guests = 0.0
    cgroup = Path("/sys/fs/cgroup/unified", lab_names().cgroup_parent, "cpu.stat")
    with contextlib.suppress(OSError, ValueError):
        for line in cgroup.read_text().splitlines():
            if line.startswith("usage_usec "):
                guests = int(line.split()[1]) / 1e6
    return own.ru_utime + own.ru_stime + waited.ru_utime + waited.ru_stime, guests


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[CPU_START] = _cpu_seconds()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    report: pytest.TestReport = yield
    if report.when == "teardown" and CPU_START in item.stash:  # sent on to the controller by xdist
        (own0, guests0), (own1, guests1) = item.stash[CPU_START], _cpu_seconds()
        # a lab taken down in this teardown took its counter with it: its guests' last share is lost
        guests = guests1 - guests0 if guests1 >= guests0 else 0.0
        report.user_properties.append(("cpu_seconds", round(own1 - own0 + guests, 1)))
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Record each test's outcome once (in the controller, not in each xdist worker as well), and
    after its teardown the CPU it took."""
    path = os.environ.get("FLEETOPS_TEST_RECORD")
    if not path or WORKER:
        return
    line: dict[str, object] = {}
    if report.when == "call" or (report.when == "setup" and not report.passed):
        line = {"id": report.nodeid, "outcome": report.outcome, "seconds": round(report.duration, 2)}
        if report.skipped and isinstance(report.longrepr, tuple):
            line["reason"] = str(report.longrepr[2])
    elif report.when == "teardown":
        cpu = dict(report.user_properties).get("cpu_seconds")
        if cpu is not None:
            line = {"id": report.nodeid, "cpu_seconds": cpu}
    if line:
        with Path(path).open("a") as fh:
            fh.write(json.dumps(line) + "\n")


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    """A rollout's state and audit log in the test's own directory, not the machine's."""
    return {
        "FLEETOPS_STATE_DIR": str(tmp_path / "state"),
        "FLEETOPS_AUDIT_LOG": str(tmp_path / "audit.jsonl"),
    }
