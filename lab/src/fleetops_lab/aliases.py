"""A simulated fleet: each lab host answers on K addresses of its own, and D addresses answer nothing.

``fleetops-lab up N --addresses K [--dead D]`` lists N x K inventory hosts (``lab-01-a001`` ..), each
with its own address, so a controller opens one ssh connection per inventory host as it would on a
real fleet (ssh's ControlPersist masters are per address). What the aliases share is everything
behind the address: an alias is its host, so a fault injected on lab-03 shows on all of lab-03's
addresses, and the hosts' CPU is shared as the lab's always is.

How it is built (all derived here; ``Lab.up`` applies it):

- The addresses come from the lab's alias network (``LabNames.alias_network``: a /19 in RFC 6598's
  shared space, 100.64.0.0/10, next to the lab's /24), host by host in contiguous blocks, then the
  dead ones.
- A host takes its block with ``local`` routes in its own network namespace (Linux's AnyIP: a local
  route makes every address in it the namespace's own, and sshd listening on 0.0.0.0 answers on all
  of them), and this machine routes the block to the host's address on the bridge. So the machine's
  neighbour table holds one entry per host, not per address: a real controller reaches a fleet of
  that size through routers too, and the lab never runs into ``gc_thresh3``.
- The dead block is routed to the first host, whose namespace has a ``blackhole`` route for it: a
  SYN is dropped without an answer, so ssh waits out its connect timeout as it does for an instance
  that is gone, rather than failing at once.
- sshd's ``MaxStartups`` is raised in every lab host (``rootfs.SSHD_DROPIN``): one host takes the
  connections of K hosts.

The inventory is written interleaved, ``a001`` of every host first, then ``a002`` .., with the dead
addresses spread evenly among them: the order a real inventory has no reason to group, so a scan's
forks spread over the hosts as they would over distinct machines, and meet the dead ones now and
then rather than all at the end.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from fleetops_lab.errors import LabError

MAX_ADDRESSES = 999  # a001 .. a999 per host
DEAD_PREFIX = "lab-dead-"


@dataclass(frozen=True)
class Alias:
    name: str  # the inventory host: lab-01-a001, or lab-dead-001
    ip: str
    host: str | None  # the lab host behind it; None for a dead address


@dataclass(frozen=True)
class AliasPlan:
    network: ipaddress.IPv4Network
    hosts: tuple[str, ...]  # the lab hosts, in order
    addresses: int  # K per host (0: no aliases)
    dead: int  # D dead addresses

    @property
    def first(self) -> ipaddress.IPv4Address:
        return self.network.network_address + 16  # .0 .. .15 unused

    def host_range(self, index: int) -> tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]:
        """The first and last address of the ``index``-th host's block (0-based)."""
        start = self.first + index * self.addresses
        return start, start + self.addresses - 1

    def dead_range(self) -> tuple[ipaddress.IPv4Address, ipaddress.IPv4Address] | None:
        if not self.dead:
            return None
        start = self.first + len(self.hosts) * self.addresses
        return start, start + self.dead - 1

    def host_prefixes(self, index: int) -> list[ipaddress.IPv4Network]:
        return list(ipaddress.summarize_address_range(*self.host_range(index)))

    def dead_prefixes(self) -> list[ipaddress.IPv4Network]:
        span = self.dead_range()
        return list(ipaddress.summarize_address_range(*span)) if span else []

    def aliases(self) -> list[Alias]:
        """Every inventory host, interleaved: a001 of each host, then a002, .., with the dead ones spread
        evenly among them (a gone instance sits anywhere in a real inventory, not all at its end)."""
        live = [
            Alias(f"{host}-a{k + 1:03d}", str(self.host_range(i)[0] + k), host)
            for k in range(self.addresses)
            for i, host in enumerate(self.hosts)
        ]
        span = self.dead_range()
        if not span:
            return live
        dead = [Alias(f"{DEAD_PREFIX}{d + 1:03d}", str(span[0] + d), None) for d in range(self.dead)]
        out: list[Alias] = []
        for j, alias in enumerate(dead):  # dead j after the first (j + 1/2) / D of the live hosts
            out += live[len(out) - j : (2 * j + 1) * len(live) // (2 * len(dead))]
            out.append(alias)
        return out + live[len(out) - len(dead) :]

    def by_host(self) -> dict[str, list[str]]:
        """Each lab host's alias addresses (its known_hosts line lists them)."""
        return {
            host: [str(self.host_range(i)[0] + k) for k in range(self.addresses)]
            for i, host in enumerate(self.hosts)
        }


def plan(network: ipaddress.IPv4Network, hosts: Sequence[str], addresses: int, dead: int) -> AliasPlan:
    """The plan for ``hosts``, checked: K in 0 .. MAX_ADDRESSES, D >= 0 (only with K), all inside the network."""
    for what, value in (("--addresses", addresses), ("--dead", dead)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise LabError(f"Failed to start the lab: {what} must be a whole number >= 0, not {value!r}")
    if addresses > MAX_ADDRESSES:
        raise LabError(f"Failed to start the lab: --addresses must be 0 .. {MAX_ADDRESSES}, not {addresses}")
    if dead and not addresses:
        raise LabError(
            "Failed to start the lab: --dead needs --addresses (dead addresses join a simulated fleet)"
        )
    if dead > MAX_ADDRESSES:
        raise LabError(f"Failed to start the lab: --dead must be 0 .. {MAX_ADDRESSES}, not {dead}")
    result = AliasPlan(network, tuple(hosts), addresses, dead)
    room = network.num_addresses - 16 - 1  # the first 16 and the broadcast address unused
    wanted = len(hosts) * addresses + dead
    if wanted > room:
        raise LabError(
            f"Failed to start the lab: {len(hosts)} host(s) x {addresses} address(es) + {dead} dead is "
            f"{wanted} addresses; the lab's alias network {network} holds {room}"
        )
    return result
