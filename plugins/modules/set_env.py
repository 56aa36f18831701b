#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: set_env
short_description: Set environment variables of a systemd service with a drop-in
version_added: "0.1.0"
description:
  - Writes the variables into a drop-in of the service,
    C(/etc/systemd/system/<unit>.d/<drop_in>), as C(Environment=) lines, atomically (a temporary
    file in the same directory, renamed over the old one; file mode 0644, directory 0755), then
    runs C(systemctl daemon-reload). This is how the UCX mmap-hook leak is fixed where a service
    starts (C(UCX_MEM_MMAP_HOOK_MODE=none)).
  - The running process keeps its old environment until the service restarts. With
    O(restart=true) the service is restarted (C(systemctl try-restart), so only when it runs) when
    the drop-in changed, or when its main process does not have the values yet. The rollout staggers
    these restarts.
  - Values are quoted and escaped for systemd (C(\\), C(") and the C(%) specifier character), so
    what the service sees is exactly the value given; C($) has no meaning in C(Environment=).
    Names must match C([A-Za-z_][A-Za-z0-9_]*); values must not contain newlines, NUL or other
    control characters (tabs included). Invalid input, invalid unit names, units that do not exist or are masked,
    and hosts without systemd are refused with no change.
  - After the daemon-reload the module checks that systemd sees the values; a drop-in that sorts
    later and sets the same variable wins, which is reported as an error.
  - Idempotent; supports check mode and diff (the drop-in before and after).
options:
  name:
    description:
      - The service. A name without a type suffix means C(.service); only services are accepted.
    type: str
    required: true
  env:
    description:
      - Variables to set, name to value. Other variables already in the drop-in stay unless
        O(exclusive=true).
      - Required with O(state=present).
    type: dict
  exclusive:
    description: Make the drop-in hold exactly O(env), removing variables it set before.
    type: bool
    default: false
  state:
    description:
      - V(present) writes the variables; V(absent) removes the drop-in (every variable it set).
    type: str
    choices: [present, absent]
    default: present
  restart:
    description:
      - Restart the service (if it runs) when the drop-in changed or its main process does not
        have the values yet.
    type: bool
    default: false
  drop_in:
    description:
      - The drop-in file name under C(/etc/systemd/system/<unit>.d/). Drop-ins apply in file-name
        order and a later one wins for the same variable.
    type: str
    default: 50-fleetops-env.conf
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
seealso:
  - name: systemd.exec Environment=
    description: Quoting, escapes and specifiers of Environment= lines.
    link: https://www.freedesktop.org/software/systemd/man/latest/systemd.exec.html#Environment=
author:
  - fleetops maintainers (@fleetops)
"""

EXAMPLES = r"""
- name: Turn UCX's mmap hooks off for the decode workers and restart them
  fleetops.node.set_env:
    name: vllm-decode.service
    env:
      UCX_MEM_MMAP_HOOK_MODE: none
    restart: true

- name: Bound the UCX registration cache instead, preview only
  fleetops.node.set_env:
    name: vllm-decode
    env:
      UCX_RCACHE_MAX_UNRELEASED: "1024"
  check_mode: true
  diff: true

- name: Remove the drop-in again
  fleetops.node.set_env:
    name: vllm-decode
    state: absent
"""

RETURN = r"""
unit:
  description: The full unit name.
  returned: always
  type: str
  sample: vllm-decode.service
path:
  description: The drop-in file.
  returned: always
  type: str
  sample: /etc/systemd/system/vllm-decode.service.d/50-fleetops-env.conf
env_before:
  description: The variables the drop-in set before.
  returned: always
  type: dict
  sample: {}
env_after:
  description: The variables the drop-in sets after (predicted in check mode).
  returned: always
  type: dict
  sample: {"UCX_MEM_MMAP_HOOK_MODE": "none"}
restarted:
  description: Whether the service was restarted (would be, in check mode).
  returned: always
  type: bool
  sample: true
main_pid:
  description: The main process of the service after the change (0 when it does not run).
  returned: always
  type: int
  sample: 4242
actions:
  description: What was done (or would be, in check mode), in order.
  returned: always
  type: list
  elements: str
  sample: ["write /etc/systemd/system/vllm-decode.service.d/50-fleetops-env.conf", "daemon-reload", "try-restart"]
"""

import os
import re
import tempfile
import time
import unicodedata

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.fleetops.node.plugins.module_utils.systemd import (
    UnitNameError,
    is_systemd_host,
    normalize_unit_name,
    parse_show,
)
from ansible_collections.fleetops.node.plugins.module_utils.ucx import parse_unit_environment

UNIT_DIR = "/etc/systemd/system"
HEADER = "# Managed by fleetops (fleetops.node.set_env). Changes made here are overwritten.\n"
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DROP_IN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]*\.conf$")
_PROPS = "Id,LoadState,ActiveState,SubState,MainPID,Environment"
_RUNNING = ("active", "activating", "reloading")


class SetEnvError(ValueError):
    pass


def validate_env(env):
    """{name: str value} from the ``env`` option, or SetEnvError naming the first bad entry."""
    result = {}
    for name, value in (env or {}).items():
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise SetEnvError("%r is not a valid variable name (letters, digits, '_'; not starting with a digit)" % (name,))
        if isinstance(value, bool) or value is None or isinstance(value, (dict, list)):
            raise SetEnvError("the value of %s must be a string, got %r (quote it)" % (name, value))
        value = str(value)
        for ch in value:
            if ch in "\n\r\x85\u2028\u2029":
                raise SetEnvError("the value of %s contains a newline" % name)
            if ch == "\0":
                raise SetEnvError("the value of %s contains a NUL character" % name)
            if unicodedata.category(ch) in ("Cc", "Cs"):
                raise SetEnvError("the value of %s contains the control character %r" % (name, ch))
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


def render(env):
    """The drop-in text for {name: value} (an empty dict gives no file: None)."""
    if not env:
        return None
    return HEADER + "[Service]\n" + "".join(quote_assignment(k, v) for k, v in env.items())


def parse_drop_in(text):
    """{name: value} of the Environment= lines of a drop-in (the inverse of render)."""
    env = {}
    section = None
    for lineno, line in enumerate(text.split("\n"), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", ";")):
            continue
        if stripped.startswith("["):
            section = stripped
            continue
        key, sep, rest = stripped.partition("=")
        if not sep:
            raise SetEnvError("line %d: expected KEY=VALUE, got %r" % (lineno, stripped[:80]))
        if section == "[Service]" and key.strip() == "Environment":
            rest = rest.strip()
            if not _quotes_balanced(rest):
                raise SetEnvError("line %d: unbalanced quotes" % lineno)
            env.update(parse_unit_environment(rest.replace("%%", "%")))
    return env


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


def write_atomic(path, text):
    """Write ``text`` to ``path`` via a temporary file in the same directory and a rename (0644)."""
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o755)
        os.chmod(directory, 0o755)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), 0o644)
            os.fsync(handle.fileno())
        os.rename(tmp, path)
    except Exception:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _read_environ(pid):
    if not pid:
        return None
    try:
        with open("/proc/%d/environ" % pid, "rb") as handle:
            data = handle.read()
    except (IOError, OSError):
        return None
    env = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def _main_pid(props):
    value = props.get("MainPID", "0")
    return int(value) if value.isdigit() else 0


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            env=dict(type="dict"),
            exclusive=dict(type="bool", default=False),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            restart=dict(type="bool", default=False),
            drop_in=dict(type="str", default="50-fleetops-env.conf"),
        ),
        required_if=[("state", "present", ["env"])],
        supports_check_mode=True,
    )
    params = module.params
    try:
        unit = normalize_unit_name(params["name"])
    except UnitNameError as exc:
        module.fail_json(msg="Failed to set the environment of a unit: %s" % exc)
    if not unit.endswith(".service"):
        module.fail_json(msg="Failed to set the environment of %s: only services take Environment= drop-ins" % unit)
    if not _DROP_IN_RE.match(params["drop_in"]):
        module.fail_json(
            msg="Failed to set the environment of %s: drop_in %r must be a plain file name ending in .conf"
            % (unit, params["drop_in"])
        )
    try:
        env = validate_env(params["env"])
    except SetEnvError as exc:
        module.fail_json(msg="Failed to set the environment of %s: %s" % (unit, exc), unit=unit)
    if params["state"] == "present" and not env:
        module.fail_json(msg="Failed to set the environment of %s: env is empty" % unit, unit=unit)
    if not is_systemd_host():
        module.fail_json(msg="Failed to set the environment of %s: this host is not running systemd" % unit, unit=unit)
    systemctl = module.get_bin_path("systemctl", required=True)

    def show():
        rc, out, err = module.run_command([systemctl, "show", "-p", _PROPS, "--", unit])
        if rc != 0:
            module.fail_json(msg="Failed to read unit %s: %s" % (unit, (err or out).strip()), unit=unit)
        try:
            blocks = parse_show(out)
        except ValueError as exc:
            module.fail_json(msg="Failed to parse systemctl show for %s: %s" % (unit, exc), unit=unit)
        return blocks[0] if blocks else {}

    props = show()
    if props.get("LoadState") == "not-found":
        module.fail_json(msg="Failed to set the environment of %s: no such unit on this host" % unit, unit=unit)
    if props.get("LoadState") == "masked":
        module.fail_json(msg="Failed to set the environment of %s: the unit is masked" % unit, unit=unit)

    path = os.path.join(UNIT_DIR, unit + ".d", params["drop_in"])
    before_text = None
    if os.path.exists(path):
        try:
            with open(path) as handle:
                before_text = handle.read()
        except (IOError, OSError) as exc:
            module.fail_json(msg="Failed to read drop-in %s: %s" % (path, exc), unit=unit)
    try:
        env_before = parse_drop_in(before_text) if before_text is not None else {}
    except SetEnvError as exc:
        module.fail_json(
            msg="Failed to parse drop-in %s: %s (fix or remove it, or choose another drop_in)" % (path, exc), unit=unit
        )
    if params["state"] == "absent":
        env_after = {}
    elif params["exclusive"]:
        env_after = dict(env)
    else:
        env_after = dict(env_before)
        env_after.update(env)
    after_text = render(env_after)
    mode_wrong = before_text is not None and after_text is not None and (os.stat(path).st_mode & 0o7777) != 0o644
    file_changed = before_text != after_text or mode_wrong

    running = props.get("ActiveState") in _RUNNING
    pid = _main_pid(props)
    proc_env = _read_environ(pid) if running else None
    removed = [k for k in env_before if k not in env_after]
    stale = proc_env is not None and (
        any(proc_env.get(k) != v for k, v in env_after.items()) or any(k in proc_env for k in removed)
    )
    restart = bool(params["restart"] and running and (file_changed or stale))

    actions = []
    if file_changed:
        actions.append(("write %s" % path) if after_text is not None else ("remove %s" % path))
        actions.append("daemon-reload")
    if restart:
        actions.append("try-restart")
    changed = bool(actions)
    result = dict(
        changed=changed, unit=unit, path=path, env_before=env_before, env_after=env_after,
        restarted=restart, main_pid=pid, actions=actions,
    )
    if module._diff:
        result["diff"] = dict(
            before=before_text or "",
            after=after_text or "",
            before_header="%s (before)" % path,
            after_header="%s (after)" % path,
        )
    if not changed or module.check_mode:
        module.exit_json(**result)

    if file_changed:
        try:
            if after_text is None:
                os.unlink(path)
            else:
                write_atomic(path, after_text)
        except (IOError, OSError) as exc:
            module.fail_json(msg="Failed to write drop-in %s: %s" % (path, exc), **result)
        rc, out, err = module.run_command([systemctl, "daemon-reload"])
        if rc != 0:
            module.fail_json(msg="Failed to reload systemd after writing %s: %s" % (path, (err or out).strip()), **result)
    props = show()
    seen = parse_unit_environment(props.get("Environment", ""))
    overridden = ["%s=%s" % (k, seen.get(k)) for k, v in env_after.items() if seen.get(k) != v]
    if overridden:
        module.fail_json(
            msg="Failed to set the environment of %s: systemd sees %s after the reload (a drop-in sorting after %s "
            "sets it too; nothing was restarted)" % (unit, ", ".join(overridden), params["drop_in"]),
            **result
        )
    if restart:
        rc, out, err = module.run_command([systemctl, "try-restart", "--", unit])
        if rc != 0:
            module.fail_json(msg="Failed to restart %s: %s" % (unit, (err or out).strip()), **result)
        # The new main process must have the values (EnvironmentFile= would override Environment=).
        deadline = time.time() + 10
        while True:
            props = show()
            pid = _main_pid(props)
            proc_env = _read_environ(pid)
            if proc_env is not None or time.time() > deadline:
                break
            time.sleep(0.2)
        result["main_pid"] = pid
        wrong = [
            "%s=%s" % (k, proc_env.get(k)) for k, v in env_after.items() if proc_env is not None and proc_env.get(k) != v
        ]
        if wrong:
            module.fail_json(
                msg="Failed to set the environment of %s: after the restart its main process %d has %s "
                "(an EnvironmentFile= or the start command overrides it)" % (unit, pid, ", ".join(wrong)),
                **result
            )
    else:
        result["main_pid"] = _main_pid(props)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
