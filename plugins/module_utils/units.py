# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The unexpected_unit detector (units enabled on the host but not on the fleet's allow-list), the
environment of the host's key services, and the host identity facts a drift report compares.

The Pinterest incident began with a base image that enabled ``ecs.service`` on a fleet that does
not use ECS. An allow-list of unit-name patterns (``systemd-*``, ``getty@*``) from the fleet's
group_vars catches such a unit before it crash-loops.

What it reads, and what it costs:

- The candidates: the names of the symlinks in the ``*.wants`` / ``*.requires`` / ``*.upholds``
  directories of systemd's configuration and runtime directories (``/etc/systemd/system``,
  ``/run/systemd/system``, ...): a few directory reads. That is where ``systemctl enable`` puts its
  links, so an enabled unit is among them.
- One ``systemctl show -p Id,UnitFileState,UnitFilePreset,Environment -- CANDIDATES ENV_UNITS`` call:
  systemd itself says which of the candidates are enabled (``UnitFileState``, computed as
  ``list-unit-files`` computes it, for these units only: listing every unit file instead makes systemd
  compute the state of every unit file on the host, ~100,000 ``openat`` calls and ~0.6 s on systemd 252
  with ~360 unit files) and, in the same answer, the ``Environment=`` of the key services
  (``env_units``; by default the enabled services, at most ``ENV_UNITS_MAX``). An instance link
  (``getty@tty1.service``) is asked by its own name (systemd refuses to show a template) and reported by
  its template's (``getty@.service``), as ``list-unit-files`` names it. Values of variables
  whose names look secret (``*PASSWORD*``, ``*TOKEN*``, ...) are replaced by a short digest, and so are
  credentials inside other values (URL userinfo, ``password=`` pairs, AWS keys, bearer tokens:
  ``module_utils/redact.py``), so a drift report still sees that they differ without printing them.
  (Before, a ``list-unit-files`` for the candidates and a ``show`` for the services: two systemctl
  processes and two calls into PID 1 per scan.)
  From the scan's runner and the host timer (root) the same properties are asked over D-Bus instead
  (``module_utils/sdbus.py``: no systemctl process), systemctl whenever that cannot answer as it would.
- ``host_facts()``: ``os.uname()``, ``/etc/os-release`` and the boot id; no process is run.

Stdlib only; importable on Python >= 3.9.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import fnmatch
import os
import re
import time

from ansible_collections.fleetops.node.plugins.module_utils.findings import (
    DetectorError,
    make_finding,
)
from ansible_collections.fleetops.node.plugins.module_utils.redact import redact_env
from ansible_collections.fleetops.node.plugins.module_utils.sdbus import BusError
from ansible_collections.fleetops.node.plugins.module_utils.systemd import (
    UnitNameError,
    environment_from_words,
    is_systemd_host,
    normalize_unit_name,
    parse_show,
    parse_words,
)

CHECK = "unexpected_unit"
ENABLED_STATES = ("enabled", "enabled-runtime")
SHOW_UNIT_PROPERTIES = ("Id", "UnitFileState", "UnitFilePreset")  # and Environment (services, sockets, ...)
ENV_UNITS_MAX = 64
PATTERN_MAX = 256
# systemd's configuration and runtime directories, where `systemctl enable` (and generators) link units.
CONFIG_DIRS = (
    "/etc/systemd/system",
    "/etc/systemd/system.control",
    "/run/systemd/system",
    "/run/systemd/system.control",
    "/run/systemd/transient",
    "/run/systemd/generator.early",
    "/run/systemd/generator",
    "/run/systemd/generator.late",
)
_DEP_DIR_SUFFIXES = (".wants", ".requires", ".upholds")
# unit-name characters plus the glob characters fnmatch understands
_PATTERN_RE = re.compile(r"^[A-Za-z0-9:_.\\@*?\[\]!-]+\Z")
_INSTANCE_RE = re.compile(r"^([^@]+@)[^@]*(\.[a-z]+)$")


class UnitsError(DetectorError):
    pass


# ------------------------------------------------------------------------------------- patterns


def validate_patterns(patterns, option="unit_allowlist"):
    """The first problem with a list of unit-name glob patterns, or None."""
    for pattern in patterns or ():
        if not isinstance(pattern, str) or not pattern.strip():
            return "%s entries must be non-empty strings, got %r" % (option, pattern)
        if len(pattern) > PATTERN_MAX:
            return "%s entry longer than %d characters: %r" % (option, PATTERN_MAX, pattern[:40] + "...")
        if not _PATTERN_RE.match(pattern):
            return (
                "%s entry %r is not a unit-name pattern (allowed: letters, digits, ':', '_', '.', '\\', '-', '@' "
                "and the globs '*', '?', '[...]')" % (option, pattern)
            )
        if pattern.count("[") != pattern.count("]"):
            return "%s entry %r has an unbalanced '[...]'" % (option, pattern)
    return None


def validate_env_units(names):
    """The first problem with ``env_units`` (unit names, ``foo`` meaning ``foo.service``), or None."""
    for name in names or ():
        try:
            normalize_unit_name(name)
        except UnitNameError as exc:
            return "env_units: %s" % exc
    if len(names or ()) > ENV_UNITS_MAX:
        return "env_units lists %d units; at most %d" % (len(names), ENV_UNITS_MAX)
    return None


def matching_pattern(unit, patterns):
    """The first pattern that matches ``unit`` (a pattern without a unit type also matches NAME.service)."""
    for pattern in patterns or ():
        if fnmatch.fnmatchcase(unit, pattern) or fnmatch.fnmatchcase(unit, pattern + ".service"):
            return pattern
    return None


# ------------------------------------------------------------------------------------- parsers


def parse_list_unit_files(text):
    """``[{unit, state, preset}]`` from ``systemctl list-unit-files`` lines (legend or not).

    systemd 252 prints ``UNIT FILE  STATE  PRESET`` (older versions ``VENDOR PRESET``; before 245 no
    preset column); the preset is None where it is not printed or is ``-``.
    """
    units = []
    for lineno, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or fields[0] == "UNIT" or (len(fields) >= 3 and fields[1:3] == ["unit", "files"]):
            continue  # blank, the header, "N unit files listed."
        if len(fields) < 2 or len(fields) > 3:
            raise UnitsError("parse", "systemctl list-unit-files output", "line %d: %r" % (lineno, line[:80]))
        preset = fields[2] if len(fields) == 3 and fields[2] != "-" else None
        units.append({"unit": fields[0], "state": fields[1], "preset": preset})
    return units


def parse_os_release(text):
    """{KEY: value} of an os-release file (shell-style assignments, quotes removed)."""
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not re.match(r"^[A-Z0-9_]+$", key):
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = re.sub(r"\\(.)", r"\1", value[1:-1]) if value[0] == '"' else value[1:-1]
        values[key] = value
    return values


def parse_env_show(text):
    """{unit: {unit_file_state, unit_file_preset, environment}} from ``systemctl show -p
    Id,UnitFileState,UnitFilePreset,Environment`` (``UnitFilePreset`` None where not asked or empty).

    Units systemd does not know (an empty ``UnitFileState`` and no fragment) are left out.
    """
    try:
        blocks = parse_show(text)
    except ValueError as exc:
        raise UnitsError("parse", "systemctl show output", str(exc))
    for props in blocks:
        props["Environment"] = parse_words(props.get("Environment", ""))
    return env_records(blocks)


def env_records(blocks):
    """parse_env_show's answer from the shown units' properties, ``Environment`` as its words (systemctl's,
    or the D-Bus property's strings)."""
    result = {}
    for props in blocks:
        unit = props.get("Id")
        if not unit or not props.get("UnitFileState"):
            continue
        result[unit] = {
            "unit_file_state": props["UnitFileState"],
            "unit_file_preset": props.get("UnitFilePreset") or None,
            "environment": redact_env(environment_from_words(props.get("Environment") or ())),
        }
    return result


# ------------------------------------------------------------------------------------- collect


def _template(name):
    """``getty@tty1.service`` -> ``getty@.service`` (what list-unit-files knows); others unchanged."""
    match = _INSTANCE_RE.match(name)
    return match.group(1) + match.group(2) if match else name


def enablement_candidates(dirs=CONFIG_DIRS):
    """Sorted unit names linked from the ``*.wants`` / ``*.requires`` / ``*.upholds`` directories, an
    instance by its template's name (``getty@tty1.service`` -> ``getty@.service``)."""
    return sorted(set(_template(name) for name in linked_units(dirs)))


def linked_units(dirs=CONFIG_DIRS):
    """Sorted names of the links in the ``*.wants`` / ``*.requires`` / ``*.upholds`` directories, as
    linked (instances as themselves), those systemctl can show (valid unit names, no template)."""
    names = set()
    for base in dirs:
        try:
            entries = os.listdir(base)
        except OSError:
            continue
        for entry in entries:
            if not entry.endswith(_DEP_DIR_SUFFIXES):
                continue
            try:
                links = os.listdir(os.path.join(base, entry))
            except OSError:
                continue
            for link in links:
                if "." in link and not link.startswith(".") and _showable(link):
                    names.add(link)
    return sorted(names)


def _showable(name):
    try:
        return normalize_unit_name(name) == name and "@." not in name
    except UnitNameError:
        return False


def _env_targets(env_units, enabled):
    """The services whose Environment= is read: ``env_units`` or the enabled services, capped."""
    if env_units:
        targets = list(dict.fromkeys(normalize_unit_name(u) for u in env_units))
    else:
        targets = [u for u in enabled if u.endswith(".service") and "@." not in u]
    return targets[:ENV_UNITS_MAX], len(targets) > ENV_UNITS_MAX


def collect(run, env_units=None, systemd_dir="/run/systemd/system", config_dirs=CONFIG_DIRS, bus=None):
    """One sample: the enabled units, and the Environment= of the key services.

    ``run(argv) -> (rc, stdout, stderr)``. At most one systemctl call, whatever the host has; none when
    ``bus`` (sdbus.Systemd) answers the same question.
    """
    started = time.monotonic()
    if not is_systemd_host(systemd_dir):
        return {"systemd": False, "reason": "systemd is not PID 1 on this host", "enabled": [], "unit_files": {},
                "environment": {}}  # fmt: skip
    linked = linked_units(config_dirs)
    asked = [normalize_unit_name(u) for u in env_units or ()]
    shown = {}
    if linked or asked:
        shown = _show(run, bus, list(dict.fromkeys(linked + asked)))
    unit_files = {}
    for unit in linked:
        data = shown.get(unit)
        name = _template(unit)
        if data is not None and data["unit_file_state"] in ENABLED_STATES and name not in unit_files:
            unit_files[name] = {"state": data["unit_file_state"], "preset": data["unit_file_preset"]}
    enabled = sorted(unit_files)
    targets, truncated = _env_targets(env_units, enabled)
    environment = dict((unit, shown[unit]["environment"]) for unit in targets if unit in shown)
    return {
        "systemd": True,
        "reason": None,
        "enabled": enabled,
        "unit_files": unit_files,
        "candidates": len(set(_template(u) for u in linked)),
        "environment": environment,
        "environment_units": targets,
        "environment_truncated": truncated,
        "collect_ms": round((time.monotonic() - started) * 1000.0, 3),
    }


def _show(run, bus, names):
    """parse_env_show's answer for ``names``: over D-Bus when ``bus`` can (the properties systemctl would
    print), else from ``systemctl show``."""
    if bus is not None:
        try:
            return env_records(bus.show(names, SHOW_UNIT_PROPERTIES, ("Environment",)))
        except BusError:
            pass  # systemctl, as always
    argv = ["systemctl", "show", "-p", ",".join(SHOW_UNIT_PROPERTIES + ("Environment",)), "--"]
    rc, out, err = run(argv + names)
    if rc != 0:
        raise UnitsError("run", "systemctl show", (err or out).strip() or "exit %d" % rc)
    return parse_env_show(out)


def add_growth(first, second, seconds):
    """Unit enablement has no rate: the second sample."""
    return second


def _read(path, limit=65536):
    try:
        with open(path, "rb") as handle:
            return handle.read(limit).decode("utf-8", "replace")
    except (IOError, OSError):
        return None


def host_facts(os_release=("/etc/os-release", "/usr/lib/os-release"), proc="/proc"):
    """What the host is: kernel, OS, architecture and boot id (no process run; microseconds)."""
    uname = os.uname()
    release = {}
    for path in os_release:
        text = _read(path)
        if text is not None:
            release = parse_os_release(text)
            break
    boot_id = _read(proc + "/sys/kernel/random/boot_id", 64)
    return {
        "kernel": uname.release,
        "arch": uname.machine,
        "os": release.get("PRETTY_NAME") or release.get("NAME"),
        "os_id": release.get("ID"),
        "os_version_id": release.get("VERSION_ID"),
        "boot_id": boot_id.strip() if boot_id else None,
    }


# ------------------------------------------------------------------------------------- evaluate


def _origin(state, preset):
    if state == "enabled-runtime":
        return "enabled at runtime (in /run, gone at reboot)"
    if preset == "enabled":
        return "the image enabled it (its vendor preset is enabled)"
    if preset == "disabled":
        return "enabled against its vendor preset (disabled): the image build or an operator enabled it"
    return "the image enabled it"


def evaluate(facts, allowlist=None):
    """One warning per enabled unit no allow-list pattern matches; none without an allow-list."""
    if not allowlist or not facts.get("systemd"):
        return []
    findings = []
    for unit in facts.get("enabled", []):
        if matching_pattern(unit, allowlist):
            continue
        info = facts.get("unit_files", {}).get(unit, {})
        summary = "%s is enabled but not on the fleet's unit allow-list (%d pattern%s): %s; allow it "
        summary += "(fleetops_unit_allowlist) or turn it off (fleetops remediate disable-unit --unit %s)"
        summary = summary % (
            unit, len(allowlist), "" if len(allowlist) == 1 else "s",
            _origin(info.get("state"), info.get("preset")), unit,
        )  # fmt: skip
        data = {
            "unit": unit,
            "state": info.get("state"),
            "preset": info.get("preset"),
            "allowlist": list(allowlist),
        }
        findings.append(make_finding(CHECK, "warning", summary, data))
    return findings
