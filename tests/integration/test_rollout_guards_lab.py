"""Rollout guards on real lab hosts (issue 14): a unit whose ExecStop never returns is bounded by
--host-timeout and leaves no lock behind; a capacity floor of 0 keeps an AZ with an unreachable host
untouched while the other AZ proceeds.

The lab: lab-01 and lab-03 in us-east-1a, lab-02 in us-east-1b (odd/even), in this
worker's lab (FLEETOPS_LAB: tests/integration/conftest.py).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetops_lab import Lab
from tests.helpers import fleetops

pytestmark = pytest.mark.lab

HANG_UNIT = """[Unit]
Description=fleetops test: a service whose ExecStop never returns
[Service]
ExecStart=/bin/sleep infinity
ExecStop=/bin/sleep infinity
TimeoutStopSec=infinity
[Install]
WantedBy=multi-user.target
"""
# --host-timeout of the hang test: long enough for ssh and the module on a busy 2-core machine
HANG_TIMEOUT = 30


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab()
    lab.up(3)
    try:
        yield lab
    finally:
        lab.down()


def test_a_stop_that_never_returns_is_bounded_and_leaves_no_lock(lab: Lab, env: dict[str, str]) -> None:
    lab.run(
        "lab-01",
        f"cat > /etc/systemd/system/fleetops-hang.service <<'EOF'\n{HANG_UNIT}EOF\n"
        "systemctl daemon-reload && systemctl enable --now fleetops-hang.service",
        check=True,
    )
    try:
        argv = ["remediate", "disable-unit", "--unit", "fleetops-hang", "-i", str(lab.inventory_path())]
        argv += ["--limit", "lab-01", "--apply", "--host-timeout", str(HANG_TIMEOUT), "--format", "json"]
        start = time.monotonic()
        first = fleetops(*argv, env=env, timeout=400)
        took = time.monotonic() - start
        assert first.rc == 3, first.stderr + first.stdout
        assert took < HANG_TIMEOUT + 120, took  # bounded: the timeout, then the teardown
        outcome = first.json()["batches"][0]["results"]["lab-01"]
        assert outcome["status"] == "failed", outcome
        assert f"timed out after {HANG_TIMEOUT}" in json.dumps(outcome), outcome
        # The same command right after is not refused as locked (exit 4): it runs, and times out again.
        again = fleetops(*argv, env=env, timeout=400)
        assert again.rc != 4, again.stderr
        assert "held by" not in again.stderr and "locked" not in again.stderr.lower(), again.stderr
        locks = Path(env["FLEETOPS_STATE_DIR"]) / "locks"
        assert not list(locks.glob("*.lock")) if locks.exists() else True
    finally:
        lab.run(
            "lab-01",
            "systemctl kill -s KILL fleetops-hang.service; sleep 1; systemctl unmask fleetops-hang.service;"
            " systemctl disable fleetops-hang.service; rm -f /etc/systemd/system/fleetops-hang.service;"
            " systemctl daemon-reload; systemctl reset-failed",
        )


def test_a_capacity_floor_of_zero_keeps_a_degraded_az_untouched(lab: Lab, env: dict[str, str]) -> None:
    """lab-01 (AZ lab-1a) made unreachable by taking its link down: with --max-unhealthy 0 no other
    host of lab-1a (lab-03) is touched; lab-1b's lab-02 is unaffected by it (it runs, even though the
    plan put lab-03's batch first); the rollout ends with exit 3, lab-03 pending for --resume."""
    veth = lab.link("lab-01")
    subprocess.run(["ip", "link", "set", veth, "down"], check=True)
    try:
        result = fleetops(
            "remediate", "reclaim", "-i", str(lab.inventory_path()), "--apply", "--min-zombies", "999999999",
            "--per-group-max", "1", "--max-unhealthy", "0", "--preflight-max-unreachable", "1",
            "--format", "json",
            env=env, timeout=400,
        )  # fmt: skip
        assert result.rc == 3, result.stderr + result.stdout
        doc = result.json()
        ran = {h for b in doc["batches"] for h in (b.get("results") or {})}
        hosts = doc.get("hosts") or {}
        assert "lab-03" not in ran, doc
        assert "lab-02" in ran, doc
        assert doc["batches"] and any(
            (b.get("results") or {}).get("lab-02", {}).get("status") in ("ok", "changed")
            for b in doc["batches"]
        ), doc
        assert "group lab-1a: 1 of its 2 hosts are unhealthy (lab-01)" in result.stderr, result.stderr
        assert hosts["lab-03"] == "pending" and hosts["lab-01"] == "skipped", hosts
        assert doc["stopped"]["pending"] == ["lab-03"], doc["stopped"]
    finally:
        subprocess.run(["ip", "link", "set", veth, "up"], check=False)
