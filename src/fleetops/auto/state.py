"""The state directory's files (without a shared store): the ladders, the ledger and the storm brakes,
under the pass lock."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from fleetops.auto.result import (
    PassLockedError,
)
from fleetops.documents import DocumentError, read_json
from fleetops.policy import (
    SPENT_TAG_KEY,
    TAG_KEY,
    BudgetLedger,
    LadderState,
    StateError,
    file_lock,
)
from fleetops.util import LADDER_FILE as LADDER_FILE  # declared there: a scan reads it too
from fleetops.util import atomic_write

LEDGER_FILE = "ledger.json"
BRAKES_FILE = "brakes.json"  # the storm brakes in force, without a shared store
BRAKES_SCHEMA = "fleetops.auto.brakes/v1"
PASS_LOCK_TIMEOUT_S = 2.0  # another pass holds the state: fail at once rather than queue behind it


def load_brakes(path: Path) -> dict[str, dict[str, Any]]:
    """The storm brakes in force (``brakes.json``: rule -> {since, why}); none when there is no file.
    DocumentError (exit 2) when it is not such a document: a brake nobody can read must not vanish."""
    if not path.exists() and not path.is_symlink():
        return {}
    data = read_json(path)
    brakes = data.get("brakes") if isinstance(data, dict) and data.get("schema") == BRAKES_SCHEMA else None
    if not isinstance(brakes, dict) or not all(isinstance(b, dict) for b in brakes.values()):
        raise DocumentError(str(path), f"not a {BRAKES_SCHEMA} document; nothing was done")
    return brakes


def save_brakes(path: Path, brakes: Mapping[str, Mapping[str, Any]]) -> None:
    text = json.dumps({"schema": BRAKES_SCHEMA, "brakes": brakes}, indent=1, sort_keys=True) + "\n"
    atomic_write(path, text, mode=0o600, mkdir=True)


def lift_brake(state_dir: Path, rule: str) -> bool:
    """Remove the brake on ``rule`` from the state directory's brakes (under the pass lock); whether
    there was one."""
    with state_locks(state_dir):
        path = state_dir / BRAKES_FILE
        brakes = load_brakes(path)
        if rule not in brakes:
            return False
        del brakes[rule]
        save_brakes(path, brakes)
        return True


@contextlib.contextmanager
def state_locks(directory: Path) -> Iterator[tuple[Path, Path]]:
    ladder_path, ledger_path = directory / LADDER_FILE, directory / LEDGER_FILE
    try:
        with file_lock(ladder_path, PASS_LOCK_TIMEOUT_S), file_lock(ledger_path, PASS_LOCK_TIMEOUT_S):
            yield ladder_path, ledger_path
    except StateError as exc:
        raise PassLockedError(f"another 'fleetops remediate auto' pass is running: {exc}") from None


# What moving an unreadable state file aside would cost, said with the error.
_ASIDE = {
    LADDER_FILE: f"restarts every ladder from what the EC2 hosts' {TAG_KEY} tags still record (the others "
    "from their first rung)",
    LEDGER_FILE: f"forgets the budgets spent, except what each EC2 host's {SPENT_TAG_KEY} tag records",
}


def load_state(ladder_path: Path, ledger_path: Path) -> tuple[LadderState, BudgetLedger]:
    """Both state files; an unreadable one stops the pass before anything is decided or changed
    (exit 2), saying what moving it aside would cost."""
    path = ladder_path
    try:
        ladder = LadderState.load(path)
        path = ledger_path
        return ladder, BudgetLedger.load(path)
    except DocumentError as exc:
        cost = _ASIDE.get(path.name, "")
        raise DocumentError(
            exc.source, f"{exc.problem}; nothing was done. Moving it aside {cost}", exc.field
        ) from None
