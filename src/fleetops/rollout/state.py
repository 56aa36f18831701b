"""A rollout's state on disk: what it plans, where each host stands, what happened (resumable)."""

from __future__ import annotations

import getpass
import json
import os
import socket
import time
import uuid
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fleetops.errors import FleetopsError
from fleetops.exitcodes import ExitCode
from fleetops.rollout.outcome import HostOutcome
from fleetops.util import atomic_write

STATE_SCHEMA = "fleetops.rollout.engine-state/v1"
HOST_PENDING, HOST_RUNNING, HOST_DONE, HOST_FAILED, HOST_SKIPPED = (
    "pending",
    "running",
    "done",
    "failed",
    "skipped",
)


class RolloutError(FleetopsError):
    """The rollout cannot start or continue (bad state file, preflight refused)."""

    exit_code = ExitCode.FAILED


def state_home() -> Path:
    """Where rollouts keep state, locks and the audit log ($FLEETOPS_STATE_DIR overrides)."""
    env = os.environ.get("FLEETOPS_STATE_DIR")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/fleetops")
    return Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "fleetops"


def operator() -> str:
    """Who is acting: the sudo user behind root when there is one, and the machine."""
    user = os.environ.get("SUDO_USER") or os.environ.get("FLEETOPS_OPERATOR") or getpass.getuser()
    return f"{user}@{socket.gethostname()}"


@dataclass
class Rollout:
    """Everything needed to report on a rollout or resume it, saved after every step."""

    id: str
    action: str
    apply: bool
    inventory: list[str]
    extravars: dict[str, Any]
    plan: dict[str, Any]
    max_failures: int
    cooldown: float
    gate: bool
    state_path: str
    operator: str = field(default_factory=operator)
    created: float = field(default_factory=time.time)
    status: str = "running"  # running | done | stopped | interrupted | refused
    hosts: dict[str, str] = field(default_factory=dict)  # host -> pending|running|done|failed|skipped
    results: dict[str, HostOutcome] = field(default_factory=dict)  # host -> last outcome
    batches: list[dict[str, Any]] = field(default_factory=list)  # {"hosts", "started", "finished"}
    preflight: dict[str, str | None] = field(default_factory=dict)  # host -> None or why unreachable
    stopped: dict[str, Any] | None = None
    # EC2 tag lease: {"ttl": seconds, "instances": {host: {"instance", "region"}}}; None: not EC2
    lease: dict[str, Any] | None = None
    schema: str = STATE_SCHEMA

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["results"] = {h: o.to_dict() for h, o in self.results.items()}
        return data

    def save(self) -> None:
        atomic_write(Path(self.state_path), json.dumps(self.to_dict(), indent=2) + "\n", mkdir=True)

    @classmethod
    def load(cls, path: Path, actions: Collection[str] | None = None) -> Rollout:
        """The rollout saved at ``path``, validated (``fleetops.schemas.load_state``): a missing,
        truncated or foreign file is a ``DocumentError`` (one line, exit 2). ``actions``: the
        remediations this fleetops knows; a state naming another one is refused too."""
        from fleetops import schemas  # pydantic costs ~0.2 s: only commands that read a state pay it

        data = schemas.load_state(path, actions)
        known = set(cls.__dataclass_fields__)
        fields = {k: v for k, v in data.items() if k in known}
        fields["results"] = {
            str(h): HostOutcome.from_dict(o)
            for h, o in (data.get("results") or {}).items()
            if isinstance(o, dict)
        }
        rollout = cls(**fields)
        rollout.state_path = str(path)
        return rollout

    def result(self, host: str) -> HostOutcome | None:
        return self.results.get(host)

    def failures(self) -> int:
        return sum(1 for s in self.hosts.values() if s == HOST_FAILED)

    def pending(self) -> list[str]:
        return [
            h for b in self.plan["batches"] for h in b if self.hosts.get(h) in (HOST_PENDING, HOST_RUNNING)
        ]

    def summary(self) -> dict[str, int]:
        counts = {"hosts": len(self.hosts), "done": 0, "failed": 0, "pending": 0, "skipped": 0, "changed": 0}
        for host, status in self.hosts.items():
            key = HOST_PENDING if status == HOST_RUNNING else status
            counts[key] = counts.get(key, 0) + 1
            outcome = self.results.get(host)
            counts["changed"] += bool(outcome is not None and outcome.changed)
        return counts


def new_rollout(
    *,
    action: str,
    apply: bool,
    inventory: Sequence[Path],
    extravars: dict[str, Any],
    plan: dict[str, Any],
    max_failures: int,
    cooldown: float,
    gate: bool,
    state_path: Path | None,
) -> Rollout:
    rid = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:6]
    path = state_path or state_home() / "rollouts" / f"{rid}-{action}.json"
    rollout = Rollout(
        id=rid,
        action=action,
        apply=apply,
        inventory=[str(p.resolve()) for p in inventory],
        extravars=extravars,
        plan=plan,
        max_failures=max_failures,
        cooldown=cooldown,
        gate=gate,
        state_path=str(path),
    )
    rollout.hosts = {h: HOST_PENDING for b in plan["batches"] for h in b}
    return rollout
