"""`fleetops remediate auto`'s pass (fleetops.auto.run_pass): decide, act through an injected runner,
record ladders and budgets, climb on later passes.

The actions' rollouts are a recorded stand-in here (the engine, ansible and the lab hosts are proven
by tests/integration/test_auto_lab.py); the policy, its state files and their locks are real.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from fleetops import auto
from fleetops.documents import DocumentError
from fleetops.errors import FleetopsError, UsageError
from fleetops.exitcodes import ExitCode
from fleetops.policy import (
    SPENT_TAG_KEY,
    TAG_KEY,
    LadderState,
    Policy,
    default_policy_path,
    file_lock,
    load_policy,
    parse_policy,
)
from fleetops.remediations import REMEDIATIONS

H = 3600.0
T0 = 1_800_000_000.0


def ecc(host_gpus: int = 1) -> dict[str, Any]:
    return {
        "check": "gpu_health",
        "severity": "critical",
        "summary": "GPU 0: 2 uncorrectable ECC errors",
        "data": {"gpus": [{"index": 0, "ecc_uncorrected_volatile": 2}], "xid": {}},
    }


CRASHLOOP = {"check": "crashloop_unit", "severity": "warning", "summary": "ecs.service restarts", "data": {}}
UCX = {
    "check": "ucx_mmap_hooks",
    "severity": "warning",
    "summary": "UCX hooks",
    "data": {"fixable_unit": True},
}


def report(**hosts: list[dict[str, Any]] | str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, findings in hosts.items():
        if isinstance(findings, str):
            out[name] = {"status": findings, "msg": "ssh: connection refused"}
        else:
            out[name] = {"status": "ok", "findings": findings}
    return {"hosts": out}


class Runner:
    """Records each action's rollout; ``fail`` hosts end failed, ``raises`` actions raise."""

    def __init__(self, fail: Sequence[str] = (), raises: Mapping[str, Exception] | None = None) -> None:
        self.calls: list[tuple[str, list[str], dict[str, Any]]] = []
        self.fail = set(fail)
        self.raises = dict(raises or {})

    def __call__(self, action: str, hosts: Sequence[str], params: Mapping[str, Any]) -> auto.ActionRun:
        self.calls.append((action, list(hosts), dict(params)))
        if action in self.raises:
            raise self.raises[action]
        done = frozenset(h for h in hosts if h not in self.fail)
        return auto.ActionRun(
            action,
            tuple(hosts),
            params,
            attempted=frozenset(hosts),
            done=done,
            exit_code=ExitCode.OK if done == set(hosts) else ExitCode.FAILED,
        )


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Batches(Runner):
    """A rollout that takes time: a canary of one host, then ``gap`` seconds (cooldown, gate) before each
    further batch of ``size`` hosts, on ``clock``; ``acts`` records when each host was acted on. ``tell``:
    the run reports those times (``ActionRun.acted``, as api.auto reads them from the rollout's batches)."""

    def __init__(self, clock: Clock, gap: float, size: int = 1, tell: bool = True) -> None:
        super().__init__()
        self.clock, self.gap, self.size, self.tell = clock, gap, size, tell
        self.acts: list[tuple[float, str, str]] = []

    def __call__(self, action: str, hosts: Sequence[str], params: Mapping[str, Any]) -> auto.ActionRun:
        self.calls.append((action, list(hosts), dict(params)))
        batches = [list(hosts[:1])] + [
            list(hosts[i : i + self.size]) for i in range(1, len(hosts), self.size)
        ]
        for index, batch in enumerate(batches):
            if index:
                self.clock.now += self.gap
            self.acts.extend((self.clock.now, action, h) for h in batch)
        return auto.ActionRun(
            action,
            tuple(hosts),
            params,
            attempted=frozenset(hosts),
            done=frozenset(hosts),
            **({"acted": {h: t for t, _a, h in self.acts}} if self.tell else {}),
        )

    def most_in_a_window(self, action: str, window: float) -> int:
        """The most ``action`` acts any window of ``window`` seconds holds."""
        times = sorted(t for t, a, _h in self.acts if a == action)
        return max((sum(1 for u in times if t <= u < t + window) for t in times), default=0)


# a reboot budget of 2 an hour, and nothing else in the way (no floor, no storm brake at 3 hosts)
REBOOT_POLICY = """
schema: fleetops.policy/v1
storm: {min_hosts: 10}
budgets:
  reboot: {window: 1h, max: 2}
rules:
  - name: gpu-fatal
    match: [{check: gpu_health, severity: [critical]}]
    ladder:
      - {action: reboot, clear_after: 10m}
      - {action: human}
"""


def without_floor(policy: Policy) -> Policy:
    """The policy without its capacity floor: these tests are about ladders and budgets on fleets of a few
    hosts in one group, where the default floor (half a group stays in service) holds most actions."""
    return policy.model_copy(update={"floor": None})


def run(
    tmp_path: Path,
    scan: dict[str, Any],
    runner: Runner,
    now: float,
    *,
    apply: bool = True,
    policy_text: str | None = None,
    groups: Mapping[str, str | None] | None = None,
    tags: Mapping[str, auto.TagTarget] | None = None,
    clock: Clock | None = None,
) -> tuple[auto.PassResult, list[str]]:
    lines: list[str] = []
    if clock is not None:
        clock.now = now
    # the default policy's capacity floor (proven in test_floors.py) would hold these small one-group fleets
    policy = (
        parse_policy(policy_text, "policy.yml")
        if policy_text
        else without_floor(load_policy(default_policy_path()))
    )
    inputs = auto.PassInputs(
        policy=policy,
        policy_source="policy.yml",
        scan_report=scan,
        group_of=dict(groups) if groups is not None else {h: "az-a" for h in scan["hosts"]},
        state_dir=tmp_path / "auto",
        apply=apply,
        tags=dict(tags or {}),
    )
    result = auto.run_pass(
        inputs, runner, lambda text, style: lines.append(text), clock=clock or (lambda: now)
    )
    return result, lines


def test_the_default_policy_names_only_remediations_that_exist() -> None:
    policy = load_policy(default_policy_path())
    auto.check_policy_actions(policy, "default.yml")
    used = {r.action for rule in policy.rules for r in rule.ladder} - {"human"}
    assert used <= set(REMEDIATIONS), used - set(REMEDIATIONS)
    assert {"quarantine", "stop-start", "replace"} <= used


def test_a_rung_action_fleetops_does_not_have_is_refused_naming_it() -> None:
    text = """
schema: fleetops.policy/v1
budgets:
  fix: {unlimited: true}
rules:
  - name: crash
    match: [{check: crashloop_unit}]
    ladder: [{action: fix, clear_after: 10m, params: {no_such_knob: 1}}]
"""
    with pytest.raises(UsageError, match=r"rule crash rung 1 \(fix\): unknown parameter\(s\) no_such_knob"):
        auto.check_policy_actions(parse_policy(text, "p.yml"), "p.yml")


def test_first_pass_fixes_software_faults_and_quarantines_the_ecc_host(tmp_path: Path) -> None:
    scan = report(**{"lab-01": [CRASHLOOP], "lab-02": [UCX], "lab-03": [ecc()], "lab-04": []})
    runner = Runner()
    # one AZ each: the default policy's fix budget is 25% of a group an hour
    groups = {"lab-01": "az-a", "lab-02": "az-b", "lab-03": "az-c", "lab-04": "az-a"}
    result, lines = run(tmp_path, scan, runner, T0, groups=groups)
    assert [(a, h) for a, h, _p in runner.calls] == [
        ("fix", ["lab-01"]),
        ("fix", ["lab-02"]),
        ("quarantine", ["lab-03"]),
    ]
    ucx_params = runner.calls[1][2]
    assert ucx_params == {"ucx_fix": "hooks-off"}
    q = runner.calls[2][2]
    assert q["finding"] == "gpu_health" and "rule gpu-fatal rung 1" in q["reason"]
    assert set(q) == {"finding", "reason"}
    by_host = {d.host: d for d in result.decisions}
    assert by_host["lab-04"].status == "clean"
    assert any(
        line.startswith("lab-03: gpu_health (critical) rule gpu-fatal rung 1/4 quarantine:") for line in lines
    )
    assert result.exit_code == ExitCode.OK
    ladder = LadderState.load(tmp_path / "auto" / auto.LADDER_FILE)
    assert ladder.get("lab-03", "gpu-fatal") is not None
    assert ladder.get("lab-03", "gpu-fatal").action == "quarantine"  # type: ignore[union-attr]


def test_later_passes_climb_the_ecc_hosts_ladder_and_reset_it_once_clean(tmp_path: Path) -> None:
    scan = report(**{"lab-03": [ecc()]})
    runner = Runner()
    run(tmp_path, scan, runner, T0)
    _, lines = run(tmp_path, scan, runner, T0 + 5 * 60)  # within quarantine's 15 min
    assert [c[0] for c in runner.calls] == ["quarantine"]
    assert any("waiting: rung quarantine tried 5 min ago, gets 15 min" in line for line in lines), lines
    run(tmp_path, scan, runner, T0 + 16 * 60)
    assert [c[0] for c in runner.calls] == ["quarantine", "stop-start"]
    assert (
        runner.calls[-1][2].get("finding") == "gpu_health"
        or "finding" not in REMEDIATIONS["stop-start"].params
    )
    run(tmp_path, scan, runner, T0 + 16 * 60 + 46 * 60)
    assert [c[0] for c in runner.calls] == ["quarantine", "stop-start", "replace"]
    # clean now: the ladder resets, and the pass says the taint stays until released
    result, lines = run(tmp_path, report(**{"lab-03": []}), runner, T0 + 4 * H)
    assert len(runner.calls) == 3
    assert result.decisions[0].still_quarantined == ("gpu-fatal",)
    assert any("still quarantined by gpu-fatal" in line for line in lines)
    assert LadderState.load(tmp_path / "auto" / auto.LADDER_FILE).get("lab-03", "gpu-fatal") is None


def test_a_budget_of_one_per_hour_stops_a_second_replacement_and_says_so(tmp_path: Path) -> None:
    policy = """
schema: fleetops.policy/v1
budgets:
  replace: {window: 1h, max: 1}
rules:
  - name: gpu
    match: [{check: gpu_health}]
    ladder: [{action: replace, clear_after: 2h}]
"""
    runner = Runner()
    result, lines = run(tmp_path, report(**{"a": [ecc()], "b": [ecc()]}), runner, T0, policy_text=policy)
    assert [(c[0], c[1]) for c in runner.calls] == [("replace", ["a"])]
    blocked = next(d for d in result.decisions if d.host == "b")
    assert blocked.status == "budget" and "replace 1/h across the fleet used" in blocked.reason
    assert any(line.startswith("b:") and "budget" in line for line in lines)
    # a later pass in the same hour: still blocked (the ledger remembers); after the hour: allowed
    run(tmp_path, report(**{"b": [ecc()]}), runner, T0 + 30 * 60, policy_text=policy)
    assert len(runner.calls) == 1
    run(tmp_path, report(**{"b": [ecc()]}), runner, T0 + H + 1, policy_text=policy)
    assert [(c[0], c[1]) for c in runner.calls][-1] == ("replace", ["b"])


@pytest.mark.parametrize("tell", [True, False])
def test_a_budget_window_counts_from_each_hosts_act_not_from_the_reservation(
    tmp_path: Path, tell: bool
) -> None:
    """A reboot budget of 2/h; the pass's rollout reboots its canary at T0 and its second batch 65 minutes
    later. A pass a minute after it may reboot one more host (the canary's hour is over, the second
    batch's is not), never two: no hour holds more than 2 reboots. Without the batches' times (``tell``
    False) both count from when the run returned: none more."""
    clock = Clock(T0)
    runner = Batches(clock, gap=65 * 60, tell=tell)
    first, _ = run(tmp_path, report(a=[ecc()], b=[ecc()]), runner, T0, policy_text=REBOOT_POLICY, clock=clock)
    assert [(c[0], c[1]) for c in runner.calls] == [("reboot", ["a", "b"])] and first.exit_code == ExitCode.OK
    ledger = json.loads((tmp_path / "auto" / auto.LEDGER_FILE).read_text())
    assert {e["host"]: e["at"] for e in ledger["entries"]} == (
        {"a": T0, "b": T0 + 65 * 60} if tell else {"a": T0 + 65 * 60, "b": T0 + 65 * 60}
    )
    assert not any("reserved" in e for e in ledger["entries"])  # settled
    later = report(a=[], b=[], c=[ecc()], d=[ecc()], e=[ecc()])
    second, lines = run(tmp_path, later, runner, T0 + 66 * 60, policy_text=REBOOT_POLICY, clock=clock)
    assert [c[1] for c in runner.calls[1:]] == ([["c"]] if tell else []), lines
    assert sum(d.status == "budget" for d in second.decisions) == (2 if tell else 3)
    assert runner.most_in_a_window("reboot", H) <= 2, runner.acts


_KILLED_PASS = """
import os, signal, sys
from pathlib import Path
from fleetops import auto
from fleetops.policy import parse_policy

tmp = Path(sys.argv[1])

def run_action(action, hosts, params):  # the canary is rebooted; then the controller is SIGKILLed
    (tmp / "acted").write_text(hosts[0])
    os.kill(os.getpid(), signal.SIGKILL)

scan = {"hosts": {h: {"status": "ok", "findings": [%(ecc)r]} for h in ("a", "b")}}
inputs = auto.PassInputs(policy=parse_policy(%(policy)r, "policy.yml"), policy_source="policy.yml",
                         scan_report=scan, group_of={"a": "az-a", "b": "az-a"}, state_dir=tmp / "auto", apply=True)
auto.run_pass(inputs, run_action, lambda text, style: None, clock=lambda: %(t0)r)
"""


def test_a_pass_killed_mid_rollout_leaves_its_budget_spent(tmp_path: Path) -> None:
    """A real process SIGKILLed in its rollout's first batch (nothing of it unwinds): its reservation is
    on disk before the batch starts, so the next pass counts both reboots as spent (from when it found
    them: the hosts may have been acted on any time before) and reboots nobody. Before, nothing of the
    killed pass was recorded and the next pass rebooted two more: four in one hour on a budget of 2."""
    script = _KILLED_PASS % {"ecc": ecc(), "policy": REBOOT_POLICY, "t0": T0}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == -signal.SIGKILL and (tmp_path / "acted").read_text() == "a", done.stderr
    runner = Runner()
    later = report(a=[], b=[], c=[ecc()], d=[ecc()])
    result, lines = run(tmp_path, later, runner, T0 + 30 * 60, policy_text=REBOOT_POLICY)
    assert runner.calls == [], lines
    assert [d.status for d in result.decisions if d.host in "cd"] == ["budget", "budget"]
    assert (
        sum("which ended before settling it: its budget counts as spent" in w for w in result.warnings) == 2
    )
    ledger = json.loads((tmp_path / "auto" / auto.LEDGER_FILE).read_text())
    assert sorted((e["host"], e["at"], "reserved" in e) for e in ledger["entries"]) == [
        ("a", T0 + 30 * 60, False),
        ("b", T0 + 30 * 60, False),
    ]


def test_a_dry_run_acts_in_check_mode_and_records_nothing(tmp_path: Path) -> None:
    runner = Runner()
    result, _ = run(tmp_path, report(**{"lab-03": [ecc()]}), runner, T0, apply=False)
    assert [c[0] for c in runner.calls] == ["quarantine"]
    assert not (tmp_path / "auto" / auto.LADDER_FILE).exists()
    assert not (tmp_path / "auto" / auto.LEDGER_FILE).exists()
    # so the next (applied) pass starts at the first rung again
    run(tmp_path, report(**{"lab-03": [ecc()]}), runner, T0 + H)
    assert [c[0] for c in runner.calls] == ["quarantine", "quarantine"]
    assert result.document()["apply"] is False


def test_a_failed_action_still_climbs_and_spends_its_budget(tmp_path: Path) -> None:
    runner = Runner(fail=["lab-03"])
    result, _ = run(tmp_path, report(**{"lab-03": [ecc()]}), runner, T0)
    assert result.exit_code == ExitCode.FAILED
    ledger = json.loads((tmp_path / "auto" / auto.LEDGER_FILE).read_text())
    assert [e["action"] for e in ledger["entries"]] == ["quarantine"]
    run(tmp_path, report(**{"lab-03": [ecc()]}), runner, T0 + 16 * 60)
    assert [c[0] for c in runner.calls] == ["quarantine", "stop-start"]


def test_an_action_that_raises_is_reported_and_the_others_still_run_and_are_recorded(tmp_path: Path) -> None:
    runner = Runner(raises={"fix": FleetopsError("hosts locked by rollout X")})
    scan = report(**{"lab-01": [CRASHLOOP], "lab-03": [ecc()]})
    result, lines = run(tmp_path, scan, runner, T0)
    assert [c[0] for c in runner.calls] == ["fix", "quarantine"]
    assert result.exit_code == ExitCode.FAILED
    assert any("hosts locked by rollout X" in line for line in lines)
    ladder = LadderState.load(tmp_path / "auto" / auto.LADDER_FILE)
    assert ladder.get("lab-01", "crashloop") is None  # never attempted: tried again next pass
    assert ladder.get("lab-03", "gpu-fatal") is not None


def test_an_interrupted_pass_still_records_what_it_attempted(tmp_path: Path) -> None:
    runner = Runner(raises={"quarantine": KeyboardInterrupt()})
    scan = report(**{"lab-01": [CRASHLOOP], "lab-03": [ecc()]})
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, scan, runner, T0)
    ladder = LadderState.load(tmp_path / "auto" / auto.LADDER_FILE)
    assert ladder.get("lab-01", "crashloop") is not None
    assert ladder.get("lab-03", "gpu-fatal") is None


def test_a_rollout_stopped_by_a_signal_ends_the_pass_and_its_caught_hosts_climb(tmp_path: Path) -> None:
    """SIGTERM mid-batch: the engine saves the rollout with the batch's hosts ``running`` and
    exits 143; the pass must not start the next action, and the caught hosts count as attempted."""

    class Terminated(Runner):
        def __call__(self, action: str, hosts: Sequence[str], params: Mapping[str, Any]) -> auto.ActionRun:
            self.calls.append((action, list(hosts), dict(params)))
            return auto.ActionRun(action, tuple(hosts), params, attempted=frozenset(hosts),
                                  exit_code=ExitCode.TERMINATED)  # fmt: skip

    runner = Terminated()
    scan = report(**{"lab-01": [CRASHLOOP], "lab-03": [ecc()]})
    result, lines = run(tmp_path, scan, runner, T0)
    assert [c[0] for c in runner.calls] == ["fix"]  # quarantine never started
    assert result.exit_code == ExitCode.TERMINATED
    assert any("the pass starts no further action" in line for line in lines)
    ladder = LadderState.load(tmp_path / "auto" / auto.LADDER_FILE)
    assert ladder.get("lab-01", "crashloop") is not None
    assert ladder.get("lab-03", "gpu-fatal") is None


def test_a_rollout_the_kill_switch_stopped_ends_the_pass(tmp_path: Path) -> None:
    """`fleetops stop --all` during the pass's first action: that rollout stops, and the pass starts
    no further action (before, it went on to quarantine, reboot, stop-start and replace)."""

    class Stopped(Runner):
        def __call__(self, action: str, hosts: Sequence[str], params: Mapping[str, Any]) -> auto.ActionRun:
            self.calls.append((action, list(hosts), dict(params)))
            return auto.ActionRun(action, tuple(hosts), params, attempted=frozenset(hosts),
                                  exit_code=ExitCode.FAILED, stop_requested="stopped by bob@ctl: freeze")  # fmt: skip

    runner = Stopped()
    scan = report(**{"lab-01": [CRASHLOOP], "lab-03": [ecc()]})
    result, lines = run(tmp_path, scan, runner, T0)
    assert [c[0] for c in runner.calls] == ["fix"]  # quarantine never started
    assert result.exit_code == ExitCode.FAILED
    assert any("stopped by bob@ctl: freeze; the pass starts no further action" in line for line in lines)
    ladder = LadderState.load(tmp_path / "auto" / auto.LADDER_FILE)
    assert ladder.get("lab-01", "crashloop") is not None  # what it attempted is recorded
    assert ladder.get("lab-03", "gpu-fatal") is None


def test_a_pass_that_cannot_judge_a_ladder_in_progress_fails(tmp_path: Path) -> None:
    """lab-03's gpu_health detector fails on the next pass: its quarantine ladder is kept (not reset
    as clean) and the pass exits 3, so an AWX job says something is wrong; lab-01 is handled as usual."""
    runner = Runner()
    run(tmp_path, report(**{"lab-03": [ecc()]}), runner, T0)
    blind = report(**{"lab-01": [CRASHLOOP], "lab-03": []})
    blind["hosts"]["lab-03"]["errors"] = [{"check": "gpu_health", "msg": "nvidia-smi timed out"}]
    result, lines = run(tmp_path, blind, runner, T0 + 60)
    assert result.exit_code == ExitCode.FAILED
    assert [c[0] for c in runner.calls] == ["quarantine", "fix"]
    assert any(
        "ladder kept: its detector failed on the host: gpu-fatal (gpu_health)" in line for line in lines
    )
    ladder = LadderState.load(tmp_path / "auto" / auto.LADDER_FILE)
    assert ladder.get("lab-03", "gpu-fatal") is not None


def test_a_failed_tag_write_fails_the_pass_and_every_other_host_is_still_written(tmp_path: Path) -> None:
    """A real moto_server: lab-02's instance id is one EC2 refuses (InvalidID: its CreateTags fails), lab-01's and lab-03's tags
    are still written (before, the first failure skipped every later host, and both tags), and the
    pass exits 3 naming lab-02 instead of 0 with a warning."""
    from fleetops.rollout.lease import Ec2Connection
    from fleetops_lab.ec2sim import MotoServer, client, launch_many

    server = MotoServer()
    url = server.start()
    try:
        ids = launch_many(url, "us-east-1", 2)
        targets = {
            "lab-01": auto.TagTarget(ids[0], "us-east-1", None),
            "lab-02": auto.TagTarget("i-zzzz", "us-east-1", None),
            "lab-03": auto.TagTarget(ids[1], "us-east-1", None),
        }
        lines: list[str] = []
        inputs = auto.PassInputs(
            policy=without_floor(load_policy(default_policy_path())),
            policy_source="default",
            scan_report=report(**{h: [ecc()] for h in targets}),
            group_of={h: f"az-{h}" for h in targets},
            state_dir=tmp_path / "auto",
            apply=True,
            tags=targets,
            connection=Ec2Connection(
                endpoint_url=url, aws_access_key="testing", aws_secret_key="testing", regions=("us-east-1",)
            ),
        )
        result = auto.run_pass(inputs, Runner(), lambda text, style: lines.append(text), clock=lambda: T0)
        written = {
            t["ResourceId"]: t["Key"]
            for t in client(url, "us-east-1").describe_tags(Filters=[{"Name": "resource-id", "Values": ids}])[
                "Tags"
            ]
        }
    finally:
        server.stop()
    assert result.tag_failures == ["lab-02", "lab-02"]  # its ladder tag and its spent tag
    assert result.exit_code == ExitCode.FAILED
    assert sorted(result.tag_writes) == ["lab-01", "lab-03"]
    assert set(written) == set(ids)  # both live instances got their tags
    assert any(line.startswith("lab-02: Failed to write its tag fleetops.io/ladder") for line in lines)


def test_a_replaced_hosts_spent_tag_travels_to_its_new_instance(tmp_path: Path) -> None:
    """A real moto_server: lab-01 is replaced by a new instance. Its spent tag (the replace, budgeted)
    is written on the new instance too: the old one is terminated, and an inventory of running
    instances (AWX's) never lists it again, so the record of the spend would be lost with it."""
    from fleetops.rollout.lease import Ec2Connection
    from fleetops_lab.ec2sim import MotoServer, client, launch_many

    server = MotoServer()
    url = server.start()
    try:
        old, new = launch_many(url, "us-east-1", 2)

        class Replacing(Runner):
            def __call__(
                self, action: str, hosts: Sequence[str], params: Mapping[str, Any]
            ) -> auto.ActionRun:
                run = super().__call__(action, hosts, params)
                return dataclasses.replace(run, replacements={"lab-01": (new, "us-east-1")})

        policy = (
            _gpu_policy("{action: replace, clear_after: 2h}")
            .replace("  replace: {unlimited: true}\n", "")
            .replace("budgets:\n", "budgets:\n  replace: {window: 1h, max: 1}\n")
        )
        inputs = auto.PassInputs(
            policy=parse_policy(policy, "p.yml"),
            policy_source="p.yml",
            scan_report=report(**{"lab-01": [ecc()]}),
            group_of={"lab-01": "az-a"},
            state_dir=tmp_path / "auto",
            apply=True,
            tags={"lab-01": auto.TagTarget(old, "us-east-1", None)},
            connection=Ec2Connection(
                endpoint_url=url, aws_access_key="testing", aws_secret_key="testing", regions=("us-east-1",)
            ),
        )
        result = auto.run_pass(inputs, Replacing(), lambda text, style: None, clock=lambda: T0)
        tags = {
            (t["ResourceId"], t["Key"]): t["Value"]
            for t in client(url, "us-east-1").describe_tags(
                Filters=[{"Name": "resource-id", "Values": [old, new]}]
            )["Tags"]
        }
    finally:
        server.stop()
    spent = f"replace:{int(T0)}"
    assert tags[(old, SPENT_TAG_KEY)] == spent
    assert tags[(new, SPENT_TAG_KEY)] == spent  # the record survives the old instance
    assert (new, TAG_KEY) not in tags  # the ladder stays the old host's: the new one starts clean
    assert result.carried == {new: spent} and result.document()["spent_tags_carried"] == {new: spent}


_SIGTERM_PASS = """
import sys, time
from pathlib import Path
from fleetops import api, auto
from fleetops.cli.errors import run_main
from fleetops.exitcodes import ExitCode
from fleetops.policy import default_policy_path, load_policy

tmp = Path(sys.argv[1])

def run_action(action, hosts, params):
    if action == "quarantine":  # the second action: still planning when the signal comes
        (tmp / "ready").write_text("")
        time.sleep(60)
    return auto.ActionRun(action, tuple(hosts), params, attempted=frozenset(hosts), done=frozenset(hosts))

def main():
    scan = {"hosts": {"lab-01": {"status": "ok", "findings": [%(crash)r]},
                      "lab-03": {"status": "ok", "findings": [%(ecc)r]}}}
    inputs = auto.PassInputs(policy=load_policy(default_policy_path()).model_copy(update={"floor": None}), policy_source="default",
                             scan_report=scan, group_of={"lab-01": "a", "lab-03": "a"},
                             state_dir=tmp / "auto", apply=True)
    with api._PassSignals().installed() as signals:
        auto.run_pass(inputs, run_action, lambda text, style: print(text, flush=True), shield=signals.held)
    return 0

sys.exit(run_main("fleetops", main))
"""


def test_sigterm_between_actions_of_a_real_process_saves_the_pass_and_exits_143(tmp_path: Path) -> None:
    """A real process and a real SIGTERM (what AWX sends a cancelled job), outside any rollout:
    the pass unwinds, the first action's host is recorded, the signalled one is not, exit 143."""
    script = _SIGTERM_PASS % {"crash": CRASHLOOP, "ecc": ecc()}
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "ready").exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the pass never reached its second action"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == ExitCode.TERMINATED, (out, err)
    assert "terminated (SIGTERM); the state is saved" in err
    ladder = LadderState.load(tmp_path / "auto" / auto.LADDER_FILE)
    assert ladder.get("lab-01", "crashloop") is not None
    assert ladder.get("lab-03", "gpu-fatal") is None
    assert not list((tmp_path / "auto").glob("*.tmp*"))  # no torn write left behind


@pytest.mark.parametrize("held", [True, False])
def test_a_sigterm_as_the_pass_saves_waits_until_ladder_and_ledger_are_both_written(
    tmp_path: Path, held: bool
) -> None:
    """A real SIGTERM to this process just as the commit starts: held, the pass writes the rung (the
    budget it spent was written as its batch ran), then raises Signalled (exit 143). Not held (the
    control), it unwinds before the rung is written."""
    from fleetops import api
    from fleetops.errors import Signalled

    signals = api._PassSignals()

    @contextlib.contextmanager
    def shield() -> Iterator[None]:
        with signals.held() if held else contextlib.nullcontext():
            os.kill(os.getpid(), signal.SIGTERM)  # delivered here, in the main thread
            yield

    with signals.installed(), pytest.raises(Signalled) as err:
        lines: list[str] = []
        inputs = auto.PassInputs(
            policy=without_floor(load_policy(default_policy_path())), policy_source="default",
            scan_report=report(**{"lab-03": [ecc()]}), group_of={"lab-03": "az-a"},
            state_dir=tmp_path / "auto", apply=True,
        )  # fmt: skip
        auto.run_pass(
            inputs, Runner(), lambda text, style: lines.append(text), clock=lambda: T0, shield=shield
        )
    assert err.value.exit_code == ExitCode.TERMINATED
    state = tmp_path / "auto"
    # the budget is on disk either way: reserved before the batch, settled after it
    ledger = json.loads((state / auto.LEDGER_FILE).read_text())
    assert [(e["action"], "reserved" in e) for e in ledger["entries"]] == [("quarantine", False)]
    if held:
        assert LadderState.load(state / auto.LADDER_FILE).get("lab-03", "gpu-fatal") is not None
    else:
        assert not (state / auto.LADDER_FILE).exists()


@pytest.mark.parametrize("name", [auto.LADDER_FILE, auto.LEDGER_FILE])
def test_a_truncated_state_file_stops_the_pass_before_anything_runs(tmp_path: Path, name: str) -> None:
    """A state file cut short (a full disk, a copy gone wrong): exit 2 naming it, no action run,
    neither file rewritten, and the message says what moving it aside would cost."""
    run(tmp_path, report(**{"lab-03": [ecc()]}), Runner(), T0)
    state = tmp_path / "auto"
    path = state / name
    path.write_text(path.read_text()[:40])
    before = {f.name: f.read_bytes() for f in state.glob("*.json")}
    runner = Runner()
    with pytest.raises(DocumentError, match="not valid JSON") as err:
        run(tmp_path, report(**{"lab-01": [CRASHLOOP], "lab-03": [ecc()]}), runner, T0 + 2 * H)
    assert err.value.exit_code == ExitCode.USAGE
    assert err.value.source == str(path)
    assert "nothing was done. Moving it aside" in str(err.value)
    assert runner.calls == []
    assert {f.name: f.read_bytes() for f in state.glob("*.json")} == before


def test_a_second_pass_at_the_same_time_is_refused_with_exit_4(tmp_path: Path) -> None:
    with (
        file_lock(tmp_path / "auto" / auto.LADDER_FILE, 1),
        pytest.raises(auto.PassLockedError, match="another 'fleetops remediate auto' pass") as err,
    ):
        run(tmp_path, report(**{"lab-03": [ecc()]}), Runner(), T0)
    assert err.value.exit_code == ExitCode.LOCKED


def test_exit_codes_say_a_host_was_not_scanned_and_a_human_is_needed_only_when_asked(tmp_path: Path) -> None:
    """A host that waits for a person is not a failed pass (exit 0: a scheduled job stays green, the JSON
    names it) unless --fail-on human (exit 1); a host not scanned fails the pass (exit 3) either way."""
    unowned = {"check": "ucx_mmap_hooks", "severity": "warning", "data": {"fixable_unit": False}}
    result, _ = run(tmp_path, report(**{"a": [unowned]}), Runner(), T0)
    assert result.decisions[0].status == "human" and result.exit_code == ExitCode.OK
    assert result.document()["waiting_for_person"] == {"hosts": ["a"], "brakes": [], "fail_on": "never"}
    assert result.document()["exit_code"] == 0
    result.fail_on = "human"
    assert result.exit_code == ExitCode.FINDINGS and result.document()["exit_code"] == 1
    result, _ = run(tmp_path / "2", report(**{"a": [unowned], "b": "unreachable"}), Runner(), T0)
    assert result.exit_code == ExitCode.FAILED
    result.fail_on = "human"
    assert result.exit_code == ExitCode.FAILED  # the pass failed: 3 whatever --fail-on says


def _gpu_policy(*rungs: str) -> str:
    """A policy of one rule, gpu-fatal (any gpu_health finding), with these rungs; one stop-start an hour."""
    return (
        "schema: fleetops.policy/v1\nbudgets:\n  stop-start: {window: 1h, max: 1}\n  quarantine: {unlimited: true}\n"
        "  reboot: {unlimited: true}\n  replace: {unlimited: true}\nrules:\n  - name: gpu-fatal\n"
        "    match: [{check: gpu_health}]\n    ladder:\n" + "".join(f"      - {r}\n" for r in rungs)
    )


def test_another_controllers_ladder_tag_makes_this_pass_climb_and_spend_the_same_budget(
    tmp_path: Path,
) -> None:
    other = LadderState()
    other.record("lab-03", "gpu-fatal", "gpu_health", 0, "quarantine", T0)
    other.record("lab-03", "gpu-fatal", "gpu_health", 1, "stop-start", T0 + 16 * 60)
    value = other.tag_value("lab-03")
    assert value is not None
    policy = _gpu_policy(
        "{action: quarantine, clear_after: 15m}",
        "{action: stop-start, clear_after: 45m}",
        "{action: replace, clear_after: 2h}",
    )
    tags = {
        "lab-03": auto.TagTarget("i-3", "us-east-1", value),
        "lab-04": auto.TagTarget("i-4", "us-east-1", "not=a:valid:tag"),
    }
    runner = Runner()
    scan = report(**{"lab-03": [ecc()], "lab-05": [ecc()]})
    # this controller's state directory is empty: the tag alone says lab-03 is at stop-start (4 min ago)
    result, _ = run(tmp_path, scan, runner, T0 + 20 * 60, policy_text=policy, tags=tags)
    by_host = {d.host: d for d in result.decisions}
    assert by_host["lab-03"].status == "wait" and by_host["lab-03"].rung_action == "stop-start"
    assert [(c[0], c[1]) for c in runner.calls] == [("quarantine", ["lab-05"])]
    assert any("lab-04" in w and "ignored" in w for w in result.warnings)
    # lab-05 climbs to stop-start within the hour of the tag's stop-start: over the budget the tag spent
    result, _ = run(tmp_path, report(**{"lab-05": [ecc()]}), runner, T0 + 36 * 60, policy_text=policy)
    d = result.decisions[0]
    assert d.status == "budget" and d.rung_action == "stop-start", d
    # and lab-03, 46 min after its stop-start, climbs to replace on this controller
    result, _ = run(
        tmp_path, report(**{"lab-03": [ecc()]}), runner, T0 + 62 * 60, policy_text=policy, tags=tags
    )
    assert (runner.calls[-1][0], runner.calls[-1][1]) == ("replace", ["lab-03"])


def _ec2(after: auto.PassResult | None, hosts: Sequence[str]) -> dict[str, auto.TagTarget]:
    """Each host's instance and its two tags as the previous pass left them (none before the first)."""
    shown = after.tags_after if after is not None else {}
    return {
        h: auto.TagTarget(
            f"i-{h}", "us-east-1", shown.get(h, {}).get(TAG_KEY), shown.get(h, {}).get(SPENT_TAG_KEY)
        )
        for h in hosts
    }


def test_a_budget_spent_by_an_action_that_cleared_its_fault_holds_on_controllers_with_fresh_state(
    tmp_path: Path,
) -> None:
    """AWX runs every pass in a new container (an empty state directory): the EC2 tags are all it has.
    A stop-start that cleared its fault resets the host's ladder and deletes its ladder tag, but the
    stop-start still counts against the 1/h budget, through the spent tag, until its hour is over."""
    policy = _gpu_policy("{action: stop-start, clear_after: 45m}", "{action: human}")
    hosts = ["lab-03", "lab-05"]
    runner = Runner()
    first, _ = run(tmp_path / "a", report(**{"lab-03": [ecc()], "lab-05": []}), runner, T0,
                   policy_text=policy, tags=_ec2(None, hosts))  # fmt: skip
    assert [(c[0], c[1]) for c in runner.calls] == [("stop-start", ["lab-03"])]
    assert first.tags_after["lab-03"][SPENT_TAG_KEY] == f"stop-start:{int(T0)}"
    # 15 min later, another job: new hardware cleared lab-03's fault; its ladder resets, its ladder tag goes
    second, _ = run(tmp_path / "b", report(**{"lab-03": [], "lab-05": []}), runner, T0 + 15 * 60,
                    policy_text=policy, tags=_ec2(first, hosts))  # fmt: skip
    assert second.decisions[0].reset == ("gpu-fatal",)
    assert second.tags_after["lab-03"] == {TAG_KEY: None, SPENT_TAG_KEY: f"stop-start:{int(T0)}"}
    # 30 min after the stop-start, a third job finds lab-05's GPU failing: the hour's stop-start is spent
    third, _ = run(tmp_path / "c", report(**{"lab-03": [], "lab-05": [ecc()]}), runner, T0 + 30 * 60,
                   policy_text=policy, tags=_ec2(second, hosts))  # fmt: skip
    d = {d.host: d for d in third.decisions}["lab-05"]
    assert d.status == "budget" and d.rung_action == "stop-start", d
    assert "1/h" in d.reason, d.reason
    assert len(runner.calls) == 1
    # past the hour, the next job stop-starts it; lab-03's spent tag has nothing left to carry
    fourth, _ = run(tmp_path / "d", report(**{"lab-03": [], "lab-05": [ecc()]}), runner, T0 + 61 * 60,
                    policy_text=policy, tags=_ec2(third, hosts))  # fmt: skip
    assert [(c[0], c[1]) for c in runner.calls][1:] == [("stop-start", ["lab-05"])]
    assert fourth.tags_after["lab-03"] == {TAG_KEY: None, SPENT_TAG_KEY: None}
    assert fourth.tags_after["lab-05"][SPENT_TAG_KEY] == f"stop-start:{int(T0 + 61 * 60)}"
    # a dry run computes no tags (it records nothing)
    dry, _ = run(tmp_path / "e", report(**{"lab-05": [ecc()]}), Runner(), T0 + 62 * 60, apply=False,
                 policy_text=policy, tags=_ec2(fourth, hosts))  # fmt: skip
    assert dry.tags_after == {}


def test_a_malformed_spent_tag_is_a_warning_and_counts_nothing(tmp_path: Path) -> None:
    tags = {"lab-05": auto.TagTarget("i-5", "us-east-1", None, "stop-start:soon")}
    policy = _gpu_policy("{action: stop-start, clear_after: 1h}")
    runner = Runner()
    result, _ = run(tmp_path, report(**{"lab-05": [ecc()]}), runner, T0, policy_text=policy, tags=tags)
    assert any("tag fleetops.io/spent" in w and "ignored" in w for w in result.warnings), result.warnings
    assert [(c[0], c[1]) for c in runner.calls] == [("stop-start", ["lab-05"])]


def test_a_malformed_tag_is_left_as_found_and_fails_the_pass(tmp_path: Path) -> None:
    """What a tag holds that this controller cannot parse may be another controller's record: the pass
    never overwrites it (before, the rewrite erased it), names it, and exits 3 so a person mends it."""
    tags = {
        "lab-05": auto.TagTarget(
            "i-5", "us-east-1", "gpu-fatal=0:reimage:1:2:1:0:gpu_health", "stop-start:soon"
        )
    }
    policy = _gpu_policy("{action: stop-start, clear_after: 1h}")
    result, _ = run(tmp_path, report(**{"lab-05": [ecc()]}), Runner(), T0, policy_text=policy, tags=tags)
    assert result.malformed_tags == ["lab-05: fleetops.io/ladder", "lab-05: fleetops.io/spent"]
    assert result.tags_after["lab-05"] == {TAG_KEY: tags["lab-05"].value, SPENT_TAG_KEY: "stop-start:soon"}
    assert result.exit_code == ExitCode.FAILED
    assert result.document()["malformed_tags"] == result.malformed_tags


def test_batches_group_hosts_by_action_and_params_in_a_fixed_order(tmp_path: Path) -> None:
    scan = report(**{"b": [CRASHLOOP], "a": [CRASHLOOP], "c": [ecc()], "d": [ecc()]})
    runner = Runner()
    groups = {"a": "az-a", "b": "az-b", "c": "az-c", "d": "az-d"}  # the default budgets: 1 per group here
    run(tmp_path, scan, runner, T0, groups=groups)
    assert [(c[0], c[1]) for c in runner.calls] == [("fix", ["a", "b"]), ("quarantine", ["c", "d"])]


# ------------------------------------------------------------------------------ through the API


def _static_inventory(tmp_path: Path, hosts: Mapping[str, str]) -> Path:
    """Hosts with their AZ (fleetops_az); never reached: the scan and the rollouts are recorded."""
    path = tmp_path / "inv.yml"
    body = "".join(f"    {h}: {{ansible_connection: local, fleetops_az: {az}}}\n" for h, az in hosts.items())
    path.write_text("all:\n  hosts:\n" + body)
    return path


def test_api_auto_runs_each_action_on_exactly_the_hosts_it_decided(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """api.auto wires the pass to api.remediate: one request per action, naming its hosts exactly
    (``hosts=``, never a joined --limit), with the pass's caps; the scan is recorded (ansible and the
    lab are proven by tests/integration/test_auto_lab.py)."""
    import fleetops.api.verbs as api_mod

    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(tmp_path / "state"))
    inv = _static_inventory(tmp_path, {"lab-01": "a", "lab-02": "b", "lab-03": "c"})
    scanned = report(**{"lab-01": [CRASHLOOP], "lab-02": [], "lab-03": [ecc()]})
    monkeypatch.setattr(api_mod, "run_scan", lambda opts, **k: scanned)
    seen: list[api_mod.RemediationRequest] = []

    def remediate(request: api_mod.RemediationRequest, observer: Any = None, **k: Any) -> Any:
        seen.append(request)
        return api_mod.RolloutResult(None, {"recorded": True}, ExitCode.OK)

    monkeypatch.setattr(api_mod, "remediate", remediate)
    policy = tmp_path / "policy.yml"  # the default policy but its floor (one host per group here)
    policy.write_text(
        "\n".join(x for x in default_policy_path().read_text().splitlines() if not x.startswith("floor:"))
    )
    result = api_mod.auto(
        api_mod.AutoRequest(policy=policy, inventory=[inv], apply=True, canary=0, max_parallel=2)
    )
    assert [(r.action, list(r.hosts or [])) for r in seen] == [
        ("fix", ["lab-01"]),
        ("quarantine", ["lab-03"]),
    ]
    assert all(r.apply and r.limit is None and r.canary == 0 and r.max_parallel == 2 for r in seen)
    assert seen[1].params["finding"] == "gpu_health"
    assert result.document["schema"] == auto.AUTO_SCHEMA
    # no host state came back (a stand-in rollout): nothing was attempted, so nothing climbs
    ladder = LadderState.load(tmp_path / "state" / "auto" / auto.LADDER_FILE)
    assert ladder.hosts == {}


def test_api_auto_ends_the_pass_when_the_kill_switch_stopped_an_actions_rollout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rollout's stop record says a person asked for it (kind kill_switch): api.auto's action
    reports it and the pass runs nothing after it."""
    import fleetops.api.verbs as api_mod
    from fleetops.rollout.engine import STOP_KILL_SWITCH
    from fleetops.rollout.state import new_rollout

    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(tmp_path / "state"))
    inv = _static_inventory(tmp_path, {"lab-01": "a", "lab-03": "c"})
    monkeypatch.setattr(
        api_mod, "run_scan", lambda opts, **k: report(**{"lab-01": [CRASHLOOP], "lab-03": [ecc()]})
    )
    seen: list[str] = []

    def remediate(request: api_mod.RemediationRequest, observer: Any = None, **k: Any) -> Any:
        seen.append(request.action)
        rollout = new_rollout(action=request.action, apply=True, inventory=[inv], extravars={},
                              plan={"batches": [list(request.hosts or [])]}, max_failures=0, cooldown=0.0,
                              gate=True, state_path=tmp_path / f"{request.action}.json")  # fmt: skip
        rollout.status = "stopped"
        rollout.stopped = {"after_batch": 0, "reason": "stopped by bob@ctl: freeze", "pending": [],
                           "kind": STOP_KILL_SWITCH}  # fmt: skip
        return api_mod.RolloutResult(rollout, {"recorded": True}, ExitCode.FAILED)

    monkeypatch.setattr(api_mod, "remediate", remediate)
    result = api_mod.auto(api_mod.AutoRequest(inventory=[inv], apply=True))
    assert seen == ["fix"]
    assert result.exit_code == ExitCode.FAILED
    assert result.result.runs[0].stop_requested == "stopped by bob@ctl: freeze"


def test_a_rung_that_finds_nothing_to_do_counts_as_tried_and_fails_the_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fix's own scan finds nothing it may do (the crash-looping unit is protected): before, the ladder
    stayed at rung 1 and every pass exited 0 deciding fix again; now the rung counts as tried (the
    ladder climbs after its clear time) and the pass exits 3 saying so."""
    import fleetops.api.verbs as api_mod

    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(tmp_path / "state"))
    inv = _static_inventory(tmp_path, {"lab-01": "a"})
    monkeypatch.setattr(api_mod, "run_scan", lambda opts, **k: report(**{"lab-01": [CRASHLOOP]}))
    lines: list[str] = []

    class Observer(api_mod.NullObserver):
        def message(self, text: str, style: str = "") -> None:
            lines.append(text)

    def remediate(request: api_mod.RemediationRequest, observer: Any = None, **k: Any) -> Any:
        return api_mod.RolloutResult(None, api_mod.empty_document(request.action, request.apply), ExitCode.OK)

    monkeypatch.setattr(api_mod, "remediate", remediate)
    result = api_mod.auto(api_mod.AutoRequest(inventory=[inv], apply=True), Observer())
    assert result.exit_code == ExitCode.FAILED
    assert result.result.runs[0].cannot_act == {"lab-01"}
    assert any("fix: nothing to do on lab-01: the rung could not act" in line for line in lines)
    ladder = LadderState.load(tmp_path / "state" / "auto" / auto.LADDER_FILE)
    rec = ladder.get("lab-01", "crashloop")
    assert rec is not None and rec.action == "fix"


def test_a_host_its_remediation_refused_counts_as_tried_so_the_ladder_climbs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stop-start refuses an Auto Scaling group's instance (skipped, "refused: ..."): the pass exits 3
    and the rung counts as tried, so the next pass after its clear time climbs to replace rather than
    asking for the refused stop-start forever."""
    import fleetops.api.verbs as api_mod
    from fleetops.rollout.engine import REFUSED
    from fleetops.rollout.outcome import HostOutcome
    from fleetops.rollout.state import new_rollout

    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(tmp_path / "state"))
    inv = _static_inventory(tmp_path, {"lab-03": "c"})
    monkeypatch.setattr(api_mod, "run_scan", lambda opts, **k: report(**{"lab-03": [ecc()]}))

    def remediate(request: api_mod.RemediationRequest, observer: Any = None, **k: Any) -> Any:
        rollout = new_rollout(action=request.action, apply=True, inventory=[inv], extravars={},
                              plan={"batches": []}, max_failures=0, cooldown=0.0, gate=True,
                              state_path=tmp_path / f"{request.action}.json")  # fmt: skip
        rollout.hosts = {"lab-03": "skipped"}
        rollout.results["lab-03"] = HostOutcome(status="skipped", msg=REFUSED + "an Auto Scaling group's")
        return api_mod.RolloutResult(rollout, {"recorded": True}, ExitCode.FAILED)

    monkeypatch.setattr(api_mod, "remediate", remediate)
    policy = tmp_path / "p.yml"
    policy.write_text(
        _gpu_policy("{action: stop-start, clear_after: 30m}", "{action: replace, clear_after: 2h}")
    )
    result = api_mod.auto(api_mod.AutoRequest(inventory=[inv], apply=True, policy=policy))
    assert result.exit_code == ExitCode.FAILED
    assert result.result.runs[0].cannot_act == {"lab-03"}
    rec = LadderState.load(tmp_path / "state" / "auto" / auto.LADDER_FILE).get("lab-03", "gpu-fatal")
    assert rec is not None and rec.action == "stop-start"


def test_a_pass_limited_to_some_hosts_sizes_groups_and_reads_tags_over_the_whole_fleet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass with -l over 2 hosts of a 4-host group: reboot's 50% budget is 2 of the group's 4 (not 1 of
    the 2 selected); a stop-start spent on a host outside the limit (its spent tag) counts against the
    1-an-hour budget; the tags of hosts outside the limit are read, never written."""
    import fleetops.api.verbs as api_mod

    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(tmp_path / "state"))
    inv = tmp_path / "inv.yml"
    rows = {"n1": "", "n2": "", "n3": "", "n4": f"'fleetops.io/spent': 'stop-start:{int(time.time()) - 60}'"}
    inv.write_text("all:\n  hosts:\n" + "".join(
        f"    {h}: {{ansible_connection: local, fleetops_az: a, ec2_instance_id: i-0{i}, ec2_region: us-east-1, "
        f"ec2_tags: {{{tags}}}}}\n" for i, (h, tags) in enumerate(rows.items())
    ))  # fmt: skip
    ena = {"check": "ena_resets", "severity": "warning", "summary": "resets", "data": {}}
    monkeypatch.setattr(api_mod, "run_scan", lambda opts, **k: report(**{"n1": [ena], "n2": [ena]}))
    monkeypatch.setattr(api_mod, "connection_for", lambda inventories: object())
    seen: list[tuple[str, list[str]]] = []

    def remediate(request: api_mod.RemediationRequest, observer: Any = None, **k: Any) -> Any:
        seen.append((request.action, list(request.hosts or [])))
        return api_mod.RolloutResult(None, {"recorded": True}, ExitCode.OK)

    monkeypatch.setattr(api_mod, "remediate", remediate)
    policy = tmp_path / "p.yml"
    policy.write_text(
        "schema: fleetops.policy/v1\nbudgets:\n  reboot: {per_group_pct: 50}\n  stop-start: {max: 1}\n"
        "rules:\n  - name: nic\n    match: [{check: ena_resets}]\n    ladder:\n"
        "      - {action: reboot, clear_after: 1h}\n"
    )
    result = api_mod.auto(api_mod.AutoRequest(inventory=[inv], limit="n1:n2", apply=False, policy=policy))
    assert seen == [("reboot", ["n1", "n2"])]  # 50% of the group's 4 hosts: both
    assert {d.host: d.status for d in result.result.decisions} == {"n1": "act", "n2": "act"}
    seen.clear()
    policy.write_text(
        policy.read_text().replace(
            "{action: reboot, clear_after: 1h}", "{action: stop-start, clear_after: 1h}"
        )
    )
    result = api_mod.auto(api_mod.AutoRequest(inventory=[inv], limit="n1:n2", apply=False, policy=policy))
    assert seen == []  # n4's stop-start a minute ago spent the hour's one, though n4 is outside the limit
    assert all(d.status == "budget" for d in result.result.decisions)


def test_api_auto_finds_the_new_instance_a_replace_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replace module's result names the new instance: api.auto hands it to the pass (which writes
    the spent tag there; the write itself is tested against moto above), with when its batch started."""
    import fleetops.api.verbs as api_mod
    from fleetops.rollout.outcome import HostOutcome
    from fleetops.rollout.state import new_rollout

    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(tmp_path / "state"))
    inv = tmp_path / "inv.yml"
    inv.write_text(
        "all:\n  hosts:\n    n1: {ansible_connection: local, ec2_instance_id: i-0old, ec2_region: eu-west-1}\n"
    )
    monkeypatch.setattr(api_mod, "run_scan", lambda opts, **k: report(**{"n1": [ecc()]}))
    monkeypatch.setattr(api_mod, "connection_for", lambda inventories: object())  # a dry run: nothing written

    def remediate(request: api_mod.RemediationRequest, observer: Any = None, **k: Any) -> Any:
        rollout = new_rollout(action=request.action, apply=True, inventory=[inv], extravars={},
                              plan={"batches": [["n1"]]}, max_failures=0, cooldown=0.0, gate=True,
                              state_path=tmp_path / "r.json")  # fmt: skip
        rollout.hosts = {"n1": "done"}
        rollout.batches = [{"index": 0, "hosts": ["n1"], "started": T0 + 5, "finished": T0 + 99}]
        rollout.results["n1"] = HostOutcome(
            status="ok", result={"new_instances": [{"instance_id": "i-0new"}, {"instance_id": "i-0other"}]}
        )
        return api_mod.RolloutResult(rollout, {"recorded": True}, ExitCode.OK)

    monkeypatch.setattr(api_mod, "remediate", remediate)
    monkeypatch.setattr(
        api_mod,
        "_tag_targets",
        lambda hosts: {h.name: auto.TagTarget("i-0old", "eu-west-1", None) for h in hosts},
    )
    policy = tmp_path / "p.yml"
    policy.write_text(_gpu_policy("{action: replace, clear_after: 2h}"))
    result = api_mod.auto(api_mod.AutoRequest(inventory=[inv], apply=False, policy=policy))
    assert result.result.runs[0].replacements == {"n1": ("i-0new", "eu-west-1")}
    assert result.result.runs[0].acted == {"n1": T0 + 5}  # its budget counts from its batch's start


def test_a_remediation_request_naming_hosts_acts_on_those_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fleetops.api.verbs as api_mod

    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("FLEETOPS_AUDIT_LOG", str(tmp_path / "audit.jsonl"))
    inv = _static_inventory(tmp_path, {"a": "x", "b": "x", "c": "y"})
    with pytest.raises(UsageError, match="host\\(s\\) outside the selection: zz"):
        api_mod.remediate(api_mod.RemediationRequest(action="reboot", inventory=[inv], hosts=["a", "zz"]))
    with pytest.raises(UsageError, match="the hosts named matches no host"):
        api_mod.remediate(api_mod.RemediationRequest(action="reboot", inventory=[inv], hosts=[]))
    planned = api_mod._start(
        api_mod.RemediationRequest(action="reboot", inventory=[inv], hosts=["c", "a"], canary=0),
        REMEDIATIONS["reboot"],
        api_mod.NullObserver(),
    )
    assert planned is not None and sorted(planned.hosts) == ["a", "c"]


def test_a_pass_with_a_cause_writes_one_audit_line_and_says_it_in_its_document(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--cause`` (the event-driven rulebook passes the alert): the pass's document carries it, and the
    audit log gets one line for the pass with its cause, limit, decisions and each action's rollout;
    a pass without one writes no such line and its document is as before."""
    import fleetops.api.verbs as api_mod

    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(tmp_path / "state"))
    log = tmp_path / "audit.jsonl"
    monkeypatch.setenv("FLEETOPS_AUDIT_LOG", str(log))
    inv = _static_inventory(tmp_path, {"lab-01": "a", "lab-02": "b"})
    monkeypatch.setattr(api_mod, "run_scan", lambda opts, **k: report(**{"lab-01": [CRASHLOOP]}))
    monkeypatch.setattr(
        api_mod,
        "remediate",
        lambda request, observer=None, **k: api_mod.RolloutResult(None, {"id": "R-1"}, ExitCode.OK),
    )
    cause = 'alertmanager: FleetopsUnitsCrashLooping{host="lab-01"} fingerprint=0123abcd'
    result = api_mod.auto(api_mod.AutoRequest(inventory=[inv], limit="lab-01", apply=True, cause=cause))
    assert result.document["cause"] == cause
    (line,) = [json.loads(text) for text in log.read_text().splitlines()]
    assert line["event"] == "auto_pass" and line["cause"] == cause and line["limit"] == "lab-01"
    assert line["decisions"] == {"lab-01": "act"} and line["apply"] is True
    assert line["actions"] == [
        {"action": "fix", "rollout": "R-1", "hosts": ["lab-01"], "done": [], "exit_code": 0}
    ]
    assert line["exit_code"] == result.exit_code and line["operator"]
    plain = api_mod.auto(api_mod.AutoRequest(inventory=[inv], limit="lab-01", apply=True))
    assert "cause" not in plain.document and len(log.read_text().splitlines()) == 1


def test_a_pass_whose_cause_cannot_be_audited_does_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fleetops.api.verbs as api_mod
    from fleetops.rollout.audit import AuditError

    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("FLEETOPS_AUDIT_LOG", str(tmp_path / "file" / "audit.jsonl"))
    inv = _static_inventory(tmp_path, {"lab-01": "a"})
    scanned: list[Any] = []
    monkeypatch.setattr(api_mod, "run_scan", lambda opts, **k: scanned.append(opts) or report())
    with pytest.raises(AuditError, match="nothing was changed"):
        api_mod.auto(api_mod.AutoRequest(inventory=[inv], apply=True, cause="alert X"))
    assert scanned == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [("", "must not be empty"), ("  ", "must not be empty"), ("a\nb", "one line"), ("\x1b[2J", "one line"),
     ("x" * 1001, "at most 1000")],
)  # fmt: skip
def test_cause_is_one_printable_line(text: str, problem: str) -> None:
    from fleetops import values

    with pytest.raises(ValueError, match=problem):
        values.cause(text)
    assert (
        values.cause("  alert FleetopsUnitsCrashLooping on lab-01 ")
        == "alert FleetopsUnitsCrashLooping on lab-01"
    )
