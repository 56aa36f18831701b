"""`fleetops scan` across a fleet of real lab hosts (systemd-nspawn, systemd as PID 1, sshd)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetops_lab import Lab, hardware, host_faults
from tests.helpers import LAB_ANSWERED, fleetops, lab_blind

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab()
    lab.up(3)
    try:
        yield lab
    finally:
        lab.down()


def test_scan_lab_fleet_reports_namespace_scope(lab: Lab) -> None:
    result = fleetops("scan", "-i", str(lab.inventory_path()), "--format", "json", "--quiet")
    report = result.json()
    assert set(report["hosts"]) == {"lab-01", "lab-02", "lab-03"}
    for name, host in report["hosts"].items():
        # answered, but zombie_memcg could not count zombies in the guest's cgroup namespace: partial, not ok
        assert host["status"] == LAB_ANSWERED and lab_blind(host) == {"zombie_memcg"}, (name, host)
        assert "cgroup namespace" in host["coverage"]["zombie_memcg"]["reason"], host["coverage"]
        memcg = host["facts"]["memcg"]
        assert memcg["scope"] == "namespace", memcg
        # The host-wide count minus the guest's own directories is not a zombie count: never report it.
        assert memcg["zombies"] is None
        assert memcg["total"] > 0
        # live memcgs host-wide are unknown in a namespace: the headroom counts every memcg (worst case)
        assert memcg["id_used"] == memcg["total"]
        assert memcg["id_headroom"] == 65535 - memcg["total"]
        assert memcg["id_headroom_basis"] == (
            "every memcg, dying included: worst case, live memcgs host-wide are unknown in a cgroup namespace"
        )
    assert report["summary"]["partial"] == 3 and report["summary"]["ok"] == 0
    assert result.rc in (0, 1), result.stderr  # partial alone does not fail the default --fail-on


def test_unreachable_host_is_reported_and_others_still_scanned(lab: Lab, tmp_path: Path) -> None:
    inventory = yaml.safe_load(lab.inventory_path().read_text())
    hosts = inventory["all"]["children"]["fleetops_lab"]["hosts"]
    # An address in the lab's own subnet where no host answers: ssh fails fast with no route to host.
    hosts["lab-ghost"] = {"ansible_host": lab.unused_ip}
    inv = tmp_path / "with-ghost.yml"
    inv.write_text(yaml.safe_dump(inventory))
    result = fleetops("scan", "-i", str(inv), "--format", "json", "--quiet", "--forks", "10")
    report = result.json()
    assert result.rc == 3, result.stderr
    assert report["hosts"]["lab-ghost"]["status"] == "unreachable"
    assert report["hosts"]["lab-ghost"]["msg"]
    assert all(report["hosts"][h]["status"] == LAB_ANSWERED for h in ("lab-01", "lab-02", "lab-03"))
    assert report["summary"]["unreachable"] == 1
    assert report["summary"]["partial"] == 3


def test_limit_narrows_the_scan(lab: Lab) -> None:
    result = fleetops("scan", "-i", str(lab.inventory_path()), "--limit", "lab-02", "--format", "json", "-q")
    assert set(result.json()["hosts"]) == {"lab-02"}


def test_the_fast_path_and_the_module_find_the_same_faults(lab: Lab) -> None:
    """Through ansible-playbook (``--transport ansible``) node_health's action runs the staged runner (one
    command per host) unless told to run the module (FLEETOPS_NODE_HEALTH_MODULE=1), and the default transport
    (auto; ``ssh`` is its alias) runs the same runner without ansible-playbook on every lab host: over ssh, on
    hosts with distinct faults, all three report the same findings. The unit tests compare them over the
    local connection (tests/unit/plugins/action, tests/fleetops/test_scan_direct.py)."""
    hardware.inject_ecc(lab, "lab-02", uncorrected=2)
    # enabled, never started: an unexpected unit on lab-03 only (no crash loop: its rate would move)
    unit = host_faults.install_crashloop_unit(lab, "lab-03", name="stray", start=False)
    try:
        args = ("scan", "-i", str(lab.inventory_path()), "--format", "json", "-q", "-e", "fleetops_imds=never",
                "-e", '{"fleetops_unit_allowlist": ["ssh.service", "systemd-*"]}')  # fmt: skip
        runner = fleetops(*args, "--transport", "ansible")
        module = fleetops(*args, "--transport", "ansible", env={"FLEETOPS_NODE_HEALTH_MODULE": "1"})
        default = fleetops(*args)  # the default: fleetops' own ssh commands, no ansible-playbook
    finally:
        hardware.clear_hardware(lab, "lab-02")
        host_faults.remove_crashloop_unit(lab, "lab-03", name="stray")
    assert runner.rc == module.rc == default.rc == 1, (runner.stderr, module.stderr, default.stderr)

    def findings(report: dict[str, Any], host: str) -> list[tuple[str, str, str]]:
        return sorted(
            (f["check"], f["severity"], re.sub(r"\d+(\.\d+)?", "N", f["summary"]))
            for f in report["hosts"][host]["findings"]
        )

    ours, theirs, direct = runner.json(), module.json(), default.json()
    assert direct["transport"] == {"name": "auto", "by_ansible": {}}  # every lab host took the direct path
    assert ours["transport"] == theirs["transport"] == {"name": "ansible"}
    for host in ("lab-01", "lab-02", "lab-03"):
        assert ours["hosts"][host]["status"] == theirs["hosts"][host]["status"] == LAB_ANSWERED
        assert direct["hosts"][host]["status"] == LAB_ANSWERED
        # each path returns the same coverage
        blind = {
            p: lab_blind(r["hosts"][host]) for p, r in (("runner", ours), ("module", theirs), ("ssh", direct))
        }
        assert set(map(frozenset, blind.values())) == {frozenset({"zombie_memcg"})}, blind
        assert findings(ours, host) == findings(theirs, host) == findings(direct, host), host
        assert set(ours["hosts"][host]["facts"]) == set(theirs["hosts"][host]["facts"])
        assert set(direct["hosts"][host]["facts"]) == set(ours["hosts"][host]["facts"])
    severities = {host: {f[:2] for f in findings(ours, host)} for host in ("lab-01", "lab-02", "lab-03")}
    assert ("gpu_health", "critical") in severities["lab-02"]
    assert not any(check == "gpu_health" for check, _ in severities["lab-01"] | severities["lab-03"])
    strays = {h for h in ("lab-01", "lab-02", "lab-03") if any(unit in f[2] for f in findings(ours, h))}
    assert strays == {"lab-03"}
    # the fast path staged the runner on each host, in root's private cache
    staged = lab.run("lab-01", "stat -c '%a %U' /root/.ansible/fleetops/runner-*", check=True).stdout.split()
    assert staged == ["700", "root"], staged


def test_the_ssh_transport_becomes_root_through_sudo(lab: Lab, tmp_path: Path) -> None:
    """``ansible_become`` on a host: the default transport's direct path runs the runner under ``sudo -n`` (the
    lab hosts have sudo; root may use it without a password), as ansible's sudo become would; a host whose
    sudo is not there goes through ansible-playbook instead, in the same scan, which fails it as it fails any
    task there (the direct path's reason is a note, never the failure)."""
    inventory = yaml.safe_load(lab.inventory_path().read_text())
    hosts = inventory["all"]["children"]["fleetops_lab"]["hosts"]
    hosts["lab-02"]["ansible_become"] = True
    hosts["lab-03"].update(ansible_become=True, ansible_become_exe="/nonexistent/sudo")
    inv = tmp_path / "become.yml"
    inv.write_text(yaml.safe_dump(inventory))
    # the lab's remote user is root: ansible (and this transport) skip become to the same user unless told
    result = fleetops("scan", "-i", str(inv), "--format", "json", "-q",
                      "--checks", "zombie_memcg", "-e", "fleetops_imds=never",
                      env={"ANSIBLE_BECOME_ALLOW_SAME_USER": "true"})  # fmt: skip
    report = result.json()
    assert result.rc == 3, result.stderr  # lab-03's sudo is nowhere: ansible-playbook fails it too
    assert report["hosts"]["lab-01"]["status"] == report["hosts"]["lab-02"]["status"] == LAB_ANSWERED, report[
        "hosts"
    ]
    assert report["hosts"]["lab-03"]["status"] == "failed" and report["hosts"]["lab-03"]["msg"]
    # ansible-playbook's own failure, never the direct path's reason for handing the host over
    assert not report["hosts"]["lab-03"]["msg"].startswith("the runner gave no answer")
    assert report["transport"]["name"] == "auto"
    (why,) = report["transport"]["by_ansible"].values()
    assert list(report["transport"]["by_ansible"]) == ["lab-03"]
    assert why.startswith("the runner gave no answer (rc 127)"), why
