"""A batch's own inventory: the batch's hosts as the rollout's inventory lists them, for its ansible-playbook.

ansible-playbook parses its whole inventory before it applies ``--limit``: over a 7,500-host YAML inventory
that is about 8.5 CPU s (ansible's YAML loader, the data tags on every value, a deep copy of the parsed file
for each of the two plugins that read it), in every batch of a rollout, for one host's work. The rollout's
process has that inventory parsed already (``listing``: once per process for a static one), so each batch's
runner is given instead a file of exactly the batch's hosts, each with every variable ansible-inventory
lists for it and in its groups, written from that parse (``write``).

What the play sees is the same for the batch's hosts: their variables (merged as ansible merged them: the
remediation playbooks have no group_vars or host_vars of their own, so the precedence between inventory
group and host variables is already resolved in the listing), their groups (``group_names``), ``--limit``. What
differs: ``groups`` and ``hostvars`` hold the batch's hosts only, and ``inventory_file`` / ``inventory_dir`` name
the batch's file. So a playbook that reads other hosts of the inventory (``replace``: a new instance's name
unique in ``groups['all']``) gets the whole inventory (the caller does not call ``write``), and ``write`` answers
None, the whole inventory then, wherever the listing could differ from what ansible-playbook would read: no
in-process listing (a vault: ansible-inventory lists it), a variable holding a template (ansible-inventory
lists ``!unsafe`` values as plain strings: written back they would be templated), a host name that a YAML
inventory would read as a pattern or a port, a listing without exactly the batch's hosts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from fleetops.ansible import listing
from fleetops.util import atomic_write

FILE = "batch.yml"
TEMPLATE = re.compile(r"\{\{|\{%|\{#")
ODD_NAME = re.compile(r"[\s\[\]:,]")  # a range, a port, a list, a blank: YAML inventory syntax, not a name
DERIVED = ("all", "ungrouped", "_meta")  # ansible makes these itself from the hosts and groups


def _templated(value: Any) -> bool:
    if isinstance(value, str):
        return TEMPLATE.search(value) is not None
    if isinstance(value, dict):
        return any(_templated(k) or _templated(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_templated(v) for v in value)
    return False


def document(listed: dict[str, Any], hosts: Sequence[str]) -> dict[str, Any] | None:
    """The YAML inventory of ``hosts`` from ``listed`` (ansible-inventory's ``--list`` of exactly them), or
    None when it could differ from what ansible-playbook reads from the inventory itself."""
    hostvars: dict[str, Any] = (listed.get("_meta") or {}).get("hostvars") or {}
    names = set(hosts)
    in_groups: set[str] = set()
    children: dict[str, Any] = {}
    for group, body in listed.items():
        if group in DERIVED or not isinstance(body, dict):
            continue
        members = list(body.get("hosts") or [])
        in_groups.update(members)
        entry: dict[str, Any] = {}
        if members:
            entry["hosts"] = dict.fromkeys(members)
        subs = [c for c in body.get("children") or [] if c not in DERIVED]
        if subs:
            entry["children"] = dict.fromkeys(subs)
        children[group] = entry or None
    listed_hosts = in_groups | set((listed.get("ungrouped") or {}).get("hosts") or []) | set(hostvars)
    if listed_hosts != names or any(ODD_NAME.search(h) for h in names):
        return None
    if any(_templated(hostvars.get(h)) for h in hosts):
        return None
    top: dict[str, Any] = {"hosts": {h: hostvars.get(h) or None for h in hosts}}
    if children:
        top["children"] = children
    return {"all": top}


def write(inventories: Sequence[Path], hosts: Sequence[str], folder: Path) -> Path | None:
    """``FILE`` in ``folder``: the batch's ``hosts`` as ``inventories`` list them (``document``), or None when
    ansible-playbook must read ``inventories`` themselves."""
    if not hosts:
        return None
    found = listing.parsed(inventories)
    if found is None:
        return None
    doc = document(found.list(",".join(hosts)), hosts)
    if doc is None:
        return None
    path = folder / FILE
    atomic_write(path, yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=1_000_000))
    return path
