"""Small helpers every layer may use: atomic writes and a zombie-aware liveness check."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def atomic_write(path: Path, data: str | bytes, *, mode: int = 0o666, mkdir: bool = False) -> None:
    """Write ``data`` to ``path`` so a reader sees the old file or the whole new one, never a torn one.

    A temp file is created with O_EXCL (no link followed, no other writer's file reused) in the target's
    directory, written and fsynced, renamed over ``path``, and the directory is fsynced so the rename
    survives a crash. ``mode`` is the new file's mode before the umask (0o666: as ``open("w")``).
    """
    if mkdir:
        path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def pid_alive(pid: int) -> bool:
    """True when process ``pid`` exists and is not a zombie (state Z or X in /proc/PID/stat)."""
    if pid <= 0:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # "pid (comm) S ...": comm may hold spaces and parentheses; the state follows the last ')'.
    fields = stat[stat.rfind(")") + 1 :].split()
    return bool(fields) and fields[0] not in ("Z", "X")
