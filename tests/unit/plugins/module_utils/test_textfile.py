"""The host timer's runner (module_utils/textfile.py) as the playbook installs it: the files
playbooks/detector_timer.yml copies, run by the host's Python in isolated mode without site-packages
(``python3 -I -S``: stdlib only, no Ansible), on this machine's real /proc, cgroups and commands."""

from __future__ import annotations

import ast
import json
import os
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.fleetops.node.plugins.module_utils import health, textfile
from prometheus_client.parser import text_string_to_metric_families

from fleetops import detector_runner
from fleetops.cli import detector_runner as detector_runner_cli
from tests.paths import REPO

PLAYBOOK = REPO / "playbooks" / "detector_timer.yml"
MODULE_UTILS = REPO / "plugins" / "module_utils"
PREFIX = "ansible_collections.fleetops.node.plugins.module_utils"
# The system's Python (Debian 12's 3.11, as on the lab hosts), not this venv's.
HOST_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else str(shutil.which("python3"))


def _play() -> dict[str, Any]:
    play: dict[str, Any] = yaml.safe_load(PLAYBOOK.read_text())[0]
    return play


def _tasks(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for task in items:
        out.append(task)
        out += _tasks(task.get("block") or [])
    return out


def _imports(name: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse((MODULE_UTILS / f"{name}.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == PREFIX:
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PREFIX + "."):
            found.add(str(node.module).rsplit(".", 1)[1])
    return found


def test_the_playbook_copies_exactly_what_the_runner_imports() -> None:
    seen: set[str] = set()
    todo = ["textfile"]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += sorted(_imports(name))
    assert sorted(_play()["vars"]["fleetops_dt_module_utils"]) == sorted(seen)
    assert {"aws", "lease"}.isdisjoint(seen)  # the two that need Ansible on the host


def _install(root: Path) -> Path:
    """The runner's tree under ``root``, unpacked from the archive the playbook copies."""
    root.mkdir()
    with tarfile.open(detector_runner.ARCHIVE) as tar:
        tar.extractall(root, filter="data")
    return root / detector_runner.ENTRY


def test_the_archive_is_built_from_the_sources_as_they_are() -> None:
    assert detector_runner_cli.main(["--check"]) == 0, detector_runner.WRITE
    assert detector_runner.build() == detector_runner.build()  # the same bytes every time
    with tarfile.open(detector_runner.ARCHIVE) as tar:
        names = tar.getnames()
    for name in _play()["vars"]["fleetops_dt_module_utils"]:
        assert f"{detector_runner.PACKAGE}/{name}.py" in names


def test_a_stale_archive_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_path / "fleetops-detector.tar"
    stale.write_bytes(detector_runner.ARCHIVE.read_bytes()[:-512])
    monkeypatch.setattr(detector_runner, "ARCHIVE", stale)
    monkeypatch.setattr(detector_runner, "REPO", tmp_path)
    assert detector_runner_cli.main(["--check"]) == 1


def _config(tmp_path: Path, **overrides: Any) -> Path:
    config: dict[str, Any] = {
        "host": "node-a",
        "instance_id": "i-0123456789abcdef0",
        "az": "us-east-1a",
        "textfile": str(tmp_path / "textfile" / "fleetops.prom"),
        "params": {"checks": ["zombie_memcg", "crashloop_unit", "cpu_starvation"], "imds": "never"},
    }
    config.update(overrides)
    path = tmp_path / "detector.json"
    path.write_text(json.dumps(config))
    return path


def _run(entry: Path, config: Path) -> subprocess.CompletedProcess[str]:
    def umask() -> None:
        os.umask(0o077)  # a strict umask must not make the textfile unreadable to node_exporter

    return subprocess.run(
        [HOST_PYTHON, "-I", "-S", str(entry), str(config)],
        capture_output=True, text=True, timeout=120, check=False, preexec_fn=umask,
    )  # fmt: skip


@pytest.fixture()
def entry(tmp_path: Path) -> Path:
    (tmp_path / "textfile").mkdir()
    return _install(tmp_path / "lib")


def test_one_run_writes_the_hosts_gauges_0644_with_identity_labels(entry: Path, tmp_path: Path) -> None:
    proc = _run(entry, _config(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "fleetops-detector: 3 detectors" in proc.stdout and "cpu_ms=" in proc.stdout
    prom = tmp_path / "textfile" / "fleetops.prom"
    assert stat.S_IMODE(prom.stat().st_mode) == 0o644
    assert os.listdir(prom.parent) == ["fleetops.prom"]  # no temporary file left behind
    samples = {
        s.name: s.labels
        for family in text_string_to_metric_families(prom.read_text())
        for s in family.samples
    }
    assert samples["fleetops_scan_host_up"] == {
        "host": "node-a", "instance_id": "i-0123456789abcdef0", "az": "us-east-1a",
    }  # fmt: skip
    assert samples["fleetops_scan_timestamp_seconds"]["host"] == "node-a"
    assert {"fleetops_memcg_total", "fleetops_check_findings", "fleetops_detector_errors"} <= set(samples)


def test_a_symlinked_textfile_directory_is_refused(entry: Path, tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    proc = _run(entry, _config(tmp_path, textfile=str(tmp_path / "link" / "fleetops.prom")))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"fleetops-detector: Failed to write the textfile: {tmp_path / 'link'} is a symbolic link: refused"
    ]
    assert os.listdir(real) == []


def test_a_directory_in_the_textfiles_place_is_refused(entry: Path, tmp_path: Path) -> None:
    (tmp_path / "textfile" / "fleetops.prom").mkdir()
    proc = _run(entry, _config(tmp_path))
    assert proc.returncode == 1 and "is not a regular file: refused" in proc.stderr
    assert os.listdir(tmp_path / "textfile") == ["fleetops.prom"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"host": ""}, "host must be a non-empty string"),
        ({"az": 3}, "az must be a string or null"),
        ({"textfile": "relative.prom"}, "textfile must be an absolute path ending in .prom"),
        (
            {"params": {"zombie_warning": 50, "zombie_critical": 10}},
            "zombie_warning (50) must not be greater",
        ),
        ({"params": {"no_such_option": 1}}, "unknown node_health option(s) no_such_option"),
        ({"params": {"zombie_warning": "many"}}, "params: TypeError"),
        ({"params": {"checks": ["no_such_check"]}}, "checks: unknown detector(s) no_such_check"),
    ],
)
def test_a_bad_configuration_is_one_line_and_writes_nothing(
    entry: Path, tmp_path: Path, overrides: dict[str, Any], message: str
) -> None:
    proc = _run(entry, _config(tmp_path, **overrides))
    assert proc.returncode == 2, proc
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("fleetops-detector: Failed to read ") and message in line, line
    assert os.listdir(tmp_path / "textfile") == []


def test_an_unreadable_configuration(entry: Path, tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    proc = _run(entry, tmp_path / "bad.json")
    assert proc.returncode == 2 and "Failed to read" in proc.stderr and "Traceback" not in proc.stderr
    proc = _run(entry, tmp_path / "missing.json")
    assert proc.returncode == 2 and "No such file" in proc.stderr


def test_write_replaces_atomically_and_never_follows_a_link(tmp_path: Path) -> None:
    target = tmp_path / "fleetops.prom"
    textfile.write_textfile(str(target), "a 1.0\n")
    inode = target.stat().st_ino
    textfile.write_textfile(str(target), "a 2.0\n")
    assert target.read_text() == "a 2.0\n" and target.stat().st_ino != inode  # a new file renamed over
    victim = tmp_path / "victim"
    victim.write_text("keep")
    target.unlink()
    target.symlink_to(victim)
    textfile.write_textfile(str(target), "a 3.0\n")  # the link itself is replaced, its target untouched
    assert victim.read_text() == "keep" and not target.is_symlink() and target.read_text() == "a 3.0\n"
    assert sorted(os.listdir(tmp_path)) == ["fleetops.prom", "victim"]


def test_the_runner_passes_all_options_it_is_given(tmp_path: Path) -> None:
    config = json.loads(_config(tmp_path).read_text())
    config["params"] = {key: spec.get("default") for key, spec in health.ARGUMENT_SPEC.items()}
    path = tmp_path / "full.json"
    path.write_text(json.dumps(config))
    assert textfile.load_config(str(path))["params"] == config["params"]


def test_which_finds_what_shutil_which_finds_and_skips_folders_and_files_it_cannot_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``which`` is shutil.which's test without importing shutil on every host: PATH first, then the system
    folders a service's PATH may leave out; a folder or a file without the execute bit is not a program."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (first / "tool").mkdir()  # a folder named like the program
    (first / "plain").write_text("")  # not executable
    for folder in (first, second):
        for name in ("tool", "plain"):
            path = folder / name
            if not path.exists():
                path.write_text("#!/bin/sh\n")
                path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{first}{os.pathsep}{second}")
    assert textfile.which("tool") == str(second / "tool") == shutil.which("tool")
    assert textfile.which("plain") == str(second / "plain") == shutil.which("plain")
    assert textfile.which("no-such-program-here") is None
    assert textfile.which(str(second / "tool")) == str(second / "tool")  # a path is checked as it is
    assert textfile.which(str(first / "tool")) is None
    # the system folders come after PATH: sh is found with an empty PATH
    monkeypatch.setenv("PATH", "")
    assert textfile.which("sh") in {"/usr/sbin/sh", "/usr/bin/sh", "/sbin/sh", "/bin/sh"}


# run_command: posix_spawn and a poll loop answer what subprocess.run answered (the runner's run_command before).
SPAWN_CASES = [
    ["sh", "-c", "echo out; echo err >&2; exit 3"],
    ["sh", "-c", "kill -TERM $$"],  # killed by a signal: rc -15, as subprocess gives
    ["sh", "-c", "head -c 300000 /dev/zero | tr '\\0' o; head -c 300000 /dev/zero | tr '\\0' e >&2"],
    ["sh", "-c", "printf '\\377\\376 not utf-8'"],
    ["sh", "-c", "cat; echo read-stdin-to-eof"],  # standard input is /dev/null
    ["sh", "-c", 'echo "$LC_ALL $LANG"'],
    ["fleetops-no-such-command"],
    ["/nonexistent/fleetops"],
    ["/"],
]


@pytest.mark.parametrize("argv", SPAWN_CASES, ids=lambda argv: " ".join(argv)[:40])
def test_run_command_answers_what_subprocess_answers(argv: list[str]) -> None:
    env = dict(os.environ, LC_ALL="C", LANG="C")
    assert hasattr(os, "posix_spawnp")  # this Python takes the spawn path, not the fallback compared with
    assert textfile.run_command(argv) == textfile._run_subprocess(argv, env)


def test_run_command_reads_both_pipes_at_once() -> None:
    # 1 MB on stderr before anything on stdout: reading stdout alone would wait forever on a full pipe
    rc, out, err = textfile.run_command(["sh", "-c", "head -c 1000000 /dev/zero >&2; echo done"])
    assert (rc, out, len(err)) == (0, "done\n", 1000000)


def test_run_command_gives_the_command_sigpipe_back() -> None:
    # Python ignores SIGPIPE; a command that inherited that would see EPIPE and say so ("Broken pipe")
    rc, out, err = textfile.run_command(["sh", "-c", "yes | head -n 1; trap"])
    assert (rc, out, err) == (0, "y\n", "")


def test_run_command_keeps_this_processs_descriptors_from_the_command() -> None:
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        os.set_inheritable(fd, True)
        rc, out, _err = textfile.run_command(["sh", "-c", "ls /proc/self/fd"])
    finally:
        os.close(fd)
    assert rc == 0
    assert str(fd) not in out.split()


def test_run_command_kills_a_command_past_its_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(textfile, "COMMAND_TIMEOUT_S", 0.5)
    rc, out, err = textfile.run_command(["sh", "-c", "echo started; exec sleep 30"])
    assert (rc, out, err) == (124, "", "sh: timed out after 0.5s")
    # one that closes its output and goes on is timed out too (its wait, not its read)
    rc, _out, _err = textfile.run_command(["sh", "-c", "exec >&- 2>&-; exec sleep 30"])
    assert rc == 124
