"""Issue 40, items 1, 4 (part) and 7: input checked on the controller before any host is contacted (exit 2, one
line, nothing started), `scan --fail-on`, the Prometheus file's mode and `-`, and the words of a dry run.

Through the real ``fleetops.cli.app.main`` with real inventories in tmp_path; the scans that run, run on this
machine (ansible's local connection). "Nothing started" is shown by the files a started scan or rollout
writes first (``-o FILE``'s ``FILE.partial``, the rollout's state) and by a host that fails when contacted.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from fleetops.cli.app import main
from tests.paths import REPO

# a host that fails at once if anything contacts it (nothing listens on port 1)
DEAD = "dead: {ansible_host: 127.0.0.1, ansible_port: 1, ansible_connection: ssh}"
EVENTS = [{"Code": "system-reboot", "Description": "scheduled reboot", "EventId": "e-1"}]
CRITICAL_EVENTS = [{"Code": "instance-stop", "Description": "scheduled stop", "EventId": "e-2"}]


def _inventory(tmp_path: Path, *hosts: str) -> Path:
    path = tmp_path / "inv.yml"
    lines = hosts or (
        f"localhost: {{ansible_connection: local, ansible_python_interpreter: {sys.executable}}}",
    )
    path.write_text("all:\n  hosts:\n" + "".join(f"    {h}\n" for h in lines))
    return path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        rc = main(list(argv))
    except SystemExit as exc:  # argparse's own errors (exit 2, one line)
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def _usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    rc, out, err = _run(capsys, *argv)
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2 and out == "" and len(lines) == 1, (rc, out, err)
    return lines[0]


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = tmp_path / "state"
    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(state))
    return state


# ------------------------------------------------------------------------- scan: checked before it runs


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (
            ["--checks", "gpu,zombie"],
            [
                "--checks: unknown check 'gpu' (did you mean gpu_health?)",
                "known: zombie_memcg, crashloop_unit",
            ],
        ),
        (["--checks", "zombie_memcg,foo"], ["--checks: unknown check 'foo'"]),
        (
            ["-e", "fleetops_zombie_warnin=1"],
            [
                "-e fleetops_zombie_warnin: not a knob of playbooks/scan.yml (did you mean fleetops_zombie_warning?)"
            ],
        ),
        (["-e", "zombie_warning=1"], ["(did you mean fleetops_zombie_warning?)"]),
        (["-e", "fleetops_zombie_warning=abc"], ["-e fleetops_zombie_warning='abc': ", "convert to int"]),
        (["-e", "fleetops_imds=sometimes"], ["-e fleetops_imds='sometimes': value of imds must be one of"]),
        (["-e", "fleetops_checks=[zombie_memcg,nope]"], ["-e fleetops_checks: unknown check 'nope'"]),
        (["-e", "fleetops_host_timeout=soon"], ["-e fleetops_host_timeout='soon'"]),
        (
            ["-e", "fleetops_zombie_warning=500 fleetops_zombie_critical=100"],
            ["zombie_warning (500) must not be greater than zombie_critical (100)"],
        ),
        (["-e", "fleetops_cpu_system_warning_pct=-1"], ["cpu_system_warning_pct must not be negative"]),
        (["--fail-on", "sometimes"], ["invalid choice: 'sometimes'"]),
        (["--prometheus", "-", "--format", "json"], ["--prometheus - and --format json would both write"]),
    ],
)
def test_a_scan_refuses_bad_input_before_any_host_is_contacted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], needles: list[str]
) -> None:
    inv = _inventory(tmp_path, DEAD)
    out, prom = tmp_path / "r.json", tmp_path / "m.prom"
    line = _usage_error(
        capsys, "scan", "-i", str(inv), "-q", "-o", str(out), "--prometheus", str(prom), *args
    )
    for needle in needles:
        assert needle in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inv.yml"]  # no r.json.partial: nothing started


def test_a_scan_passes_ansible_variables_and_valid_knobs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ansible's own variables pass through; knobs of the right type are sent as given."""
    inv = _inventory(tmp_path)
    rc, out, err = _run(
        capsys, "scan", "-i", str(inv), "-q", "--format", "json", "--checks", "zombie_memcg",
        "-e", "ansible_remote_tmp=/tmp/.fleetops-cli-test", "-e", "fleetops_zombie_warning=1000000",
        "-e", "fleetops_zombie_critical=1000001",
    )  # fmt: skip
    assert rc == 0, err
    assert json.loads(out)["hosts"]["localhost"]["checks"] == ["zombie_memcg"]


# ------------------------------------------------------------------------- scan: --fail-on


@pytest.mark.parametrize(
    ("events", "fail_on", "code"),
    [
        (EVENTS, None, 1),  # today's default: a warning exits 1
        (EVENTS, "warning", 1),
        (EVENTS, "critical", 0),
        (CRITICAL_EVENTS, "critical", 1),
        (CRITICAL_EVENTS, "never", 0),
    ],
)
def test_fail_on_sets_which_findings_exit_1(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    events: list[dict[str, str]],
    fail_on: str | None,
    code: int,
) -> None:
    inv = _inventory(tmp_path)
    knobs = json.dumps({"fleetops_inventory_events": events, "fleetops_imds": "never"})
    more = ["--fail-on", fail_on] if fail_on else []
    rc, out, err = _run(
        capsys,
        "scan",
        "-i",
        str(inv),
        "-q",
        "--format",
        "json",
        "--checks",
        "ec2_scheduled_event",
        "-e",
        knobs,
        *more,
    )
    (finding,) = json.loads(out)["hosts"]["localhost"]["findings"]
    assert finding["severity"] == ("critical" if events is CRITICAL_EVENTS else "warning")
    assert rc == code, err


def test_fail_on_never_still_exits_3_for_a_host_not_scanned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inv = _inventory(tmp_path, DEAD)
    rc, _out, _err = _run(capsys, "scan", "-i", str(inv), "-q", "--format", "json", "--fail-on", "never")
    assert rc == 3


# ------------------------------------------------------------------------- scan: the Prometheus file


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another user may enter (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="fleetops-prom-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        for child in path.iterdir():
            child.unlink()
        path.rmdir()


@pytest.mark.skipif(os.geteuid() != 0, reason="reads the file as another user: needs root (runuser)")
def test_the_prometheus_file_is_readable_by_node_exporters_user_and_a_subset_scan_is_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shared_dir: Path
) -> None:
    """0644 whatever the umask (node_exporter runs as its own user); a host scanned with a subset of the
    checks is up."""
    prom = shared_dir / "fleetops.prom"
    old = os.umask(0o077)
    try:
        rc, _out, err = _run(
            capsys, "scan", "-i", str(_inventory(tmp_path)), "-q", "--checks", "zombie_memcg,gpu_health",
            "--prometheus", str(prom),
        )  # fmt: skip
    finally:
        os.umask(old)
    assert rc in (0, 1), err
    assert stat.S_IMODE(prom.stat().st_mode) == 0o644
    read = subprocess.run(
        ["runuser", "-u", "nobody", "--", "cat", str(prom)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert read.returncode == 0, read.stderr
    assert 'fleetops_scan_host_up{host="localhost"} 1.0' in read.stdout
    assert [p.name for p in shared_dir.iterdir()] == ["fleetops.prom"]  # no temporary file left


def test_prometheus_dash_writes_the_metrics_to_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    rc, out, err = _run(
        capsys, "scan", "-i", str(_inventory(tmp_path)), "-q", "--checks", "zombie_memcg", "--prometheus", "-"
    )
    assert rc == 0, err
    assert out.startswith("# HELP fleetops_") and 'fleetops_scan_host_up{host="localhost"} 1.0' in out
    assert all(
        line.startswith(("# ", "fleetops_")) for line in out.splitlines()
    )  # the metrics only: no table
    assert not (tmp_path / "-").exists()


# ------------------------------------------------------------------------- remediate and plan: checked first


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["disable-unit", "--unit", "bad unit!!"],
            "remediate disable-unit: --unit: 'bad unit!!.service' is not a valid",
        ),
        (
            ["disable-unit", "--unit", "ecs", "--container", "a b"],
            "--container: 'a b' is not a valid container name",
        ),
        (["disable-unit", "--unit", "ecs", "--protected", "ssh d"], "--protected: --protected entry 'ssh d'"),
        (["fix", "--protected", "a;b"], "remediate fix: --protected: "),
        (["set-env", "--unit", "x;y", "--env", "A=1"], "remediate set-env: --unit: "),
        (["set-env", "--unit", "vllm", "--env", "1A=1"], "--env: '1A' is not a valid variable name"),
        (
            ["set-env", "--unit", "vllm", "--env", "A=1", "--drop-in", "../x.conf"],
            "--drop-in: drop_in '../x.conf'",
        ),
    ],
)
def test_a_remediation_refuses_a_value_its_module_would_refuse_before_any_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], state_dir: Path, args: list[str], needle: str
) -> None:
    inv = _inventory(tmp_path, DEAD)
    line = _usage_error(capsys, "remediate", *args, "-i", str(inv), "--apply")
    assert needle in line, line
    assert not state_dir.exists()  # no rollout started: no state, no lock, no audit


def test_plan_refuses_an_unknown_action(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _usage_error(capsys, "plan", "rebot", "-i", str(_inventory(tmp_path, DEAD)))
    assert "unknown remediation 'rebot' (did you mean reboot?); one of disable-unit, reclaim" in line


def test_exclude_takes_one_value_and_never_the_action(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inv = _inventory(tmp_path, *(f"gpu-0{i}: {{}}" for i in range(1, 5)))
    rc, out, err = _run(
        capsys, "plan", "-i", str(inv), "--exclude", "gpu-01", "--exclude", "gpu-02,gpu-03", "reboot",
        "--format", "json",
    )  # fmt: skip
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["action"] == "reboot" and doc["excluded"] == ["gpu-01", "gpu-02", "gpu-03"]
    assert [h for batch in doc["batches"] for h in batch] == ["gpu-04"]
    assert "an empty host name" in _usage_error(
        capsys, "plan", "reboot", "-i", str(inv), "--exclude", "gpu-01,"
    )


# ------------------------------------------------------------------------- dry runs and their words


def test_a_dry_run_writes_no_rollout_file_and_says_would_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], state_dir: Path
) -> None:
    inv = _inventory(tmp_path)
    rc, out, err = _run(
        capsys, "remediate", "reclaim", "-i", str(inv), "--min-zombies", "0", "--format", "json"
    )
    doc = json.loads(out)
    assert rc == 0, err
    assert doc["apply"] is False and doc["state"] is None
    assert not (state_dir / "rollouts").exists() or not list((state_dir / "rollouts").iterdir())
    rc, out, err = _run(capsys, "remediate", "reclaim", "-i", str(inv), "--min-zombies", "0")
    assert rc == 0 and "would change" in out and "(dry run: add --apply to change hosts)" in out, (out, err)
    assert "resume with" not in err
    # the summary of a dry run never says done: its hosts were checked (it said "1 would change, 1 done")
    (summary,) = [line for line in out.splitlines() if line.startswith("reclaim: ")]
    assert re.search(r"\bdone\b", summary) is None, summary
    assert re.fullmatch(r"reclaim: 1 host\(s\): 1 checked \([01] would change\), 0 failed, 0 pending, "
                        r"0 skipped; every host checked \(dry run: add --apply to change hosts\)", summary), summary  # fmt: skip


def test_a_fix_plan_is_printed_as_the_operator_would_type_it() -> None:
    from fleetops.remediations.behaviour import fix_plan_text

    todo: dict[str, Any] = {
        "disable_units": ["ecs.service"],
        "reclaim": True,
        "set_env": [{"unit": "vllm.service", "env": {"UCX_RCACHE_MAX_UNRELEASED": "1024"}}],
    }
    assert fix_plan_text(todo) == (
        "disable-unit --unit ecs.service; reclaim; "
        "set-env --unit vllm.service --env UCX_RCACHE_MAX_UNRELEASED=1024 --restart"
    )
    assert fix_plan_text({"disable_units": [], "reclaim": False}) == "nothing"


# ------------------------------------------------------------------------- the auto pass's document


def test_a_real_auto_pass_matches_its_schema_and_counts_rungs_from_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], state_dir: Path
) -> None:
    """`remediate auto --format json` on this machine, with a policy whose first rung acts on the scheduled
    event the scan is told of: its document validates against schemas/auto-pass.schema.json, and the JSON's
    rung is the text's."""
    policy = tmp_path / "policy.yml"
    policy.write_text(
        "schema: fleetops.policy/v1\n"
        "budgets:\n"
        "  reclaim: {window: 1h, per_group_pct: 100}\n"
        "rules:\n"
        "  - name: events\n"
        "    match: [{check: ec2_scheduled_event}]\n"
        "    ladder:\n"
        "      - {action: reclaim, clear_after: 1h}\n"
        "      - {action: human, note: look at it}\n"
    )
    inv = tmp_path / "inv.yml"
    inv.write_text(
        "all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
        f"      ansible_python_interpreter: {sys.executable}\n      fleetops_imds: never\n"
        f"      ec2_scheduled_events: {json.dumps(EVENTS)}\n"
    )
    rc, out, err = _run(
        capsys, "remediate", "auto", "-i", str(inv), "--policy", str(policy), "--format", "json"
    )
    assert rc == 0, err
    doc = json.loads(out)
    schema = json.loads((REPO / "schemas" / "auto-pass.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)
    (decision,) = doc["decisions"]
    assert decision["status"] == "act" and decision["rung"] == 1 and decision["rungs"] == 2, (decision, err)
    assert doc["actions"] and doc["actions"][0]["rollout"]["state"] is None  # a dry run: no state file
    assert not (state_dir / "rollouts").exists() or not list((state_dir / "rollouts").iterdir())
    rc, out, err = _run(capsys, "remediate", "auto", "-i", str(inv), "--policy", str(policy))
    assert "rule events rung 1/2 reclaim:" in out and "[dry run]" not in out, out
    assert " -> would change" in out, out


def test_the_auto_schema_is_the_model_s_and_takes_every_golden_pass() -> None:
    """schemas/auto-pass.schema.json is generated from fleetops.auto_schema (test_schemas checks it is current);
    the simulated passes of tests/fleetops/golden (actions, unreachable hosts, budgets) validate too, and the
    document's name and statuses are those the pass and its metrics use."""
    from typing import get_args

    from fleetops import auto, auto_schema, metrics

    schema = json.loads((REPO / "schemas" / "auto-pass.schema.json").read_text())
    assert schema["title"] == auto.AUTO_SCHEMA == auto_schema.AUTO_SCHEMA
    assert set(get_args(auto_schema.DecisionStatus)) == set(metrics.AUTO_STATUSES)
    passes = json.loads((REPO / "tests" / "fleetops" / "golden" / "auto-passes.json").read_text())
    for name, record in passes.items():
        jsonschema.Draft202012Validator(schema).validate(record["document"])
        for decision in record["document"]["decisions"]:
            assert decision["rung"] is None or 1 <= decision["rung"] <= decision["rungs"], name
