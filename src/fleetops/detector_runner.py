"""The detector timer's runner as one archive: ``playbooks/files/fleetops-detector.tar``.

``fleetops.node.detector_timer`` installs, on each host, the collection's module_utils the runner imports
(``textfile`` and what it imports, stdlib only), the package markers above them and a 4-line entry point.
Copied file by file that was about 30 module calls a host; as one archive it is a copy and an unpack, each
idempotent (the copy by checksum, the unpack by ``tar --diff``). The archive is derived, never edited:
``python -m fleetops.cli.detector_runner --write`` (its command line, in ``cli/``) rebuilds it from the playbook's ``fleetops_dt_module_utils``
and the module_utils' sources, ``--check`` (a unit test runs it) fails when it is stale. Its bytes depend
only on those sources: sorted members, one fixed time, root's ids, 0644 files and 0755 folders.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = REPO / "playbooks" / "detector_timer.yml"
ARCHIVE = REPO / "playbooks" / "files" / "fleetops-detector.tar"
MODULE_UTILS = REPO / "plugins" / "module_utils"
PACKAGE = "ansible_collections/fleetops/node/plugins/module_utils"
ENTRY = "fleetops-detector"
MTIME = 1_767_225_600  # 2026-01-01T00:00:00Z: the members' one time (tar --diff compares it)
ENTRY_POINT = """\
# fleetops.node.detector_timer's runner: node_health's detectors once, this host's gauges to the textfile.
# Run as: python3 -I -S fleetops-detector CONFIG.json (isolated: only the stdlib and the files here).
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ansible_collections.fleetops.node.plugins.module_utils import textfile
sys.exit(textfile.main(sys.argv[1:]))
"""


def module_utils_names() -> list[str]:
    """The module_utils the playbook declares the runner imports (``fleetops_dt_module_utils``)."""
    play = yaml.safe_load(PLAYBOOK.read_text())[0]
    return [str(n) for n in play["vars"]["fleetops_dt_module_utils"]]


def members() -> dict[str, bytes | None]:
    """Each path of the runner's tree -> its bytes (None: a folder), in the order they are archived."""
    tree: dict[str, bytes | None] = {}
    parts = PACKAGE.split("/")
    for depth in range(1, len(parts) + 1):
        folder = "/".join(parts[:depth])
        tree[folder] = None
        tree[f"{folder}/__init__.py"] = b""
    for name in sorted(module_utils_names()):
        tree[f"{PACKAGE}/{name}.py"] = (MODULE_UTILS / f"{name}.py").read_bytes()
    tree[ENTRY] = ENTRY_POINT.encode()
    return dict(sorted(tree.items()))


def build() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for path, data in members().items():
            info = tarfile.TarInfo(path)
            info.mtime, info.uid, info.gid, info.uname, info.gname = MTIME, 0, 0, "root", "root"
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


WRITE = "python -m fleetops.cli.detector_runner --write"


def write() -> str:
    """Rebuild the archive; one line saying what it holds."""
    wanted = build()
    ARCHIVE.parent.mkdir(exist_ok=True)
    ARCHIVE.write_bytes(wanted)
    return f"{ARCHIVE.relative_to(REPO)}: {len(members())} members, {len(wanted)} bytes"


def stale() -> str | None:
    """Why the archive is not what ``write`` makes (None: it is)."""
    if ARCHIVE.exists() and ARCHIVE.read_bytes() == build():
        return None
    return f"{ARCHIVE.relative_to(REPO)} is stale (a module_utils file or the playbook's list changed): run {WRITE}"
