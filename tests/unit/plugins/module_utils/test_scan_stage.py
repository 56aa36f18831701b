"""node_health's fast path on the host (module_utils/scan_stage.py), run the way the action runs it: its
source as ``python3 -I -S -c SOURCE`` (the system's Python, stdlib only), the request on standard input,
a private HOME, this machine's real /proc, cgroups and commands. The action's side is
tests/unit/plugins/action/test_node_health_action.py."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.fleetops.node.plugins.module_utils import health

from tests.paths import REPO

STAGE = (REPO / "plugins" / "module_utils" / "scan_stage.py").read_text()
ARCHIVE = (REPO / "playbooks" / "files" / "fleetops-detector.tar").read_bytes()
SHA = hashlib.sha256(ARCHIVE).hexdigest()
HOST_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else str(shutil.which("python3"))
PARAMS = dict(health.DEFAULTS, checks=["zombie_memcg", "cpu_starvation"], imds="never")


def _ask(home: Path, data: bytes, python: str = HOST_PYTHON) -> dict[str, Any]:
    proc = subprocess.run(
        [python, "-I", "-S", "-c", STAGE],
        input=data,
        capture_output=True,
        env={"HOME": str(home), "PATH": os.environ["PATH"]},
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.decode().splitlines()
    assert len(lines) == 1, proc.stdout  # one JSON object, nothing else
    reply: dict[str, Any] = json.loads(lines[0])
    return reply


def _request(sha: str = SHA, params: dict[str, Any] | None = None, blob: bytes = b"") -> bytes:
    return json.dumps({"sha": sha, "params": PARAMS if params is None else params}).encode() + b"\n" + blob


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / ".ansible").mkdir(parents=True, mode=0o700)
    return home


def _cache(home: Path) -> Path:
    return home / ".ansible" / "fleetops"


def test_first_call_asks_for_the_archive_then_it_is_staged_and_runs(home: Path) -> None:
    assert _ask(home, _request()) == {"fleetops_runner": "missing"}
    assert sorted(os.listdir(_cache(home))) == []  # nothing staged without the archive
    reply = _ask(home, _request(blob=ARCHIVE))
    assert reply["fleetops_runner"] == "ok", reply
    result = reply["result"]
    assert result["checks"] == ["zombie_memcg", "cpu_starvation"]
    assert set(result) == {"facts", "findings", "errors", "checks", "coverage", "duration_ms"}
    assert list(result["coverage"]) == result["checks"]
    assert result["facts"]["memcg"]["total"] > 0  # this machine's real /proc/cgroups
    staged = _cache(home) / f"runner-{SHA}"
    assert sorted(os.listdir(_cache(home))) == [staged.name]  # the temporary folder was renamed into place
    assert (staged.stat().st_mode & 0o777) == 0o700
    # the next call needs no archive, and the runner's files were compiled where they are
    again = _ask(home, _request())
    assert again["fleetops_runner"] == "ok"
    assert again["result"]["checks"] == result["checks"]
    assert list(staged.rglob("__pycache__/health.*.pyc"))


STAGING_ONLY = ("tarfile", "tempfile", "hashlib", "shutil", "traceback", "shlex")
# Nor what the runner does without: subprocess (its run_command spawns with os.posix_spawnp), calendar (only
# docker's timestamps), socket (sdbus talks to systemd through _socket), each some milliseconds of every host's
# CPU on every scan; contextlib (a try instead of suppress), signal (_signal's numbers) and resource (only the
# timer reports its CPU), 0.2-0.4 ms each.
NOT_FOR_A_SCAN = (
    *STAGING_ONLY,
    "subprocess",
    "threading",
    "calendar",
    "socket",
    "contextlib",
    "signal",
    "resource",
)


def test_a_scan_with_the_runner_staged_imports_nothing_only_staging_needs(home: Path) -> None:
    """Every import in the stage is paid by every host on every scan: what only staging, a crash or the
    controller's side needs is imported where it is used. The stage runs as it does on a host, runs one
    command as a detector does (the runner's run_command), then says which of those modules it loaded (the
    runner's detectors import none of them either)."""
    assert _ask(home, _request(blob=ARCHIVE))["fleetops_runner"] == "ok"
    probe = STAGE.replace('if __name__ == "__main__":', "if True:") + (
        f"\nrc = sys.modules[PACKAGE + '.textfile'].run_command(['sh', '-c', 'echo ran'])"
        f"\nassert rc == (0, 'ran\\n', ''), rc"
        f"\nsys.stdout.write(json.dumps(sorted(m for m in {NOT_FOR_A_SCAN!r} if m in sys.modules)) + '\\n')\n"
    )
    proc = subprocess.run(
        [HOST_PYTHON, "-I", "-S", "-c", probe],
        input=_request(),
        capture_output=True,
        env={"HOME": str(home), "PATH": os.environ["PATH"]},
        timeout=60,
        check=True,
    )
    reply, loaded = proc.stdout.decode().splitlines()
    assert json.loads(reply)["fleetops_runner"] == "ok"
    assert json.loads(loaded) == []
    # staging itself does load them: the probe can see an import when there is one
    fresh = home.parent / "fresh"
    (fresh / ".ansible").mkdir(parents=True, mode=0o700)
    proc = subprocess.run(
        [HOST_PYTHON, "-I", "-S", "-c", probe],
        input=_request(blob=ARCHIVE),
        capture_output=True,
        env={"HOME": str(fresh), "PATH": os.environ["PATH"]},
        timeout=60,
        check=True,
    )
    assert {"tarfile", "tempfile", "hashlib"} <= set(json.loads(proc.stdout.decode().splitlines()[1]))


def test_the_same_result_as_run_checks_in_process(home: Path) -> None:
    """The runner runs health.run_checks on the staged copy: the same facts and findings as in-process."""
    from ansible_collections.fleetops.node.plugins.module_utils import textfile

    params = dict(PARAMS, checks=["zombie_memcg"])
    reply = _ask(home, _request(params=params, blob=ARCHIVE))
    here = health.run_checks(dict(params, _run=textfile.run_command))
    assert reply["result"]["findings"] == here["findings"]
    assert reply["result"]["facts"]["memcg"]["cgroup_version"] == here["facts"]["memcg"]["cgroup_version"]


def test_options_the_module_refuses_are_refused(home: Path) -> None:
    reply = _ask(home, _request(params=dict(PARAMS, zombie_warning=10, zombie_critical=5), blob=ARCHIVE))
    assert reply["fleetops_runner"] == "failed"
    assert "zombie_warning (10) must not be greater than zombie_critical (5)" in reply["msg"]


def test_an_archive_that_does_not_match_its_sha_is_refused_and_nothing_is_staged(home: Path) -> None:
    truncated = ARCHIVE[: len(ARCHIVE) // 2]
    reply = _ask(home, _request(blob=truncated))
    assert reply["fleetops_runner"] == "unusable"
    assert "does not match its sha256" in reply["msg"]
    assert os.listdir(_cache(home)) == []


def test_a_symlinked_cache_is_refused_and_nothing_is_written_through_it(home: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    _cache(home).symlink_to(elsewhere)
    reply = _ask(home, _request(blob=ARCHIVE))
    assert reply["fleetops_runner"] == "unusable"
    assert "is a symbolic link: refused" in reply["msg"]
    assert os.listdir(elsewhere) == []


def test_a_staged_folder_that_is_a_symlink_is_refused(home: Path, tmp_path: Path) -> None:
    """Someone who could plant ``runner-<sha>`` as a link to their own code does not get it imported."""
    planted = tmp_path / "planted"
    planted.mkdir()
    _cache(home).mkdir(mode=0o700)
    (_cache(home) / f"runner-{SHA}").symlink_to(planted)
    reply = _ask(home, _request())
    assert reply == {
        "fleetops_runner": "unusable",
        "msg": f"{_cache(home)}/runner-{SHA} is a symbolic link: refused",
    }


def test_a_cache_other_users_can_write_is_refused(home: Path) -> None:
    _cache(home).mkdir()
    _cache(home).chmod(0o777)
    reply = _ask(home, _request(blob=ARCHIVE))
    assert reply["fleetops_runner"] == "unusable"
    assert "can be written by other users (mode 777)" in reply["msg"]
    assert os.listdir(_cache(home)) == []


def test_a_cache_owned_by_another_user_is_refused(home: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("changing a folder's owner needs root")
    _cache(home).mkdir(mode=0o700)
    os.chown(_cache(home), 65534, 65534)
    reply = _ask(home, _request(blob=ARCHIVE))
    assert reply["fleetops_runner"] == "unusable"
    assert "belongs to uid 65534" in reply["msg"]


@pytest.mark.parametrize("name", ["../escaped.py", "/tmp/absolute.py", "a/../../escaped.py"])
def test_an_archive_member_that_leaves_its_folder_is_refused(home: Path, tmp_path: Path, name: str) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        data = b"print('owned')\n"
        info = tarfile.TarInfo(name)
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    blob = out.getvalue()
    reply = _ask(home, _request(sha=hashlib.sha256(blob).hexdigest(), blob=blob))
    assert reply["fleetops_runner"] == "unusable"
    assert "leaves its folder: refused" in reply["msg"]
    assert os.listdir(_cache(home)) == []  # the temporary folder is gone too
    assert not (tmp_path / "escaped.py").exists() and not Path("/tmp/absolute.py").exists()


def test_an_archive_with_a_link_member_is_refused(home: Path) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        info = tarfile.TarInfo("link")
        info.type = tarfile.SYMTYPE
        info.linkname = "/etc/shadow"
        archive.addfile(info)
    blob = out.getvalue()
    reply = _ask(home, _request(sha=hashlib.sha256(blob).hexdigest(), blob=blob))
    assert reply["fleetops_runner"] == "unusable"
    assert "is not a file or a folder" in reply["msg"]


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json\n",
        b'{"sha": "abc", "params": {}}\n',
        b'{"params": {}}\n',
        b'{"sha": "%s"}\n' % SHA.encode(),
    ],
)
def test_a_bad_request_is_unusable_and_stages_nothing(home: Path, data: bytes) -> None:
    reply = _ask(home, data)
    assert reply["fleetops_runner"] == "unusable"
    assert reply["msg"].startswith("bad request")
    assert not _cache(home).exists()


def test_a_home_that_cannot_be_written_is_unusable(tmp_path: Path) -> None:
    home = tmp_path / "ro"
    home.mkdir(mode=0o500)
    if os.geteuid() == 0:
        home = tmp_path / "missing" / "home"  # root writes anywhere: a home below a file
        (tmp_path / "missing").write_text("a file, not a folder")
    reply = _ask(home, _request(blob=ARCHIVE))
    assert reply["fleetops_runner"] == "unusable"
    assert "cannot create" in reply["msg"]


def test_two_first_scans_at_once_both_run_and_one_copy_is_kept(home: Path) -> None:
    """Each unpacks into its own temporary folder; one rename wins, the other uses the winner's copy."""
    procs = [
        subprocess.Popen(
            [HOST_PYTHON, "-I", "-S", "-c", STAGE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={"HOME": str(home), "PATH": os.environ["PATH"]},
        )
        for _ in range(4)
    ]
    for proc in procs:  # every request is in before any answer is read: the four race
        assert proc.stdin is not None
        proc.stdin.write(_request(blob=ARCHIVE))
        proc.stdin.flush()
    replies = [json.loads(proc.communicate(timeout=60)[0]) for proc in procs]
    assert [r["fleetops_runner"] for r in replies] == ["ok"] * 4, replies
    assert os.listdir(_cache(home)) == [f"runner-{SHA}"]


def test_the_venv_python_runs_it_too(home: Path) -> None:
    """The host's Python may be any supported version: the controller's (3.12+) as well as Debian's 3.11."""
    reply = _ask(home, _request(blob=ARCHIVE), python=str(Path(os.sys.executable)))
    assert reply["fleetops_runner"] == "ok"


def test_losing_the_rename_race_uses_the_winners_copy(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The interleaving forced: another scan renames its copy into place between this one's unpack and rename."""
    from ansible_collections.fleetops.node.plugins.module_utils import scan_stage

    base = str(_cache(home))
    os.makedirs(base, mode=0o700)
    final = os.path.join(base, f"runner-{SHA}")
    rename = os.rename

    def beaten(src: str, dst: str) -> None:
        os.mkdir(dst, 0o700)  # the winner's copy (empty here: which copy is used is what is checked)
        (Path(dst) / "winner").write_text("")
        rename(src, dst)  # fails: the destination is a folder that is not empty

    monkeypatch.setattr(scan_stage.os, "rename", beaten)
    assert scan_stage.stage(base, SHA, ARCHIVE) == final
    assert sorted(os.listdir(base)) == [f"runner-{SHA}"]  # this run's temporary copy is gone
    assert os.listdir(final) == ["winner"]


def test_an_unpack_that_fails_leaves_no_temporary_folder(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ansible_collections.fleetops.node.plugins.module_utils import scan_stage

    base = str(_cache(home))
    os.makedirs(base, mode=0o700)

    def full(*_args: object, **_kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shutil, "copyfileobj", full)  # the stage imports shutil where it unpacks
    with pytest.raises(scan_stage.Unusable, match="No space left on device"):
        scan_stage.stage(base, SHA, ARCHIVE)
    assert os.listdir(base) == []


def test_staging_a_new_runner_prunes_runners_unused_for_two_weeks_and_stale_unpacks(
    home: Path, tmp_path: Path
) -> None:
    cache = _cache(home)
    cache.mkdir(mode=0o700)
    old_day = 1_700_000_000  # long ago
    stale, recent = cache / f"runner-{'a' * 64}", cache / f"runner-{'b' * 64}"
    killed, fresh_unpack = cache / ".unpack-killed", cache / ".unpack-running"
    for folder in (stale, recent, killed, fresh_unpack):
        folder.mkdir(mode=0o700)
        (folder / "x.py").write_text("")
    os.utime(stale, (old_day, old_day))
    os.utime(killed, (old_day, old_day))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("")
    link = cache / f"runner-{'c' * 64}"
    link.symlink_to(outside)
    os.utime(link, (old_day, old_day), follow_symlinks=False)
    other = cache / "notes.txt"  # not ours to judge
    other.write_text("")
    os.utime(other, (old_day, old_day))

    reply = _ask(home, _request(blob=ARCHIVE))
    assert reply["fleetops_runner"] == "ok"
    left = sorted(os.listdir(cache))
    assert left == sorted([f"runner-{SHA}", recent.name, fresh_unpack.name, link.name, other.name]), left
    assert (outside / "keep").exists()  # a link is never followed


def test_each_use_touches_the_runner_so_a_busy_one_is_never_pruned(home: Path) -> None:
    _ask(home, _request(blob=ARCHIVE))
    staged = _cache(home) / f"runner-{SHA}"
    os.utime(staged, (1_700_000_000, 1_700_000_000))
    assert _ask(home, _request())["fleetops_runner"] == "ok"
    assert staged.stat().st_mtime > 1_700_000_000 + 86400
