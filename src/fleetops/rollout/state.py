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

from fleetops.errors import FleetopsError, UsageError
from fleetops.exitcodes import ExitCode
from fleetops.paths import state_home
from fleetops.rollout.outcome import HostOutcome
from fleetops.util import atomic_write, digest_value, private_dir, redact

STATE_SCHEMA = "fleetops.rollout.engine-state/v1"
# set-env's values: kept only as digests at rest (state, audit, reports) unless fleetops_show_values
SECRET_ENV_VAR, SHOW_VALUES_VAR, DIGESTED_VAR = (
    "fleetops_env",
    "fleetops_show_values",
    "fleetops_env_digested",
)
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
    # False for a dry run whose state nobody asked for (no --state FILE): it changes nothing, so nothing is
    # saved (``save``): no rollout file to resume, stop or report; its report is its output. Not saved itself.
    keep: bool = field(default=True, repr=False, compare=False)

    def secret_values(self) -> list[str]:
        """The values no file or output may hold: set-env's (``fleetops_env``), unless it was asked to
        show them (``--show-values``) or they are digests already (a loaded state)."""
        env = self.extravars.get(SECRET_ENV_VAR)
        if (
            not isinstance(env, dict)
            or self.extravars.get(SHOW_VALUES_VAR)
            or self.extravars.get(DIGESTED_VAR)
        ):
            return []
        return [str(v) for v in env.values() if v is not None and str(v) != ""]

    def redact_outcome(self, outcome: dict[str, Any]) -> dict[str, Any]:
        """A host outcome's saved form (``HostOutcome.to_dict``) with any secret value in what the host
        said (msg, result, before, after, notes) replaced by its digest; status and gate are fleetops'
        own words and left alone. (The set_env module digests its results itself: this is the net.)"""
        secrets = self.secret_values()
        if not secrets:
            return outcome
        said = ("msg", "result", "before", "after", "notes")
        return {k: (redact(v, secrets) if k in said else v) for k, v in outcome.items()}

    def to_dict(self) -> dict[str, Any]:
        """The state as saved: set-env's values digested (``sha256:<12 hex>``, as the module shows them)."""
        data = asdict(self)
        del data["keep"]
        data["results"] = {h: self.redact_outcome(o.to_dict()) for h, o in self.results.items()}
        if self.secret_values():
            env = self.extravars[SECRET_ENV_VAR]
            data["extravars"] = {
                **data["extravars"],
                SECRET_ENV_VAR: {k: digest_value(str(v)) for k, v in env.items()},
                DIGESTED_VAR: True,
            }
        return data

    def save(self) -> None:
        """Write the state atomically, 0600 in a 0700 directory (the state home tightened if looser).

        A dry run saves nothing unless its state file was named (``keep``)."""
        if not self.keep:
            return
        path = Path(self.state_path)
        home = state_home()
        if path.parent == home or home in path.parent.parents:
            private_dir(home)
            private_dir(path.parent)
        atomic_write(path, json.dumps(self.to_dict(), indent=2) + "\n", mkdir=True)

    def check_resumable(self) -> None:
        """Refuse to resume a set-env rollout whose values were kept only as digests (a digest is not
        a value to set): the operator runs it again with the same --env (done hosts stay unchanged)."""
        if self.extravars.get(DIGESTED_VAR):
            raise UsageError(
                f"cannot resume rollout {self.id}: its set-env values are kept only as digests (secrets are "
                "not stored); run `fleetops remediate set-env` again with the same --env (hosts already "
                "done stay unchanged: setting the same values again changes nothing)"
            )

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
        keep=apply or state_path is not None,
    )
    rollout.hosts = {h: HOST_PENDING for b in plan["batches"] for h in b}
    return rollout
