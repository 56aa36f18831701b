"""Where the collection lives, so the wrapper can run its playbooks by FQCN from anywhere."""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import yaml


def _is_collection_root(path: Path) -> bool:
    galaxy = path / "galaxy.yml"
    if not galaxy.is_file():
        return False
    try:
        meta = yaml.safe_load(galaxy.read_text())
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(meta, dict) and meta.get("namespace") == "fleetops" and meta.get("name") == "node"


@cache
def collection_root() -> Path | None:
    """The fleetops.node checkout this package runs from (editable install), or $FLEETOPS_COLLECTION_ROOT.

    None when the package was installed on its own: then the collection must be installed where
    ansible finds collections (``ansible-galaxy collection install``), and playbooks still run by FQCN.
    """
    env = os.environ.get("FLEETOPS_COLLECTION_ROOT")
    if env:
        return Path(env).resolve()
    for parent in Path(__file__).resolve().parents:
        if _is_collection_root(parent):
            return parent
    return None


def collections_path() -> Path | None:
    """The folder that holds ``ansible_collections/fleetops/node`` for this checkout."""
    root = collection_root()
    if root is None:
        return None
    return root / "collections"


# The localhost inventory the package ships, for a controller with no checkout (pip install of the wheel).
# In a checkout it is a link to inventory/localhost.yml (the one file); the wheel holds its content.
SHIPPED_INVENTORY = Path(__file__).resolve().parent / "localhost.yml"


def default_inventory() -> Path:
    """This machine, scanned in-process: the checkout's inventory/localhost.yml, else the package's."""
    root = collection_root()
    if root is not None and (root / "inventory" / "localhost.yml").is_file():
        return root / "inventory" / "localhost.yml"
    return SHIPPED_INVENTORY


def resolve_inventories(given: Sequence[Path] | None) -> list[Path]:
    """The inventories to use: those given, else the localhost inventory (the one default)."""
    return list(given or []) or [default_inventory()]


def state_home() -> Path:
    """Where rollouts keep state, locks and the audit log ($FLEETOPS_STATE_DIR overrides)."""
    env = os.environ.get("FLEETOPS_STATE_DIR")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/fleetops")
    return Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "fleetops"
