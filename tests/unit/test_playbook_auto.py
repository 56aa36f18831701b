"""playbooks/remediate_auto.yml: the `fleetops remediate auto` command line it builds, and what it does
with the pass's exit code and JSON.

The playbook runs through ansible-runner (as AWX runs a job: events, set_stats in the stats event's
artifact_data) with a STAND-IN `fleetops` first on PATH: a small script written by this test, not the
real CLI, that records its argv and part of its environment, prints a document the test chooses and exits
with the code the test chooses. The real CLI needs a fleet and a policy whose actions exist; its own tests
cover it (tests/fleetops), and tests/integration/test_ee.py runs the real one inside the EE.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import ansible_runner
import pytest

from tests.paths import REPO

PLAYBOOK = REPO / "playbooks" / "remediate_auto.yml"
BIN = Path(sys.executable).parent
DEFAULT_INVENTORY = str(REPO / "awx" / "inventory" / "fleet.fleet_ec2.yml")

STANDIN = """#!{python}
# A stand-in for `fleetops` written by tests/unit/test_playbook_auto.py (NOT the real CLI): it records its
# argv, environment and working directory, sleeps STANDIN_SLEEP s, prints STANDIN_STDOUT, STANDIN_STDERR,
# and exits with STANDIN_RC.
import json, os, sys, time
with open(os.environ["STANDIN_RECORD"], "w") as f:
    json.dump({{"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd()}}, f)
time.sleep(float(os.environ.get("STANDIN_SLEEP", "0")))
if os.environ.get("STANDIN_NESTED"):  # run ansible through ansible-runner, as the real CLI does
    import ansible_runner
    nested = ansible_runner.run(
        private_data_dir=os.environ["STANDIN_NESTED"], playbook="nested.yml", inventory="localhost,", quiet=True
    )
    events = [e.get("event_data", {{}}).get("res", {{}}).get("msg") for e in nested.events if e["event"] == "runner_on_ok"]
    print(json.dumps({{"status": nested.status, "rc": nested.rc, "msgs": events}}))
    sys.exit(nested.rc)
sys.stdout.write(os.environ.get("STANDIN_STDOUT", ""))
sys.stderr.write(os.environ.get("STANDIN_STDERR", ""))
seq = os.environ.get("STANDIN_RC_SEQ", "").split()  # one exit code per call, the last one repeated
if seq:
    with open(os.environ["STANDIN_RECORD"] + ".calls", "a+") as f:
        f.seek(0)
        n = len(f.read())
        f.write("x")
    sys.exit(int(seq[min(n, len(seq) - 1)]))
sys.exit(int(os.environ["STANDIN_RC"]))
"""

DOCUMENT: dict[str, Any] = {
    "schema": "fleetops.auto/v1",
    "apply": False,
    "policy": "default.yml",
    "decisions": [
        {"host": "gpu-1", "status": "act", "reason": "quarantine now", "action": "quarantine"},
        {"host": "gpu-2", "status": "clean", "reason": "no finding", "action": None},
        {"host": "gpu-3", "status": "human", "reason": "needs a human: open a case", "action": None},
    ],
    "actions": [{"action": "quarantine", "hosts": ["gpu-1"], "done": [], "exit_code": 0}],
    "ladder_tags": {},
    "warnings": [],
    "exit_code": 0,
}


@pytest.fixture(autouse=True)
def _no_ansible_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """ansible-runner passes this process's environment on: leave out the Makefile's ANSIBLE_* settings."""
    for key in [k for k in os.environ if k.startswith("ANSIBLE_")]:
        monkeypatch.delenv(key)


class Job:
    def __init__(self, status: str, rc: int, events: list[dict[str, Any]], record: dict[str, Any] | None):
        self.status, self.rc, self.events, self.record = status, rc, events, record

    @property
    def argv(self) -> list[str]:
        assert self.record is not None, "the stand-in never ran"
        argv: list[str] = self.record["argv"]
        return argv

    def artifacts(self) -> dict[str, Any]:
        (stats,) = [e for e in self.events if e["event"] == "playbook_on_stats"]
        data: dict[str, Any] = stats["event_data"].get("artifact_data") or {}
        return data

    def task(self, name_start: str) -> dict[str, Any]:
        """The per-host result event of the task whose name starts with `name_start`."""
        (event,) = [
            e
            for e in self.events
            if e["event"].startswith("runner_on_")
            and e["event"] != "runner_on_start"
            and e["event_data"].get("task", "").startswith(name_start)
        ]
        return event


def _job(
    tmp_path: Path,
    rc: int,
    *,
    check: bool,
    extravars: dict[str, Any] | None = None,
    stdout: str = "",
    stderr: str = "",
    user: str | None = None,
    sleep: float = 0,
    nested: Path | None = None,
    rc_seq: str = "",
) -> Job:
    standin_dir = tmp_path / "standin"
    standin_dir.mkdir()
    standin = standin_dir / "fleetops"
    standin.write_text(STANDIN.format(python=sys.executable))
    standin.chmod(0o755)
    record = tmp_path / "argv.json"
    cmdline = " ".join((["--check"] if check else []) + (["-u", user] if user else []))
    # as in AWX: the fleet's inventory, without localhost (the play runs on the implicit localhost), and
    # the project's ansible.cfg found in the job's working directory (the project), not named by ANSIBLE_CONFIG
    (tmp_path / "job" / "inventory").mkdir(parents=True)
    (tmp_path / "job" / "project").mkdir()
    (tmp_path / "job" / "project" / "ansible.cfg").write_text((REPO / "ansible.cfg").read_text())
    (tmp_path / "job" / "inventory" / "hosts.yml").write_text(
        "all:\n  hosts:\n    gpu-1:\n      ansible_host: 192.0.2.1\n"
    )
    result = ansible_runner.run(
        private_data_dir=str(tmp_path / "job"),
        playbook=str(PLAYBOOK),
        cmdline=cmdline or None,
        extravars=extravars or {},
        envvars={
            "PATH": os.pathsep.join([str(standin_dir), str(BIN), os.environ.get("PATH", "")]),
            "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
            "STANDIN_RECORD": str(record),
            "STANDIN_RC": str(rc),
            "STANDIN_STDOUT": stdout,
            "STANDIN_STDERR": stderr,
            "STANDIN_SLEEP": str(sleep),
            "STANDIN_NESTED": str(nested or ""),
            "STANDIN_RC_SEQ": rc_seq,
        },
        quiet=True,
        timeout=240,
    )
    events = list(result.events)
    recorded = json.loads(record.read_text()) if record.exists() else None
    return Job(result.status, result.rc, events, recorded)


def test_check_job_is_a_dry_run_with_the_packages_policy_and_the_projects_inventory(tmp_path: Path) -> None:
    job = _job(tmp_path, 0, check=True, stdout=json.dumps(DOCUMENT))
    assert job.status == "successful", job.events[-1]
    # every knob unset: nothing but the inventory and the JSON format; no --apply in a check job
    assert job.argv == ["remediate", "auto", "--format", "json", "-i", DEFAULT_INVENTORY]
    assert Path(DEFAULT_INVENTORY).is_file()
    # the pass's document, as AWX keeps it (the job's artifacts)
    assert job.artifacts() == {"fleetops_auto": DOCUMENT}
    lines = job.task("One line per host")["event_data"]["res"]["msg"]
    assert lines == [
        "gpu-1: act: quarantine now",
        "gpu-2: clean: no finding",
        "gpu-3: human: needs a human: open a case",
    ]
    # a dry run changes nothing
    assert job.task("Run one pass")["event_data"]["res"]["changed"] is False
    # the CLI's own ansible runs get this job's ansible.cfg (the project's); no -u, no ssh user set
    assert job.record is not None
    assert job.record["env"]["ANSIBLE_CONFIG"] == str(tmp_path / "job" / "project" / "ansible.cfg")
    assert "ANSIBLE_REMOTE_USER" not in job.record["env"]
    # it runs in the project's root (relative knobs are from there), not the job's private directory
    assert job.record["cwd"] == str(REPO)


def test_run_job_applies_with_every_knob_as_one_argv_element(tmp_path: Path) -> None:
    knobs = {
        "fleetops_auto_policy": "/etc/fleetops/policy with space.yml",
        "fleetops_auto_inventory": "/runner/project/gpu.fleet_ec2.yml",
        "fleetops_targets": "az_us_east_1a:!gpu-*; rm -rf /",  # a pattern, never a shell word list
        "fleetops_auto_state_dir": "/var/lib/fleetops/auto",
        "fleetops_auto_ec2_tags": "false",  # as a survey's multiple choice passes it
        "fleetops_kubectl": "/usr/local/bin/kubectl",
        "fleetops_kubeconfig": "/runner/kubeconfig",
        "fleetops_not_after": "2h",
        "fleetops_host_timeout": 600,
        "fleetops_max_unhealthy": "10%",
        "fleetops_sample_seconds": 5,
        "fleetops_auto_timeout": 900,
        "fleetops_auto_cause": "alertmanager: FleetopsUnitsCrashLooping (host=gpu-1) fingerprint 0a1b",
        "fleetops_auto_fail_on": "human",
    }
    applied = {**DOCUMENT, "apply": True, "actions": [{**DOCUMENT["actions"][0], "done": ["gpu-1"]}]}
    job = _job(tmp_path, 0, check=False, extravars=knobs, stdout=json.dumps(applied), user="ec2-user")
    assert job.status == "successful", job.events[-1]
    assert job.argv == [
        "remediate", "auto", "--format", "json",
        "-i", "/runner/project/gpu.fleet_ec2.yml",
        "--policy", "/etc/fleetops/policy with space.yml",
        "-l", "az_us_east_1a:!gpu-*; rm -rf /",
        "--state-dir", "/var/lib/fleetops/auto",
        "--kubectl", "/usr/local/bin/kubectl",
        "--kubeconfig", "/runner/kubeconfig",
        "--not-after", "2h",
        "--host-timeout", "600",
        "--max-unhealthy", "10%",
        "--sample-seconds", "5",
        "--cause", "alertmanager: FleetopsUnitsCrashLooping (host=gpu-1) fingerprint 0a1b",
        "--fail-on", "human",
        "--no-ec2-tags",
        "--apply",
    ]  # fmt: skip
    # the machine credential's user (-u) reaches the CLI's own ansible runs
    assert job.record is not None and job.record["env"]["ANSIBLE_REMOTE_USER"] == "ec2-user"
    # an applied action that finished a host is a change
    assert job.task("Run one pass")["event_data"]["res"]["changed"] is True
    assert job.artifacts() == {"fleetops_auto": applied}


def test_a_null_or_empty_knob_passes_nothing_and_a_zero_is_passed(tmp_path: Path) -> None:
    """AWX leaves a blank survey answer out; an extra var may still be null or empty: the CLI's default
    applies. 0 seconds between samples is a value (one sample), not a blank."""
    knobs = {
        "fleetops_auto_policy": "",
        "fleetops_targets": None,
        "fleetops_auto_inventory": "",
        "fleetops_sample_seconds": 0,
    }
    job = _job(tmp_path, 0, check=True, extravars=knobs, stdout=json.dumps(DOCUMENT))
    assert job.argv == [
        "remediate",
        "auto",
        "--format",
        "json",
        "-i",
        DEFAULT_INVENTORY,
        "--sample-seconds",
        "0",
    ]


NESTED = """\
- name: Nested
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Say hello
      ansible.builtin.debug:
        msg: hello from a nested ansible-runner
"""


def test_the_clis_own_ansible_runner_works_inside_the_job(tmp_path: Path) -> None:
    """The real CLI runs its playbooks through ansible-runner, inside this job, itself run by
    ansible-runner (AWX): here the stand-in does that with a one-task playbook. Without the playbook's
    environment for it, the job's awx_display callback would wrap itself and ansible-playbook exit 250."""
    nested = tmp_path / "nested"
    (nested / "project").mkdir(parents=True)
    (nested / "project" / "nested.yml").write_text(NESTED)
    job = _job(tmp_path, 0, check=True, nested=nested)
    res = job.task("Run one pass")["event_data"]["res"]
    assert res["rc"] == 0, res
    assert json.loads(res["stdout"]) == {
        "status": "successful",
        "rc": 0,
        "msgs": ["hello from a nested ansible-runner"],
    }
    assert job.record is not None
    assert (
        job.record["env"]["ANSIBLE_STDOUT_CALLBACK"] == "default"
        and job.record["env"]["ANSIBLE_CALLBACK_PLUGINS"] == ""
    )


def test_a_pass_past_its_time_limit_is_stopped_and_fails_the_job(tmp_path: Path) -> None:
    """coreutils timeout wraps the CLI: SIGTERM after fleetops_auto_timeout (the CLI saves its state and
    releases its lock and lease), the job fails with 124's meaning."""
    started = time.monotonic()
    job = _job(tmp_path, 0, check=True, extravars={"fleetops_auto_timeout": 2}, sleep=120, stdout="{}")
    assert time.monotonic() - started < 60
    cmd = job.task("Run one pass")["event_data"]["res"]["cmd"]
    assert cmd[:5] == ["timeout", "--signal=TERM", "--kill-after=60", "2", "fleetops"], cmd
    assert (job.status, job.rc) == ("failed", 2)
    msg = job.task("Fail the job")["event_data"]["res"]["msg"]
    assert msg.startswith(
        "fleetops remediate auto exited 124: the pass took longer than fleetops_auto_timeout"
    ), msg


def test_a_host_that_needs_a_human_fails_the_job_and_names_it_with_fail_on_human(tmp_path: Path) -> None:
    doc = {**DOCUMENT, "exit_code": 1}
    job = _job(tmp_path, 1, check=True, stdout=json.dumps(doc), extravars={"fleetops_auto_fail_on": "human"})
    assert job.argv[-2:] == ["--fail-on", "human"]
    assert (job.status, job.rc) == ("failed", 2)
    msg = job.task("Fail the job")["event_data"]["res"]["msg"]
    assert msg.startswith("fleetops remediate auto exited 1: a host needs a human"), msg
    assert "Needs a human: gpu-3." in msg, msg
    # the artifacts are kept all the same (AWX notifications can quote them)
    assert job.artifacts() == {"fleetops_auto": doc}


@pytest.mark.parametrize(
    ("rc", "meaning"),
    [
        (2, "bad input (the policy or an option)"),
        (
            3,
            "a host was not scanned, a detector its ladder relies on failed, a rung could not act, a rollout did not finish (or was stopped), or the store failed",
        ),
        (4, "another pass or rollout holds the state"),
        (5, "automation is paused (fleetops pause): nothing acted"),
        (143, "the pass was stopped (SIGTERM)"),
    ],
)
def test_every_other_exit_code_fails_the_job_with_its_meaning(tmp_path: Path, rc: int, meaning: str) -> None:
    error = "fleetops: error: policy.yml: rule x rung 2 (stop-start): fleetops has no such remediation\n"
    job = _job(tmp_path, rc, check=False, stderr="progress line\n\n" + error)
    assert (job.status, job.rc) == ("failed", 2)
    assert job.argv[-1] == "--apply"
    msg = job.task("Fail the job")["event_data"]["res"]["msg"]
    assert msg.startswith(f"fleetops remediate auto exited {rc}: {meaning}"), msg
    assert error.strip() in msg and "Needs a human" not in msg, msg
    # no JSON on stdout (it stopped before a pass): the artifacts say the exit code and the error
    assert job.artifacts() == {"fleetops_auto": {"exit_code": rc, "error": ["progress line", error.strip()]}}


def test_a_zero_exit_passes_even_with_no_decision(tmp_path: Path) -> None:
    doc = {**DOCUMENT, "decisions": [], "actions": []}
    job = _job(tmp_path, 0, check=False, stdout=json.dumps(doc))
    assert (job.status, job.rc) == ("successful", 0)
    assert job.task("Fail the job")["event"] == "runner_on_skipped"
    assert job.task("Run one pass")["event_data"]["res"]["changed"] is False


@pytest.mark.parametrize(
    ("rc_seq", "retries", "calls", "status"),
    [
        ("4 4 0", 3, 3, "successful"),  # locked twice, then the pass runs
        ("4", 2, 3, "failed"),  # locked every time: bounded, then the job fails with exit 4's meaning
        ("1 0", 3, 1, "failed"),  # any other exit is the pass's own: never run again
        ("4 0", 0, 1, "failed"),  # the default (the schedule): no retry
    ],
)
def test_a_locked_pass_is_run_again_up_to_fleetops_auto_locked_retries(
    tmp_path: Path, rc_seq: str, retries: int, calls: int, status: str
) -> None:
    """The event-driven rulebook's passes (extensions/eda/rulebooks/) set fleetops_auto_locked_retries: its
    throttle has already swallowed the alert's repeats, so a pass that found another one running (exit 4)
    is run again, fleetops_auto_locked_delay s apart, instead of being lost."""
    knobs: dict[str, Any] = {"fleetops_auto_locked_delay": 1}
    if retries:
        knobs["fleetops_auto_locked_retries"] = retries
    started = time.monotonic()
    job = _job(tmp_path, 0, check=False, extravars=knobs, stdout=json.dumps(DOCUMENT), rc_seq=rc_seq)
    assert job.status == status
    assert len((tmp_path / "argv.json.calls").read_text()) == calls
    assert time.monotonic() - started >= calls - 1  # the delay between tries
    if status == "failed":
        expected = "fleetops remediate auto exited " + rc_seq.split()[min(calls, len(rc_seq.split())) - 1]
        assert job.task("Fail the job")["event_data"]["res"]["msg"].startswith(expected)
