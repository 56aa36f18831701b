"""Small, typed wrappers over the host facilities the lab uses: commands, processes, mounts, cgroups, links.

Everything here acts on names and paths the caller passes; nothing here knows lab policy.
Processes are always signalled by PID after checking what they are (never by name).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from fleetops.util import atomic_write, pid_alive
from fleetops_lab.errors import LabError

__all__ = ["pid_alive"]  # re-exported: the lab's callers use system.pid_alive

# --------------------------------------------------------------------------- commands


def run_cmd(
    argv: Sequence[str],
    *,
    what: str,
    check: bool = True,
    timeout: float = 60.0,
    input_text: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command, capture its output; on failure raise LabError("Failed to <what>: <cause>")."""
    try:
        proc = subprocess.run(
            list(argv),
            input=input_text,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=env,
            stdin=None if input_text is not None else subprocess.DEVNULL,
        )
    except FileNotFoundError:
        raise LabError(f"Failed to {what}: command not found: {argv[0]}") from None
    except subprocess.TimeoutExpired:
        raise LabError(f"Failed to {what}: {argv[0]} did not finish within {timeout:g} s") from None
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        cause = detail[-1] if detail else f"exit status {proc.returncode}"
        raise LabError(f"Failed to {what}: {cause}")
    return proc


def tail(path: Path, lines: int = 15) -> str:
    """The last lines of a log file ('' when it cannot be read)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 16384))
            data = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def write_text_atomic(path: Path, text: str | bytes, mode: int = 0o644) -> None:
    """Write a file by rename (the product's one atomic writer), with exactly ``mode``."""
    atomic_write(path, text, mode=mode)
    os.chmod(path, mode)


# --------------------------------------------------------------------------- processes


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0")[:-1]]


def all_pids() -> Iterator[int]:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            yield int(entry.name)


def read_pid_file(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def send_signal(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


# --------------------------------------------------------------------------- mounts


@dataclass(frozen=True)
class Mount:
    mount_id: int
    mountpoint: Path
    fstype: str
    source: str
    super_options: str


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo
    out, i = [], 0
    while i < len(field):
        code = field[i + 1 : i + 4]
        if field[i] == "\\" and len(code) == 3 and code.isdigit():
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail_fields = left.split(), right.split()
        if len(fields) < 5 or len(tail_fields) < 3:
            continue
        mounts.append(
            Mount(
                mount_id=int(fields[0]),
                mountpoint=Path(_unescape(fields[4])),
                fstype=tail_fields[0],
                source=_unescape(tail_fields[1]),
                super_options=_unescape(tail_fields[2]),
            )
        )
    return mounts


def mounts() -> list[Mount]:
    return parse_mountinfo(Path("/proc/self/mountinfo").read_text())


def is_under(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def mounts_under(path: Path) -> list[Mount]:
    return [m for m in mounts() if is_under(m.mountpoint, path)]


def unmount_under(path: Path, *, what: str) -> None:
    """Unmount everything at or below path, deepest (and most recent) first; lazily if busy."""
    for _ in range(20):
        found = mounts_under(path)
        if not found:
            return
        found.sort(key=lambda m: (len(m.mountpoint.parts), m.mount_id), reverse=True)
        for mount in found:
            proc = run_cmd(["umount", str(mount.mountpoint)], what=what, check=False)
            if proc.returncode != 0:
                run_cmd(["umount", "--lazy", str(mount.mountpoint)], what=what, check=False)
    left = mounts_under(path)
    if left:
        raise LabError(f"Failed to {what}: still mounted: {left[0].mountpoint}")


# --------------------------------------------------------------------------- cgroups

CGROUP_ROOT = Path("/sys/fs/cgroup")
# The hierarchies a lab host gets its own cgroup in (design §7): systemd's own v1 tree, the cgroup2
# tree a hybrid systemd uses, and the memory and pids controllers.
CGROUP_HIERARCHIES = ("systemd", "unified", "memory", "pids")


def cgroup_paths(rel: str) -> list[Path]:
    return [CGROUP_ROOT / hier / rel for hier in CGROUP_HIERARCHIES]


def missing_hierarchies() -> list[str]:
    return [h for h in CGROUP_HIERARCHIES if not (CGROUP_ROOT / h / "cgroup.procs").exists()]


def cgroup_create(rel: str) -> None:
    for path in cgroup_paths(rel):
        path.mkdir(parents=True, exist_ok=True)


def cgroup_join_self(rel: str) -> None:
    """Move the calling process into rel in every hierarchy (for a child before exec)."""
    for path in cgroup_paths(rel):
        (path / "cgroup.procs").write_text("0\n")


def _walk_dirs(top: Path) -> list[Path]:
    """top and its sub-directories, deepest first (for rmdir); [] when top is missing."""
    if not top.is_dir():
        return []
    found: list[Path] = []
    for dirpath, _dirnames, _files in os.walk(top, topdown=False):
        found.append(Path(dirpath))
    return found


def cgroup_pids(rel: str) -> set[int]:
    """Every process in rel or below it, in any of the hierarchies."""
    pids: set[int] = set()
    for top in cgroup_paths(rel):
        for path in _walk_dirs(top):
            with contextlib.suppress(OSError):
                pids.update(int(x) for x in (path / "cgroup.procs").read_text().split())
    return pids


def cgroup_prune(rel: str, *, keep_top: bool) -> list[Path]:
    """rmdir empty cgroups at or below rel, deepest first; returns those that could not be removed."""
    left = []
    for top in cgroup_paths(rel):
        for path in _walk_dirs(top):
            if keep_top and path == top:
                continue
            # v1 memory: reclaim the page cache still charged here (the shared rootfs' pages are
            # charged to the host that read them first), or rmdir leaves a dying "zombie" memcg.
            force_empty = path / "memory.force_empty"
            if force_empty.exists():
                with contextlib.suppress(OSError):
                    force_empty.write_text("0\n")
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                left.append(path)
    return left


# --------------------------------------------------------------------------- network


def link_names() -> list[str]:
    try:
        return sorted(os.listdir("/sys/class/net"))
    except OSError:
        return []


def link_exists(name: str) -> bool:
    return os.path.lexists(f"/sys/class/net/{name}")


NETNS_DIR = Path("/run/netns")


def netns_names() -> list[str]:
    try:
        return sorted(os.listdir(NETNS_DIR))
    except OSError:
        return []


def subnet_clash(network: ipaddress.IPv4Network, own_link: str) -> str | None:
    """An IPv4 address or route of this machine, on a link other than ``own_link``, that overlaps
    ``network`` (the default route aside), said as ``ip`` would; None when there is none."""
    addrs = json.loads(run_cmd(["ip", "-j", "-4", "addr", "show"], what="list addresses").stdout or "[]")
    for link in addrs:
        if link.get("ifname") == own_link:
            continue
        for info in link.get("addr_info", []):
            with contextlib.suppress(KeyError, ValueError):
                net = ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False)
                if net.overlaps(network):
                    return f"address {info['local']}/{info['prefixlen']} on {link.get('ifname')}"
    routes = json.loads(run_cmd(["ip", "-j", "-4", "route", "show"], what="list routes").stdout or "[]")
    for route in routes:
        dst, dev = route.get("dst", ""), route.get("dev")
        if dst == "default" or dev == own_link:
            continue
        with contextlib.suppress(ValueError):
            if ipaddress.IPv4Network(dst, strict=False).overlaps(network):
                return f"route {dst} dev {dev}" if dev else f"route {dst}"
    return None
