"""The one loader for the collection's code on the controller.

The controller never parses a host's files itself, but a few facts live once, in the collection's
``plugins/module_utils`` (the severity order, the zombie warning level, the UCX fixes, the EC2 client
and retries), and the controller reads them from there. Ansible's own collection finder resolves
``ansible_collections.fleetops.node`` from this checkout's ``collections/`` folder, then
``ANSIBLE_COLLECTIONS_PATH`` and the default paths, exactly as ansible-playbook would; nothing is
appended to ``sys.path``.
"""

from __future__ import annotations

import importlib
import os
from functools import cache
from pathlib import Path
from types import ModuleType

from fleetops import paths
from fleetops.errors import FleetopsError

PACKAGE = "ansible_collections.fleetops.node"


def _search_paths() -> list[str]:
    folders: list[Path] = []
    own = paths.collections_path()
    if own is not None:
        folders.append(own)
    env = os.environ.get("ANSIBLE_COLLECTIONS_PATH") or os.environ.get("ANSIBLE_COLLECTIONS_PATHS") or ""
    folders += [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    folders += [Path.home() / ".ansible" / "collections", Path("/usr/share/ansible/collections")]
    return [str(f) for f in folders if f.is_dir()]


@cache
def _install_finder() -> None:
    from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder

    try:
        importlib.import_module(PACKAGE)
        return  # a finder (ansible's, or an earlier one of ours) already resolves the collection
    except ImportError:
        pass
    _AnsibleCollectionFinder(paths=_search_paths())._install()


def load(relative: str) -> ModuleType:
    """``load("plugins.module_utils.findings")`` -> that module of fleetops.node, or a clear error."""
    _install_finder()
    name = f"{PACKAGE}.{relative}"
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise FleetopsError(
            f"Failed to load {name}: the fleetops.node collection is not installed where ansible finds "
            f"collections ({err})"
        ) from err


def module_utils(name: str) -> ModuleType:
    """``module_utils("findings")``: a module of the collection's plugins/module_utils."""
    return load(f"plugins.module_utils.{name}")
