"""What this controller has installed, checked before a command runs and shown by ``fleetops --version``.

- ansible-core: the range the installed ``fleetops`` package requires (its own metadata, i.e. pyproject's
  dependency: the one place the range is written for the controller). pip refuses to install fleetops
  beside another ansible-core, but a later ``pip install ansible-core==...`` or a ``--no-deps`` install
  leaves one; the first command then says what it needs in one line (exit 2) instead of failing deep
  inside ansible.
- The collection: where ``fleetops.node`` is found, in the order ansible-core searches (this checkout's
  ``collections/``, the configured collections paths, then ``sys.path``, where the wheel installs it into
  site-packages), and its version (MANIFEST.json of an installed one, galaxy.yml of a checkout). Found
  twice (a wheel's in site-packages and a tarball's under ~/.ansible/collections), the first is the one
  ansible-core and fleetops use; ``fleetops --version`` names it and the others.

Nothing here imports ansible: the version output and the check run before any command.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

import fleetops
from fleetops.ansible.collection import found_at
from fleetops.errors import UsageError

DISTRIBUTION = "fleetops"
ANSIBLE_CORE = "ansible-core"


@dataclass(frozen=True)
class Located:
    path: Path
    version: str


# A Requires-Dist line (PEP 508 as the metadata writes it): name, extras, the version specifiers, a marker.
# Read here rather than by packaging.requirements (its markers and tags: ~15 ms of every command's start;
# packaging's specifiers and versions are imported by ansible anyway).
_REQUIRES = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*\(?([^;()@]*?)\)?\s*(;.*)?")


@dataclass(frozen=True)
class CoreRequirement:
    """fleetops' requirement on ansible-core: ``ansible-core<2.22,>=2.20`` (its specifiers)."""

    specifier: Any  # packaging.specifiers.SpecifierSet

    def __str__(self) -> str:
        return f"{ANSIBLE_CORE}{self.specifier}"


def ansible_core_requirement() -> CoreRequirement | None:
    """The ansible-core requirement of the installed fleetops package (None when it is not installed)."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        requires = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return None
    for line in requires:
        found = _REQUIRES.fullmatch(line)
        if found is None or found[3] is not None:
            continue
        if re.sub(r"[-_.]+", "-", found[1]).lower() != ANSIBLE_CORE:
            continue
        try:
            return CoreRequirement(SpecifierSet(found[2].strip()))
        except InvalidSpecifier:
            continue
    return None


def check_ansible_core() -> None:
    """UsageError (one line, exit 2) when this Python's ansible-core is missing or outside fleetops' range."""
    from packaging.version import InvalidVersion, Version

    req = ansible_core_requirement()
    if req is None:
        return
    try:
        have = metadata.version(ANSIBLE_CORE)
    except metadata.PackageNotFoundError:
        have = ""
    try:
        ok = bool(have) and req.specifier.contains(Version(have), prereleases=True)
    except InvalidVersion:
        ok = False
    if not ok:
        found = f"ansible-core {have}" if have else "no ansible-core"
        raise UsageError(f"fleetops needs {req}; {sys.executable} has {found}: pip install '{req}'")


def _version_at(folder: Path) -> str:
    manifest = folder / "MANIFEST.json"
    try:
        if manifest.is_file():
            return str(json.loads(manifest.read_text())["collection_info"]["version"])
        return str(yaml.safe_load((folder / "galaxy.yml").read_text())["version"])
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError):
        return "unknown"


def collections() -> list[Located]:
    """Every fleetops.node this controller finds, the one ansible-core uses first."""
    return [Located(path, _version_at(path)) for path in found_at()]


def version_text() -> str:
    """``fleetops --version``: the package, and which collection runs (path and version), others after."""
    lines = [f"fleetops {fleetops.__version__} (Python {sys.version.split()[0]} at {sys.executable})"]
    found = collections()
    if not found:
        lines.append(
            "collection fleetops.node: not found (pip install the fleetops wheel, or ansible-galaxy collection install)"
        )
    for n, c in enumerate(found):
        role = "collection fleetops.node" if n == 0 else "  also found, not used"
        lines.append(f"{role} {c.version} at {c.path}")
    return "\n".join(lines)
