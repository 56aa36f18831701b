"""Secrets at rest: set-env values are kept only as digests (state, audit log, report, output) unless
--show-values; every file fleetops writes is 0600 in a 0700 directory; no writer follows a planted link.

The rollouts here run the real engine, state and audit code with a stand-in batch runner (no hosts on
this machine): it answers what the set_env module answers (``env_before`` / ``env_after`` digested with
the module's own ``digest_value``, its ``diff``) and, as a net for a careless module, a ``msg`` that
repeats the value. That the module digests its own results is tested in
tests/unit/plugins/modules/test_set_env.py and on real systemd in tests/integration/test_ucx_lab.py.
"""

from __future__ import annotations

import io
import json
import logging
import os
import secrets
import stat
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.fleetops.node.plugins.module_utils import systemd
from rich.console import Console

from fleetops import api, util
from fleetops.ansible.runner import PlaybookRun, TaskResult
from fleetops.cli.observer import ConsoleObserver
from fleetops.errors import UsageError
from fleetops.paths import state_home
from fleetops.remediations import REMEDIATIONS
from fleetops.rollout.audit import AuditError, audit, audit_path
from fleetops.rollout.engine import Engine
from fleetops.rollout.outcome import HostOutcome
from fleetops.rollout.state import Rollout, new_rollout
from fleetops.scan import PartialReport, write_report
from tests.helpers import fleetops


class SetEnvRunner:
    """Answers as fleetops.node.set_env does (values digested unless show_values), plus a careless msg."""

    def __init__(self) -> None:
        self.extravars: list[dict[str, Any]] = []

    def __call__(
        self,
        hosts: Sequence[str],
        extravars: dict[str, Any],
        *,
        check: bool,
        on_result: Callable[[TaskResult], None] | None,
        cancel: threading.Event | None,
    ) -> PlaybookRun:
        self.extravars.append(extravars)
        env: dict[str, str] = extravars["fleetops_env"]
        shown = bool(extravars.get("fleetops_show_values"))

        def show(value: str) -> str:
            return value if shown else systemd.digest_value(value)

        run = PlaybookRun(status="successful", rc=0)
        for host in hosts:
            result = {
                "changed": True,
                "unit": extravars["fleetops_unit"],
                "env_before": {k: show("old") for k in env},
                "env_after": {k: show(v) for k, v in env.items()},
                "changed_vars": sorted(env),
                "values_shown": shown,
                "diff": {
                    "before": "",
                    "after": "".join(f"Environment={k}={show(v)}\n" for k, v in env.items()),
                },
                "msg": "set " + " ".join(f"{k}={v}" for k, v in env.items()),  # careless: the net's job
            }
            tr = TaskResult(host, "ok", "set env", "fleetops.node.set_env", result)
            run.tasks[host] = [tr]
            if on_result is not None:
                on_result(tr)
        return run


def _set_env_rollout(tmp_path: Path, value: str, show: bool = False) -> tuple[Rollout, str, SetEnvRunner]:
    remediation = REMEDIATIONS["set-env"]
    params = remediation.resolve({"unit": "app.service", "env": [("API_TOKEN", value)], "show_values": show})
    rollout = new_rollout(
        action="set-env",
        apply=True,
        inventory=[tmp_path / "hosts.yml"],
        extravars=remediation.extravars(params),
        plan={"schema": "fleetops.plan/v1", "hosts": 2, "batches": [["h1"], ["h2"]]},
        max_failures=0,
        cooldown=0.0,
        gate=False,
        state_path=None,
    )
    out = io.StringIO()
    runner = SetEnvRunner()
    engine = Engine(
        rollout=rollout,
        actions=remediation.actions,
        runner=runner,
        scanner=lambda hosts: {h: {"status": "ok", "findings": []} for h in hosts},
        observer=ConsoleObserver(Console(file=out, width=200)),
    )
    assert engine.run().status == "done"
    return rollout, out.getvalue(), runner


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "state"
    home.mkdir(mode=0o755)
    os.chmod(home, 0o755)  # as an older fleetops (or a umask) left it
    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(home))
    monkeypatch.delenv("FLEETOPS_AUDIT_LOG", raising=False)
    return home


def _all_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def test_digest_is_the_modules() -> None:
    for value in ("", "x", "s3cr3t", "ünïcødé ✓", "\udcff"):
        assert util.digest_value(value) == systemd.digest_value(value)


def test_set_env_values_never_rest_in_a_file_or_output(
    tmp_path: Path, state_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    value = "tok-" + secrets.token_hex(16)
    with caplog.at_level(logging.WARNING, logger="fleetops"):
        rollout, output, runner = _set_env_rollout(tmp_path, value)
    assert runner.extravars[0]["fleetops_env"] == {"API_TOKEN": value}  # the hosts get the value itself
    assert f"tightened {state_dir} from 0755 to 0700" in caplog.text
    digest = util.digest_value(value)
    state = Path(rollout.state_path)
    assert state.parent.parent == state_dir and audit_path() == state_dir / "audit.jsonl"
    report = api.report(state)  # read back through the validated loader
    saved = json.loads(state.read_text())
    assert saved["extravars"]["fleetops_env"] == {"API_TOKEN": digest}
    assert saved["results"]["h1"]["result"]["env_after"] == {"API_TOKEN": digest}
    lines = [json.loads(ln) for ln in audit_path().read_text().splitlines()]
    assert [e["host"] for e in lines] == ["h1", "h2"]
    assert lines[0]["before"] == {"env": {"API_TOKEN": util.digest_value("old")}}
    assert lines[0]["after"] == {"env": {"API_TOKEN": digest}}
    assert saved["results"]["h1"]["result"]["msg"] == f"set API_TOKEN={digest}"  # the net caught it
    cli = fleetops(
        "report", str(state), "--format", "json", env={"FLEETOPS_STATE_DIR": str(state_dir)}, timeout=60
    )
    assert cli.rc == 0, cli.stderr
    everything = [output, report.json(), cli.stdout, cli.stderr] + [
        p.read_text() for p in _all_files(state_dir)
    ]
    assert len(everything) >= 6 and digest in "".join(everything)
    for text in everything:
        assert value not in text
    for path in _all_files(state_dir):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for path in [state_dir, *(p for p in state_dir.rglob("*") if p.is_dir())]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    # a digest is not a value to set: resuming it is refused, with what to do instead
    state.write_text(json.dumps({**saved, "status": "interrupted", "hosts": {"h1": "done", "h2": "pending"}}))
    with pytest.raises(UsageError, match="kept only as digests"):
        api.resume(api.ResumeRequest(state=state))


def test_show_values_keeps_them(tmp_path: Path, state_dir: Path) -> None:
    rollout, _, runner = _set_env_rollout(tmp_path, "UCX-none", show=True)
    assert runner.extravars[0]["fleetops_show_values"] is True
    saved = json.loads(Path(rollout.state_path).read_text())
    assert saved["extravars"]["fleetops_env"] == {"API_TOKEN": "UCX-none"}
    assert saved["results"]["h1"]["result"]["env_after"] == {"API_TOKEN": "UCX-none"}
    assert "UCX-none" in audit_path().read_text()


def test_show_values_flag_reaches_the_playbook() -> None:
    from fleetops.cli.app import build_parser
    from fleetops.cli.remediate import remediation_request

    args = build_parser().parse_args(["remediate", "set-env", "--unit", "a", "--env", "K=v", "--show-values"])
    request = remediation_request(args)
    params = REMEDIATIONS["set-env"].resolve(request.params)
    assert REMEDIATIONS["set-env"].extravars(params)["fleetops_show_values"] is True
    args = build_parser().parse_args(["remediate", "set-env", "--unit", "a", "--env", "K=v"])
    params = REMEDIATIONS["set-env"].resolve(remediation_request(args).params)
    assert "fleetops_show_values" not in REMEDIATIONS["set-env"].extravars(params)
    text = (Path(__file__).parents[2] / "playbooks" / "remediate_set_env.yml").read_text()
    assert 'show_values: "{{ fleetops_show_values | default(omit) }}"' in text


# ---- files 0600, no link followed


def test_reports_and_partial_are_0600_and_metrics_0644(tmp_path: Path) -> None:
    """Reports may hold what a host said; the node_exporter textfile holds no secret (counts, names) and
    must be read by node_exporter's own user: 0644 whatever the umask, as the host timer writes it."""
    from fleetops.metrics import write_textfile

    report = {"schema": "fleetops.scan/v1", "started_at": "2026-01-01T00:00:00Z", "duration_s": 0.1,
              "hosts": {}, "summary": {"hosts": 0, "ok": 0, "unreachable": 0, "failed": 0, "errors": 0,
                                       "findings": {}}}  # fmt: skip
    loose = tmp_path / "report.json"
    loose.write_text("old")
    os.chmod(loose, 0o644)
    write_report(loose, json.dumps(report))
    write_textfile(report, tmp_path / "fleet.prom")
    partial = PartialReport(tmp_path / "report.json.partial")
    partial.add("h1", {"status": "ok"})
    for name in ("report.json", "report.json.partial"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
    assert stat.S_IMODE((tmp_path / "fleet.prom").stat().st_mode) == 0o644
    partial.close(done=True)


def _plant(link: Path, target: Path) -> None:
    target.write_text("precious\n")
    link.symlink_to(target)


def test_atomic_write_never_follows_a_link_planted_at_its_temp_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = iter(["aaaa", "bbbb"])
    monkeypatch.setattr(util.secrets, "token_hex", lambda n: next(names))
    target = tmp_path / "outside"
    out = tmp_path / "report.json"
    _plant(tmp_path / f".report.json.{os.getpid()}.aaaa.tmp", target)
    util.atomic_write(out, "new\n")
    assert out.read_text() == "new\n" and target.read_text() == "precious\n"
    assert (tmp_path / f".report.json.{os.getpid()}.aaaa.tmp").is_symlink()  # left alone


@pytest.mark.parametrize("writer", ["state", "report", "metrics"])
def test_each_atomic_writer_replaces_a_link_at_its_path_without_following_it(
    tmp_path: Path, writer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetops.metrics import write_textfile

    target = tmp_path / "outside"
    path = tmp_path / "out.json"
    _plant(path, target)
    names = iter(["cccc", "dddd"])
    monkeypatch.setattr(util.secrets, "token_hex", lambda n: next(names))
    _plant(tmp_path / f".out.json.{os.getpid()}.cccc.tmp", tmp_path / "outside2")
    report = {"hosts": {}, "summary": {"hosts": 0, "ok": 0, "unreachable": 0, "failed": 0, "errors": 0}}
    if writer == "state":
        rollout = new_rollout(action="reclaim", apply=False, inventory=[], extravars={},
                              plan={"batches": [["h1"]]}, max_failures=0, cooldown=0.0, gate=False,
                              state_path=path)  # fmt: skip
        rollout.save()
    elif writer == "report":
        write_report(path, "{}\n")
    else:
        write_textfile(report, path)
    assert target.read_text() == "precious\n" and (tmp_path / "outside2").read_text() == "precious\n"
    mode = 0o644 if writer == "metrics" else 0o600  # a textfile node_exporter reads; the others private
    assert not path.is_symlink() and stat.S_IMODE(path.stat().st_mode) == mode


def test_partial_and_audit_refuse_a_planted_link(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "outside"
    _plant(tmp_path / "scan.json.partial", target)
    with pytest.raises(UsageError, match=r"scan\.json\.partial: a symbolic link \(not followed\)"):
        PartialReport(tmp_path / "scan.json.partial")
    assert target.read_text() == "precious\n"
    log = tmp_path / "audit.jsonl"
    _plant(log, tmp_path / "outside-audit")
    monkeypatch.setenv("FLEETOPS_AUDIT_LOG", str(log))
    rollout = new_rollout(action="reclaim", apply=True, inventory=[], extravars={},
                          plan={"batches": [["h1"], ["h2"]]}, max_failures=0, cooldown=0.0, gate=False,
                          state_path=tmp_path / "state.json")  # fmt: skip
    with pytest.raises(AuditError, match="Failed to write the audit log"):
        audit(rollout, "h1", HostOutcome(status="ok", changed=True))
    assert (tmp_path / "outside-audit").read_text() == "precious\n"
    saved = json.loads((tmp_path / "state.json").read_text())
    assert saved["status"] == "stopped" and "audit log could not be written" in saved["stopped"]["reason"]
    assert saved["stopped"]["pending"] == ["h1", "h2"]


def test_state_home_is_created_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(tmp_path / "new" / "state"))
    # applied: a dry run with no --state saves nothing (Rollout.keep)
    rollout = new_rollout(action="reclaim", apply=True, inventory=[], extravars={},
                          plan={"batches": [["h1"]]}, max_failures=0, cooldown=0.0, gate=False,
                          state_path=None)  # fmt: skip
    rollout.save()
    assert Path(rollout.state_path).parent == state_home() / "rollouts"
    for d in (state_home(), state_home() / "rollouts"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
