"""Where ansible's ssh keeps its ControlMaster sockets when its own default cannot hold one.

ansible's ssh connection puts each host's ControlMaster socket at ``<control_path_dir>/<10 hex>``
(``control_path_dir`` defaults to ``~/.ansible/cp``), and ssh first binds it as that name plus
``.`` and 16 random characters. A Unix socket's path holds at most 107 bytes, so under a home longer
than about 66 characters (a CI workspace, a service account's deep home, a test's temporary home) every
connection fails with ``unix_listener: path "..." too long for Unix domain socket``: every host
unreachable. fleetops then points ansible at a short private folder instead.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

SOCKET_PATH_MAX = 107  # sun_path is 108 bytes with its NUL
# ansible's hash (10) and ssh's temporary suffix ("." + 16), after the folder and its "/"
SOCKET_NAME_LEN = 1 + 10 + 17
SETTINGS = ("ANSIBLE_SSH_CONTROL_PATH_DIR", "ANSIBLE_SSH_CONTROL_PATH")


def fits(folder: str) -> bool:
    """Whether ssh can bind a ControlMaster socket in ``folder``."""
    return len(os.fsencode(folder)) + SOCKET_NAME_LEN <= SOCKET_PATH_MAX


def _private(folder: Path) -> bool:
    """``folder`` exists, or was made, as a real folder of this user's that nobody else can enter."""
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o700


def control_path_dir(environ: dict[str, str] | None = None) -> str | None:
    """A ``control_path_dir`` for ansible, or None to keep its own.

    None when the environment sets the control path (``ANSIBLE_SSH_CONTROL_PATH_DIR`` or
    ``ANSIBLE_SSH_CONTROL_PATH``: the user's choice) or when the default ``~/.ansible/cp`` fits. Else
    ``$XDG_RUNTIME_DIR/fleetops-cp`` (the user's own runtime folder) when that fits, else
    ``<tmp>/fleetops-cp-<uid>``, made 0700 and used only when it is this user's own 0700 folder (not a
    link someone else left); None when neither is, and ssh says why it fails. A ``control_path_dir`` in
    an ansible.cfg is overridden only in that long-home case, where it could not have been the default."""
    env = os.environ if environ is None else environ
    if any(env.get(name) for name in SETTINGS):
        return None
    home = os.path.expanduser("~/.ansible/cp")
    if fits(home):
        return None
    candidates = []
    if env.get("XDG_RUNTIME_DIR"):
        candidates.append(Path(env["XDG_RUNTIME_DIR"]) / "fleetops-cp")
    candidates.append(Path(tempfile.gettempdir()) / f"fleetops-cp-{os.getuid()}")
    for folder in candidates:
        if fits(str(folder)) and _private(folder):
            return str(folder)
    return None
