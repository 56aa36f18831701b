"""Small helpers every layer may use: private files and directories, atomic writes, a zombie-aware
liveness check.

Every file fleetops writes (rollout state, audit log, reports, the scan's ``.partial``, Prometheus
textfiles) may hold secrets or what an attacker would like to know: each is created 0600, and the
directories fleetops keeps them in are 0700 (``private_dir``; an existing looser one is tightened,
with a warning line on stderr).
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import hashlib
import logging
import os
import secrets
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

FILE_MODE = 0o600
DIR_MODE = 0o700
TEMP_ATTEMPTS = 8  # random temp names tried before giving up (each taken one is left alone)
# remediate auto's ladders in its state directory (fleetops.auto.state); a scan reads them for its next steps
LADDER_FILE = "ladder.json"
HOUR_S = 3600  # seconds
DAY_S = 24 * HOUR_S
# The schema ids of the documents fleetops writes and reads back (scan.py, drift.py, api.py, schemas.py).
SCAN_SCHEMA = "fleetops.scan/v1"
SCAN_HOST_SCHEMA = "fleetops.scan.host/v1"  # one line of `fleetops scan --format ndjson`
DRIFT_SCHEMA = "fleetops.drift/v1"
# how a scan reaches its hosts (fleetops.scan.TRANSPORT_HELP says what each does; the report's
# ``transport.name``, schemas.reports.ScanTransport)
ScanTransportName = Literal["auto", "ansible", "ssh"]
SCAN_TRANSPORTS: tuple[str, ...] = get_args(ScanTransportName)
# a merge's ``transport.name`` when its sources were reached by different transports or did not all record theirs
MixedTransport = Literal["mixed"]
MIXED_TRANSPORT: str = get_args(MixedTransport)[0]
PLAN_SCHEMA = "fleetops.plan/v1"
ROLLOUTS_SCHEMA = "fleetops.rollouts/v1"  # `fleetops rollouts --format json`
ROLLOUT_CUT_OFF = "running (no process)"  # `fleetops rollouts`: saved as running, no live process holds it
# A rollout id (it names lock and lease records): rollout.lease.ROLLOUT_ID, schemas' rollout id field.
ROLLOUT_ID_PATTERN = r"^\d{8}T\d{6}Z-[0-9a-f]{6}$"
# The hostvar naming a host's quarantine backend (fleetops.remediations.backends.BACKENDS: its values), and the
# Slurm one's name: here, since every scan asks ``on_slurm`` of its hosts (their nodes read before they answer)
BACKEND_VAR = "fleetops_quarantine_backend"
SLURM_BACKEND = "slurm"
log = logging.getLogger("fleetops")


def iso_utc(ts: float) -> str:
    """A Unix time as fleetops writes times for people and records: ``2026-12-07T06:58:21Z`` (UTC, seconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def private_dir(directory: Path) -> None:
    """Make sure ``directory`` exists and is 0700: created so (parents too), or tightened when it is
    ours and group or others may enter it (one warning line). A directory of another user, or a
    shared sticky one (/tmp), is left as it is."""
    try:
        st = os.stat(directory)
    except FileNotFoundError:
        os.makedirs(directory, DIR_MODE, exist_ok=True)  # every component created is 0700
        return
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(directory))
    loose = stat.S_IMODE(st.st_mode) & 0o077
    if loose and st.st_uid == os.geteuid() and not st.st_mode & stat.S_ISVTX:
        os.chmod(directory, stat.S_IMODE(st.st_mode) & ~0o077)
        log.warning(
            "fleetops: warning: tightened %s from %04o to %04o (it holds rollout state, the audit log "
            "or reports)",
            directory,
            stat.S_IMODE(st.st_mode),
            stat.S_IMODE(st.st_mode) & ~0o077,
        )


DIGEST_HEX = 12  # as plugins/module_utils/systemd.py digest_value (the set_env module's results)


def digest_value(value: str) -> str:
    """What files and output show instead of a secret value: ``sha256:`` and 12 hex digits of its
    SHA-256, the format the set_env module returns (so the two can be compared)."""
    return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:DIGEST_HEX]


# Shorter secrets are replaced only where a whole string equals them: "1" inside "10" is no leak.
MIN_SUBSTRING_SECRET = 4


def redact(data: Any, secrets_: Sequence[str]) -> Any:
    """``data`` (JSON-like) with each string equal to a secret, or containing one at least
    MIN_SUBSTRING_SECRET long, rewritten with ``digest_value`` in its place (keys too)."""
    if not secrets_:
        return data
    exact = {s: digest_value(s) for s in secrets_}
    inner = sorted((s for s in exact if len(s) >= MIN_SUBSTRING_SECRET), key=len, reverse=True)

    def text(value: str) -> str:
        if value in exact:
            return exact[value]
        for secret in inner:
            if secret in value:
                value = value.replace(secret, exact[secret])
        return value

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            return text(value)
        if isinstance(value, dict):
            return {(text(k) if isinstance(k, str) else k): walk(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(v) for v in value]
        return value

    return walk(data)


def open_append(path: Path, *, truncate: bool = False) -> int:
    """A descriptor to append to ``path`` (created 0600; an existing looser file is made 0600), never
    through a symbolic link (O_NOFOLLOW: ELOOP, an OSError, instead)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags | (os.O_TRUNC if truncate else 0), FILE_MODE)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_writable(path: Path) -> str | None:
    """Why fleetops could not write the file ``path`` (its parent missing or not a directory, not
    writable, ``path`` a directory), or None. Checked before any work, so a long scan never ends
    unable to save its report."""
    parent = path.parent
    if path.is_dir():
        return f"{path} is a directory"
    if not parent.exists():
        return f"no such directory {parent}"
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"no permission to create files in {parent}"
    return None


def atomic_write(
    path: Path, data: str | bytes, *, mode: int = FILE_MODE, mkdir: bool = False, exact: bool = False
) -> None:
    """Write ``data`` to ``path`` so a reader sees the old file or the whole new one, never a torn one.

    A temp file with a random name is created with O_EXCL|O_NOFOLLOW (no link followed, no other
    writer's file reused) in the target's directory, written and fsynced, renamed over ``path`` (a
    link at ``path`` is replaced, not followed), and the directory is fsynced so the rename survives
    a crash. ``mode``: the new file's mode before the umask (default 0600); ``exact``: that mode whatever
    the umask (a file another user must read). ``mkdir``: create the directory first (0700; an existing
    one is left as it is: see ``private_dir``).
    """
    if mkdir:
        os.makedirs(path.parent, DIR_MODE, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for attempt in range(TEMP_ATTEMPTS):
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(tmp, flags, mode)
            break
        except FileExistsError:  # something (a planted link?) holds that name: never reuse it
            if attempt == TEMP_ATTEMPTS - 1:
                raise
    try:
        with os.fdopen(fd, "wb") as handle:
            if exact:
                os.fchmod(handle.fileno(), mode)
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


# What tells two processes with the same host name apart (hostNetwork pods, containers that keep the
# host's name): the kernel's boot (a random id per boot of a machine) and the PID namespace (its inode,
# unique on that boot). A PID names a process only within both.
BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
PID_NS_FILE = Path("/proc/self/ns/pid")
PROC_SELF = Path("/proc/self")
UNKNOWN_SPACE = "-"  # process_id's third part where this process's PID space cannot be read


def pid_space() -> str | None:
    """``<boot id>/<PID namespace inode>``: where this process's PID means this process. None when it
    cannot be told (not Linux, /proc unreadable, or /proc mounted for another PID namespace than ours,
    as under ``unshare --pid`` without ``--mount-proc``: its /proc/PID entries are not our PIDs)."""
    try:
        boot = BOOT_ID_FILE.read_text().strip()
        namespace = os.stat(PID_NS_FILE).st_ino
        seen_as = int(os.readlink(PROC_SELF))
    except (OSError, ValueError):
        return None
    if not boot or seen_as != os.getpid():
        return None
    return f"{boot}/{namespace}"


def process_id() -> str:
    """``<hostname>:<pid>:<boot id>/<PID namespace inode>`` (``pid_space``; ``-`` when unknown): the
    process holding a lease or lock, so that a controller on the same machine and in the same PID
    namespace can tell that it died (``dead_here``)."""
    return f"{os.uname().nodename}:{os.getpid()}:{pid_space() or UNKNOWN_SPACE}"


def same_pid_space(host: object, space: object) -> bool:
    """Whether a holder recorded as running on ``host`` in ``space`` (``pid_space``) is on this machine and
    in this PID namespace, so that its PID can be checked here. A holder of an older fleetops (no space
    recorded: ``host:pid``) never is: another container with this host name may hold it, so only its
    expiry or ``--break-lock`` frees it."""
    here = pid_space()
    return here is not None and host == os.uname().nodename and space == here


def dead_here(controller: object) -> bool:
    """Whether ``controller`` (``process_id``) is a process of this machine and PID namespace that no longer
    runs: its lease needs no waiting out (a pass or rollout killed with SIGKILL here is taken over at once).
    Another machine, another PID namespace with the same host name (a hostNetwork pod, a container that
    keeps the host's name), an unknown space or the old ``host:pid`` format: never dead here."""
    if not isinstance(controller, str) or controller.count(":") != 2:
        return False
    host, pid, space = controller.split(":")
    if not pid.isdigit() or int(pid) == os.getpid() or not same_pid_space(host, space):
        return False
    return not pid_alive(int(pid))  # a zombie is dead too; another user's process is alive


def nearest(name: str, known: Iterable[str]) -> str:
    """`` (did you mean X?)`` for the known name closest to ``name`` (the one it starts, or difflib's
    nearest), else ""."""
    names = list(known)
    started = [k for k in names if k.startswith(name)] if name else []
    match = started if len(started) == 1 else difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    return f" (did you mean {match[0]}?)" if match else ""


def on_slurm(hostvars: Mapping[str, Any]) -> bool:
    """Whether the host's hostvars pick the Slurm backend (no check: ``backends.backend_of`` judges the value)."""
    return hostvars.get(BACKEND_VAR) == SLURM_BACKEND
