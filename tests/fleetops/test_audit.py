"""The audit log records every change's before and after from the module results, and a rollout never
goes on unaudited (the engine with a stand-in batch runner: no hosts on this machine)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from fleetops.ansible.runner import PlaybookRun, TaskResult
from fleetops.exitcodes import ExitCode
from fleetops.rollout.audit import AuditError, ensure_writable, entry_of
from fleetops.rollout.engine import Engine, NullObserver
from fleetops.rollout.outcome import host_outcome
from fleetops.rollout.state import Rollout, new_rollout

FIX_ACTIONS = ("fleetops.node.disable_unit", "fleetops.node.reclaim_memcg", "fleetops.node.set_env")


def _rollout(tmp_path: Path, action: str, batches: list[list[str]], extravars: dict[str, Any]) -> Rollout:
    return new_rollout(action=action, apply=True, inventory=[], extravars=extravars,
                       plan={"schema": "fleetops.plan/v1", "batches": batches}, max_failures=0, cooldown=0.0,
                       gate=False, state_path=tmp_path / "state.json")  # fmt: skip


def _fix_results(host: str) -> list[TaskResult]:
    """What remediate_fix.yml's three tasks answer (loop tasks: one result per item under "results")."""
    disabled = {"changed": True, "results": [
        {"changed": True, "unit": "ecs.service", "before": {"active": "active", "enabled": "enabled"},
         "after": {"active": "inactive", "enabled": "masked"}},
    ]}  # fmt: skip
    set_env = {"changed": True, "results": [
        {"changed": True, "unit": "trainer.service", "env_before": {},
         "env_after": {"UCX_MEM_MMAP_HOOK_MODE": "none"}, "restarted": True},
    ]}  # fmt: skip
    reclaim = {"changed": True, "reclaimed": True, "freed": 4000, "needs_reboot": False,
               "before": {"zombies": 5000}, "after": {"zombies": 1000}}  # fmt: skip
    return [
        TaskResult(host, "ok", "disable", FIX_ACTIONS[0], disabled),
        TaskResult(host, "ok", "set env", FIX_ACTIONS[2], set_env),
        TaskResult(host, "ok", "reclaim", FIX_ACTIONS[1], reclaim),
    ]


def test_a_fix_records_each_steps_before_and_after(tmp_path: Path) -> None:
    rollout = _rollout(tmp_path, "fix", [["h1"]], {})
    entry = entry_of(rollout, "h1", host_outcome(_fix_results("h1"), FIX_ACTIONS))
    assert entry["steps"] == [
        {"step": "disable-unit ecs.service", "before": {"active": "active", "enabled": "enabled"},
         "after": {"active": "inactive", "enabled": "masked"}, "changed": True},
        {"step": "set-env trainer.service", "before": {"env": {}},
         "after": {"env": {"UCX_MEM_MMAP_HOOK_MODE": "none"}, "restarted": True}, "changed": True},
        {"step": "reclaim", "before": {"zombies": 5000}, "after": {"zombies": 1000}, "changed": True},
    ]  # fmt: skip
    assert entry["result"] == {"status": "ok", "changed": True}


def test_a_single_step_is_the_entrys_before_and_after(tmp_path: Path) -> None:
    rollout = _rollout(tmp_path, "reclaim", [["h1"]], {})
    outcome = host_outcome([_fix_results("h1")[2]], ("fleetops.node.reclaim_memcg",))
    entry = entry_of(rollout, "h1", outcome)
    assert (entry["before"], entry["after"]) == ({"zombies": 5000}, {"zombies": 1000})
    assert "steps" not in entry


class Runner:
    def __init__(self, before_batch: Callable[[int], None]) -> None:
        self.batches = 0
        self.before_batch = before_batch

    def __call__(
        self,
        hosts: Sequence[str],
        extravars: dict[str, Any],
        *,
        check: bool,
        on_result: Callable[[TaskResult], None] | None,
        cancel: threading.Event | None,
    ) -> PlaybookRun:
        self.batches += 1
        self.before_batch(self.batches)
        run = PlaybookRun(status="successful", rc=0)
        for host in hosts:
            run.tasks[host] = _fix_results(host)
        return run


def test_an_unwritable_audit_log_stops_the_rollout_with_its_state_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "audit.jsonl"
    monkeypatch.setenv("FLEETOPS_AUDIT_LOG", str(log))
    outside = tmp_path / "outside"
    outside.write_text("")

    def second_batch_breaks_the_log(n: int) -> None:
        if n == 2:  # the log is swapped for a link (or the disk is gone): no line can be written
            log.rename(tmp_path / "audit.before")
            log.symlink_to(outside)

    runner = Runner(second_batch_breaks_the_log)
    rollout = _rollout(tmp_path, "fix", [["h1"], ["h2"], ["h3"]], {})
    engine = Engine(rollout=rollout, actions=FIX_ACTIONS, runner=runner,
                    scanner=lambda hosts: {}, observer=NullObserver())  # fmt: skip
    with pytest.raises(AuditError, match=r"Failed to write the audit log .*audit\.jsonl") as err:
        engine.run()
    assert err.value.exit_code == ExitCode.FAILED
    assert runner.batches == 2  # no third batch
    before = [json.loads(ln) for ln in (tmp_path / "audit.before").read_text().splitlines()]
    assert [e["host"] for e in before] == ["h1"] and len(before[0]["steps"]) == 3
    assert outside.read_text() == ""  # the link was not followed
    saved = json.loads((tmp_path / "state.json").read_text())
    assert saved["status"] == "stopped"
    assert "audit log could not be written" in saved["stopped"]["reason"]
    assert saved["stopped"]["pending"] == ["h3"] and saved["hosts"]["h1"] == "done"


def test_a_rollout_does_not_start_when_the_audit_log_cannot_be_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("FLEETOPS_AUDIT_LOG", str(tmp_path / "file" / "audit.jsonl"))
    with pytest.raises(AuditError, match=r"Failed to open the audit log .*nothing was changed"):
        ensure_writable()
    monkeypatch.setenv("FLEETOPS_AUDIT_LOG", str(tmp_path / "audit.jsonl"))
    ensure_writable()
    assert (tmp_path / "audit.jsonl").read_text() == ""
