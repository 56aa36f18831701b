"""The wheel's build hook: one version, and the collection inside the wheel.

- The version is galaxy.yml's, and so are the project URLs (pyproject.toml declares both dynamic).
  galaxy.yml, because it is the one place ansible-galaxy can read: `ansible-galaxy collection build`
  takes the collection's version from there and nowhere else, while setuptools takes one from a hook.
  The wheel, the collection tarball, `fleetops --version` (the installed package's metadata), the
  changelog's release and the modules' version_added (tests/unit/test_versions.py) all follow it.
- The wheel carries the collection as ``ansible_collections/fleetops/node`` in site-packages, as the
  ``ansible`` package on PyPI does: ansible-core finds collections on sys.path with no configuration. Its
  files are those of the collection tarball (`ansible-galaxy collection build`, galaxy.yml's build_ignore:
  no lab, tests, bench or CI), MANIFEST.json and FILES.json included, so `ansible-galaxy collection list`
  shows it with its version as it shows one installed from the tarball. Not for an editable install: a
  checkout's collection is the checkout itself (collections/ansible_collections/fleetops/node -> ..).
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import yaml
from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
COLLECTION = ("ansible_collections", "fleetops", "node")


def galaxy() -> dict[str, Any]:
    meta: dict[str, Any] = yaml.safe_load((ROOT / "galaxy.yml").read_text())
    return meta


class BuildWithCollection(build_py):
    """build_py, then the collection tarball's files under build_lib/ansible_collections/fleetops/node."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        dest = Path(self.build_lib).joinpath(*COLLECTION)
        with tempfile.TemporaryDirectory() as tmp:
            galaxy = [sys.executable, "-m", "ansible.cli.galaxy"]
            subprocess.run(
                [*galaxy, "collection", "build", str(ROOT), "--output-path", tmp, "--force"],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            (tarball,) = Path(tmp).glob("fleetops-node-*.tar.gz")
            with tarfile.open(tarball) as tar:
                tar.extractall(dest, filter="data")


META = galaxy()
setup(
    version=str(META["version"]),
    project_urls={key.capitalize(): META[key] for key in ("repository", "documentation", "issues")},
    cmdclass={"build_py": BuildWithCollection},
)
