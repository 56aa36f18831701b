"""Named labs side by side (fleetops_lab.names): two labs boot at once, are scanned at the same time,
each inventory holds only its own hosts, a host of one cannot reach the other's, and `down` of one
leaves the other answering. Two `up`s of one name at once build one lab; a subnet that clashes with
an address of this machine is refused, naming it, before anything is made."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from fleetops_lab import Lab
from fleetops_lab import _system as system
from fleetops_lab.names import current_name, lab_names
from tests.helpers import LAB_ANSWERED, fleetops

pytestmark = pytest.mark.lab


def _two_names() -> tuple[str, str]:
    """Two lab names no other test uses: this worker's lab name (gwN) or 't', plus a letter."""
    base = current_name()
    base = "t" if base == "default" else base
    return f"{base}x", f"{base}y"


@pytest.fixture(scope="module")
def labs() -> Iterator[tuple[Lab, Lab]]:
    first, second = (Lab(name=n, state_dir=lab_names(n).default_state_dir) for n in _two_names())
    for lab in (first, second):
        lab.down()
    try:
        yield first, second
    finally:
        for lab in (first, second):
            lab.down()


def _inventory_hosts(lab: Lab) -> dict[str, str]:
    inventory = yaml.safe_load(lab.inventory_path().read_text())
    hosts = inventory["all"]["children"]["fleetops_lab"]["hosts"]
    return {name: entry["ansible_host"] for name, entry in hosts.items()}


def test_two_named_labs_boot_and_scan_at_once_each_with_only_its_own_hosts(labs: tuple[Lab, Lab]) -> None:
    first, second = labs
    with ThreadPoolExecutor(2) as pool:
        booted = list(pool.map(lambda lab: lab.up(2), (first, second)))
    assert [[h.name for h in hosts] for hosts in booted] == [["lab-01", "lab-02"]] * 2
    assert all(h.running and h.ssh_ok for hosts in booted for h in hosts)
    ips = [{h.ip for h in hosts} for hosts in booted]
    assert ips[0].isdisjoint(ips[1])
    for lab, hosts in zip((first, second), booted, strict=True):
        assert _inventory_hosts(lab) == {h.name: h.ip for h in hosts}  # its own hosts, no other lab's
        assert all(ipaddress.ip_address(h.ip) in lab.names.network for h in hosts)
        assert system.link_exists(lab.names.bridge)
        # each guest is the host of its own lab: its hostname file says lab-NN, its address is this lab's
        assert lab.run("lab-01", "hostname -I", check=True).stdout.split() == [lab.host_ip("lab-01")]

    # scanned at the same time: both scans succeed and report exactly their own lab's hosts
    with ThreadPoolExecutor(2) as pool:
        results = list(
            pool.map(
                lambda lab: fleetops("scan", "-i", str(lab.inventory_path()), "--format", "json", "-q"),
                (first, second),
            )
        )
    for result in results:
        assert result.rc in (0, 1), result.stderr
        report = result.json()
        assert sorted(report["hosts"]) == ["lab-01", "lab-02"]
        assert {entry["status"] for entry in report["hosts"].values()} == {LAB_ANSWERED}

    # a host of one lab cannot reach the other lab's hosts (no route: each lab is its own /24)
    probe = (
        f"python3 -c 'import socket; s = socket.socket(); s.settimeout(3); "
        f'print(s.connect_ex(("{second.host_ip("lab-01")}", 22)))\''
    )
    out = first.run("lab-01", probe, check=True).stdout.strip()
    assert out != "0", "a host of one lab reached the other lab's sshd"


def test_down_of_one_lab_leaves_the_other_answering(labs: tuple[Lab, Lab]) -> None:
    first, second = labs
    assert [h.ssh_ok for h in second.status()] == [True, True]
    first.down()
    assert first.status() == []
    assert not system.link_exists(first.names.bridge)
    assert not [p for p in system.cgroup_paths(first.names.cgroup_parent) if p.exists()]
    assert [(h.name, h.running, h.ssh_ok) for h in second.status()] == [
        ("lab-01", True, True),
        ("lab-02", True, True),
    ]
    assert second.run("lab-02", "hostname", check=True).stdout.strip() == "lab-02"
    second.down()


def test_two_ups_of_one_name_at_once_build_one_lab(labs: tuple[Lab, Lab]) -> None:
    lab = labs[0]
    errors: list[BaseException] = []

    def up() -> None:
        try:
            Lab(name=lab.name, state_dir=lab.state_dir).up(2)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=up) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    hosts = lab.status()
    assert [(h.name, h.running, h.ssh_ok) for h in hosts] == [("lab-01", True, True), ("lab-02", True, True)]
    assert len({h.supervisor_pid for h in hosts}) == 2  # one supervisor per host: not two half-labs
    lab.down()


def test_a_subnet_that_clashes_with_an_address_of_this_machine_is_refused_naming_it(
    labs: tuple[Lab, Lab], tmp_path: Path
) -> None:
    lab = labs[1]
    lab.down()
    clash = f"fo{lab.name}-clash"[:15]  # a bridge: this kernel has no dummy links
    taken = f"{lab.names.network.network_address + 7}/24"
    subprocess.run(["ip", "link", "add", clash, "type", "bridge"], check=True)
    try:
        subprocess.run(["ip", "addr", "add", taken, "dev", clash], check=True)
        proc = subprocess.run(
            [sys.executable, "-m", "fleetops_lab.cli", "--lab", lab.name, "up", "1"],
            capture_output=True, text=True, timeout=120, check=False,
            env={**os.environ, "FLEETOPS_LAB_DIR": str(lab.state_dir)},
        )  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1, proc.stderr
        assert f"address {taken} on {clash}" in proc.stderr and str(lab.names.network) in proc.stderr
        assert not system.link_exists(lab.names.bridge)  # nothing was made
        assert lab.status() == []
        assert not lab.names.owner_file.exists()  # not claimed: refused before anything is written
    finally:
        subprocess.run(["ip", "link", "delete", clash], check=False)
