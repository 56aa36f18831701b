"""A simulated fleet's addresses (fleetops_lab.aliases): every inventory host its own address, each host's
block covered exactly by its routes, dead addresses spread through the inventory, labs' alias networks
apart, and bad sizes refused in one line before anything is touched."""

from __future__ import annotations

import ipaddress
import itertools
from pathlib import Path

import pytest

from fleetops_lab import Lab, LabError
from fleetops_lab import aliases as lab_aliases
from fleetops_lab.names import lab_names

from .test_lab_names import SIDE_BY_SIDE

NET = ipaddress.IPv4Network("100.64.0.0/19")
HOSTS = [f"lab-{i:02d}" for i in range(1, 51)]


def _covered(prefixes: list[ipaddress.IPv4Network]) -> set[str]:
    return {str(ip) for p in prefixes for ip in p}


@pytest.mark.parametrize(("hosts", "k", "dead"), [(3, 4, 2), (50, 147, 150), (50, 150, 0), (7, 1, 1)])
def test_each_alias_has_its_own_address_and_its_hosts_routes_cover_exactly_its_block(
    hosts: int, k: int, dead: int
) -> None:
    plan = lab_aliases.plan(NET, HOSTS[:hosts], k, dead)
    listed = plan.aliases()
    assert len(listed) == hosts * k + dead
    assert len({a.name for a in listed}) == len({a.ip for a in listed}) == len(listed)
    assert all(ipaddress.IPv4Address(a.ip) in NET for a in listed)
    by_host = plan.by_host()
    for i, host in enumerate(HOSTS[:hosts]):
        mine = {a.ip for a in listed if a.host == host}
        assert len(mine) == k and set(by_host[host]) == mine
        assert _covered(plan.host_prefixes(i)) == mine  # the routes cover the block, nothing more
        assert {a.name for a in listed if a.host == host} == {f"{host}-a{n:03d}" for n in range(1, k + 1)}
    dead_ips = {a.ip for a in listed if a.host is None}
    assert _covered(plan.dead_prefixes()) == dead_ips and len(dead_ips) == dead
    assert not dead_ips & {ip for ips in by_host.values() for ip in ips}


def test_the_inventory_interleaves_hosts_and_spreads_the_dead() -> None:
    plan = lab_aliases.plan(NET, HOSTS, 147, 150)
    listed = plan.aliases()
    assert [a.name for a in listed[:3]] == ["lab-01-a001", "lab-02-a001", "lab-03-a001"]
    where = [i for i, a in enumerate(listed) if a.host is None]
    gaps = [b - a for a, b in itertools.pairwise(where)]
    assert min(gaps) >= 49 and max(gaps) <= 51, gaps  # one in every 50, not a run at the end
    assert where[0] < 50 and len(listed) - where[-1] <= 50


@pytest.mark.parametrize(
    ("k", "dead", "words"),
    [
        (-1, 0, "--addresses must be a whole number"),
        (1000, 0, "--addresses must be 0 .. 999"),
        (0, 3, "--dead needs --addresses"),
        (2, -1, "--dead must be a whole number"),
        (True, 0, "--addresses must be a whole number"),
        (170, 0, "8500 addresses; the lab's alias network 100.64.0.0/19 holds 8175"),
    ],
)
def test_bad_sizes_are_refused_in_one_line(k: int, dead: int, words: str) -> None:
    with pytest.raises(LabError) as err:
        lab_aliases.plan(NET, HOSTS, k, dead)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_labs_alias_networks_are_apart_from_each_other_and_from_their_subnets() -> None:
    names = [lab_names(n) for n in ["default", *SIDE_BY_SIDE]]
    nets = [n.alias_network for n in names]
    assert nets[0] == NET
    assert all(n.prefixlen == 19 and n.subnet_of(ipaddress.IPv4Network("100.64.0.0/10")) for n in nets)
    assert len(set(nets)) == len(nets), "two labs that run side by side share an alias network"
    assert not any(a.overlaps(n.network) for a in nets for n in names)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"vm": 1}, "not with --vm, --slurm or --ec2"),
        ({"slurm": True}, "not with --vm, --slurm or --ec2"),
        ({"ec2": True}, "not with --vm, --slurm or --ec2"),
        ({"addresses": 0, "dead": 2}, "--dead needs --addresses"),
    ],
)
def test_up_refuses_a_simulated_fleet_it_cannot_build_before_touching_anything(
    kwargs: dict[str, object], words: str, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    with pytest.raises(LabError) as err:
        Lab(state_dir=state, name="zz").up(2, **{"addresses": 2, **kwargs})  # type: ignore[arg-type]
    assert words in str(err.value)
    assert not state.exists()  # refused before the lock, the state dir or a single host
