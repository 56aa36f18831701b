"""What a lab is called on this machine: every machine-wide name of one lab, derived from its name.

A lab is a namespace of names (design §7): a bridge and a /24, veth and tap links, network
namespaces, nspawn machine names, a cgroup parent, a lock and an owner record, a state directory.
Two labs with different names share none of them, so they run side by side; the default lab
(``FLEETOPS_LAB`` unset, empty or ``default``) keeps the names the lab always had (``fleetops0``,
10.213.0.0/24, ``fleetops-lab-NN``, ``/var/lib/fleetops/lab``), so every existing command works
unchanged.

A named lab's name is 1-6 characters, ``[a-z][a-z0-9]*``: Linux caps interface names at 15
characters, and ``fo<name>-v<NNN>`` must fit. Its subnet is a /24 in 10.214.0.0 .. 10.229.255.0,
chosen by a hash of the name (so every process that knows the name agrees on it, with no record to
read); ``Lab.up`` refuses one that clashes with an address or route this machine already has.
Host names stay ``lab-01 ..`` in every lab: they are data the tests assert on.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from fleetops_lab.errors import LabError

ENV = "FLEETOPS_LAB"
DEFAULT_NAME = "default"
_NAME_RE = re.compile(r"[a-z][a-z0-9]{0,5}")
RUN_DIR = Path("/run/fleetops")
STATE_ROOT = Path("/var/lib/fleetops")
# Named labs' subnets: 16 x 256 /24s, 10.214.0.0/24 .. 10.229.255.0/24 (the default lab is 10.213.0.0/24).
_NAMED_FIRST_OCTET2, _NAMED_SPAN = 214, 16 * 256
# Simulated fleets' addresses (fleetops_lab.aliases): a /19 of RFC 6598's shared space, 100.64.0.0/10 (512 /19s);
# the default lab takes the first, a named lab one of the other 511 by a hash of its name.
_ALIAS_SPACE, _ALIAS_PREFIXLEN = ipaddress.IPv4Network("100.64.0.0/10"), 19
AZS = ("lab-1a", "lab-1b")


@dataclass(frozen=True)
class LabNames:
    """Every machine-wide name of one lab."""

    name: str  # "default" or the lab's name
    network: ipaddress.IPv4Network  # a /24: the bridge is .1, hosts as host_ip says
    alias_network: ipaddress.IPv4Network  # a /19 routed over the bridge: a simulated fleet's addresses
    bridge: str
    link_prefix: str  # + "v"/"p"/"t" + the host's number: veth (this side), veth peer, VM tap
    netns_prefix: str  # + the host's number
    machine_prefix: str  # nspawn --machine and QEMU -name guest=, + the host's number
    cgroup_parent: str  # under each hierarchy's root
    # Four octets; a host's MACs add two. Fixed (locally administered): a host re-created after a crash
    # keeps its MAC, so neither this machine's neighbour cache nor the other guests' point at a vanished link.
    mac_prefix: str
    lock_file: Path
    owner_file: Path
    default_state_dir: Path

    @property
    def is_default(self) -> bool:
        return self.name == DEFAULT_NAME

    @property
    def bridge_cidr(self) -> str:
        return f"{self.network.network_address + 1}/{self.network.prefixlen}"

    @property
    def bridge_mac(self) -> str:
        return f"{self.mac_prefix}:00:01"

    @property
    def link_re(self) -> re.Pattern[str]:
        """This lab's veth and tap links (the number is group 1)."""
        return re.compile(rf"^{re.escape(self.link_prefix)}[vpt](\d{{2,3}})$")

    def host_ip(self, index: int) -> str:
        """Odd hosts (lab-1a) in the /24's lower half from .11, even ones (lab-1b) in the upper half from
        .139: one contiguous half per AZ, so the lab's EC2 side can give each AZ a subnet that holds
        exactly its hosts' addresses (an EC2 instance's private IP must lie in its subnet)."""
        offset = 10 + (index + 1) // 2 if index % 2 else 138 + index // 2
        return str(self.network.network_address + offset)

    def az_subnets(self) -> dict[str, str]:
        """Each lab AZ's half of the /24, as the lab's EC2 VPC subnets."""
        lower, upper = self.network.subnets(prefixlen_diff=1)
        return {AZS[0]: str(lower), AZS[1]: str(upper)}


def check_name(name: str) -> str:
    if name == DEFAULT_NAME or _NAME_RE.fullmatch(name):
        return name
    raise LabError(
        f"Failed to use the lab {name!r}: a lab's name is 1-6 characters, a lowercase letter then "
        f"lowercase letters or digits (or {DEFAULT_NAME!r}); Linux caps interface names at 15 characters"
    )


def current_name(name: str | None = None) -> str:
    """``name``, else ``$FLEETOPS_LAB``, else the default lab; checked."""
    chosen = name if name is not None else os.environ.get(ENV, "")
    return check_name(chosen or DEFAULT_NAME)


def lab_names(name: str | None = None) -> LabNames:
    """The names of lab ``name`` (see ``current_name``)."""
    name = current_name(name)
    if name == DEFAULT_NAME:
        return LabNames(
            name=name,
            network=ipaddress.IPv4Network("10.213.0.0/24"),
            alias_network=_alias_network(0),
            bridge="fleetops0",
            link_prefix="fleetops-",
            netns_prefix="fleetops-lab-",
            machine_prefix="fleetops-lab-",
            cgroup_parent="fleetops-lab",
            mac_prefix="02:fe:0a:d5",
            lock_file=RUN_DIR / "lab.lock",
            owner_file=RUN_DIR / "lab.json",
            default_state_dir=STATE_ROOT / "lab",
        )
    digest = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")
    slot = digest % _NAMED_SPAN
    octet2, octet3 = _NAMED_FIRST_OCTET2 + slot // 256, slot % 256
    return LabNames(
        name=name,
        network=ipaddress.IPv4Network(f"10.{octet2}.{octet3}.0/24"),
        alias_network=_alias_network(1 + digest % (2 ** (_ALIAS_PREFIXLEN - _ALIAS_SPACE.prefixlen) - 1)),
        bridge=f"fo{name}-br",
        link_prefix=f"fo{name}-",
        netns_prefix=f"fleetops-lab{name}-",
        machine_prefix=f"fleetops-lab{name}-",
        cgroup_parent=f"fleetops-lab{name}",
        mac_prefix=f"02:fd:{octet2:02x}:{octet3:02x}",
        lock_file=RUN_DIR / f"lab{name}.lock",
        owner_file=RUN_DIR / f"lab{name}.json",
        default_state_dir=STATE_ROOT / f"lab{name}",
    )


def _alias_network(slot: int) -> ipaddress.IPv4Network:
    size = 2 ** (32 - _ALIAS_PREFIXLEN)
    return ipaddress.IPv4Network((int(_ALIAS_SPACE.network_address) + slot * size, _ALIAS_PREFIXLEN))


def labs_on_this_machine() -> list[str]:
    """The names of every lab something of is on this machine: a lock or owner record, a state dir, a
    cgroup parent or a network namespace (what ``fleetops-lab down --all`` takes down)."""
    found: set[str] = set()

    def add(suffix: str) -> None:
        name = suffix or DEFAULT_NAME
        if name == DEFAULT_NAME or _NAME_RE.fullmatch(name):
            found.add(name)

    for path in [*RUN_DIR.glob("lab*.lock"), *RUN_DIR.glob("lab*.json")]:
        add(path.stem.removeprefix("lab"))
    for path in STATE_ROOT.glob("lab*"):
        if path.is_dir():
            add(path.name.removeprefix("lab"))
    for path in Path("/sys/fs/cgroup").glob("*/fleetops-lab*"):
        add(path.name.removeprefix("fleetops-lab"))
    for path in Path("/run/netns").glob("fleetops-lab*-*"):
        add(path.name.removeprefix("fleetops-lab").rsplit("-", 1)[0])
    return sorted(found)
