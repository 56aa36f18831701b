"""``ansible-inventory --list`` in this process: ansible's own InventoryManager and VariableManager, as
ansible-inventory's ``InventoryCLI`` drives them, without starting another Python (about 0.35 s of every
command's start, more on a busy machine).

The listing is ansible-inventory's, value for value: the same plugins (ansible's YAML/INI/script/auto
plugins, the collection's ``fleetops.node.ec2``) loaded through the same configuration (``ansible_env``:
``ANSIBLE_CONFIG``, ``ANSIBLE_COLLECTIONS_PATH``, set in this process's environment before ansible's
configuration is first read: ``runner.prepare_env``), every host's variables from
``VariableManager.get_vars`` less ansible's internal ones, and the whole written with ansible-inventory's
JSON encoder and read back (untagged plain values, ``__ansible_unsafe`` read as the string it wraps).
Where this process cannot list as the subprocess would (a vault configured: ansible-inventory reads
its secrets; ansible's configuration already read from another file; collections imported without
ansible's collection finder), ``parsed`` answers None and the
caller runs ansible-inventory.

A static inventory (YAML/INI files, their group_vars and host_vars, no plugin or script source) is parsed
once per process and kept while none of its files changes (their paths, sizes and mtimes), so the
commands of one rollout or auto pass (the plan, each batch's gate scan, a ``--limit``'s second listing)
parse it once; a limit is ansible's ``subset`` of the parsed inventory. A dynamic one (an inventory
plugin's source, a script) is parsed again by every caller, as the subprocess did.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from fleetops.errors import UsageError

_LOCK = threading.Lock()  # one listing at a time: ansible's inventory objects are not thread-safe
_PLUGIN_SOURCE = re.compile(rb"^plugin\s*:", re.MULTILINE)  # the auto plugin's mark of a plugin's source
_VARS_DIRS = ("group_vars", "host_vars")  # host_group_vars reads these beside each source


class Parsed:
    """One parse of some inventory sources, listed for any limit (ansible's ``subset``)."""

    def __init__(self, sources: Sequence[str]) -> None:
        from ansible import constants as C
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader
        from ansible.vars.manager import VariableManager

        self.internal = C.INTERNAL_STATIC_VARS
        loader = DataLoader()
        with _warnings() as captured:
            try:
                self.manager = InventoryManager(loader=loader, sources=list(sources), cache=True)
            except Exception as exc:  # ansible-inventory exits 1 on whatever ansible raised
                raise UsageError(f"Failed to read inventory: {_one_line(exc, captured)}") from None
        if not self.manager._inventory.processed_sources:
            # what ANSIBLE_INVENTORY_UNPARSED_FAILED makes ansible-inventory say, without setting it here
            raise UsageError(f"Failed to read inventory: {_one_line(None, captured)}")
        self.variables = VariableManager(loader=loader, inventory=self.manager)
        self.hostvars: dict[str, dict[str, Any]] = {}  # per host, as ansible-inventory prints them

    def list(self, limit: str | None) -> dict[str, Any]:
        """``ansible-inventory --list [--limit LIMIT]``'s output, as parsed JSON."""
        with _LOCK, _warnings() as captured:
            try:
                if limit:
                    self.manager.subset(limit)
                return self._listing()
            except Exception as exc:  # the same
                raise UsageError(f"Failed to read inventory: {_one_line(exc, captured)}") from None
            finally:
                self.manager.subset(None)

    def _listing(self) -> dict[str, Any]:
        hosts = self.manager.get_hosts("all")
        available = frozenset(h.name for h in hosts)
        groups: dict[str, Any] = {}
        seen: set[str] = set()

        def add(group: Any) -> None:  # InventoryCLI.json_inventory's format_group
            body: dict[str, Any] = {}
            if group.name != "all":
                body["hosts"] = [h.name for h in group.hosts if h.name in available]
            body["children"] = []
            for sub in group.child_groups:
                body["children"].append(sub.name)
                if sub.name not in seen:
                    add(sub)
                    seen.add(sub.name)
            body = {k: v for k, v in body.items() if v}
            if body:
                groups[group.name] = body

        add(self.manager.groups["all"])
        hostvars: dict[str, Any] = {}
        for host in hosts:
            if host.name not in self.hostvars:
                found = self.variables.get_vars(host=host, include_hostvars=False, stage="all")
                self.hostvars[host.name] = _plain({k: v for k, v in found.items() if k not in self.internal})
            if self.hostvars[host.name]:
                hostvars[host.name] = self.hostvars[host.name]
        from ansible._internal._json._profiles import _inventory_legacy

        groups = _plain(groups)
        groups["_meta"] = {"hostvars": dict(sorted(hostvars.items())),
                           "profile": _inventory_legacy.Encoder.profile_name}  # fmt: skip
        return dict(sorted(groups.items()))  # ansible-inventory sorts its keys


def _plain(data: Any) -> Any:
    """``data`` as ansible-inventory writes it and fleetops reads it back: plain JSON values."""
    from ansible._internal._json._profiles import _inventory_legacy

    return json.loads(
        json.dumps(data, cls=_inventory_legacy.Encoder, sort_keys=True), object_hook=unwrap_unsafe
    )


def unwrap_unsafe(obj: dict[str, Any]) -> Any:
    """ansible-inventory writes plugin-provided strings as {"__ansible_unsafe": "..."}: read the value."""
    if len(obj) == 1 and "__ansible_unsafe" in obj:
        return obj["__ansible_unsafe"]
    return obj


class _warnings:
    """Ansible's warnings while listing, kept (ansible-inventory's stderr) instead of printed."""

    def __enter__(self) -> list[str]:
        from ansible._internal._display_utils import DeferredWarningContext

        self.context = DeferredWarningContext(variables={})
        self.context.__enter__()
        self.found: list[str] = []
        return self.found

    def __exit__(self, *exc: object) -> None:
        self.context.__exit__(*exc)
        for warning in self.context.get_warnings():
            event: Any = warning.event
            parts = [event.msg]
            while event.chain is not None:
                event = event.chain.event
                parts.append(event.msg)
            self.found.append(": ".join(str(p).strip().rstrip(".") for p in parts if p))


def _one_line(exc: BaseException | None, warnings: Sequence[str]) -> str:
    """ansible's complaint in one line: the error, the warnings that say which source and why."""
    picked = [" ".join(str(exc).split())] if exc is not None else []
    picked += [" ".join(w.split()) for w in warnings]
    return "; ".join(dict.fromkeys(p for p in picked if p)) or "ansible parsed no inventory source"


# ------------------------------------------------------------------------------------- the cache

_CACHE: dict[tuple[str, ...], tuple[tuple[Any, ...], Parsed]] = {}


def parsed(inventories: Sequence[Path]) -> Parsed | None:
    """The parse of ``inventories`` (a static one kept while its files stay as they were); None where this
    process cannot list as ansible-inventory would (the caller runs it)."""
    sources = tuple(str(p.resolve()) for p in inventories)
    if not _ansible_ready():
        return None
    with _LOCK:
        key = _static_key(sources)
        kept = _CACHE.get(sources)
        if key is not None and kept is not None and kept[0] == key:
            return kept[1]
        fresh = Parsed(sources)
        if key is not None:
            _CACHE[sources] = (key, fresh)
        else:
            _CACHE.pop(sources, None)
        return fresh


def forget() -> None:
    """Drop every kept parse (tests; a caller that knows the inventory changed within one mtime tick)."""
    with _LOCK:
        _CACHE.clear()


def _ansible_ready() -> bool:
    """Ansible's configuration loaded in this process as ansible-inventory would load it: this checkout's
    ``ANSIBLE_*`` settings in the environment first (``runner.prepare_env``), its collection finder
    installed as ansible's CLIs install it (not where collections were imported without one), and no
    vault to read secrets for."""
    from fleetops.ansible.runner import prepare_env

    prepare_env()
    from fleetops.ansible.parse_cache import ansible_constants

    C = ansible_constants()

    wanted = os.environ.get("ANSIBLE_CONFIG")
    if wanted and not _same_file(C.CONFIG_FILE, wanted):
        return False  # ansible's configuration was read before, from elsewhere
    if C.DEFAULT_VAULT_IDENTITY_LIST or C.DEFAULT_VAULT_PASSWORD_FILE or C.DEFAULT_VAULT_ID_MATCH:
        return False
    from fleetops.ansible.collection import install_ansible_loader

    return install_ansible_loader()


def _same_file(a: str | None, b: str) -> bool:
    try:
        return a is not None and os.path.samefile(a, b)
    except OSError:
        return False


def _static_key(sources: Sequence[str]) -> tuple[Any, ...] | None:
    """Every file the static sources read (each source, and its group_vars and host_vars), with its size
    and mtime; None when a source is dynamic (an inventory plugin's YAML, an executable script)."""
    stamps: list[tuple[str, int, int]] = []
    for source in sources:
        root = Path(source)
        files = list(_files(root)) if root.is_dir() else [root]
        for path in files:
            try:
                st = path.stat()
            except OSError:
                continue
            if _dynamic(path, st.st_mode):
                return None
            stamps.append((str(path), st.st_size, st.st_mtime_ns))
        folder = root if root.is_dir() else root.parent
        for name in _VARS_DIRS:
            if not root.is_dir() or not (folder / name).is_relative_to(root):
                for path in _files(folder / name):
                    with_stat = _stamp(path)
                    if with_stat is not None:
                        stamps.append(with_stat)
    return tuple(stamps)


def _files(folder: Path) -> Iterator[Path]:
    if not folder.is_dir():
        return
    for top, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            yield Path(top, name)


def _stamp(path: Path) -> tuple[str, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (str(path), st.st_size, st.st_mtime_ns)


def _dynamic(path: Path, mode: int) -> bool:
    if mode & 0o111 and path.suffix not in (".yml", ".yaml", ".ini", ".json", ".toml", ".cfg"):
        return True  # the script plugin runs it
    if path.suffix in (".yml", ".yaml"):
        try:
            with path.open("rb") as f:
                return bool(_PLUGIN_SOURCE.search(f.read()))
        except OSError:
            return True
    return False
