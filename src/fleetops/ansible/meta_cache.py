"""ansible.builtin's routing table read from a JSON copy, not parsed again by every command.

Once ansible's collection finder is installed (``fleetops.ansible.collection``), the first import of an
``ansible.*`` module it has not seen makes it read ansible.builtin's ``meta/runtime.yml`` (ansible-core's
``config/ansible_builtin_runtime.yml``: 370 KB of YAML, about 75 ms of CPU) to look for an import
redirection; every fleetops command that lists an inventory or loads the collection paid that. The finder
reads a collection's runtime.yml through ``_collection_finder._meta_yml_to_dict(data, content_id)``, the
hook ansible-core documents for tools to replace ("content_id ... to allow other implementations to cache
the output"). ``install`` wraps it: ansible.builtin's table is kept as JSON in the user's cache folder
(``$XDG_CACHE_HOME/fleetops``, else ``~/.cache/fleetops``), named by the SHA-256 of the YAML's bytes (another
ansible-core, another file), written whole (a temporary file renamed into place). The table decides where
imports go, so the copy is read only from a folder and a file of this user that no one else can write;
anything else (no home, a read-only one as in some execution environments, a file that is not valid) and
the YAML is parsed as before. Other collections' tables (a few lines) are parsed as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

BUILTIN = ("ansible.builtin", "runtime.yml")  # the content_id the finder passes for ansible.builtin's table
_LOCK = threading.Lock()


def cache_dir() -> Path | None:
    """Where the copy is kept: ``$XDG_CACHE_HOME/fleetops``, else ``~/.cache/fleetops``; None without a home
    (a container's user with none) or with a relative ``XDG_CACHE_HOME`` (which the XDG spec says to ignore)."""
    base = os.environ.get("XDG_CACHE_HOME") or ""
    if not os.path.isabs(base):
        home = os.path.expanduser("~")
        if not os.path.isabs(home):
            return None
        base = os.path.join(home, ".cache")
    return Path(base) / "fleetops"


def _private(path: Path, *, folder: bool) -> bool:
    """``path`` is a real folder (or file) of this user that no other user can write."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    kind = stat.S_ISDIR(st.st_mode) if folder else stat.S_ISREG(st.st_mode)
    return kind and st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _read(path: Path) -> Any:
    if not (_private(path.parent, folder=True) and _private(path, folder=False)):
        return None
    try:
        found = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _write(path: Path, table: Any) -> None:
    with contextlib.suppress(OSError):
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _private(path.parent, folder=True):
            return
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".meta-", suffix=".json")  # 0600
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(table, f, separators=(",", ":"))
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def cached(parse: Callable[[Any, Any], Any], folder: Path | None = None) -> Callable[[Any, Any], Any]:
    """``parse`` (the finder's ``_meta_yml_to_dict``) with ansible.builtin's table kept in ``folder``."""

    def meta_yml_to_dict(yaml_string_data: Any, content_id: Any) -> Any:
        if tuple(content_id or ()) != BUILTIN:
            return parse(yaml_string_data, content_id)
        where = folder or cache_dir()
        if where is None:
            return parse(yaml_string_data, content_id)
        raw = yaml_string_data.encode() if isinstance(yaml_string_data, str) else bytes(yaml_string_data)
        path = where / f"ansible-builtin-runtime-{hashlib.sha256(raw).hexdigest()}.json"
        table = _read(path)
        if table is None:
            table = parse(yaml_string_data, content_id)
            _write(path, table)
        return table

    meta_yml_to_dict.fleetops_cached = True  # type: ignore[attr-defined]
    return meta_yml_to_dict


def install() -> None:
    """Wrap ansible's ``_meta_yml_to_dict`` once (before the finder first reads ansible.builtin's table)."""
    from ansible.utils.collection_loader import _collection_finder

    with _LOCK:
        current = _collection_finder._meta_yml_to_dict
        if current is not None and not getattr(current, "fleetops_cached", False):
            _collection_finder._meta_yml_to_dict = cached(current)
