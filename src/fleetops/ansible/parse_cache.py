"""What every fleetops command parses from files that do not change between commands, kept in a private copy.

A scan's start parsed the same files each time before its first ssh: ansible.builtin's routing table
(``config/ansible_builtin_runtime.yml``, 370 KB of YAML: ~75 ms of CPU, parsed by ansible's collection finder
at the first ``ansible.*`` import it has not seen), ansible's configuration definitions (``config/base.yml``,
~35 ms, read when ``ansible.constants`` is first imported), the collection's Python (``fleetops.node``'s
module_utils and action plugin: ansible's collection loader compiles their source at every import and keeps
no ``.pyc``: ~40 ms) and the constants fleetops reads from the collection's source (``collection.constant``:
an ``ast`` parse of each module, ~20 ms). ``keep`` gives what was derived from the same bytes before: a copy
in the user's cache folder (``$XDG_CACHE_HOME/fleetops``, else ``~/.cache/fleetops``), named by the SHA-256 of
the bytes it was derived from (another ansible-core, an edited module: another name) and written whole (a
temporary file renamed into place), one copy per kind and source file (writing a new one removes the older).

A copy decides what runs (an import redirection, a module's code), so it is read only from a folder and a file
of this user that no one else can write, as Python reads its own ``__pycache__``; anything else (no home, a
read-only one as in some execution environments, a copy that is not valid) and the file is parsed as before.
A copy is written only when reading it back gives what the parse gave.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import marshal
import os
import re
import stat
import sys
import tempfile
import threading
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

BUILTIN = ("ansible.builtin", "runtime.yml")  # the content_id the finder passes for ansible.builtin's table
# Code and marshal's format are this Python's: its cache tag, bytecode magic and -O level name every copy.
PYTHON = f"{sys.implementation.cache_tag}-{importlib.util.MAGIC_NUMBER.hex()}-O{sys.flags.optimize}"
# Copies kept at most: a write past it removes the oldest (each is one source file's: the collections of
# temporary checkouts, as tests make, would otherwise pile up).
MAX_COPIES = 500
_COPY = re.compile(
    r"[a-z][a-z0-9-]*-[0-9a-f]{16}-[0-9a-f]{64}"
)  # a copy's name (keep); the folder holds others
_LOCK = threading.Lock()


def cache_dir() -> Path | None:
    """Where the copies are kept: ``$XDG_CACHE_HOME/fleetops``, else ``~/.cache/fleetops``; None without a home
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


def _read(path: Path) -> bytes | None:
    if not (_private(path.parent, folder=True) and _private(path, folder=False)):
        return None
    try:
        return path.read_bytes()
    except OSError:
        return None


def _write(path: Path, data: bytes, older: str) -> None:
    """``data`` to ``path`` whole (0600 in a 0700 folder), then the other copies matching ``older`` removed."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _private(path.parent, folder=True):
            return
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".kept-")  # 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        for stale in path.parent.glob(older):
            if stale != path:
                with contextlib.suppress(OSError):
                    stale.unlink()
        _trim(path.parent)


def _trim(folder: Path) -> None:
    """The oldest copies removed past MAX_COPIES (by when each was written)."""
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        copies = [e for e in entries if _COPY.fullmatch(e.name) and e.is_file(follow_symlinks=False)]
        if len(copies) <= MAX_COPIES:
            return
        copies.sort(key=lambda e: e.stat(follow_symlinks=False).st_mtime_ns)
        for entry in copies[: len(copies) - MAX_COPIES]:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)


def keep[T](
    kind: str,
    source: str,
    raw: bytes,
    derive: Callable[[], T],
    dump: Callable[[T], bytes],
    load: Callable[[bytes], T],
    folder: Path | None = None,
) -> T:
    """``derive()`` (what ``raw``, the bytes of the file ``source``, gives), or the copy kept of it: the
    copy is named by ``kind``, ``source`` and the SHA-256 of ``raw``; ``load`` raises ValueError (or
    TypeError, EOFError) for a copy that is not what ``dump`` wrote."""
    where = folder or cache_dir()
    if where is None:
        return derive()
    prefix = f"{kind}-{hashlib.sha256(source.encode()).hexdigest()[:16]}-"
    path = where / f"{prefix}{hashlib.sha256(raw).hexdigest()}"
    data = _read(path)
    if data is not None:
        with contextlib.suppress(ValueError, TypeError, EOFError):
            return load(data)
    value = derive()
    try:
        blob = dump(value)
        same = load(blob) == value
    except (ValueError, TypeError, EOFError):
        same = False
    if same:
        _write(path, blob, f"{prefix}*")
    return value


def _json_dict(data: bytes) -> dict[str, Any]:
    found = json.loads(data)
    if not isinstance(found, dict):
        raise ValueError("not a mapping")
    return found


def _json_dump(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def kept_mapping(
    kind: str, source: str, raw: bytes, derive: Callable[[], Any], folder: Path | None = None
) -> Any:
    """``keep`` for a mapping of JSON's types (a parsed YAML document), kept as JSON."""
    return keep(kind, source, raw, derive, _json_dump, _json_dict, folder)


def kept_literals(kind: str, source: str, raw: bytes, derive: Callable[[], Any]) -> Any:
    """``keep`` for a mapping of Python literals (tuples, sets and all: marshal keeps their types)."""

    def load(data: bytes) -> Any:
        found = marshal.loads(data)
        if not isinstance(found, dict):
            raise ValueError("not a mapping")
        return found

    return keep(f"{kind}-{PYTHON}", source, raw, derive, marshal.dumps, load)


def _code(data: bytes) -> types.CodeType:
    found = marshal.loads(data)
    if not isinstance(found, types.CodeType):
        raise ValueError("not code")
    return found


# ---------------------------------------------------------------------------------------------- hooks


def cached(parse: Callable[[Any, Any], Any], folder: Path | None = None) -> Callable[[Any, Any], Any]:
    """``parse`` (the finder's ``_meta_yml_to_dict(data, content_id)``, the hook ansible-core documents for
    tools to replace, "to allow other implementations to cache the output") with ansible.builtin's table
    kept; other collections' tables (a few lines) are parsed as before."""

    def meta_yml_to_dict(yaml_string_data: Any, content_id: Any) -> Any:
        if tuple(content_id or ()) != BUILTIN:
            return parse(yaml_string_data, content_id)
        raw = yaml_string_data.encode() if isinstance(yaml_string_data, str) else bytes(yaml_string_data)
        return kept_mapping(
            "ansible-builtin-runtime",
            "ansible.builtin",
            raw,
            lambda: parse(yaml_string_data, content_id),
            folder,
        )

    meta_yml_to_dict.fleetops_cached = True  # type: ignore[attr-defined]
    return meta_yml_to_dict


def compiled(get_code: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
    """The collection loader's ``get_code`` (it compiles a collection module's source at every import) with
    each module's code kept, by its source and file name (the name is in the code: tracebacks)."""

    def get_code_kept(loader: Any, fullname: str) -> Any:
        if getattr(loader, "_compiled_code", None) or not hasattr(loader, "_compiled_code"):
            return get_code(loader, fullname)
        filename = loader.get_filename(fullname) or "<string>"
        source = loader.get_source(fullname)
        if source is None:
            return get_code(loader, fullname)
        raw = source.encode() if isinstance(source, str) else bytes(source)
        code = keep(
            f"code-{PYTHON}",
            str(filename),
            raw,
            lambda: get_code(loader, fullname),
            marshal.dumps,
            _code,
        )
        loader._compiled_code = code
        return code

    get_code_kept.fleetops_cached = True  # type: ignore[attr-defined]
    return get_code_kept


def install() -> None:
    """Wrap ansible's ``_meta_yml_to_dict`` and its collection loader's ``get_code`` once (before the finder
    first reads ansible.builtin's table or imports a collection's module)."""
    from ansible.utils.collection_loader import _collection_finder

    with _LOCK:
        current = _collection_finder._meta_yml_to_dict
        if current is not None and not getattr(current, "fleetops_cached", False):
            _collection_finder._meta_yml_to_dict = cached(current)
        base = getattr(_collection_finder, "_AnsibleCollectionPkgLoaderBase", None)
        get_code = getattr(base, "get_code", None)
        if get_code is not None and not getattr(get_code, "fleetops_cached", False):
            base.get_code = compiled(get_code)  # type: ignore[union-attr]


def ansible_constants() -> Any:
    """``ansible.constants``; when this process reads ansible's configuration first, its definitions
    (``config/base.yml``, read by ``ConfigManager._read_config_yaml_file``) come from their kept copy."""
    if "ansible.constants" not in sys.modules:
        with _LOCK:
            from ansible.config.manager import ConfigManager

            read = ConfigManager._read_config_yaml_file
            if not getattr(read, "fleetops_cached", False):
                ConfigManager._read_config_yaml_file = _definitions(read)
    import ansible.constants

    return ansible.constants


def _definitions(read: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def read_config_yaml_file(manager: Any, yml_file: Any) -> Any:
        path = os.fsdecode(yml_file)
        try:
            raw = Path(path).read_bytes()
        except OSError:
            return read(manager, yml_file)  # ansible's own error
        return kept_mapping("ansible-config", path, raw, lambda: read(manager, yml_file))

    read_config_yaml_file.fleetops_cached = True  # type: ignore[attr-defined]
    return read_config_yaml_file
