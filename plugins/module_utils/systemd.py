# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""systemd helpers shared by detectors and remediations.

- Unit names: the one normalisation rule (``normalize_unit_name``), unit types, and the identity of a
  unit as systemd resolves it (``unit_identity``: its ``Id`` and every one of its ``Names``).
- Protection: the built-in protected patterns, matched against every name a unit has.
- ``systemctl show`` parsing, including the quoted word lists of ``Names=`` and ``Environment=``.
- ``Environment=`` drop-ins: names and values checked, quoted for systemd, parsed back (the set_env
  module writes them, with ``AnsibleModule.atomic_move``).

Stdlib only; importable on Python >= 3.9. Pure functions except ``is_systemd_host``.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import fnmatch
import os
import re
import unicodedata

UNIT_TYPES = (
    "service", "socket", "target", "device", "mount", "automount", "swap", "timer", "path", "slice", "scope",
)  # fmt: skip
# The unit types a remediation may stop, disable and mask. Targets, slices, scopes, mounts, swaps and
# devices are the machine's structure: turning one off takes many units with it.
DISABLEABLE_TYPES = ("service", "socket", "timer", "path")
# systemd's unit_name_is_valid(): [a-zA-Z0-9:_.\\-] plus one "@" for templates, <= 255 chars, a known
# suffix. fleetops also refuses a leading "-" (it reads as an option; "-.slice" and "-.mount" are the
# root slice and mount, never something to turn off). Checked with fullmatch: "$" would accept a
# trailing newline.
_UNIT_NAME_RE = re.compile(
    r"[A-Za-z0-9:_.\\][A-Za-z0-9:_.\\-]*(@[A-Za-z0-9:_.\\-]*)?\.(%s)" % "|".join(UNIT_TYPES)
)
UNIT_NAME_MAX = 255
# A unit-name glob (the ``protected`` option, allow-lists): unit-name characters plus * ? [ ] !
_UNIT_PATTERN_RE = re.compile(r"[A-Za-z0-9:_.\\@*?\[\]!-]+")

# Units a remediation must never stop without an explicit override, as globs on full unit names,
# matched against every name systemd knows the unit by (aliases included): the way in, the bus and
# its activation aliases, the network, systemd itself, consoles, and the node's agents, container
# runtime and kubelet.
PROTECTED_PATTERNS = (
    "ssh.service", "ssh.socket", "ssh@*.service", "sshd.service", "sshd.socket", "sshd@*.service",
    "systemd-*",
    "dbus.service", "dbus.socket", "dbus-broker.service", "dbus-org.freedesktop.*",
    "udev.service", "udev*.socket",
    "getty@*.service", "serial-getty@*.service", "container-getty@*.service", "console-getty.service",
    "networking.service", "network.service", "ifup@*.service", "ifupdown*.service",
    "NetworkManager*.service", "wpa_supplicant*.service",
    "kubelet.service",
    "containerd.service", "containerd.socket", "docker.service", "docker.socket",
    "crio.service", "cri-docker.service", "cri-docker.socket",
    "amazon-ssm-agent.service", "snap.amazon-ssm-agent.*",
    "nvidia-fabricmanager.service", "nvidia-persistenced.service",
    "init.scope", "-.slice", "-.mount",
)  # fmt: skip

# Environment variable names (what systemd accepts in Environment= and a shell can export).
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A drop-in file name: a plain file name ending in .conf, no path, not hidden, not an option.
_DROP_IN_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]*\.conf")
_NEWLINES = "\n\r\x85\u2028\u2029"
DIGEST_HEX = 12


class UnitNameError(ValueError):
    """A unit name systemd would reject (or that smuggles shell metacharacters or an option)."""


class DropInError(ValueError):
    """An Environment= name, value or drop-in that fleetops will not write or cannot read."""


# ------------------------------------------------------------------------------------- unit names


def normalize_unit_name(name):
    """Return a valid full unit name or raise UnitNameError.

    The one rule (systemctl's own): a name whose last dot-separated part is not a unit type gets
    ``.service`` (``ecs`` -> ``ecs.service``, ``dbus-org.freedesktop.login1`` ->
    ``dbus-org.freedesktop.login1.service``).
    """
    if not isinstance(name, str) or not name:
        raise UnitNameError("unit name is empty")
    if name.startswith("-"):
        raise UnitNameError("%r starts with '-' (it would read as an option)" % name)
    if unit_type(name) is None:
        name = name + ".service"
    if len(name) > UNIT_NAME_MAX:
        raise UnitNameError("unit name longer than %d characters" % UNIT_NAME_MAX)
    if not _UNIT_NAME_RE.fullmatch(name):
        raise UnitNameError(
            "%r is not a valid systemd unit name (allowed: letters, digits, ':', '_', '.', '\\', '-', one '@')"
            % name
        )
    return name


def unit_type(name):
    """``service`` for ``a.service``; None when the name has no known unit-type suffix."""
    base, dot, suffix = name.rpartition(".")
    if not dot or not base or suffix not in UNIT_TYPES:
        return None
    return suffix


def validate_unit_patterns(patterns, option="protected"):
    """The first problem with a list of unit-name globs, or None."""
    for pattern in patterns or ():
        if not isinstance(pattern, str) or not _UNIT_PATTERN_RE.fullmatch(pattern) or pattern.startswith("-"):
            return (
                "%s entry %r is not a unit-name pattern (letters, digits, ':', '_', '.', '\\', '-', '@' and the "
                "globs '*', '?', '[...]'; not starting with '-')" % (option, pattern)
            )
    return None


# docker's own rule for container names ([a-zA-Z0-9][a-zA-Z0-9_.-]+), which also keeps options out.
_CONTAINER_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def validate_container_names(names):
    """The first problem with a list of docker container names, or None."""
    for name in names or ():
        if not isinstance(name, str) or not _CONTAINER_NAME_RE.fullmatch(name):
            return "%r is not a valid container name" % (name,)
    return None


def protected_match(names, extra=()):
    """``(name, pattern)`` for the first of ``names`` a protected pattern matches, or None.

    ``names``: one name or every name of a unit (its Id, its Names, the name asked for). ``extra``:
    more globs; one without a unit type also matches ``NAME.service``.
    """
    if isinstance(names, str):
        names = [names]
    patterns = list(PROTECTED_PATTERNS)
    for entry in extra or ():
        patterns.extend((entry, entry + ".service"))
    for name in names:
        for pattern in patterns:
            if fnmatch.fnmatchcase(name, pattern):
                return name, pattern
    return None


def is_protected(names, extra=()):
    """True when any of ``names`` (a name or a unit's names) is protected."""
    return protected_match(names, extra) is not None


def unit_identity(props, requested):
    """``{"id", "names"}`` of the unit systemd resolved ``requested`` to (a ``systemctl show`` block).

    ``names`` holds the Id, every name in ``Names=`` and the name asked for, in that order, once each:
    protection is checked against all of them.
    """
    unit_id = props.get("Id") or requested
    names = [unit_id] + parse_words(props.get("Names", "")) + [requested]
    return {"id": unit_id, "names": list(dict.fromkeys(n for n in names if n))}


# ------------------------------------------------------------------------------------- systemctl show


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


def _unescape(ch):
    return {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'"}.get(ch, ch)


def parse_words(value):
    """The words of a ``systemctl show`` list value (``Names=``, ``Environment=``).

    systemctl separates words with spaces and quotes those that need it (``"a b"``), with C escapes
    inside the quotes (``Names="system-serial\\\\x2dgetty.slice"``).
    """
    words = []
    i, n = 0, len(value)
    while i < n:
        while i < n and value[i] in " \t":
            i += 1
        if i >= n:
            break
        word = []
        quote = None
        while i < n:
            ch = value[i]
            if quote:
                if ch == "\\" and i + 1 < n:
                    word.append(_unescape(value[i + 1]))
                    i += 2
                    continue
                if ch == quote:
                    quote = None
                    i += 1
                    continue
                word.append(ch)
            elif ch in "\"'":
                quote = ch
            elif ch in " \t":
                break
            elif ch == "\\" and i + 1 < n:
                word.append(value[i + 1])
                i += 1
            else:
                word.append(ch)
            i += 1
        words.append("".join(word))
    return words


def parse_environment(value):
    """{NAME: value} from an ``Environment=`` value (``systemctl show`` or a unit file's line).

    A word without ``NAME=`` continues the previous value.
    """
    return environment_from_words(parse_words(value))


def environment_from_words(words):
    """{NAME: value} from the words of an ``Environment=`` (parse_words', or the strings systemd's D-Bus
    property holds, one ``NAME=value`` each); a word without ``NAME=`` continues the previous value."""
    env = {}
    last = None
    for word in words:
        name, sep, val = word.partition("=")
        if sep and _ENV_NAME_RE.fullmatch(name):
            env[name] = val
            last = name
        elif last is not None:
            env[last] += " " + word
    return env


def is_systemd_host(run_dir="/run/systemd/system"):
    """sd_booted(): systemd is PID 1 when /run/systemd/system exists."""
    return os.path.isdir(run_dir)


# ------------------------------------------------------------------------------------- Environment= drop-ins


def digest_value(value):
    """What results and diffs show instead of a value: ``sha256:`` and the first hex digits."""
    # imported here: hashlib (OpenSSL) costs every host ~2 ms to import, and most scans digest nothing
    from hashlib import sha256

    return "sha256:" + sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:DIGEST_HEX]


def check_drop_in_name(name):
    """Raise DropInError unless ``name`` is a plain drop-in file name ending in ``.conf``."""
    if not isinstance(name, str) or not _DROP_IN_NAME_RE.fullmatch(name):
        raise DropInError("drop_in %r must be a plain file name ending in .conf" % (name,))


def validate_env(env):
    """{name: str value} from an ``env`` mapping, or DropInError naming the first bad entry.

    The error never contains a value (values may be secrets).
    """
    result = {}
    for name, value in (env or {}).items():
        if not isinstance(name, str) or not _ENV_NAME_RE.fullmatch(name):
            raise DropInError(
                "%r is not a valid variable name (letters, digits, '_'; not starting with a digit)" % (name,)
            )
        if isinstance(value, bool) or value is None or isinstance(value, (dict, list)):
            raise DropInError(
                "the value of %s must be a string, got %s (quote it)" % (name, type(value).__name__)
            )
        value = str(value)
        for ch in value:
            if ch in _NEWLINES:
                raise DropInError("the value of %s contains a newline" % name)
            if ch == "\0":
                raise DropInError("the value of %s contains a NUL character" % name)
            if unicodedata.category(ch) in ("Cc", "Cs"):
                raise DropInError("the value of %s contains the control character %r" % (name, ch))
        result[name] = value
    return result


def quote_assignment(name, value):
    """One ``Environment=`` line systemd reads back as exactly NAME=value.

    Inside double quotes systemd C-unescapes (so ``\\`` and ``"`` are escaped) after expanding
    specifiers (so ``%`` is doubled). ``$`` means nothing in Environment=.
    """
    text = "%s=%s" % (name, value)
    text = text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return 'Environment="%s"\n' % text


def render_env_drop_in(env, header):
    """The drop-in text for {name: value} under ``header`` (an empty dict gives no file: None)."""
    if not env:
        return None
    return header + "[Service]\n" + "".join(quote_assignment(k, v) for k, v in env.items())


def _quotes_balanced(text):
    quote = None
    escaped = False
    for ch in text:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif quote is None and ch in "\"'":
            quote = ch
        elif ch == quote:
            quote = None
    return quote is None and not escaped


def parse_drop_in(text):
    """``(env, other)`` of a drop-in: the Environment= variables of its ``[Service]`` section, and
    ``line N: KEY=`` or ``line N: [Section]`` for everything else it holds (other settings, other
    sections), comments, blank lines and the ``[Service]`` header aside. A malformed line raises
    DropInError (no content in the message: it may hold a secret).
    """
    env = {}
    other = []
    section = None
    for lineno, line in enumerate(text.split("\n"), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", ";")):
            continue
        if stripped.startswith("["):
            section = stripped
            if section != "[Service]":
                other.append("line %d: %s" % (lineno, section[:40]))
            continue
        key, sep, rest = stripped.partition("=")
        if not sep:
            raise DropInError("line %d: expected KEY=VALUE" % lineno)
        if section == "[Service]" and key.strip() == "Environment":
            rest = rest.strip()
            if not _quotes_balanced(rest):
                raise DropInError("line %d: unbalanced quotes" % lineno)
            env.update(parse_environment(rest.replace("%%", "%")))
        else:
            other.append("line %d: %s=" % (lineno, key.strip()[:40]))
    return env, other
