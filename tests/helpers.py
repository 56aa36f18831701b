"""Shared test helpers: run the real `fleetops` console script and read its JSON report."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FLEETOPS = Path(sys.executable).parent / "fleetops"

# The scan status of a lab host (a systemd-nspawn guest, root over ssh) that answers a scan running zombie_memcg:
# in its own cgroup namespace the zombie count cannot be known (coverage partial), so the host is "partial";
# lab_blind(entry) is then exactly {"zombie_memcg"}.
LAB_ANSWERED = "partial"


def cli_parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(the command after "fleetops", its parser) for the top level ("") and every sub-command, depth first,
    read from the CLI's own parser (``fleetops.cli.app.build_parser``), not a copy of its command list."""
    from fleetops.cli.app import build_parser

    def walk(parser: argparse.ArgumentParser, prefix: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
        yield prefix, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    yield from walk(child, f"{prefix} {name}".strip())

    yield from walk(build_parser(), "")


def lab_blind(entry: dict[str, Any]) -> set[str]:
    """The checks of a scan entry that could not look fully (coverage level not full)."""
    return {check for check, cov in (entry.get("coverage") or {}).items() if cov["level"] != "full"}


@dataclass
class CliResult:
    rc: int
    stdout: str
    stderr: str

    def json(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.stdout)
        return data


def fleetops(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> CliResult:
    """Run the installed `fleetops` CLI as a user would (a real subprocess)."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [str(FLEETOPS), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def run_module(
    tmp_path: Path, module: str, args: str, *extra: str, python: str | None = None
) -> tuple[int, dict[str, Any]]:
    """``ansible localhost -m MODULE -a ARGS`` on this machine; the result as the tree callback saved it."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
        f"      ansible_python_interpreter: {python or sys.executable}\n"
    )
    tree = tmp_path / "tree"
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections"),
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        "ANSIBLE_CALLBACKS_ENABLED": "ansible.builtin.tree",
        "ANSIBLE_CALLBACK_TREE_DIR": str(tree),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
        "ANSIBLE_NOCOLOR": "1",
    }
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("ansible")), "localhost", "-i", str(inventory), "-m", module,
         "-a", args, *extra],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    result_file = tree / "localhost"
    assert result_file.exists(), proc.stdout + proc.stderr
    result: dict[str, Any] = json.loads(result_file.read_text())
    return proc.returncode, result


def call_module(
    tmp_path: Path, main: Callable[[], None], args: dict[str, Any], check: bool = False
) -> tuple[int, dict[str, Any]]:
    """A module's ``main()`` in this process, its arguments handed over as AnsiballZ hands them
    (``ansible.module_utils.testing.patch_module_args``), its exit_json/fail_json answer read back:
    (the exit status, the result). The module's own code with no controller around it: about 1.3
    CPU-seconds less than ``run_module`` (no ``ansible`` start, no module process importing boto3). A
    test file that uses it keeps some ``run_module`` calls for what needs Ansible itself: the
    arguments and ``--check`` passed by the controller, the packaged module_utils, the tree result."""
    from ansible.module_utils.testing import patch_module_args

    module_tmp = tmp_path / "module-tmp"
    module_tmp.mkdir(exist_ok=True)
    out = io.StringIO()
    full = {**args, "_ansible_check_mode": check, "_ansible_tmpdir": str(module_tmp)}
    with patch_module_args(full), contextlib.redirect_stdout(out):
        try:
            main()
        except SystemExit as e:
            code = e.code
        else:
            raise AssertionError("the module returned without exit_json or fail_json")
    result: dict[str, Any] = json.loads(out.getvalue())
    return (0 if code is None else code if isinstance(code, int) else 1), result


BOOTS_CMD = "cat /proc/sys/kernel/random/boot_id; journalctl --list-boots --no-pager -q | wc -l"


def boots(lab: Any, hosts: Sequence[str]) -> dict[str, tuple[str, int]]:
    """Each lab host's (boot id, number of boots in its persistent journal): how reboots are counted."""
    out = {}
    for host in hosts:
        text = lab.run(host, BOOTS_CMD, check=True).stdout.split()
        out[host] = (text[0], int(text[1]))
    return out


def kill_tree(root: int) -> list[int]:
    """SIGKILL ``root`` and every process descended from it, as a controller machine dying would:
    ansible-runner puts ansible-playbook in a session of its own, so a kill of the CLI's process group
    alone leaves the batch running. All are stopped first (no fork escapes), then killed. The pids."""

    def children() -> dict[int, list[int]]:
        tree: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            tree.setdefault(ppid, []).append(int(entry))
        return tree

    found: list[int] = []
    for _ in range(3):  # a child forked while we walked is caught on the next round
        tree, todo = children(), [root]
        while todo:
            pid = todo.pop()
            if pid not in found:
                found.append(pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            todo.extend(tree.get(pid, []))
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return found


def wait_for_a_batch(state: Path, timeout: float = 120) -> None:
    """Until the rollout saved in ``state`` has a host ``running`` (inside a batch); fails the test after
    ``timeout`` seconds."""
    import pytest

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            if "running" in json.loads(state.read_text())["hosts"].values():
                return
        time.sleep(0.1)
    pytest.fail("the rollout never started a batch")


def ansible_doc(name: str, plugin_type: str = "module") -> dict[str, Any]:
    """The ``doc`` of this collection's plugin ``name`` as ``ansible-doc --json`` renders it (doc
    fragments merged in), with no ANSIBLE_* setting of the caller's environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-doc")), "-t", plugin_type, "--json", name],
        cwd=REPO, env={**env, "ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections"), "ANSIBLE_NOCOLOR": "1"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)[name]["doc"]
    return doc
