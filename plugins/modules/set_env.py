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
    C(/etc/systemd/system/<unit>.d/<drop_in>), as C(Environment=) lines, atomically, the way
    ansible's own modules write files (a temporary file in the module's temporary directory, created
    exclusively and fsynced, moved over the old one with C(AnsibleModule.atomic_move), which keeps the
    SELinux context and attributes of the file it replaces; file mode 0644, directory 0755), then runs
    C(systemctl daemon-reload). This is how the UCX mmap-hook leak is fixed where a service starts
    (C(UCX_MEM_MMAP_HOOK_MODE=none)).
  - The name is resolved the way systemd resolves it (one C(systemctl show) call); the drop-in goes to
    the unit's own name (its C(Id)), so an alias writes where the unit reads.
  - The running process keeps its old environment until the service restarts. With
    O(restart=true) the service is restarted (C(systemctl try-restart), so only when it runs) when
    the drop-in changed, or when its main process does not have the values yet. The rollout staggers
    these restarts.
  - Values are quoted and escaped for systemd (C(\\), C(") and the C(%) specifier character), so
    what the service sees is exactly the value given; C($) has no meaning in C(Environment=).
    Names must match C([A-Za-z_][A-Za-z0-9_]*) (the whole name, so a trailing newline is refused); values must
    not contain newlines, NUL or other control characters (tabs included). Invalid input, invalid unit
    names, units that are not services, units that do not exist or are masked, and hosts without systemd
    are refused with no change.
  - Values may be secrets. O(env) is C(no_log), and results, diffs and messages show each value as a digest
    (C(sha256:) and the first 12 hex digits of its SHA-256) unless O(show_values=true); the names of the
    variables that change are always returned (RV(changed_vars), RV(removed_vars)).
  - A drop-in that fleetops did not write (no fleetops header, for example C(override.conf) from
    C(systemctl edit)) is only rewritten or removed when it holds nothing but C(Environment=) lines
    (comments, blank lines and the C([Service]) header aside); otherwise the module refuses, so that its
    other settings (C(ExecStart=), limits) are not lost. A drop-in that is a symbolic link is refused.
  - After the daemon-reload the module checks that systemd sees the values; a drop-in that sorts
    later and sets the same variable wins, which is reported as an error.
  - Idempotent; supports check mode and diff (the drop-in before and after, values digested unless
    O(show_values=true)).
options:
  name:
    description:
      - The service. A name whose last dot-separated part is not a unit type gets C(.service) (as with
        C(systemctl)); only services are accepted. Names starting with C(-) are refused.
    type: str
    required: true
  env:
    description:
      - Variables to set, name to value. Other variables already in the drop-in stay unless
        O(exclusive=true).
      - Required with O(state=present).
      - The values are not logged (C(no_log)); see O(show_values).
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
  show_values:
    description:
      - Show the values in the result, the diff and messages instead of their digests. Only for values
        that are not secret.
    type: bool
    default: false
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
    show_values: true  # not a secret

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
  description: The service, as systemd resolved the name (its C(Id)).
  returned: always
  type: str
  sample: vllm-decode.service
requested:
  description: The name asked for, normalised (C(.service) added where it had no unit type).
  returned: always
  type: str
  sample: vllm-decode.service
names:
  description: Every name of the unit (its C(Id), its aliases, the name asked for).
  returned: always
  type: list
  elements: str
  sample: ["vllm-decode.service"]
path:
  description: The drop-in file.
  returned: success
  type: str
  sample: /etc/systemd/system/vllm-decode.service.d/50-fleetops-env.conf
env_before:
  description: The variables the drop-in set before; values digested unless O(show_values=true).
  returned: success
  type: dict
  sample: {}
env_after:
  description: The variables the drop-in sets after (predicted in check mode); values digested unless
    O(show_values=true).
  returned: success
  type: dict
  sample: {"UCX_MEM_MMAP_HOOK_MODE": "sha256:0b3b2b5e6a0b"}
changed_vars:
  description: The names of the variables the drop-in sets with a new value or newly (would, in check mode).
  returned: success
  type: list
  elements: str
  sample: ["UCX_MEM_MMAP_HOOK_MODE"]
removed_vars:
  description: The names of the variables the drop-in no longer sets.
  returned: success
  type: list
  elements: str
  sample: []
values_shown:
  description: Whether values are shown as given (O(show_values=true)) rather than digested.
  returned: always
  type: bool
  sample: false
restarted:
  description: Whether the service was restarted (would be, in check mode).
  returned: success
  type: bool
  sample: true
main_pid:
  description: The main process of the service after the change (0 when it does not run).
  returned: success
  type: int
  sample: 4242
actions:
  description: What was done (or would be, in check mode), in order.
  returned: success
  type: list
  elements: str
  sample: ["write /etc/systemd/system/vllm-decode.service.d/50-fleetops-env.conf", "daemon-reload", "try-restart"]
"""

import os
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.fleetops.node.plugins.module_utils.systemd import (
    DropInError,
    UnitNameError,
    check_drop_in_name,
    digest_value,
    is_systemd_host,
    normalize_unit_name,
    parse_drop_in,
    parse_environment,
    parse_show,
    render_env_drop_in,
    unit_identity,
    unit_type,
    validate_env,
)

UNIT_DIR = "/etc/systemd/system"
HEADER = "# Managed by fleetops (fleetops.node.set_env). Changes made here are overwritten.\n"
_PROPS = "Id,Names,LoadState,ActiveState,SubState,MainPID,Environment"
_RUNNING = ("active", "activating", "reloading")


class SetEnvError(Exception):
    """A refusal or a failure: ``msg`` is the one-line message, ``result`` what goes with it."""

    def __init__(self, msg, **result):
        super(SetEnvError, self).__init__(msg)
        self.result = result


def _read_environ(proc, pid):
    if not pid:
        return None
    try:
        with open("%s/%d/environ" % (proc, pid), "rb") as handle:
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


def write_file(module, path, text, mode=0o644, dir_mode=0o755):
    """Write ``text`` to ``path`` as ansible's own modules write files (lineinfile, ansible.posix's).

    The text goes to a temporary file in ``module.tmpdir`` (``tempfile.mkstemp``: created exclusively,
    never through a link), fsynced, then ``module.atomic_move`` renames it over ``path`` (across
    filesystems it copies it next to ``path`` first), keeping the SELinux context, owner and
    attributes of the file it replaces (the default context for a new file). ``atomic_move`` follows
    a link at ``path``: callers refuse links before calling this. It also gives the file the old
    one's mode (a new one 0666 & ~umask), so ``mode`` is set afterwards on the file itself, opened
    without following a link; then the file and the directory are fsynced. A missing directory is
    created with ``dir_mode``. Raises OSError, or what ``atomic_move`` raises.
    """
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        os.makedirs(directory, dir_mode)
        os.chmod(directory, dir_mode)
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), suffix=".tmp", dir=module.tmpdir)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode("utf-8"))
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        module.atomic_move(tmp, path)
    finally:
        module.cleanup(tmp)  # renamed away, unless the move failed
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class EnvDropIn:
    """The Environment= drop-in of one service: ``decide()`` reads (one ``systemctl show``, the drop-in,
    the main process's environ) and refuses or plans; ``act()`` writes, reloads, checks and restarts.
    ``run(argv) -> (rc, stdout, stderr)`` runs commands; ``write(path, text)`` writes the drop-in
    (``write_file`` with the module)."""

    def __init__(
        self, run, write, params, systemctl="systemctl", booted=True, unit_dir=UNIT_DIR, proc="/proc"
    ):
        self.run = run
        self.write = write
        self.params = params
        self.systemctl = systemctl
        self.booted = booted
        self.unit_dir = unit_dir
        self.proc = proc
        self.show_values = bool(params.get("show_values"))
        self.unit = None
        self.result = dict(values_shown=self.show_values)

    def shown(self, value):
        """A value as results, diffs and messages show it."""
        return value if self.show_values else digest_value(value)

    def _shown_env(self, env):
        return dict((k, self.shown(v)) for k, v in env.items())

    def _fail(self, why, **extra):
        raise SetEnvError(
            "Failed to set the environment of %s: %s" % (self.unit or "a unit", why),
            **dict(self.result, **extra),
        )

    def _show(self):
        rc, out, err = self.run([self.systemctl, "show", "-p", _PROPS, "--", self.unit])
        if rc != 0:
            raise SetEnvError("Failed to read unit %s: %s" % (self.unit, (err or out).strip()), **self.result)
        try:
            blocks = parse_show(out)
        except ValueError as exc:
            raise SetEnvError("Failed to parse systemctl show for %s: %s" % (self.unit, exc), **self.result)
        return blocks[0] if blocks else {}

    def _refuse_links(self):
        """Neither the drop-in nor its directory may be a link (``atomic_move`` follows one)."""
        for link in (os.path.dirname(self.path), self.path):
            if os.path.islink(link):
                self._fail("%s is a symbolic link; fleetops does not write through or over links" % link)

    # ---------------------------------------------------------------------------------- decide

    def decide(self):
        params = self.params
        try:
            requested = normalize_unit_name(params["name"])
        except UnitNameError as exc:
            self._fail(str(exc))
        self.unit = requested
        self.result.update(unit=requested, requested=requested, names=[requested])
        if unit_type(requested) != "service":
            self._fail("only services take Environment= drop-ins")
        try:
            check_drop_in_name(params["drop_in"])
            env = validate_env(params["env"])
        except DropInError as exc:
            self._fail(str(exc))
        if params["state"] == "present" and not env:
            self._fail("env is empty")
        if not self.booted:
            self._fail("this host is not running systemd")

        props = self._show()
        identity = unit_identity(props, requested)
        self.unit = identity["id"]
        self.result.update(unit=self.unit, names=identity["names"])
        if unit_type(self.unit) != "service":
            self._fail("it resolves to %s; only services take Environment= drop-ins" % self.unit)
        if props.get("LoadState") == "not-found":
            self._fail("no such unit on this host")
        if props.get("LoadState") == "masked":
            self._fail("the unit is masked")

        directory = os.path.join(self.unit_dir, self.unit + ".d")
        path = os.path.join(directory, params["drop_in"])
        self.path = path
        self.result["path"] = path
        self._refuse_links()
        before_text = None
        if os.path.lexists(path):
            try:
                with open(path) as handle:
                    before_text = handle.read()
            except (IOError, OSError) as exc:
                raise SetEnvError("Failed to read drop-in %s: %s" % (path, exc), **self.result)
        env_before, other = {}, []
        if before_text is not None:
            try:
                env_before, other = parse_drop_in(before_text)
            except DropInError as exc:
                raise SetEnvError(
                    "Failed to parse drop-in %s: %s (fix or remove it, or choose another drop_in)"
                    % (path, exc),
                    **self.result,
                )
        if other and not before_text.startswith(HEADER):
            self._fail(
                "%s was not written by fleetops and holds more than Environment= lines (%s); it is left as it "
                "is: choose another drop_in"
                % (path, ", ".join(other[:3]) + (", ..." if len(other) > 3 else ""))
            )

        if params["state"] == "absent":
            env_after = {}
        elif params["exclusive"]:
            env_after = dict(env)
        else:
            env_after = dict(env_before)
            env_after.update(env)
        after_text = render_env_drop_in(env_after, HEADER)
        mode_wrong = (
            before_text is not None and after_text is not None and (os.lstat(path).st_mode & 0o7777) != 0o644
        )
        file_changed = before_text != after_text or mode_wrong

        running = props.get("ActiveState") in _RUNNING
        pid = _main_pid(props)
        proc_env = _read_environ(self.proc, pid) if running else None
        removed = sorted(k for k in env_before if k not in env_after)
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
        self.env_after, self.after_text = env_after, after_text
        self.before_text, self.env_before = before_text, env_before
        self.result.update(
            changed=bool(actions),
            env_before=self._shown_env(env_before),
            env_after=self._shown_env(env_after),
            changed_vars=sorted(k for k, v in env_after.items() if env_before.get(k) != v),
            removed_vars=removed,
            restarted=restart,
            main_pid=pid,
            actions=actions,
        )
        return self.result

    def diff(self):
        if self.show_values:
            before, after = self.before_text or "", self.after_text or ""
        else:
            before = render_env_drop_in(self._shown_env(self.env_before), HEADER) or ""
            if self.before_text is not None and not before:
                before = "(no Environment= lines)\n"
            after = render_env_drop_in(self._shown_env(self.env_after), HEADER) or ""
        return dict(
            before=before,
            after=after,
            before_header="%s (before)" % self.path,
            after_header="%s (after)" % self.path,
        )

    # ---------------------------------------------------------------------------------- act

    def _check_seen(self, seen, where):
        wrong = ["%s=%s" % (k, self.shown(seen[k]) if k in seen else "(unset)") for k, v in self.env_after.items()
                 if seen.get(k) != v]  # fmt: skip
        if wrong:
            self._fail("%s %s" % (where, ", ".join(wrong)))

    def act(self):
        result, path = self.result, self.path
        if "daemon-reload" in result["actions"]:
            self._refuse_links()  # again: one may have been planted since decide()
            try:
                if self.after_text is None:
                    os.unlink(path)
                else:
                    self.write(path, self.after_text)
            except Exception as exc:  # OSError, or atomic_move's Exception (its cause the OSError)
                why = str(exc)
                if not isinstance(exc, OSError) and exc.__cause__ is not None:
                    why = "%s (%s)" % (why, exc.__cause__)
                raise SetEnvError("Failed to write drop-in %s: %s" % (path, why), **result)
            rc, out, err = self.run([self.systemctl, "daemon-reload"])
            if rc != 0:
                raise SetEnvError(
                    "Failed to reload systemd after writing %s: %s" % (path, (err or out).strip()), **result
                )
        props = self._show()
        self._check_seen(
            parse_environment(props.get("Environment", "")),
            "systemd sees, after the reload (a drop-in sorting after %s sets it too; nothing was restarted):"
            % self.params["drop_in"],
        )
        if result["restarted"]:
            rc, out, err = self.run([self.systemctl, "try-restart", "--", self.unit])
            if rc != 0:
                raise SetEnvError("Failed to restart %s: %s" % (self.unit, (err or out).strip()), **result)
            # The new main process must have the values (EnvironmentFile= would override Environment=).
            deadline = time.time() + 10
            while True:
                props = self._show()
                pid = _main_pid(props)
                proc_env = _read_environ(self.proc, pid)
                if proc_env is not None or time.time() > deadline:
                    break
                time.sleep(0.2)
            result["main_pid"] = pid
            if proc_env is not None:
                self._check_seen(
                    proc_env,
                    "after the restart its main process %d has (an EnvironmentFile= or the start command "
                    "overrides it):" % pid,
                )
        else:
            result["main_pid"] = _main_pid(props)
        return result


def _hide_values(module):
    """Take the values of ``env`` out of what ansible reports, and out of its no_log list.

    ``no_log`` on ``env`` keeps the values out of the module's log line (and the invocation). But ansible
    then also replaces every occurrence of every value, as a substring, in every string of the result
    (a value ``1`` turns ``sha256:91a1...`` into ``sha256:9********a...``, a value ``none`` hides
    ``UCX_...=none`` but also any unit named ``...none...``). The module shows values itself, digested
    unless ``show_values``, so the parameter is replaced by those digests and the values are dropped
    from the no_log list.
    """
    env = module.params.get("env")
    if not isinstance(env, dict):
        return
    show = module.params["show_values"]
    shown = {}
    for name, value in env.items():
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            module.no_log_values.discard(str(value))
            shown[name] = str(value) if show else digest_value(str(value))
        else:
            shown[name] = "(not a string)"
    module.params["env"] = shown


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            env=dict(type="dict", no_log=True),
            exclusive=dict(type="bool", default=False),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            restart=dict(type="bool", default=False),
            drop_in=dict(type="str", default="50-fleetops-env.conf"),
            show_values=dict(type="bool", default=False),
        ),
        required_if=[("state", "present", ["env"])],
        supports_check_mode=True,
    )
    params = dict(module.params)
    _hide_values(module)
    booted = is_systemd_host()
    drop_in = EnvDropIn(
        module.run_command,
        lambda path, text: write_file(module, path, text),
        params,
        systemctl=module.get_bin_path("systemctl", required=booted) or "systemctl",
        booted=booted,
    )
    try:
        result = drop_in.decide()
        if module._diff:
            result["diff"] = drop_in.diff()
        if result["changed"] and not module.check_mode:
            drop_in.act()
    except SetEnvError as exc:
        module.fail_json(msg=str(exc), **exc.result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
