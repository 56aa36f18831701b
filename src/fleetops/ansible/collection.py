"""The one loader for the collection's code on the controller.

The controller never parses a host's files itself, but a few facts live once, in the collection's
``plugins/module_utils`` (the severity order, the zombie warning level, the UCX fixes, the EC2 client
and retries), and the controller reads them from there. Ansible's own collection finder resolves
``ansible_collections.fleetops.node`` from this checkout's ``collections/`` folder, then
``ANSIBLE_COLLECTIONS_PATH`` and the default paths, then ``sys.path`` (site-packages, where the wheel
installs the collection), exactly as ansible-playbook would; nothing is appended to ``sys.path``.

Importing ansible (and, for ``aws.py`` and ``lease.py``, boto3) costs tenths of a second, so
what the command line needs before any command runs (the defaults its ``--help`` shows) is read from
the same files' source instead: ``constant("memcg", "DEFAULT_THRESHOLDS")`` takes the literal
constants of a module_utils file without importing it, or ansible.
"""

from __future__ import annotations

import ast
import copy
import importlib
import os
import sys
import threading
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from fleetops import paths
from fleetops.errors import FleetopsError

PACKAGE = "ansible_collections.fleetops.node"
_NOT_FOUND = "the fleetops.node collection is not installed where ansible finds collections"
_INSTALL = "install it with ansible-galaxy collection install, or name its folder in ANSIBLE_COLLECTIONS_PATH"


class CollectionNotFound(FleetopsError):
    """The fleetops.node collection is not where ansible finds collections (exit 2, one line)."""


def _search_paths() -> list[str]:
    folders: list[Path] = []
    own = paths.collections_path()
    if own is not None:
        folders.append(own)
    env = os.environ.get("ANSIBLE_COLLECTIONS_PATH") or os.environ.get("ANSIBLE_COLLECTIONS_PATHS") or ""
    folders += [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    folders += [Path.home() / ".ansible" / "collections", Path("/usr/share/ansible/collections")]
    return [str(f) for f in folders if f.is_dir()]


def _folders() -> list[str]:
    """Where ansible-core looks for collections, in its order: the collections paths, then sys.path."""
    folders: list[str] = []
    for folder in [*_search_paths(), *(p or "." for p in sys.path)]:
        if folder not in folders:
            folders.append(folder)
    return folders


def found_at() -> list[Path]:
    """Every ``ansible_collections/fleetops/node`` folder found, first the one ansible-core uses (a
    collection installed twice: the first in its search order wins; the wheel's in site-packages comes
    after the collections paths)."""
    found: list[Path] = []
    for folder in _folders():
        path = Path(folder) / "ansible_collections" / "fleetops" / "node"
        is_one = (path / "MANIFEST.json").is_file() or (path / "galaxy.yml").is_file()
        if is_one and path.resolve() not in {f.resolve() for f in found}:
            found.append(path)
    return found


_FINDER = threading.Lock()  # one finder installed, by whichever thread comes first


@cache
def _install_finder() -> None:
    from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder

    from fleetops.ansible import parse_cache

    parse_cache.install()  # ansible.builtin's routing table and the collection's code from their copies
    with _FINDER:
        if PACKAGE in sys.modules or _AnsibleCollectionFinder._find_existing_finder() is not None:
            return  # already loaded, or ansible's own finder (we run inside ansible) resolves it
        # Not a plain import first: the wheel's collection in site-packages imports as a namespace package,
        # which would win over one in a collections path that ansible-core prefers.
        _AnsibleCollectionFinder(paths=_search_paths())._install()


def install_ansible_loader() -> bool:
    """Ansible's plugin loading set up as its CLIs set it up (``init_plugin_loader``: the plugin filters,
    the collection finder over the configured collections paths, ansible's internal collection first), so
    that ansible's plugin loaders in this process resolve the collection's plugins (the inventory plugin
    ``fleetops.node.ec2``) as ansible-inventory does. A finder already installed (``load``'s) is kept: it
    searches the same paths. Needs ansible's configuration read with this checkout's settings first.

    False, and nothing installed, where collections were already imported without a finder (a
    ``PYTHONPATH`` holding ``ansible_collections``): a finder installed now would not know them (ansible's
    plugin loaders refuse them), and imports go on as they went."""
    from fleetops.ansible import parse_cache

    parse_cache.install()  # ansible.builtin's routing table and the collection's code from their copies
    with _FINDER:
        from ansible.plugins.loader import init_plugin_loader
        from ansible.utils.collection_loader import AnsibleCollectionConfig

        if AnsibleCollectionConfig.collection_finder is not None:
            return True
        if "ansible_collections" in sys.modules:
            return False
        init_plugin_loader()
        return True


def load(relative: str) -> ModuleType:
    """``load("plugins.module_utils.findings")`` -> that module of fleetops.node, or a clear error."""
    _install_finder()
    name = f"{PACKAGE}.{relative}"
    try:
        return importlib.import_module(name)
    except ImportError as err:
        if isinstance(err, ModuleNotFoundError) and PACKAGE.startswith(str(err.name or "-")):
            raise CollectionNotFound(f"Failed to load {name}: {_NOT_FOUND} ({_INSTALL})") from err
        raise FleetopsError(f"Failed to load {name}: {_NOT_FOUND} ({err})") from err


def module_utils(name: str) -> ModuleType:
    """``module_utils("findings")``: a module of the collection's plugins/module_utils."""
    return load(f"plugins.module_utils.{name}")


def source(relative: str) -> Path:
    """The file ``relative`` (``plugins/module_utils/lease.py``) of the collection ``load`` imports from:
    found as ansible's finder would find it (the collections paths, then sys.path), without importing
    ansible."""
    name = f"{PACKAGE}.{relative.removesuffix('.py').replace('/', '.')}"
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None):
        return Path(str(loaded.__file__))
    for folder in _folders():
        path = Path(folder) / "ansible_collections" / "fleetops" / "node" / relative
        if path.is_file():
            return path
    raise CollectionNotFound(f"Failed to read {name}: {_NOT_FOUND} ({_INSTALL})")


class _Known(ast.NodeTransformer):
    """Replaces the names of constants already read by their values."""

    def __init__(self, known: dict[str, Any]) -> None:
        self.known = known

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if isinstance(node.ctx, ast.Load) and node.id in self.known:
            return ast.copy_location(ast.Constant(self.known[node.id]), node)
        return node


@cache
def _constants(name: str) -> dict[str, Any]:
    """The module's constants, read from its source (or the copy kept of what that source gave)."""
    from fleetops.ansible.parse_cache import kept_literals

    path = source(f"plugins/module_utils/{name}.py")
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise FleetopsError(f"Failed to read {path}: {err}") from err
    known: dict[str, Any] = kept_literals("constants", str(path), raw, lambda: _parse_constants(path, raw))
    return known


def _parse_constants(path: Path, raw: bytes) -> dict[str, Any]:
    try:
        tree = ast.parse(raw, filename=str(path))
    except (SyntaxError, ValueError) as err:
        raise FleetopsError(f"Failed to read {path}: {err}") from err
    known: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if not isinstance(target, ast.Name):
            continue
        try:
            known[target.id] = ast.literal_eval(_Known(known).visit(value))
        except (ValueError, TypeError):  # not a constant (a call, a class...): not one of ours
            known.pop(target.id, None)
    return known


def constant(module: str, name: str) -> Any:
    """``constant("lease", "DEFAULT_TTL_S")``: a top-level constant of plugins/module_utils/MODULE.py, read
    from its source without importing it: a literal (``900.0``, a dict of strings), or one made of
    literals and the module's constants above it (``{RCACHE_VAR: "1024"}``). The value equals the
    imported module's (a test compares them); a fresh copy each call."""
    known = _constants(module)
    if name not in known:
        raise FleetopsError(
            f"Failed to read {name} of {PACKAGE}.plugins.module_utils.{module}: not a constant"
        )
    return copy.deepcopy(known[name])


def _keywords(node: ast.AST) -> dict[str, ast.expr] | None:
    """The entries of ``dict(a=..., b=...)`` or ``{"a": ..., "b": ...}``; None for anything else."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "dict"
        and not node.args
    ):
        return {k.arg: k.value for k in node.keywords if k.arg is not None}
    if isinstance(node, ast.Dict):
        return {
            k.value: v
            for k, v in zip(node.keys, node.values, strict=True)
            if isinstance(k, ast.Constant) and isinstance(k.value, str)
        }
    return None


def _spec_in(tree: ast.Module) -> dict[str, ast.expr] | None:
    """The options of ``AnsibleModule(argument_spec=dict(...))``, else of the ``spec = dict(...)`` a
    ``def argument_spec():`` returns (modules whose spec adds module_utils/aws.py's)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                spec = _keywords(kw.value) if kw.arg == "argument_spec" else None
                if spec is not None:
                    return spec
        if isinstance(node, ast.FunctionDef) and node.name == "argument_spec":
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and (spec := _keywords(stmt.value)) is not None:
                    return spec
    return None


@cache
def _argument_spec(module: str) -> dict[str, dict[str, ast.expr]]:
    path = source(f"plugins/modules/{module}.py")
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError) as err:
        raise FleetopsError(f"Failed to read {path}: {err}") from err
    spec = _spec_in(tree)
    if spec is None:
        raise FleetopsError(
            f"Failed to read the argument_spec of {PACKAGE}.plugins.modules.{module}: none found"
        )
    return {name: _keywords(option) or {} for name, option in spec.items()}


def option_spec(module: str, option: str, key: str) -> Any:
    """``option_spec("set_env", "drop_in", "default")``: a literal of a module's option (its default, its
    choices), read from the module's argument spec in its source without importing it: module defaults
    live only there."""
    where = f"{PACKAGE}.plugins.modules.{module}'s {option}"
    node = _argument_spec(module).get(option, {}).get(key)
    if node is None:
        raise FleetopsError(f"Failed to read the {key} of {where}: not in its argument_spec")
    try:
        return ast.literal_eval(node)
    except ValueError as err:
        raise FleetopsError(f"Failed to read the {key} of {where}: not a literal ({err})") from err
