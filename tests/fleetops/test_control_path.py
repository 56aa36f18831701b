"""ssh's ControlMaster sockets under a long home (fleetops.ansible.control_path): CI failed on it once, the
installed CLI's scan of a lab fleet finding every host unreachable ("too long for Unix domain socket")."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetops.ansible import control_path
from fleetops.ansible.runner import ansible_env


@pytest.fixture
def short() -> Iterator[Path]:
    """A folder with a short path (pytest's own, under xdist, may leave no room for a socket's name)."""
    folder = Path(tempfile.mkdtemp(prefix="cpt-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _bind(folder: str) -> None:
    """Bind a socket named as ssh names its temporary ControlMaster socket (10 hex + "." + 16)."""
    path = os.path.join(folder, "0123456789." + "a" * 16)
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(path)
    os.unlink(path)


def test_the_limit_is_the_kernels(short: Path) -> None:
    """What ``fits`` allows binds; one byte more does not (the same limit ssh meets)."""
    room = control_path.SOCKET_PATH_MAX - control_path.SOCKET_NAME_LEN - len(str(short)) - 1
    fitting = short / ("d" * room)
    fitting.mkdir()
    assert control_path.fits(str(fitting))
    _bind(str(fitting))
    longer = short / ("d" * (room + 1))
    longer.mkdir()
    assert not control_path.fits(str(longer))
    with pytest.raises(OSError):
        _bind(str(longer))


def test_a_short_home_keeps_ansibles_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/alice")
    for name in control_path.SETTINGS:
        monkeypatch.delenv(name, raising=False)
    assert control_path.control_path_dir() is None
    assert "ANSIBLE_SSH_CONTROL_PATH_DIR" not in ansible_env()


def test_a_long_home_gets_a_short_private_folder(
    tmp_path: Path, short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / ("h" * 90)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    for name in control_path.SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(short))
    folder = ansible_env()["ANSIBLE_SSH_CONTROL_PATH_DIR"]
    assert Path(folder) == short / f"fleetops-cp-{os.getuid()}"
    info = os.lstat(folder)
    assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700
    _bind(folder)


def test_the_users_own_setting_and_runtime_folder_win(
    tmp_path: Path, short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / ("h" * 90)))
    monkeypatch.setenv("ANSIBLE_SSH_CONTROL_PATH_DIR", "/run/mine")
    assert control_path.control_path_dir() is None  # theirs, as set
    monkeypatch.delenv("ANSIBLE_SSH_CONTROL_PATH_DIR")
    runtime = short / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert control_path.control_path_dir() == str(runtime / "fleetops-cp")


def test_a_folder_someone_else_planted_is_not_used(
    tmp_path: Path, short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A link (or a folder others can enter) where the private folder goes: not used, ansible's default
    kept and ssh says why it fails; never a socket in someone else's folder."""
    monkeypatch.setenv("HOME", str(tmp_path / ("h" * 90)))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    for name in control_path.SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(short))
    assert control_path.control_path_dir() == str(short / f"fleetops-cp-{os.getuid()}")  # where it goes
    (short / f"fleetops-cp-{os.getuid()}").rmdir()
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (short / f"fleetops-cp-{os.getuid()}").symlink_to(target)
    assert control_path.control_path_dir() is None
    (short / f"fleetops-cp-{os.getuid()}").unlink()
    loose = short / f"fleetops-cp-{os.getuid()}"
    loose.mkdir(mode=0o777)
    loose.chmod(0o777)
    assert control_path.control_path_dir() is None
