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
from fleetops.ansible.runner import ansible_env
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


def load_targets(
    inventories: Sequence[Path], limit: str | None = None, group_by: str | None = None
) -> InventoryTargets:
    """``load_hosts`` plus the inventory's group names.

    A ``--limit`` drops the groups without a selected host from ansible-inventory's listing, so the
    group names come from a listing without it (a second ansible-inventory run when there is a limit).
    """
    full = _checked_list(inventories, None)
    every = hosts_from_list(full, group_by)
    hosts = hosts_from_list(_list_inventory(inventories, limit), group_by) if limit else every
    return InventoryTargets(hosts, groups_from_list(full), frozenset(h.name for h in every), every)


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
    by ansible-inventory itself."""
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
