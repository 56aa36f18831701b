# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""systemd helpers shared by detectors and remediations: unit-name rules and `systemctl show` parsing.

Stdlib only; importable on Python >= 3.9. Pure functions except ``is_systemd_host``.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re

UNIT_TYPES = (
    "service", "socket", "target", "device", "mount", "automount", "swap", "timer", "path", "slice", "scope",
)
# systemd's unit_name_is_valid(): [a-zA-Z0-9:_.\\-] plus one "@" for templates, <= 255 chars, a known suffix.
_UNIT_NAME_RE = re.compile(r"^[A-Za-z0-9:_.\\-]+(@[A-Za-z0-9:_.\\-]*)?\.(%s)$" % "|".join(UNIT_TYPES))
UNIT_NAME_MAX = 255

# Units a remediation must never stop without an explicit override: the way in, the bus, the
# network, systemd itself, and the node's container runtime / kubelet.
PROTECTED_UNITS = (
    "sshd.service", "ssh.service", "ssh.socket", "sshd.socket",
    "dbus.service", "dbus.socket", "dbus-broker.service",
    "networking.service", "network.service", "NetworkManager.service", "network-online.target",
    "kubelet.service", "containerd.service", "docker.service", "docker.socket", "crio.service",
    "init.scope", "-.slice", "-.mount",
)
PROTECTED_PATTERNS = ("systemd-*",)


class UnitNameError(ValueError):
    """A unit name systemd would reject (or that smuggles shell metacharacters)."""


def normalize_unit_name(name):
    """Return a valid full unit name (``foo`` -> ``foo.service``) or raise UnitNameError."""
    if not isinstance(name, str) or not name:
        raise UnitNameError("unit name is empty")
    if "." not in name.rsplit("@", 1)[-1] or name.rsplit(".", 1)[-1] not in UNIT_TYPES:
        name = name + ".service"
    if len(name) > UNIT_NAME_MAX:
        raise UnitNameError("unit name longer than %d characters" % UNIT_NAME_MAX)
    if not _UNIT_NAME_RE.match(name):
        raise UnitNameError(
            "%r is not a valid systemd unit name (allowed: letters, digits, ':', '_', '.', '\\', '-', one '@')"
            % name
        )
    return name


def is_protected(name, extra=()):
    """True when the unit is on the protected list (built-in names and patterns, plus ``extra``)."""
    import fnmatch

    for entry in tuple(PROTECTED_UNITS) + tuple(extra):
        if fnmatch.fnmatchcase(name, entry) or fnmatch.fnmatchcase(name, entry + ".service"):
            return True
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in PROTECTED_PATTERNS)


def parse_show(text):
    """Parse ``systemctl show`` output: one dict per unit, blocks separated by blank lines.

    ``KEY=VALUE`` lines; a value may itself contain ``=``. Lines without ``=`` raise ValueError.
    """
    units = []
    current = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            if current:
                units.append(current)
                current = {}
            continue
        key, sep, value = line.partition("=")
        if not sep or not key:
            raise ValueError("line %d: expected KEY=VALUE, got %r" % (lineno, line[:80]))
        current[key] = value
    if current:
        units.append(current)
    return units


def is_systemd_host(run_dir="/run/systemd/system"):
    """sd_booted(): systemd is PID 1 when /run/systemd/system exists."""
    return os.path.isdir(run_dir)
