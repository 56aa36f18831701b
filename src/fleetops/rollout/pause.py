"""The pause on one controller, for a fleet without a shared store: ``fleetops pause`` when the inventory
names no ``store_table`` writes ``<state home>/pause.json`` (who, when, why), and every rollout and auto
pass of this controller honours it as they honour the store's pause (a rollout stops before its next
batch, a pass acts on nothing: exit 5) until ``fleetops unpause`` removes it. Other controllers do not
see it: a fleet with several controllers (or AWX containers, whose state directory starts empty each
job) needs the store's pause.

Fail safe: a pause file that exists but cannot be read (garbage, a link, not a regular file, another
schema) still means paused, and says so; only ``fleetops unpause`` lifts it. Written atomically (0600
in the 0700 state directory) without following links (``util.atomic_write``).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from fleetops.paths import state_home
from fleetops.rollout.killswitch import one_line
from fleetops.util import atomic_write, iso_utc, private_dir
from fleetops.values import CAUSE_MAX

PAUSE_FILE = "pause.json"
SCHEMA = "fleetops.pause/v1"
MAX_BYTES = 64 * 1024
REASON_MAX = CAUSE_MAX  # the CLI refuses a longer --reason (values.cause): none given is cut


def reason_line(text: str) -> str:
    """A person's reason as one printable line (the kill switch's rule), or "no reason given"."""
    return one_line(text, REASON_MAX) or "no reason given"


@dataclass(frozen=True)
class PauseRecord:
    """A pause in force: the shared store's or this controller's."""

    operator: str
    since: float
    reason: str

    def describe(self) -> str:
        return f"automation paused by {self.operator} at {iso_utc(self.since)}: {self.reason}"


def pause_path(directory: Path | None = None) -> Path:
    return (directory or state_home()) / PAUSE_FILE


def local_pause(directory: Path | None = None) -> PauseRecord | None:
    """This controller's pause, or None. A file there that does not read as one is a pause too."""
    path = pause_path(directory)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:  # a link (ELOOP), no permission: something is there
        return _unreadable(path, exc.strerror or str(exc))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return _unreadable(path, "not a regular file", st.st_mtime)
        raw = os.read(fd, MAX_BYTES)
    finally:
        os.close(fd)
    try:
        doc = json.loads(raw)
        if doc.get("schema") != SCHEMA:
            raise ValueError(f"schema {doc.get('schema')!r}")
        return PauseRecord(str(doc["operator"]), float(doc["since"]), str(doc.get("reason") or ""))
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        return _unreadable(path, f"not a pause record ({type(exc).__name__})", st.st_mtime)


def _unreadable(path: Path, why: str, since: float = 0.0) -> PauseRecord:
    return PauseRecord(
        "unknown", since, f"unreadable pause file {path}: {why} (still paused: fleetops unpause lifts it)"
    )


def pause_here(operator: str, reason: str, directory: Path | None = None) -> tuple[PauseRecord, bool]:
    """Pause this controller; ``(the pause in force, whether this call set it)``: a pause already there,
    readable or not, is kept (its who and why stay true)."""
    current = local_pause(directory)
    if current is not None:
        return current, False
    record = PauseRecord(operator, time.time(), reason_line(reason))
    path = pause_path(directory)
    private_dir(path.parent)
    doc = {"schema": SCHEMA, **vars(record), "since_at": iso_utc(record.since)}
    atomic_write(path, json.dumps(doc, sort_keys=True) + "\n")
    return record, True


def unpause_here(directory: Path | None = None) -> PauseRecord | None:
    """Lift this controller's pause; the pause lifted (an unreadable one too), or None when there was none."""
    current = local_pause(directory)
    if current is not None:
        with contextlib.suppress(FileNotFoundError):
            pause_path(directory).unlink()
    return current
