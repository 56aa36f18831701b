"""The hosts an inventory and a ``--limit`` select, with the hostvar that groups them (AZ by default).

Ansible itself resolves the inventory and the limit: ansible-inventory's listing, made in this process
by ansible's own inventory manager (``listing``) or, where that cannot list as it would, by the
``ansible-inventory`` beside this interpreter, with the same environment (config, collections path) that
the playbook runs get, so a plan's hosts are the hosts a ``--limit`` run would touch, through the same
inventory plugins.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetops.ansible import listing
from fleetops.ansible.listing import unwrap_unsafe
from fleetops.ansible.runner import ansible_env, prepare_env
from fleetops.errors import UsageError

DEFAULT_GROUP_VARS = ("ec2_az", "fleetops_az")
INVENTORY_TIMEOUT_S = 600


@dataclass(frozen=True)
class InventoryHost:
    """One targeted host: its name, its group key's value (None: no key) and the hostvars it came with.

    ``hostvars`` are as ansible-inventory prints them: group_vars/host_vars merged, not templated.
    """

    name: str
    group: str | None
    group_var: str | None = None  # the hostvar that gave ``group``
    hostvars: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


def ansible_inventory_bin() -> Path:
    """The ``ansible-inventory`` of this interpreter's environment: beside the interpreter (a venv),
    else in its scripts directory (pip into a system Python: /usr/local/bin), else on PATH."""
    for folder in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        candidate = folder / "ansible-inventory"
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("ansible-inventory")
    return Path(found) if found else Path(sys.executable).parent / "ansible-inventory"


def load_hosts(
    inventories: Sequence[Path], limit: str | None = None, group_by: str | None = None
) -> list[InventoryHost]:
    """Hosts of ``inventories`` matched by ``limit``, each with its group key.

    ``group_by`` names the hostvar to group by; None means ``ec2_az`` where a host has it, else
    ``fleetops_az``, else no group. Hosts come in ansible's order; the planner sorts them.
    """
    return hosts_from_list(_checked_list(inventories, limit), group_by)


def _checked_list(inventories: Sequence[Path], limit: str | None) -> dict[str, Any]:
    if not inventories:
        raise UsageError("no inventory given")
    for inv in inventories:
        if not inv.exists():
            raise UsageError(f"inventory not found: {inv}")
    return _list_inventory(inventories, limit)


@dataclass(frozen=True)
class InventoryTargets:
    """The hosts a limit selects, every group name of the inventory (for ``guards.check_target_names``)
    and every host name it lists, limit or not (a resume leaves out the hosts gone since)."""

    hosts: list[InventoryHost]
    groups: frozenset[str]
    present: frozenset[str]
    every: list[InventoryHost]  # every host of the inventory, limit or not
    unmatched: tuple[str, ...] = ()  # the limit's parts that select no host (``unmatched_parts``)


def load_targets(
    inventories: Sequence[Path], limit: str | None = None, group_by: str | None = None
) -> InventoryTargets:
    """``load_hosts`` plus the inventory's group names and the limit's parts that match no host.

    A ``--limit`` drops the groups without a selected host from ansible-inventory's listing, so the
    group names come from a listing without it (a second ansible-inventory run when there is a limit).
    """
    if limit is not None:
        require_limit(limit)  # before any inventory is read
    full = _checked_list(inventories, None)
    every = hosts_from_list(full, group_by)
    if limit is None:
        return InventoryTargets(every, groups_from_list(full), frozenset(h.name for h in every), every)
    hosts = hosts_from_list(_list_inventory(inventories, limit), group_by)
    unmatched = tuple(unmatched_parts(full, limit))
    return InventoryTargets(hosts, groups_from_list(full), frozenset(h.name for h in every), every, unmatched)


def limit_parts(limit: str) -> list[str]:
    """The patterns of ``limit`` as ansible's ``--limit`` reads them: ``split_host_pattern`` (commas, else
    colons), and each ``@FILE`` part replaced by its file's lines."""
    from ansible.inventory.manager import split_host_pattern

    parts: list[str] = []
    for part in split_host_pattern(limit):
        if part.startswith("@"):
            try:
                lines = Path(part[1:]).read_text(encoding="utf-8").splitlines()
            except (OSError, UnicodeDecodeError) as exc:
                raise UsageError(f"--limit {part}: cannot read {part[1:]}: {exc}") from None
            parts += split_host_pattern([ln.strip() for ln in lines if ln.strip()])
        else:
            parts.append(part)
    return parts


def unmatched_parts(listing: Mapping[str, Any], limit: str) -> list[str]:
    """The parts of ``limit`` (``limit_parts``) that select no host of ``listing`` (``ansible-inventory
    --list`` without the limit), each resolved by ansible's own pattern matching (``InventoryManager``:
    groups, globs, ``~regex``, ``[0:2]``), as the inventory_hostnames lookup does; an ``!`` or ``&`` part
    counts by what it names (excluding a typo excludes nothing), a group without hosts matches nothing,
    ansible's implicit localhost is no host of the inventory. Host names are data: a part that is a
    host's exact name matches it, whatever its characters."""
    prepare_env()  # before ansible's configuration is first read in this process
    from fleetops.ansible.parse_cache import ansible_constants

    constants = ansible_constants()
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    manager = InventoryManager(DataLoader(), parse=False)
    for group, hosts in _group_hosts(listing).items():
        manager.add_group(group)
        for host in hosts:
            manager.add_host(host, group=group)
    present = {h.name for h in hosts_from_list(listing)}
    unmatched: list[str] = []
    mismatch = constants.HOST_PATTERN_MISMATCH
    constants.HOST_PATTERN_MISMATCH = "ignore"  # the caller says it, once, naming every part
    try:
        for part in limit_parts(limit):
            pattern = part[1:] if part[0] in "!&" else part
            try:
                found = {h.name for h in manager.get_hosts(pattern)} if pattern not in present else {pattern}
            except (AnsibleError, re.error):
                found = set()
            if not found & present:
                unmatched.append(part)
    finally:
        constants.HOST_PATTERN_MISMATCH = mismatch
    return unmatched


def _group_hosts(listing: Mapping[str, Any]) -> dict[str, list[str]]:
    """Every group's hosts, its children's included, in ansible's order (``Group.get_hosts``: the
    children's first, then its own)."""
    children = {
        str(k): [str(c) for c in b.get("children") or ()]
        for k, b in listing.items()
        if k != "_meta" and isinstance(b, Mapping)
    }
    own = {
        str(k): [str(h) for h in b.get("hosts") or ()]
        for k, b in listing.items()
        if k != "_meta" and isinstance(b, Mapping)
    }
    done: dict[str, list[str]] = {}

    def hosts_of(group: str, seen: frozenset[str]) -> list[str]:
        if group in done:
            return done[group]
        found: dict[str, None] = {}
        for child in children.get(group, ()):
            if child not in seen:
                found.update(dict.fromkeys(hosts_of(child, seen | {child})))
        found.update(dict.fromkeys(own.get(group, ())))
        done[group] = list(found)
        return done[group]

    for group in groups_from_list(listing):
        hosts_of(group, frozenset({group}))
    return done


def load_groups(inventories: Sequence[Path]) -> frozenset[str]:
    """Every group name of ``inventories`` (``all`` and ``ungrouped`` included)."""
    return groups_from_list(_checked_list(inventories, None))


def groups_from_list(data: Mapping[str, Any]) -> frozenset[str]:
    """Group names from ``ansible-inventory --list`` output: its keys but ``_meta``, and every group's
    children (a group without hosts of its own appears only as a child)."""
    names: set[str] = {"all", "ungrouped"}
    for key, body in data.items():
        if key == "_meta":
            continue
        names.add(str(key))
        if isinstance(body, Mapping):
            names.update(str(c) for c in body.get("children") or ())
    return frozenset(names)


def hosts_from_list(data: Mapping[str, Any], group_by: str | None = None) -> list[InventoryHost]:
    """Hosts from ``ansible-inventory --list`` output (every group's hosts, plus ``_meta.hostvars``)."""
    meta = data.get("_meta") or {}
    hostvars: Mapping[str, Any] = meta.get("hostvars") or {}
    names: dict[str, None] = {}
    for key, body in data.items():
        if key != "_meta" and isinstance(body, Mapping):
            names.update(dict.fromkeys(str(h) for h in body.get("hosts") or ()))
    names.update(dict.fromkeys(str(h) for h in hostvars))  # a host with vars but, oddly, no group
    candidates: tuple[str, ...] = (group_by,) if group_by else DEFAULT_GROUP_VARS
    hosts: list[InventoryHost] = []
    for name in names:
        hvars: Mapping[str, Any] = hostvars.get(name) or {}
        var = next((v for v in candidates if _present(hvars.get(v))), None)
        group = _group_value(name, var, hvars[var]) if var is not None else None
        hosts.append(InventoryHost(name=name, group=group, group_var=var, hostvars=hvars))
    return hosts


def _present(value: Any) -> bool:
    return value is not None and value != ""


def _group_value(host: str, var: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise UsageError(f"host {host}: {var} must be a string to group by, got {type(value).__name__}")
    text = str(value)
    if "{{" in text or "{%" in text:
        raise UsageError(
            f"host {host}: {var} is a template ({text!r}); fleetops plan groups by the value as the "
            "inventory states it: set it literally (host_vars, or the inventory plugin's compose)"
        )
    return text


def _list_inventory(inventories: Sequence[Path], limit: str | None) -> dict[str, Any]:
    """``ansible-inventory --list``'s output: listed in this process (``listing``) where it can be, else
    by ansible-inventory itself. A blank limit is refused (``require_limit``), never read as none."""
    if limit is not None:
        require_limit(limit)
    found = listing.parsed(inventories)
    return found.list(limit) if found is not None else _run_ansible_inventory(inventories, limit)


def _run_ansible_inventory(inventories: Sequence[Path], limit: str | None) -> dict[str, Any]:
    exe = ansible_inventory_bin()
    if not exe.exists():
        raise UsageError(f"ansible-inventory not found beside {sys.executable}: is ansible-core installed?")
    cmd = [str(exe), "--list"]
    for inv in inventories:
        cmd += ["-i", str(inv.resolve())]
    if limit:
        cmd += ["--limit", limit]
    # an inventory source ansible cannot parse fails here, instead of becoming "no hosts"
    env = {**os.environ, **ansible_env(), "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True"}
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            env=env,
            stdin=subprocess.DEVNULL,
            timeout=INVENTORY_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise UsageError(
            f"Failed to read inventory: ansible-inventory took over {INVENTORY_TIMEOUT_S}s"
        ) from None
    if proc.returncode != 0:
        raise UsageError(f"Failed to read inventory: {_ansible_error(proc.stderr)}")
    try:
        data = json.loads(proc.stdout, object_hook=unwrap_unsafe)
    except json.JSONDecodeError as exc:
        raise UsageError(f"Failed to read inventory: ansible-inventory printed no JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UsageError("Failed to read inventory: ansible-inventory printed no inventory object")
    return data


def require_limit(limit: str) -> None:
    """Empty never means all: a blank ``--limit`` (a survey or script whose host variable is empty) is
    refused (UsageError), never read as no limit."""
    if not limit.strip():
        raise UsageError(
            f"--limit {limit!r} is blank: an empty selection never means all hosts "
            "(name the hosts, or leave the limit out for the whole inventory)"
        )


def _ansible_error(stderr: str) -> str:
    """ansible's multi-line complaint as one line: its [ERROR], which source, and the first cause."""
    lines = [ln.strip() for ln in stderr.splitlines()]
    picked = [ln.removeprefix("[ERROR]:").strip() for ln in lines if ln.startswith("[ERROR]:")]
    picked += [ln.removeprefix("[WARNING]:").strip() for ln in lines if "Unable to parse" in ln]
    if "<<< caused by >>>" in lines:
        after = lines[lines.index("<<< caused by >>>") + 1 :]
        cause = next((ln for ln in after if ln), None)
        if cause:
            picked.append(cause)
    if not picked:
        picked = [ln for ln in lines if ln][-1:] or ["ansible-inventory failed with no message"]
    return "; ".join(dict.fromkeys(p.rstrip(".") for p in picked))
