"""node_health's action plugin (plugins/action/node_health.py): the fast path and the module give the same
result, and the action falls back to the module whenever the fast path cannot serve. Real ansible-playbook
runs over the local connection on this machine, each with a private HOME (where the runner is staged); the
ssh side runs in every lab test that scans (tests/integration), and test_scan_lab compares the two there."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.paths import REPO

CHECKS = ["zombie_memcg", "crashloop_unit", "cpu_starvation", "unexpected_unit"]
PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Scan
      fleetops.node.node_health:
        checks: {checks}
        imds: never
        unit_allowlist: ["ssh.service", "systemd-*"]
        {extra}
      {keywords}
      register: scan
      ignore_errors: true
    - name: Keep the result
      ansible.builtin.copy:
        content: "{{{{ scan | to_json }}}}"
        dest: "{out}"
"""


def _scan(
    tmp_path: Path,
    name: str,
    *,
    module: bool = False,
    python: str = sys.executable,
    extra: str = "",
    keywords: str = "",
    home: Path | None = None,
) -> tuple[dict[str, Any], str]:
    """One node_health task on localhost: (its registered result, ansible-playbook's output)."""
    home = home or tmp_path / "home"
    home.mkdir(exist_ok=True, mode=0o700)
    out = tmp_path / f"{name}.json"
    play = tmp_path / f"{name}.yml"
    play.write_text(PLAY.format(checks=json.dumps(CHECKS), extra=extra, keywords=keywords, out=out))
    env = {
        "ANSIBLE_ASYNC_DIR": str(tmp_path / "ansible-async"),  # not under HOME: the shell finds root's
        "ANSIBLE_NOCOLOR": "1",
        "FLEETOPS_NODE_HEALTH_MODULE": "1" if module else "0",
    }
    output = _playbook(tmp_path, play, home, python, env, "-vvv")
    result: dict[str, Any] = json.loads(out.read_text())
    return result, output


def _playbook(tmp_path: Path, play: Path, home: Path, python: str, env: dict[str, str], *options: str) -> str:
    """ansible-playbook PLAY on localhost over the local connection, with this checkout's collection and a
    private HOME, under ``env``; asserts it exits 0 and returns its output."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")},
        "HOME": str(home),
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-local"),
        **env,
    }
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), *options, "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={python}", str(play)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=180, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def _shape(value: Any) -> Any:
    """A result with every number replaced: what must be equal between two runs on one live host."""
    return json.loads(re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "0", json.dumps(value, sort_keys=True)))


def test_the_runner_and_the_module_give_the_same_result(tmp_path: Path) -> None:
    runner, _ = _scan(tmp_path, "runner")
    module, _ = _scan(tmp_path, "module", module=True)
    assert runner["fleetops_path"] == "runner" and module["fleetops_path"] == "module"
    assert set(runner) == set(module)
    for key in ("checks", "errors"):
        assert runner[key] == module[key], key
    for key in ("facts", "findings", "ansible_facts"):
        assert _shape(runner[key]) == _shape(module[key]), key
    assert runner["checks"] == CHECKS
    # the allow-list finds this machine's enabled units that it does not match: the same ones both ways
    assert [f["summary"] for f in runner["findings"] if f["check"] == "unexpected_unit"] == [
        f["summary"] for f in module["findings"] if f["check"] == "unexpected_unit"
    ]
    assert runner["changed"] is False and not runner.get("failed")
    staged = list((tmp_path / "home" / ".ansible" / "fleetops").glob("runner-*"))
    assert len(staged) == 1


def test_options_are_validated_on_the_controller_with_the_modules_words(tmp_path: Path) -> None:
    extra = "zombie_warning: 900\n        zombie_critical: 800"
    runner, _ = _scan(tmp_path, "runner", extra=extra)
    module, _ = _scan(tmp_path, "module", module=True, extra=extra)
    assert runner["failed"] and module["failed"]
    assert (
        runner["msg"]
        == module["msg"]
        == (
            "Failed to validate node_health options: zombie_warning (900) must not be greater than zombie_critical (800)"
        )
    )
    assert "fleetops_path" not in runner  # nothing ran on the host
    assert not (tmp_path / "home" / ".ansible" / "fleetops").exists()


def test_a_refused_cache_warns_and_the_module_runs(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ansible").mkdir(parents=True, mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (home / ".ansible" / "fleetops").symlink_to(elsewhere)
    result, output = _scan(tmp_path, "refused", home=home)
    assert result["fleetops_path"] == "module"
    assert result["checks"] == CHECKS and not result.get("failed")
    assert "is a symbolic link: refused; running the module instead" in output
    assert os.listdir(elsewhere) == []


def test_a_python_that_gives_no_reply_gets_the_module(tmp_path: Path) -> None:
    """A host Python that cannot run the stage (too old, a wrapper, no -I) answers no JSON: the module runs."""
    wrapper = tmp_path / "python"
    wrapper.write_text(
        f'#!/bin/sh\ncase "$1" in -I) echo "no isolated mode here" >&2; exit 2;; esac\nexec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    result, output = _scan(tmp_path, "wrapper", python=str(wrapper))
    assert result["fleetops_path"] == "module"
    assert result["checks"] == CHECKS and not result.get("failed")
    assert "no reply from the runner (rc 2): no isolated mode here" in output


@pytest.mark.parametrize(
    ("module", "keywords", "path"),
    [(False, "", "runner"), (True, "", "module"), (False, "async: 60\n      poll: 1", "module")],
)
def test_the_module_switch_and_async_choose_the_module(
    tmp_path: Path, module: bool, keywords: str, path: str
) -> None:
    result, _ = _scan(tmp_path, "switch", module=module, keywords=keywords)
    assert result["checks"] == CHECKS and not result.get("failed")
    staged = (tmp_path / "home" / ".ansible" / "fleetops").exists()
    assert staged == (path == "runner")
    if keywords:  # an async task's result is async_status's, polled from the module's job
        assert "fleetops_path" not in result and result["finished"] == 1
    else:
        assert result["fleetops_path"] == path


PROBE = """
import gc
import os

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        result.update(changed=False, frozen=gc.get_freeze_count(), pid=os.getpid(), parent=os.getppid())
        return result
"""
FORK_PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Probe a worker forked before node_health was ever loaded
      freeze_probe:
      register: before
    - name: Load node_health in the strategy (its options are bad, so it fails at once, in its worker)
      fleetops.node.node_health:
        checks: [no_such_check]
      ignore_errors: true
    - name: Probe a worker forked after
      freeze_probe:
      register: after
    - name: Keep both
      ansible.builtin.copy:
        content: "{{ {'before': before, 'after': after} | to_json }}"
        dest: "{out}"
"""


def test_the_workers_forked_after_node_health_is_loaded_inherit_a_frozen_heap(tmp_path: Path) -> None:
    """The strategy imports node_health's action in ansible-playbook's main process; its fork hook freezes the
    collector's objects for each worker forked from then on (a worker's collector then never walks, and so
    never copies, the main's heap) and unfreezes them in the main, whose collector goes on as before."""
    (tmp_path / "action_plugins").mkdir()
    (tmp_path / "action_plugins" / "freeze_probe.py").write_text(PROBE)
    out = tmp_path / "probe.json"
    play = tmp_path / "fork.yml"
    play.write_text(FORK_PLAY.replace("{out}", str(out)))
    _playbook(tmp_path, play, tmp_path, sys.executable, {})
    probes = json.loads(out.read_text())
    before, after = probes["before"], probes["after"]
    assert before["parent"] == after["parent"] != after["pid"]  # both forked by the one main process
    # what Python itself keeps frozen from its start (375 objects on 3.12): the worker before node_health had no more
    start = subprocess.run([sys.executable, "-c", "import gc; print(gc.get_freeze_count())"],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert before["frozen"] == int(start), (before, after)  # nothing more until node_health is loaded
    inherited = after["frozen"] - int(start)  # the main's objects (tens of thousands), inherited frozen
    assert inherited > 10_000, after
