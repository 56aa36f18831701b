"""The hosts a command selects (``selected``: the inventory's listing, the names checked, a limit's parts
matched) and the inventory's shared store (``shared_store``): what a scan and a rollout's launch
(``fleetops.api.launch``) both start from, apart from the launch so that a scan imports none of it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fleetops.ansible.inventory import InventoryHost, InventoryTargets, load_targets
from fleetops.rollout import guards

if TYPE_CHECKING:
    from fleetops.store import Store


def shared_store(inventory: Sequence[Path]) -> Store | None:
    """The inventory's shared store (``fleetops.store.open_store``), imported here, and only for an inventory
    with a ``fleetops.node.ec2`` source (the one place a store is named): the store brings the policy's
    ledger (pydantic models), which only a rollout that acts needs, not a scan or a plan (a scan of a static
    inventory started its first ssh about 0.15 s later for it)."""
    from fleetops.ansible.runner import ec2_sources

    if next(ec2_sources(inventory), None) is None:
        return None
    from fleetops.store import open_store

    return open_store(inventory)


def _selection(inventories: Sequence[Path], limit: str | None) -> str:
    """What selected the hosts, for ``guards.require_targets``' message."""
    if limit:
        return f"--limit {limit!r}"
    return "the inventory " + " ".join(str(p) for p in inventories)


def selected(
    inventories: Sequence[Path], limit: str | None, group_by: str | None, *, strict: bool = True
) -> InventoryTargets:
    """The inventory's listing with the hosts ``limit`` selects, refused (UsageError) when the limit is
    blank, when there are no hosts, when a name is not targeted exactly by a ``--limit``
    (``guards.check_target_names``) and, ``strict`` (every command that acts or plans), when a part of
    the limit matches no host (``guards.require_matched``); not strict (a scan), such parts are left in
    the listing's ``unmatched`` for the caller to name."""
    found = load_targets(inventories, limit, group_by)
    guards.require_targets([h.name for h in found.hosts], _selection(inventories, limit))
    if strict:
        guards.require_matched(found.unmatched, limit)
    guards.check_target_names([h.name for h in found.hosts], found.groups)
    return found


def targets(inventories: Sequence[Path], limit: str | None, group_by: str | None) -> list[InventoryHost]:
    """The hosts ``limit`` selects (``selected``, strict)."""
    return selected(inventories, limit, group_by).hosts
