"""The rollouts this controller keeps (``fleetops rollouts``, ``fleetops report ID``): their state files
under the state directory's ``rollouts/``, each named ``<id>-<action>.json``, read, never written.

A rollout whose state says ``running`` but whose locks no live process of this controller holds was cut
off (killed, or its machine restarted): it is listed as ``running (no process)`` — ``fleetops remediate
--resume`` goes on with it. A file that does not load is listed as ``unreadable`` with the reason, so one
bad file hides no other rollout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetops.errors import UsageError
from fleetops.paths import state_home
from fleetops.remediations import REMEDIATIONS
from fleetops.rollout.lease import ROLLOUT_ID
from fleetops.rollout.locks import HostLocks
from fleetops.rollout.state import Rollout
from fleetops.util import ROLLOUT_CUT_OFF as CUT_OFF
from fleetops.util import ROLLOUTS_SCHEMA

_FILE = re.compile(rf"(?P<id>{ROLLOUT_ID.pattern.strip('^$')})-(?P<action>[a-z0-9-]+)\.json")


def rollouts_dir() -> Path:
    return state_home() / "rollouts"


@dataclass(frozen=True)
class RolloutRow:
    """One rollout as ``fleetops rollouts`` lists it."""

    id: str
    action: str
    status: str  # the saved status; CUT_OFF for a running one with no live process; "unreadable"
    apply: bool
    started: float | None
    operator: str
    hosts: int
    done: int
    failed: int
    pending: int
    state: str
    error: str = ""

    def document(self) -> dict[str, Any]:
        return dict(vars(self))


def list_rollouts(directory: Path | None = None) -> list[RolloutRow]:
    """Every rollout kept in ``directory`` (default: the state directory's), newest first."""
    folder = directory or rollouts_dir()
    if not folder.is_dir():
        return []
    live = HostLocks().live_rollouts()
    rows = []
    for path in folder.iterdir():
        found = _FILE.fullmatch(path.name)
        if found is None or not path.is_file():
            continue
        try:
            rollout = Rollout.load(path, actions=REMEDIATIONS)
        except Exception as exc:  # a bad file is listed, never hides the others
            rows.append(
                RolloutRow(
                    found["id"], found["action"], "unreadable", False, None, "", 0, 0, 0, 0, str(path),
                    error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                )
            )  # fmt: skip
            continue
        s = rollout.summary()
        status = CUT_OFF if rollout.status == "running" and rollout.id not in live else rollout.status
        rows.append(
            RolloutRow(
                rollout.id, rollout.action, status, rollout.apply, rollout.created, rollout.operator,
                s["hosts"], s["done"], s["failed"], s["pending"] + s["skipped"], str(path),
            )
        )  # fmt: skip
    return sorted(rows, key=lambda r: r.id, reverse=True)


def rollouts_document(rows: list[RolloutRow]) -> dict[str, Any]:
    """``fleetops rollouts --format json``: ``fleetops.rollouts/v1``."""
    return {"schema": ROLLOUTS_SCHEMA, "rollouts": [r.document() for r in rows]}


def resolve_rollout(ref: str | Path) -> Path:
    """A rollout's state file from what the operator typed: a path to one, or a rollout id kept in the
    state directory (``fleetops rollouts`` lists them); UsageError (exit 2) when neither."""
    path = Path(ref)
    if path.exists() or not ROLLOUT_ID.fullmatch(str(ref)):
        return path  # a path (Rollout.load says what is wrong with one that does not load)
    matches = sorted(rollouts_dir().glob(f"{ref}-*.json")) if rollouts_dir().is_dir() else []
    if len(matches) != 1:
        raise UsageError(
            f"no rollout {ref} in {rollouts_dir()}"
            if not matches
            else f"rollout {ref} has {len(matches)} state files"
        )
    return matches[0]
