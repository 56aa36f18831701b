"""One host's outcome in a batch, read from its task results (typed, immutable: changes make a new one)."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fleetops.ansible.runner import TaskResult


@dataclass(frozen=True)
class HostOutcome:
    """What happened to a host: ``status`` ok | failed | unreachable | skipped | running (in flight).

    ``before`` / ``after``: what the playbook read before and after acting (a reboot's boot ids);
    ``gate``: why the host failed its gate (None: passed, or not gated); ``notes``: what the
    playbook said for the operator.
    """

    status: str
    changed: bool = False
    msg: str | None = None
    result: dict[str, Any] | None = None
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    gate: str | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        """Ran and passed its gate."""
        return self.status == "ok" and not self.gate

    def with_changes(self, **changes: Any) -> HostOutcome:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The state file's and report's form (absent keys: not known)."""
        out: dict[str, Any] = {"status": self.status, "changed": self.changed}
        for key in ("msg", "result", "before", "after", "gate"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.notes:
            out["notes"] = list(self.notes)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HostOutcome:
        return cls(
            status=str(data.get("status") or "failed"),
            changed=bool(data.get("changed")),
            msg=None if data.get("msg") is None else str(data["msg"]),
            result=data.get("result"),
            before=data.get("before"),
            after=data.get("after"),
            gate=data.get("gate"),
            notes=tuple(str(n) for n in data.get("notes") or ()),
        )

    def task_results(self) -> list[dict[str, Any]]:
        """The remediation's module results (one, or each task's for a multi-task remediation)."""
        result = self.result or {}
        results = result.get("tasks") if "tasks" in result else [result]
        return [r for r in results or [] if isinstance(r, dict)]


def _slim(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if not k.startswith("_ansible") and k != "invocation"}


def boot_ids(results: Sequence[TaskResult]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(before, after) boot ids when the playbook read them (rolling_reboot.yml slurps the boot id)."""
    ids = [
        base64.b64decode(tr.result["content"]).decode().strip()
        for tr in results
        if tr.action == "ansible.builtin.slurp"
        and tr.status == "ok"
        and isinstance(tr.result.get("content"), str)
    ]
    if not ids:
        return None, None
    return {"boot_id": ids[0]}, ({"boot_id": ids[-1]} if len(ids) > 1 else None)


def notes_of(results: Sequence[TaskResult]) -> tuple[str, ...]:
    """What the playbook said for the operator: ``debug`` messages that start with ``fleetops:``."""
    return tuple(
        str(tr.result["msg"]).removeprefix("fleetops:").strip()
        for tr in results
        if tr.action in ("ansible.builtin.debug", "debug")
        and tr.status == "ok"
        and str(tr.result.get("msg", "")).startswith("fleetops:")
    )


def host_outcome(results: Sequence[TaskResult], actions: tuple[str, ...]) -> HostOutcome:
    """One host's outcome in a batch, from its task results (changed when any remediation task changed).

    A failure's message is the last failed task's: a block's rescue that fails the host explains why.
    """
    before, after = boot_ids(results)
    common: dict[str, Any] = {"before": before, "after": after, "notes": notes_of(results)}
    for tr in results:
        if tr.status == "unreachable":
            return HostOutcome(status="unreachable", msg=tr.msg, **common)
    failed = next((tr for tr in reversed(results) if tr.status == "failed"), None)
    if failed is not None:
        return HostOutcome(status="failed", msg=failed.msg, result=_slim(failed.result), **common)
    done = [tr for tr in results if tr.action in actions and tr.status == "ok"]
    if not done and not any(tr.action in actions for tr in results):
        return HostOutcome(status="failed", msg="the remediation task did not run", **common)
    return HostOutcome(
        status="ok",
        changed=any(bool(tr.result.get("changed")) for tr in done),
        result=_slim(done[0].result) if len(done) == 1 else {"tasks": [_slim(tr.result) for tr in done]},
        **common,
    )
