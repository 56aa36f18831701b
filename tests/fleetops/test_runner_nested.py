"""fleetops run from inside an ansible-runner job (AWX runs `fleetops remediate auto` from a playbook).

The job's environment carries runner's own display callback (ANSIBLE_STDOUT_CALLBACK=awx_display, its
callback directory in ANSIBLE_CALLBACK_PLUGINS, the job's ORIGINAL_STDOUT_CALLBACK). Our runner must not
inherit them: ansible-runner would wrap awx_display in itself and ansible-playbook exits 250. A real
ansible-runner run of a real playbook on localhost, in that environment.
"""

from __future__ import annotations

from pathlib import Path

import ansible_runner
import pytest

from fleetops.ansible.runner import RunnerOptions, ansible_env, run_playbook

RUNNER_CALLBACKS = str(Path(ansible_runner.__file__).parent / "display_callback" / "callback")


def _inside_a_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANSIBLE_STDOUT_CALLBACK", "awx_display")
    monkeypatch.setenv("ANSIBLE_CALLBACK_PLUGINS", RUNNER_CALLBACKS)
    monkeypatch.setenv("ORIGINAL_STDOUT_CALLBACK", "default")


def test_inside_a_runner_job_our_runs_use_the_jobs_original_callback(monkeypatch: pytest.MonkeyPatch) -> None:
    _inside_a_job(monkeypatch)
    env = ansible_env()
    assert env["ANSIBLE_STDOUT_CALLBACK"] == "default" and env["ANSIBLE_CALLBACK_PLUGINS"] == ""


def test_outside_a_job_nothing_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORIGINAL_STDOUT_CALLBACK", raising=False)
    env = ansible_env()
    assert "ANSIBLE_STDOUT_CALLBACK" not in env and "ANSIBLE_CALLBACK_PLUGINS" not in env


def test_a_playbook_runs_from_inside_a_runner_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _inside_a_job(monkeypatch)
    inv = tmp_path / "inv.yml"
    inv.write_text(
        'all:\n  hosts:\n    here: {ansible_connection: local, ansible_python_interpreter: "{{ ansible_playbook_python }}"}\n'
    )
    play = tmp_path / "ping.yml"
    play.write_text("- hosts: all\n  gather_facts: false\n  tasks:\n    - ansible.builtin.ping:\n")
    run = run_playbook(RunnerOptions(playbook=str(play), inventory=[inv]))
    assert (run.status, run.rc) == ("successful", 0), run
    assert [t.action for t in run.results_for("here")] == ["ansible.builtin.ping"]
