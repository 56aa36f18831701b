"""The lab's simulated fleet (``fleetops-lab up N --addresses K --dead D``, fleetops_lab.aliases) on real hosts.

Two lab hosts with three addresses each and one dead address: the inventory lists the seven, every
alias is reached at its own address and lands on its own host (its boot id; sshd's host key checked
strictly against the lab's known_hosts), a fault injected on lab-02 shows on all of lab-02's aliases
and on none of lab-01's, the same through both scan transports (the default and ansible), and the dead
address times out (a gone instance), not refused at once. ``up`` without ``--addresses`` takes the aliases away again.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from fleetops_lab import Lab
from fleetops_lab.hardware import inject_ecc
from tests.helpers import FLEETOPS, REPO

pytestmark = pytest.mark.lab

K, DEAD = 3, 1
HOST_TIMEOUT_S = 8  # the scan's connect timeout is half of it: the dead address costs 4 s, not 10


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab()
    lab.up(2, addresses=K, dead=DEAD)
    try:
        inject_ecc(lab, "lab-02", uncorrected=1)
        yield lab
    finally:
        lab.down()


def _scan(lab: Lab, transport: str) -> dict[str, Any]:
    """``fleetops scan --transport TRANSPORT`` ("auto": no --transport, the default)."""
    chosen = [] if transport == "auto" else ["--transport", transport]
    proc = subprocess.run(
        [str(FLEETOPS), "scan", "-i", str(lab.inventory_path()), "--checks", "gpu_health", *chosen,
         "--host-timeout", str(HOST_TIMEOUT_S), "--format", "json", "-q"],
        capture_output=True, text=True, cwd=REPO, stdin=subprocess.DEVNULL, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr[-3000:]  # a host unreachable: the dead one
    return json.loads(proc.stdout)


def _routes(*argv: str) -> str:
    return subprocess.run(["ip", *argv], capture_output=True, text=True, check=True).stdout.strip()


def test_every_alias_is_its_own_address_on_its_own_host_and_the_dead_one_times_out(lab: Lab) -> None:
    hosts = yaml.safe_load(lab.inventory_path().read_text())["all"]["children"]["fleetops_lab"]["hosts"]
    aliases = {f"lab-0{h}-a00{k}" for h in (1, 2) for k in range(1, K + 1)}
    assert set(hosts) == aliases | {"lab-dead-001"}
    addresses = [entry["ansible_host"] for entry in hosts.values()]
    assert len(set(addresses)) == len(addresses) and all(a.startswith("100.") for a in addresses)

    boot_id = "cat /proc/sys/kernel/random/boot_id"
    boots = {h: lab.run(h, boot_id, check=True).stdout.strip() for h in ("lab-01", "lab-02")}
    assert boots["lab-01"] != boots["lab-02"]
    results = {t: _scan(lab, t) for t in ("auto", "ansible")}
    for transport, report in results.items():
        got = report["hosts"]
        assert set(got) == set(hosts), transport
        for alias in sorted(aliases):
            owner = alias[:6]
            entry = got[alias]
            assert entry["status"] == "ok", (transport, alias, entry.get("msg"))
            assert entry["facts"]["host"]["boot_id"] == boots[owner], (transport, alias)  # its own host
            found = {(f["check"], f["severity"]) for f in entry["findings"]}
            assert found == ({("gpu_health", "critical")} if owner == "lab-02" else set()), (transport, alias)
        dead = got["lab-dead-001"]
        assert dead["status"] == "unreachable", (transport, dead)
        assert "timed out" in dead["msg"].lower() or "timeout" in dead["msg"].lower(), (
            transport,
            dead["msg"],
        )
    # the two transports agree host by host; the default served every host on the direct path
    assert results["auto"]["transport"] == {"name": "auto", "by_ansible": {}}
    assert {h: e["status"] for h, e in results["auto"]["hosts"].items()} == {
        h: e["status"] for h, e in results["ansible"]["hosts"].items()
    }

    # without --addresses the lab is its plain self again: its hosts listed, no alias route left anywhere
    lab.up(2)
    plain = yaml.safe_load(lab.inventory_path().read_text())["all"]["children"]["fleetops_lab"]["hosts"]
    assert set(plain) == {"lab-01", "lab-02"}
    net = str(lab.names.alias_network)
    assert _routes("route", "show", "root", net) == ""
    for number in ("01", "02"):
        ns = lab.names.netns_prefix + number
        assert _routes("-n", ns, "route", "show", "table", "all", "root", net) == "", ns
    assert not (lab.state_dir / "aliases.json").exists()
