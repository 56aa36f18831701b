"""Golden fixtures of every format fleetops persists or publishes (issue 24, item 7): what a refactor of
policy.py, api.py and the remediation declarations must keep byte for byte.

Each format is produced through the code that writes it (the library API, the engine, the audit log,
the tag codecs, the stop file, the lock, the policy state files), with a fixed clock, fixed ids, a fixed
operator and controller, and a stand-in batch runner and scanner (no host runs here), and compared
with a checked-in file under ``tests/fleetops/golden/`` (see its README.md). Paths under the test's
temporary folder are written as ``<TMP>``.

Formats that other tests already pin are compared here against *their* fixtures, not copies: the
scan, drift and plan documents are rebuilt from ``tests/unit/fixtures/documents/`` and must equal
those files byte for byte, and the legacy state files there must load, report and resume.

Regenerate on purpose (then review ``git diff tests/fleetops/golden``)::

    FLEETOPS_GOLDEN_UPDATE=1 .venv/bin/pytest -q tests/fleetops/test_golden_formats.py

Without it a run only compares: a missing or different fixture fails with a diff.
"""

from __future__ import annotations

import base64
import calendar
import difflib
import hashlib
import json
import os
import signal
import threading
import time as real_time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from fleetops import api, drift, scan, schemas
from fleetops import auto as auto_mod
from fleetops import merge as _merge  # noqa: F401  (loaded: its MergeError is in test_exit_codes)
from fleetops import policy as policy_mod
from fleetops.ansible.inventory import InventoryHost
from fleetops.ansible.runner import PlaybookRun, TaskResult
from fleetops.api import launch
from fleetops.auto import passes as auto_passes
from fleetops.errors import FleetopsError, Signalled, UsageError
from fleetops.exitcodes import ExitCode, signal_exit_code
from fleetops.policy import records as policy_records
from fleetops.policy import state as policy_state
from fleetops.remediations import REMEDIATIONS, REQUIRED
from fleetops.rollout import audit as audit_mod
from fleetops.rollout import engine as engine_mod
from fleetops.rollout import killswitch, locks
from fleetops.rollout import state as state_mod
from fleetops.rollout.budget import FailureBudget
from fleetops.rollout.lease import KEY_PREFIX, Ec2Connection, Ec2Lease
from tests.paths import FIXTURES, REPO

GOLDEN = Path(__file__).resolve().parent / "golden"
DOCS = FIXTURES / "documents"
PID_SPACE = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0/4026531836"  # util.pid_space: boot id / PID namespace
UPDATE = os.environ.get("FLEETOPS_GOLDEN_UPDATE") == "1"

T0 = 1796000000.0  # 2026-11-30T00:53:20Z: every clock of these tests starts here
ROLLOUT_HEX = "3fa9c1"  # uuid4().hex[:6] of every rollout made here
OPERATOR, MACHINE = "alice", "bastion"
SECRET = "s3cr3t-ucx-token"  # a set-env value: never at rest, only its digest


# ---------------------------------------------------------------------------------- the fixtures


def golden(name: str, text: str, tmp_path: Path | None = None) -> None:
    """``text`` (the temporary folder written as ``<TMP>``, this checkout as ``<REPO>``) equals
    ``golden/<name>``; with FLEETOPS_GOLDEN_UPDATE=1 the fixture is written instead."""
    if tmp_path is not None:
        for tmp in sorted({str(tmp_path.resolve()), str(tmp_path)}, key=len, reverse=True):
            text = text.replace(tmp, "<TMP>")
    text = text.replace(str(REPO), "<REPO>")  # a clean clone elsewhere (CI) produces the same bytes
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    assert path.exists(), f"no golden fixture {path}: run with FLEETOPS_GOLDEN_UPDATE=1 to record it"
    want = path.read_text(encoding="utf-8")
    if text != want:
        diff = "".join(
            difflib.unified_diff(
                want.splitlines(True), text.splitlines(True), f"golden/{name}", "produced now", n=2
            )
        )
        pytest.fail(f"golden/{name} changed: a persisted or public format is not what it was.\n{diff[:6000]}")


def dump(data: Any) -> str:
    return json.dumps(data, indent=2, default=str) + "\n"


def materialize(name: str, tmp_path: Path) -> str:
    """A golden fixture's text with ``<TMP>`` back to this test's temporary folder."""
    return (GOLDEN / name).read_text(encoding="utf-8").replace("<TMP>", str(tmp_path.resolve()))


class Clock:
    """The one clock of a test: it moves only when the test (or its stand-in runner) moves it."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FrozenTime:
    """A stand-in for the ``time`` module of one fleetops module: ``time()`` and ``gmtime()`` read the
    test's clock; everything else (sleep, monotonic, strftime of a given time) is the real one."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def time(self) -> float:
        return self._clock.now

    def gmtime(self, secs: float | None = None) -> real_time.struct_time:
        return real_time.gmtime(self._clock.now if secs is None else secs)

    def __getattr__(self, name: str) -> Any:
        return getattr(real_time, name)


class Counter:
    """Fixed "random" hex: 0001, 0002... of the length asked for."""

    def __init__(self, prefix: str) -> None:
        self.prefix, self.n = prefix, 0

    def token_hex(self, nbytes: int = 16) -> str:
        self.n += 1
        return (self.prefix + f"{self.n:04x}").rjust(2 * nbytes, "0")[-2 * nbytes :]


@pytest.fixture
def clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Clock:
    """Fixed time, ids, operator and controller for everything a rollout writes; its state home and
    audit log under ``tmp_path``."""
    c = Clock()
    frozen = FrozenTime(c)
    for module in (state_mod, engine_mod, audit_mod, locks, killswitch, scan):
        monkeypatch.setattr(module, "time", frozen)
    monkeypatch.setattr(state_mod, "uuid", SimpleNamespace(uuid4=lambda: uuid.UUID(ROLLOUT_HEX + "0" * 26)))
    monkeypatch.setattr(locks, "secrets", Counter("70c"))
    monkeypatch.setattr(policy_records, "secrets", Counter("1d"))  # LedgerEntry ids
    monkeypatch.setattr(state_mod.socket, "gethostname", lambda: MACHINE)
    monkeypatch.setattr(auto_passes, "controller_id", lambda: f"{MACHINE}:4242")
    monkeypatch.delenv("SUDO_USER", raising=False)
    monkeypatch.setenv("FLEETOPS_OPERATOR", OPERATOR)
    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(tmp_path / "home"))
    monkeypatch.setenv("FLEETOPS_AUDIT_LOG", str(tmp_path / "home" / "audit.jsonl"))
    real_new = launch.new_rollout

    def new_rollout(**kwargs: Any) -> state_mod.Rollout:
        rollout = real_new(**kwargs)
        rollout.created = c.now  # its default factory is the real time.time, bound at import
        return rollout

    monkeypatch.setattr(launch, "new_rollout", new_rollout)  # where the API starts a rollout
    return c


# ---------------------------------------------------------------------------------- stand-ins


def _slurp(host: str, boot: str) -> TaskResult:
    content = base64.b64encode(f"{boot}\n".encode()).decode()
    return TaskResult(host, "ok", "Read the boot id", "ansible.builtin.slurp", {"content": content})


class Runner:
    """The batch runner: answers as the remediation playbooks' tasks would, moves the clock 60 s a
    run, and records each call's hosts, check mode and extra vars (what the playbook gets)."""

    def __init__(self, clock: Clock, boots: dict[str, int] | None = None) -> None:
        self.clock = clock
        self.boots = dict(boots or {})
        self.calls: list[dict[str, Any]] = []
        self.fail: set[str] = set()
        self.during: Callable[[int, Sequence[str]], None] | None = None

    def __call__(
        self,
        hosts: Sequence[str],
        extravars: dict[str, Any],
        *,
        check: bool,
        on_result: Callable[[TaskResult], None] | None,
        cancel: threading.Event | None,
    ) -> PlaybookRun:
        self.calls.append({"hosts": list(hosts), "check": check, "extravars": extravars})
        self.clock.advance(60)
        run = PlaybookRun(status="successful", rc=0)
        for host in hosts:
            run.tasks[host] = self.results(host, extravars)
        if self.during is not None:
            self.during(len(self.calls), hosts)
        for host in hosts:
            for tr in run.tasks[host]:
                if on_result is not None:
                    on_result(tr)
        return run

    def boot(self, host: str) -> str:
        return f"{host}-boot-{self.boots.setdefault(host, 1)}"

    def results(self, host: str, xv: dict[str, Any]) -> list[TaskResult]:
        if host in self.fail:
            return [
                TaskResult(host, "failed", "act", "x", {"msg": f"{host}: exploded, {SECRET} kept", "rc": 1})
            ]
        if xv.get("fleetops_probe_only"):
            return [_slurp(host, self.boot(host))]
        if xv.get("fleetops_phase") == "post":
            post = TaskResult(host, "ok", "Post hook", "ansible.builtin.command", {"changed": True, "rc": 0})
            note = TaskResult(host, "ok", "Say", "ansible.builtin.debug", {"msg": "fleetops: post hook ran"})
            return [post, note]
        if "fleetops_reboot_timeout" in xv:
            before = self.boot(host)
            self.boots[host] += 1
            reboot = {"changed": True, "rebooted": True, "elapsed": 42}
            return [_slurp(host, before), TaskResult(host, "ok", "Reboot", "ansible.builtin.reboot", reboot),
                    _slurp(host, self.boot(host))]  # fmt: skip
        if "fleetops_env" in xv:
            result = {"changed": True, "unit": "trainer.service", "env_before": {},
                      "env_after": {"UCX_MEM_MMAP_HOOK_MODE": "none", "UCX_TOKEN": SECRET}, "restarted": True,
                      "msg": f"set UCX_TOKEN={SECRET}"}  # fmt: skip
            return [TaskResult(host, "ok", "Set env", "fleetops.node.set_env", result)]
        reclaim = {"changed": True, "reclaimed": True, "freed": 40, "needs_reboot": False,
                   "before": {"zombies": 48}, "after": {"zombies": 8}}  # fmt: skip
        return [TaskResult(host, "ok", "Reclaim", "fleetops.node.reclaim_memcg", reclaim)]


def scanner(hosts: Sequence[str]) -> dict[str, dict[str, Any]]:
    return {h: {"status": "ok", "findings": [], "facts": {}} for h in hosts}


def _stand_ins(monkeypatch: pytest.MonkeyPatch, runner: Runner, down: dict[str, str] | None = None) -> None:
    monkeypatch.setattr(launch, "PlaybookBatchRunner", lambda playbook, inventory, **k: runner)
    monkeypatch.setattr(launch, "InventoryScanner", lambda *a, **k: scanner)
    monkeypatch.setattr(
        launch, "preflight", lambda hosts, **k: {h.name: (down or {}).get(h.name) for h in hosts}
    )


def _inventory(
    tmp_path: Path, hosts: Mapping[str, str | None], name: str = "inv.yml", ec2: bool = False
) -> Path:
    def hostvars(host: str, az: str | None) -> dict[str, Any]:
        hv: dict[str, Any] = {"ansible_connection": "local", **({"fleetops_az": az} if az else {})}
        if ec2:  # what the fleetops.node.ec2 inventory gives: the lease's targets
            hv.update(ec2_instance_id=f"i-0{host}", ec2_region="us-east-1")
        return hv

    data = {"all": {"hosts": {h: hostvars(h, az) for h, az in hosts.items()}}}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


REBOOT_HOSTS = {
    "a1": "us-east-1a",
    "a2": "us-east-1a",
    "b1": "us-east-1b",
    "b2": "us-east-1b",
    "z": "us-east-1b",
}


def _reboot_request(tmp_path: Path, state: str, ec2: bool = False) -> api.RemediationRequest:
    return api.RemediationRequest(
        action="reboot",
        inventory=[_inventory(tmp_path, REBOOT_HOSTS, ec2=ec2)],
        params={"post_hook": "/usr/local/bin/fleetops-post"},
        apply=True,
        max_parallel="2",
        state=tmp_path / "state" / state,
        preflight_max_unreachable=FailureBudget(count=1),
        max_failures=FailureBudget(count=1),
        max_unhealthy="1",  # z, skipped at preflight, is the one us-east-1b may lose
        cooldown=0,
        not_after=datetime.fromisoformat("2099-01-01T00:00:00+00:00"),
    )


def _audit_lines(tmp_path: Path) -> str:
    path = tmp_path / "home" / "audit.jsonl"
    return path.read_text(encoding="utf-8") if path.exists() else ""


# ---------------------------------------------------------------------------------- rollouts


def test_rollout_state_audit_log_report_and_runner_vars_of_a_reboot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    """remediate reboot --apply through the API: probe, reboot, gate, post hook; a host left out by
    preflight; EC2 hosts (the state records the lease's targets; the lease itself finds no EC2 source
    and is not taken); the state file, the audit log, the lock files, the report and each playbook
    run's vars."""
    runner = Runner(clock)
    connection = Ec2Connection(endpoint_url="http://127.0.0.1:1", regions=("us-east-1",))
    monkeypatch.setattr(launch, "connection_for", lambda inventories: connection)
    held: dict[str, str] = {}

    def read_locks(n: int, hosts: Sequence[str]) -> None:
        if n == 1:
            for path in sorted((tmp_path / "home" / "locks").iterdir()):
                held[path.name] = path.read_text()

    runner.during = read_locks
    _stand_ins(monkeypatch, runner, down={"z": "ssh: connection refused"})
    with monkeypatch.context() as patch:
        patch.setattr(locks.os, "getpid", lambda: 4242)  # the lock records the pid
        patch.setattr(locks, "pid_space", lambda: PID_SPACE)  # and where that pid is this process
        result = api.remediate(_reboot_request(tmp_path, "reboot.json", ec2=True), handle_signals=False)
    assert result.exit_code == ExitCode.FAILED  # z was skipped: never exit 0
    golden("state-reboot-done.json", (tmp_path / "state" / "reboot.json").read_text(), tmp_path)
    golden("audit-reboot.jsonl", _audit_lines(tmp_path), tmp_path)
    golden("lock-files.json", dump(held), tmp_path)
    golden("report-reboot-done.json", result.json() + "\n", tmp_path)
    golden("runner-calls-reboot.json", dump(runner.calls), tmp_path)
    assert not list((tmp_path / "home" / "locks").iterdir())  # released


def _reboots(runner: Runner) -> list[list[str]]:
    """The hosts of each run that rebooted them (not a probe, not the post pass)."""
    return [
        c["hosts"]
        for c in runner.calls
        if not c["extravars"].get("fleetops_probe_only") and c["extravars"].get("fleetops_phase") != "post"
    ]


def _interrupt_at_batch_2(runner: Runner) -> None:
    def sigterm(n: int, hosts: Sequence[str]) -> None:
        if len(_reboots(runner)) == 2 and runner.calls[-1]["hosts"] == _reboots(runner)[-1]:
            # the batch's host rebooted, then the controller is told to go before it could say so
            os.kill(os.getpid(), signal.SIGTERM)

    runner.during = sigterm


def test_rollout_state_of_a_reboot_aborted_mid_batch_by_sigterm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    runner = Runner(clock)
    _interrupt_at_batch_2(runner)
    _stand_ins(monkeypatch, runner)
    request = _reboot_request(tmp_path, "interrupted.json")
    request.max_parallel, request.per_group_max = "1", 1
    result = api.remediate(request, handle_signals=True)
    assert result.exit_code == ExitCode.TERMINATED
    golden("state-reboot-interrupted.json", (tmp_path / "state" / "interrupted.json").read_text(), tmp_path)
    golden("audit-reboot-interrupted.jsonl", _audit_lines(tmp_path), tmp_path)


def test_a_state_file_written_before_the_change_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    """``remediate --resume`` (api.resume, what the CLI's --resume calls) of the checked-in interrupted
    state: b1, caught mid-batch, already rebooted (its boot id changed): judged, not rebooted again;
    the hosts still pending run; the rollout ends done."""
    _inventory(tmp_path, REBOOT_HOSTS)
    state = tmp_path / "state" / "interrupted.json"
    state.parent.mkdir()
    state.write_text(materialize("state-reboot-interrupted.json", tmp_path))
    saved = json.loads(state.read_text())
    caught = [h for h, s in saved["hosts"].items() if s == "running"]
    assert saved["status"] == "interrupted" and len(caught) == 1
    clock.now = T0 + 3600
    # the boots the hosts had when the controller went: batch 1's and the caught host rebooted once
    runner = Runner(clock, boots={h: 2 for h, s in saved["hosts"].items() if s in ("done", "running")})
    _stand_ins(monkeypatch, runner)
    result = api.resume(api.ResumeRequest(state=state), handle_signals=False)
    assert result.exit_code == ExitCode.OK, result.document["stopped"]
    assert all(caught[0] not in hosts for hosts in _reboots(runner))  # not rebooted twice
    assert result.rollout is not None and set(result.rollout.hosts.values()) == {"done"}
    golden("state-reboot-resumed.json", state.read_text(), tmp_path)
    golden("audit-reboot-resumed.jsonl", _audit_lines(tmp_path), tmp_path)
    golden("runner-calls-reboot-resumed.json", dump(runner.calls), tmp_path)


def test_rollout_state_of_a_set_env_stopped_by_the_breaker_keeps_only_digests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    runner = Runner(clock)
    runner.fail = {"s1"}
    _stand_ins(monkeypatch, runner)
    request = api.RemediationRequest(
        action="set-env",
        inventory=[_inventory(tmp_path, {"s1": None, "s2": None, "s3": None})],
        params={
            "unit": "trainer",
            "env": {"UCX_MEM_MMAP_HOOK_MODE": "none", "UCX_TOKEN": SECRET},
            "restart": True,
        },
        apply=True,
        max_parallel="1",
        canary=0,
        state=tmp_path / "state" / "set-env.json",
    )
    result = api.remediate(request, handle_signals=False)
    assert result.exit_code == ExitCode.FAILED
    text = (tmp_path / "state" / "set-env.json").read_text()
    assert SECRET not in text and SECRET not in _audit_lines(tmp_path)
    golden("state-set-env-stopped.json", text, tmp_path)
    golden("audit-set-env.jsonl", _audit_lines(tmp_path), tmp_path)
    with pytest.raises(UsageError, match="kept only as digests"):
        api.resume(api.ResumeRequest(state=tmp_path / "state" / "set-env.json"), handle_signals=False)


def test_a_dry_run_state_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock) -> None:
    runner = Runner(clock)
    _stand_ins(monkeypatch, runner)
    request = api.RemediationRequest(
        action="reclaim",
        inventory=[_inventory(tmp_path, {"h1": "us-east-1a", "h2": "us-east-1b"})],
        params={"min_zombies": 10},
        state=tmp_path / "state" / "reclaim.json",
    )
    result = api.remediate(request, handle_signals=False)
    assert result.exit_code == ExitCode.OK
    golden("state-reclaim-dry-run.json", (tmp_path / "state" / "reclaim.json").read_text(), tmp_path)
    assert _audit_lines(tmp_path) == ""  # a dry run changes nothing, audits nothing
    assert [c["check"] for c in runner.calls] == [True, True]


# ---------------------------------------------------------------------------------- legacy states


@pytest.mark.parametrize("name", ["state-done.json", "state-stopped.json"])
def test_the_legacy_state_files_load_and_report(name: str) -> None:
    """The CLI's own state files of an earlier fleetops (tests/unit/fixtures/documents) still load,
    save back byte for byte, and report with the same exit code."""
    rollout = state_mod.Rollout.load(DOCS / name)
    rollout.state_path = json.loads((DOCS / name).read_text())["state_path"]  # load sets where it was read
    assert json.dumps(rollout.to_dict(), indent=2) + "\n" == (DOCS / name).read_text()
    result = api.report(DOCS / name)
    assert result.exit_code == (ExitCode.OK if name == "state-done.json" else ExitCode.FAILED)
    golden(f"report-legacy-{name}", result.json() + "\n")


def test_a_legacy_stopped_state_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    """state-stopped.json (written before the guards, the host timeout and the lease existed): its
    inventory and path moved here, it resumes the failed host and the two pending ones, and is done."""
    inv = _inventory(tmp_path, {"broken": None, "gone": None, "localhost": None}, "inv5.yml")
    text = (DOCS / "state-stopped.json").read_text()
    text = text.replace("/tmp/h5/inv5.yml", str(inv)).replace("/tmp/h5/state", str(tmp_path / "state"))
    state = tmp_path / "state" / "stopped.json"
    state.parent.mkdir()
    state.write_text(text)
    runner = Runner(clock)
    _stand_ins(monkeypatch, runner)
    result = api.resume(api.ResumeRequest(state=state), handle_signals=False)
    assert result.exit_code == ExitCode.OK
    assert [c["hosts"] for c in runner.calls] == [["broken"], ["gone"], ["localhost"]]
    golden("state-legacy-stopped-resumed.json", state.read_text(), tmp_path)


# ---------------------------------------------------------------------------------- documents


def _scan_run(report: dict[str, Any]) -> PlaybookRun:
    """The node_health answers a scan-report fixture was made from."""
    run = PlaybookRun("failed", 2)
    for host, entry in report["hosts"].items():
        if entry["status"] == "unreachable":
            run.tasks[host] = [TaskResult(host, "unreachable", "scan", "fleetops.node.node_health",
                                          {"msg": entry["msg"]})]  # fmt: skip
        else:
            keys = ("findings", "facts", "errors", "checks", "coverage", "duration_ms")
            result = {k: entry[k] for k in keys if k in entry}
            run.tasks[host] = [TaskResult(host, "ok", "scan", "fleetops.node.node_health", result)]
    return run


@pytest.mark.parametrize("name", ["scan-3hosts.json", "scan-localhost.json"])
def test_scan_reports_are_rebuilt_byte_for_byte(name: str) -> None:
    text = (DOCS / name).read_text()
    report = json.loads(text)
    started = calendar.timegm(real_time.strptime(report["started_at"], "%Y-%m-%dT%H:%M:%SZ"))
    built = scan.build_report(_scan_run(report), started=started, finished=started + report["duration_s"])
    assert api.ScanResult(built, scan.exit_code(built)).json() + "\n" == text


def test_the_scan_partial_file(tmp_path: Path, clock: Clock) -> None:
    report = json.loads((DOCS / "scan-3hosts.json").read_text())
    partial = scan.PartialReport(tmp_path / "scan.json.partial")
    for host, entry in report["hosts"].items():
        partial.add(host, entry)
    partial.close(done=False)
    text = (tmp_path / "scan.json.partial").read_text()
    golden("scan-partial.jsonl", text)
    assert scan.read_partial(tmp_path / "scan.json.partial") == report["hosts"]


def test_the_drift_report_is_rebuilt_byte_for_byte() -> None:
    report = json.loads((DOCS / "scan-3hosts.json").read_text())
    hostvars = {"localhost": {"fleetops_az": "us-east-1a"}, "local2": {"fleetops_az": "us-east-1b"},
                "gone": {"fleetops_az": "us-east-1b"}}  # fmt: skip
    document = drift.build_drift(report, hostvars, list(drift.DIMENSIONS))
    assert (
        api.DriftResult(document, drift.exit_code(document)).json() + "\n"
        == (DOCS / "drift-3hosts.json").read_text()
    )


PLAN_HOSTS = [
    *(InventoryHost(n, "us-east-1a", "fleetops_az") for n in ("gpu-a1", "gpu-a2", "gpu-a3")),
    *(InventoryHost(n, "us-east-1b", "fleetops_az") for n in ("gpu-b1", "gpu-b2")),
    InventoryHost("!spare", "us-east-1c", "fleetops_az"),
    InventoryHost("plain", None),
]


@pytest.mark.parametrize(
    ("name", "request_"),
    [
        ("plan-6hosts.json", api.PlanRequest(action="reboot", max_parallel="3", exclude=["plain"])),
        (
            "plan-percent.json",
            api.PlanRequest(action="reboot", max_parallel="50%", per_group_max=None, canary=0),
        ),
        ("plan-empty.json", api.PlanRequest(action="reboot", exclude=["*"])),
    ],
)
def test_plan_documents_are_rebuilt_byte_for_byte(name: str, request_: api.PlanRequest) -> None:
    """The plan is the API's (the batches and document of ``fleetops plan --format json``), over the
    hosts the fixture was made from ('!spare' comes from before the host-name guard: planned directly)."""
    result = api._plan_hosts(request_, PLAN_HOSTS)
    assert json.dumps(result.document, indent=2) + "\n" == (DOCS / name).read_text()


def test_the_json_schemas_are_the_committed_ones() -> None:
    """schemas/*.schema.json (state, scan, drift, plan, policy) as committed, and generated from the
    models: their digests, so a refactor that regenerates them changes this fixture knowingly."""
    manifest: dict[str, str] = {}
    for path in sorted((REPO / "schemas").glob("*.schema.json")):
        manifest[f"schemas/{path.name}"] = hashlib.sha256(path.read_bytes()).hexdigest()
    generated = {name: schemas.json_schema_text(name) for name in sorted(schemas.MODELS)}
    generated[policy_mod.SCHEMA_NAME] = policy_mod.json_schema_text()
    for name, text in generated.items():
        committed = (REPO / "schemas" / f"{name}.schema.json").read_text(encoding="utf-8")
        assert text == committed, f"schemas/{name}.schema.json differs from what its model generates"
    assert set(manifest) == {f"schemas/{n}.schema.json" for n in generated}
    golden("schemas.sha256.json", dump(manifest))


# ---------------------------------------------------------------------------------- EC2 tags, stop, policy state


class FakeTags:
    """module_utils/lease.py's Ec2Tags, recording: no lease tag there at first, each write kept."""

    def __init__(self) -> None:
        self.written: list[tuple[list[str], str, str]] = []

    def read(self) -> dict[str, dict[str, Any]]:
        from fleetops.rollout.lease import LeaseRecord

        out: dict[str, dict[str, Any]] = {}
        for ids, key, value in self.written:
            for iid in ids:
                out.setdefault(iid, {})[key[len(KEY_PREFIX) :]] = LeaseRecord.parse(key, value)
        return out

    def write(self, ids: list[str], key: str, value: str) -> None:
        self.written.append((ids, key, value))

    def delete(self, ids: list[str], key: str, value: str) -> None:
        pass

    def by_region(self) -> dict[str, list[str]]:
        return {"us-east-1": ["i-0a1"]}


class FakeEc2:
    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []

    def create_tags(self, **kwargs: Any) -> None:
        self.created.append(kwargs)


def _lease_value(operator: str) -> tuple[str, str]:
    tags = FakeTags()
    connection = Ec2Connection(endpoint_url="http://127.0.0.1:1", regions=("us-east-1",))
    lease = Ec2Lease(connection, {"gpu-a1": {"instance": "i-0a1", "region": "us-east-1"}},
                     f"20261130T005320Z-{ROLLOUT_HEX}", operator, ttl=900, settle=0, clock=lambda: T0)  # fmt: skip
    lease._tags = tags
    lease.acquire()
    assert len(tags.written) == 1 and lease.value == tags.written[0][2]
    return tags.written[0][1], tags.written[0][2]


def test_ec2_tag_values(tmp_path: Path, clock: Clock) -> None:
    """The values fleetops writes in EC2 tags: the lease (``fleetops:lease:<id>``), the kill switch
    (``fleetops:stop``), a host's ladders (``fleetops.io/ladder``) and budgets spent
    (``fleetops.io/spent``), short and cut to 256; each read back by its parser."""
    from fleetops.rollout.lease import LeaseRecord

    out: dict[str, Any] = {}
    for label, operator in (("lease", f"{OPERATOR}@{MACHINE}"), ("lease-long-operator", "é" * 300)):
        key, value = _lease_value(operator)
        record = LeaseRecord.parse(key, value)
        assert len(value.encode("utf-8")) <= 256
        assert (record.since, record.expires) == (T0, T0 + 900)
        out[label] = {"key": key, "value": value}
    assert out["lease"]["key"].startswith(KEY_PREFIX)
    for label, rollout, reason in (
        ("stop", f"20261130T005320Z-{ROLLOUT_HEX}", "wrong AMI"),
        ("stop-all-long-reason", None, 'a "quoted" reason\nover lines ' * 20),
    ):
        ec2 = FakeEc2()
        written = killswitch.request_stop_ec2(ec2, rollout, reason, f"{OPERATOR}@{MACHINE}", ["i-0b2", "i-0a1"],
                                              now=T0)  # fmt: skip
        assert ec2.created == [{"Resources": ["i-0a1", "i-0b2"], "Tags": [{"Key": killswitch.STOP_TAG,
                                                                           "Value": written.value}]}]  # fmt: skip
        request = killswitch.parse_stop_tag(written.value, "tag")
        assert request.requested == T0 and request.rollout == rollout
        out[label] = {"key": killswitch.STOP_TAG, "value": written.value}

    ladder = policy_mod.LadderState()
    ladder.record("h1", "zombies", "zombie_memcg", 0, "reclaim", T0 - 7200)
    ladder.record("h1", "zombies", "zombie_memcg", 1, "reboot", T0 - 600)
    ladder.record("h1", "gpu-fatal", "gpu_health", 0, "quarantine", T0 - 60)
    for i in range(12):  # more than fits in 256 characters: the oldest are left out
        ladder.record("h2", f"rule-{i:02d}", "crashloop_unit", 0, "disable-unit", T0 - 100 * i)
    ledger = policy_mod.BudgetLedger()
    for i in range(30):
        ledger.record("reboot" if i % 2 else "reclaim", "h1", "us-east-1a", T0 - 60 * i, "ctl")
    ledger.record("replace", "h1", "us-east-1a", T0 - 8 * 86400, "ctl")  # outside any window
    windows = {"reboot": 3600.0, "reclaim": 3600.0, "replace": 86400.0}
    out[policy_mod.TAG_KEY] = {h: ladder.tag_value(h) for h in ("h1", "h2", "h3")}
    out[policy_mod.SPENT_TAG_KEY] = {
        "h1": ledger.tag_value("h1", windows, T0),
        "h2": ledger.tag_value("h2", windows, T0),
    }
    for host, value in out[policy_mod.TAG_KEY].items():
        if value is not None:
            back = policy_mod.LadderState()
            back.merge_tag(host, value, "tag")
            assert back.tag_value(host) == value
    spent = out[policy_mod.SPENT_TAG_KEY]["h1"]
    assert policy_mod.BudgetLedger().merge_tag("h1", "g", spent, "tag", T0) == len(spent.split(";"))
    golden("ec2-tags.json", dump(out))


def test_the_stop_file(tmp_path: Path, clock: Clock) -> None:
    one = killswitch.request_stop(f"20261130T005320Z-{ROLLOUT_HEX}", "wrong AMI", f"{OPERATOR}@{MACHINE}",
                                  directory=tmp_path / "stops", now=T0)  # fmt: skip
    every = killswitch.request_stop(None, "", f"{OPERATOR}@{MACHINE}", directory=tmp_path / "stops")
    golden("stop-files.json", dump({one.name: one.read_text(), every.name: every.read_text()}))
    request = killswitch.pending_stop(f"20261130T005320Z-{ROLLOUT_HEX}", T0, directory=tmp_path / "stops")
    assert request is not None and request.reason == "wrong AMI"


POLICY = """\
schema: fleetops.policy/v1
budgets:
  reclaim: {window: 1h, per_group: 1}
  reboot: {window: 1h, max: 5, per_group_pct: 50}
rules:
  - name: zombies
    match:
      - check: zombie_memcg
    ladder:
      - {action: reclaim, clear_after: 10m, params: {min_zombies: 10}}
      - {action: reboot, clear_after: 30m}
      - {action: human, note: zombies survive reboots; find the culprit}
"""


def test_the_policy_state_files_and_the_auto_document(tmp_path: Path, clock: Clock) -> None:
    """Two ``remediate auto`` passes (fleetops.auto.run_pass, the actions stood in for) over
    scan-3hosts.json: the ladder.json and ledger.json they leave, their fleetops.auto/v1 documents and
    the EC2 tags they would write; the saved files load back and save byte for byte."""
    policy = policy_mod.parse_policy(POLICY, "policy.yml")
    report = json.loads((DOCS / "scan-3hosts.json").read_text())
    group_of = {"localhost": "us-east-1a", "local2": "us-east-1b", "gone": "us-east-1b"}
    tags = {
        "localhost": auto_mod.TagTarget("i-0a1", "us-east-1", None, None),
        "local2": auto_mod.TagTarget("i-0b2", "us-east-1", None, f"reclaim:{int(T0) - 600}"),
    }

    def run_action(action: str, hosts: Sequence[str], params: Any) -> auto_mod.ActionRun:
        done = frozenset(hosts)
        return auto_mod.ActionRun(action, tuple(hosts), params, attempted=done, done=done,
                                  document={"schema": api.ROLLOUT_SCHEMA, "action": action})  # fmt: skip

    documents: dict[str, Any] = {}
    for n, at in ((1, T0), (2, T0 + 3600)):
        lines: list[str] = []
        inputs = auto_mod.PassInputs(policy, "policy.yml", report, group_of, tmp_path / "auto", True, tags)
        result = auto_mod.run_pass(
            inputs, run_action, lambda text, style, out=lines: out.append(text), clock=lambda t=at: t
        )
        documents[f"pass-{n}"] = {
            "document": result.document(),
            "tags_after": result.tags_after,
            "lines": lines,
        }
        tags = {h: auto_mod.TagTarget(t.instance, t.region, result.tags_after[h][policy_mod.TAG_KEY],
                                      result.tags_after[h][policy_mod.SPENT_TAG_KEY]) for h, t in tags.items()}  # fmt: skip
    golden("auto-passes.json", dump(documents))
    ladder_text = (tmp_path / "auto" / "ladder.json").read_text()
    ledger_text = (tmp_path / "auto" / "ledger.json").read_text()
    golden("policy-ladder.json", ladder_text)
    golden("policy-ledger.json", ledger_text)
    copy = tmp_path / "copy"
    policy_mod.LadderState.load(tmp_path / "auto" / "ladder.json").save(copy / "ladder.json")
    policy_mod.BudgetLedger.load(tmp_path / "auto" / "ledger.json").save(copy / "ledger.json")
    assert (copy / "ladder.json").read_text() == ladder_text
    assert (copy / "ledger.json").read_text() == ledger_text


def test_the_checked_in_policy_state_files_still_load(tmp_path: Path) -> None:
    """Old ladder.json / ledger.json keep working: they load (validated) and a pass can use them."""
    ladder = policy_mod.LadderState.load(GOLDEN / "policy-ladder.json")
    ledger = policy_mod.BudgetLedger.load(GOLDEN / "policy-ledger.json")
    assert ladder.hosts and ledger.entries
    assert policy_state._dump(ladder.to_json()) == (GOLDEN / "policy-ladder.json").read_text()
    assert policy_state._dump(ledger.to_json()) == (GOLDEN / "policy-ledger.json").read_text()


# ---------------------------------------------------------------------------------- extra vars, exit codes


def _json_default(value: Any) -> Any:
    if value is REQUIRED:
        return "<required>"
    if isinstance(value, tuple):
        return list(value)
    return value


ALL_ON: dict[str, dict[str, Any]] = {
    "disable-unit": {"unit": "ecs", "containers": ["ecs-agent"], "protected": ["kubelet.service"],
                     "allow_protected": True},
    "reclaim": {"min_zombies": 100, "reboot_threshold": 5000, "method": "memory_reclaim"},
    "fix": {"sample_seconds": 5.0, "protected": ["x.service"], "reboot_threshold": 5000, "min_zombies": 100,
            "method": "drop_caches", "ucx_fix": "hooks"},
    "reboot": {"reboot_timeout": 300, "pre_hook": "/bin/pre", "post_hook": "/bin/post", "kube_drain": True,
               "drain_timeout": 200, "kubeconfig": "/etc/kube/config", "kubectl": "/usr/bin/kubectl"},
    "set-env": {"unit": "trainer", "env": {"UCX_MEM_MMAP_HOOK_MODE": "none"}, "restart": True,
                "drop_in": "60-x.conf", "show_values": True},
    "quarantine": {"finding": "gpu_health", "reason": "Xid 79", "evict": True, "drain_timeout": 300,
                   "kubeconfig": "/etc/kube/config", "kubectl": "/usr/bin/kubectl"},
    "stop-start": {"stop_timeout": 300, "start_timeout": 400, "finding": "gpu_health"},
    "unquarantine": {"sample_seconds": 5.0, "kubeconfig": "/etc/kube/config", "kubectl": "/usr/bin/kubectl"},
    "replace": {"timeout": 900, "method": "unhealthy"},
}  # fmt: skip
REQUIRED_GIVEN = {"unit": "ecs", "env": {"UCX_MEM_MMAP_HOOK_MODE": "none"}, "finding": "gpu_health"}


def test_the_remediations_their_parameters_and_extra_vars() -> None:
    """Each remediation's playbook, modules, parameters (and defaults) and the extra vars its defaults
    and every option become; the probe and post-pass vars; what every batch run adds; the waits
    --host-timeout must exceed (Remediation.check_host_timeout's table)."""
    from fleetops.scan import ScanOptions

    assert set(ALL_ON) == set(REMEDIATIONS)
    out: dict[str, Any] = {}
    for name, r in REMEDIATIONS.items():
        defaults = r.resolve({k: v for k, v in REQUIRED_GIVEN.items() if r.params.get(k, None) is REQUIRED})
        everything = r.resolve(ALL_ON[name])
        xv_all = r.extravars(everything)
        out[name] = {
            "playbook": r.playbook,
            "actions": list(r.actions),
            "params": dict(r.params),
            "extravars_defaults": r.extravars(defaults),
            "extravars_all_options": xv_all,
            "probe_vars": r.probe_vars,
            "post_vars": r.post_vars(xv_all) if r.post_vars else None,
            "has_gate": r.gate is not None,
            "has_prepare": r.prepare is not None,
            "cooldown": r.cooldown,
            "host_timeout": r.host_timeout,
            "max_unhealthy": r.max_unhealthy,
            "replaces_host": r.replaces_host,
        }
    waits = {v: 10 * (i + 1) for i, v in enumerate(("fleetops_reboot_timeout", "fleetops_drain_timeout",
             "fleetops_stop_timeout", "fleetops_start_timeout", "fleetops_replace_timeout",
             "fleetops_replace_connect_timeout"))}  # fmt: skip
    with pytest.raises(UsageError) as err:
        REMEDIATIONS["reboot"].check_host_timeout(210, waits)
    assert REMEDIATIONS["reboot"].check_host_timeout(211, waits) == 211
    every_batch = {
        "batch_vars": engine_mod.BATCH_VARS,
        "lease_var": engine_mod.LEASE_VAR,
        "host_timeout_var": engine_mod.HOST_TIMEOUT_VAR,
        "guards_key": engine_mod.GUARDS_KEY,
        "secret_vars": [state_mod.SECRET_ENV_VAR, state_mod.SHOW_VALUES_VAR, state_mod.DIGESTED_VAR],
        "check_host_timeout": str(err.value),
        "scan_playbook_vars": ScanOptions(inventory=[], sample_seconds=5.0, zombie_warning=10, zombie_critical=20,
                                          headroom_critical_pct=5.0, checks=["zombie_memcg"], host_timeout=30,
                                          extravars={"fleetops_unit_allowlist": ["a.service"]}).playbook_vars(),
    }  # fmt: skip
    golden("remediations.json", json.dumps({"remediations": out, "every_batch": every_batch}, indent=2,
                                           default=_json_default) + "\n")  # fmt: skip


def _subclasses(cls: type[FleetopsError]) -> Iterator[type[FleetopsError]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_exit_codes() -> None:
    """The exit codes: the list, the signals', each library error's (those this module's imports load:
    fleetops.cli's own, loaded or not by other tests, are left out), and those of the documents'
    fixtures."""
    errors: dict[str, int] = {}
    for c in _subclasses(FleetopsError):
        module = c.__module__
        if module.split(".")[0] == "fleetops" and not module.startswith("fleetops.cli"):
            assert c.__name__ not in errors, c
            errors[c.__name__] = int(c.exit_code)
    documents: dict[str, int] = {}
    for path in sorted(DOCS.glob("*.json")):
        data = json.loads(path.read_text())
        if path.name.startswith("scan-"):
            documents[path.name] = int(scan.exit_code(data))
        elif path.name.startswith("drift-"):
            documents[path.name] = int(drift.exit_code(data))
        elif path.name.startswith("state-"):
            documents[path.name] = int(api.report(path).exit_code)
    codes = {
        "ExitCode": {c.name: int(c) for c in ExitCode},
        "signals": {s.name: int(signal_exit_code(s)) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        | {"none": int(signal_exit_code(None))},
        "Signalled": {s.name: Signalled(s).exit_code for s in (signal.SIGTERM, signal.SIGHUP)},
        "errors": dict(sorted(errors.items())),
        "documents": documents,
    }
    golden("exit-codes.json", dump(codes))


def test_a_rollout_resolves_its_targets_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    """The plan's listing is the run's: ansible-inventory runs once per rollout (twice with a --limit:
    the full listing holds the group names), not again when the run starts; a resume lists again."""
    from fleetops.ansible import inventory as inventory_mod

    listings: list[str | None] = []
    real = inventory_mod._list_inventory

    def counted(inventories: Sequence[Path], limit: str | None) -> dict[str, Any]:
        listings.append(limit)
        return real(inventories, limit)

    monkeypatch.setattr(inventory_mod, "_list_inventory", counted)
    _stand_ins(monkeypatch, Runner(clock))
    inv = _inventory(tmp_path, {"h1": "us-east-1a", "h2": "us-east-1b"})
    state = tmp_path / "state" / "reclaim.json"
    request = api.RemediationRequest(
        action="reclaim", inventory=[inv], params={"min_zombies": 10}, state=state
    )
    assert api.remediate(request, handle_signals=False).exit_code == ExitCode.OK
    assert listings == [None]
    listings.clear()
    limited = api.RemediationRequest(
        action="reclaim", inventory=[inv], limit="h1", params={"min_zombies": 10}
    )
    assert api.remediate(limited, handle_signals=False).exit_code == ExitCode.OK
    assert listings == [None, "h1"]
