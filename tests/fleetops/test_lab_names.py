"""A lab's machine-wide names (fleetops_lab.names): the default lab keeps the names it always had, and
named labs share none with it or with each other, within Linux's 15-character interface names."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from fleetops_lab import Lab, LabError
from fleetops_lab.names import ENV, LabNames, lab_names

WORKERS = [f"gw{i}" for i in range(8)]  # what the integration suite's xdist workers are called
# ... and the two more labs test_lab_named.py boots beside each worker's (or beside the default lab)
SIDE_BY_SIDE = [f"{w}{x}" for w in [*WORKERS, "t"] for x in "xy"]
IFNAMSIZ = 15


def _links(names: LabNames) -> list[str]:
    return [names.bridge] + [f"{names.link_prefix}{kind}{n:03d}" for kind in "vpt" for n in (1, 64, 999)]


def test_the_default_lab_keeps_its_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    lab = Lab(state_dir=Path("/tmp/unused-state"))
    names = lab.names
    assert names == lab_names("default") == lab_names("")
    assert (names.bridge, names.bridge_cidr, names.bridge_mac) == (
        "fleetops0",
        "10.213.0.1/24",
        "02:fe:0a:d5:00:01",
    )
    assert [lab.host_ip(n) for n in ("lab-01", "lab-02", "lab-03", "lab-64")] == [
        "10.213.0.11", "10.213.0.139", "10.213.0.12", "10.213.0.170",
    ]  # fmt: skip
    assert (lab.link("lab-01"), lab._veth_peer("lab-01"), lab._tap("lab-07")) == (
        "fleetops-v01", "fleetops-p01", "fleetops-t07",
    )  # fmt: skip
    assert (lab._netns("lab-02"), lab._machine("lab-02"), lab._cgroup("lab-02")) == (
        "fleetops-lab-02", "fleetops-lab-02", "fleetops-lab/lab-02",
    )  # fmt: skip
    assert (lab._guest_mac("lab-01"), lab._veth_mac("lab-01")) == ("02:fe:0a:d5:00:0b", "02:fe:0a:d5:01:0b")
    assert (names.lock_file, names.owner_file) == (
        Path("/run/fleetops/lab.lock"),
        Path("/run/fleetops/lab.json"),
    )
    assert Lab().state_dir == Path("/var/lib/fleetops/lab") or "FLEETOPS_LAB_DIR" in __import__("os").environ
    assert names.az_subnets() == {"lab-1a": "10.213.0.0/25", "lab-1b": "10.213.0.128/25"}
    assert lab.unused_ip == "10.213.0.250"


def test_named_labs_share_no_name_and_fit_linux_interface_names() -> None:
    labs = [lab_names(n) for n in ["default", *WORKERS, *SIDE_BY_SIDE, "a", "zzzzzz", "lab", "fleet9"]]
    for field in ("bridge", "link_prefix", "netns_prefix", "machine_prefix", "cgroup_parent", "mac_prefix",
                  "lock_file", "owner_file", "default_state_dir", "network"):  # fmt: skip
        values = [getattr(lab, field) for lab in labs]
        assert len(set(values)) == len(values), field
    for lab in labs:
        assert all(len(link) <= IFNAMSIZ for link in _links(lab)), _links(lab)
        # no lab's links, machines or namespaces read as another's (each prefix ends in a separator)
        for other in labs:
            if other is lab:
                continue
            assert not any(other.link_re.match(link) for link in _links(lab) if link != lab.bridge)
            assert not lab.machine_prefix.startswith(other.machine_prefix)
            assert not lab.cgroup_parent.startswith(other.cgroup_parent + "/")
        assert not lab.network.overlaps(lab_names("default").network) or lab.is_default
    networks = [lab.network for lab in labs]
    assert not any(a.overlaps(b) for i, a in enumerate(networks) for b in networks[i + 1 :])
    for lab in labs[1:]:
        first, last = ipaddress.IPv4Address("10.214.0.0"), ipaddress.IPv4Address("10.229.255.255")
        assert first <= lab.network.network_address and lab.network.broadcast_address <= last
        assert lab.network.prefixlen == 24


def test_a_named_lab_is_chosen_by_env_or_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "gw1")
    monkeypatch.delenv("FLEETOPS_LAB_DIR", raising=False)
    lab = Lab()
    assert lab.name == "gw1" and lab.state_dir == Path("/var/lib/fleetops/labgw1")
    assert lab.link("lab-01") == "fogw1-v01" and lab._machine("lab-01") == "fleetops-labgw1-01"
    assert Lab(name="default").names == lab_names("default")
    assert lab.host_ip("lab-01") == str(lab.names.network.network_address + 11)


@pytest.mark.parametrize("bad", ["Gw0", "0gw", "gw-0", "toolong7", "a b", "../x", "-x", "lab\n"])
def test_a_bad_lab_name_is_refused_in_one_line(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(LabError, match=r"^Failed to use the lab .*: a lab's name is 1-6 characters") as err:
        lab_names(bad)
    assert "\n" not in str(err.value).replace(repr(bad), "")
    monkeypatch.setenv(ENV, bad)
    with pytest.raises(LabError):
        Lab()


def test_the_lab_cli_takes_lab(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetops_lab.cli import main

    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setenv("FLEETOPS_LAB_DIR", "/nonexistent/fleetops-lab-state")
    assert main(["--lab", "BAD", "inventory"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a lab's name is 1-6 characters" in err
    assert main(["--lab", "gw3", "inventory"]) == 2  # not up: says so, for that lab
    assert "/nonexistent/fleetops-lab-state/inventory.yml" in capsys.readouterr().err
