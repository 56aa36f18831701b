#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: disable_unit
short_description: Stop, disable and mask a systemd unit so it stays off across reboots
version_added: "0.1.0"
description:
  - Turns off a unit that a base image enabled and that crash-loops (the Pinterest C(ecs.service) case).
    It stops it, disables it, masks it so nothing can start it again, resets its failed state, and removes
    the leftover container it owned when docker is present.
  - The name is first resolved the way systemd resolves it (one C(systemctl show -p Id,Names,...) call); an
    alias such as C(dbus-org.freedesktop.login1) is the unit C(systemd-logind.service). Every check and every
    action applies to that unit (its C(Id)), and protection is checked against every name it has.
  - Only C(.service), C(.socket), C(.timer) and C(.path) units can be turned off; targets, slices, scopes,
    mounts, swaps and devices are refused, even with O(allow_protected=true).
  - Protected units are refused unless O(allow_protected=true) (the only override) - C(ssh)/C(sshd) and their
    C(@) instances, C(systemd-*), dbus and its C(dbus-org.freedesktop.*) activation aliases, udev, the
    gettys, C(networking), C(ifup@*), NetworkManager, kubelet, containerd, docker and cri-o with their
    sockets, C(amazon-ssm-agent), C(nvidia-fabricmanager), C(nvidia-persistenced), and O(protected).
  - A refusal is a failure with a one-line message and changes nothing on the host (nothing is stopped).
  - A unit whose file lives in C(/etc/systemd/system) cannot be masked in place (the mask is a symlink
    at that path); the file is then moved to O(backup_dir) first, so the change can be undone.
  - Idempotent; supports check mode and diff.
options:
  name:
    description:
      - The unit. A name whose last dot-separated part is not a unit type gets C(.service) (as with
        C(systemctl)).
      - Must be a valid systemd unit name not starting with C(-); anything else (for example shell
        metacharacters) is refused.
    type: str
    required: true
  containers:
    description:
      - Docker containers the unit ran, removed (C(docker rm -f)) when docker is present.
      - Hosts without docker ignore this option. Names must be valid container names.
    type: list
    elements: str
    default: []
  protected:
    description:
      - More unit names or shell-style patterns to refuse, on top of the built-in list. A name without a
        unit type also matches C(NAME.service).
    type: list
    elements: str
    default: []
  allow_protected:
    description:
      - Override the protected-unit refusal. Only for an operator who knows the unit is the culprit.
      - It does not allow unit types other than service, socket, timer and path.
    type: bool
    default: false
  backup_dir:
    description: Where a unit file from C(/etc/systemd/system) is moved before the unit is masked.
    type: path
    default: /var/lib/fleetops/disabled-units
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
author:
  - fleetops maintainers (@fleetops)
"""

EXAMPLES = r"""
- name: Turn off the ECS agent a base image enabled on a fleet that does not use ECS
  fleetops.node.disable_unit:
    name: ecs.service
    containers: [ecs-agent]

- name: Preview the change only
  fleetops.node.disable_unit:
    name: ecs
  check_mode: true
  diff: true

- name: Refuse more units than the built-in list on this fleet
  fleetops.node.disable_unit:
    name: ecs
    protected: [vllm-*, ray-head]
"""

RETURN = r"""
unit:
  description: The unit acted on, as systemd resolved the name (its C(Id)).
  returned: always
  type: str
  sample: ecs.service
requested:
  description: The name asked for, normalised (C(.service) added where it had no unit type).
  returned: always
  type: str
  sample: ecs.service
names:
  description: Every name of the unit (its C(Id), its aliases from C(Names), the name asked for); protection is
    checked against all of them. Returned on refusals too, once the name was resolved.
  returned: always
  type: list
  elements: str
  sample: ["systemd-logind.service", "dbus-org.freedesktop.login1.service"]
refusal:
  description: Why the module refused (on failure only); C(invalid), C(type), C(protected) or C(not-found).
  returned: failure
  type: str
  sample: protected
before:
  description: The unit's state before the change.
  returned: success
  type: dict
  sample: {"active_state": "activating", "sub_state": "auto-restart", "unit_file_state": "enabled", "n_restarts": 412}
after:
  description: The unit's state after the change (predicted in check mode).
  returned: success
  type: dict
  sample: {"active_state": "inactive", "sub_state": "dead", "unit_file_state": "masked", "n_restarts": 0}
actions:
  description: What was done (or would be, in check mode), in order.
  returned: success
  type: list
  elements: str
  sample: ["stop", "reset-failed", "disable", "mask", "docker rm -f ecs-agent"]
"""

import os
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.fleetops.node.plugins.module_utils.systemd import (
    DISABLEABLE_TYPES,
    UnitNameError,
    is_systemd_host,
    normalize_unit_name,
    parse_show,
    protected_match,
    unit_identity,
    unit_type,
    validate_container_names,
    validate_unit_patterns,
)

_PROPS = "Id,Names,LoadState,ActiveState,SubState,UnitFileState,FragmentPath,NRestarts"


class DisableUnitError(Exception):
    """A refusal or a failure: ``msg`` is the one-line message, ``result`` what goes with it."""

    def __init__(self, msg, **result):
        super(DisableUnitError, self).__init__(msg)
        self.result = result


def _state(props):
    return {
        "load_state": props.get("LoadState", ""),
        "active_state": props.get("ActiveState", ""),
        "sub_state": props.get("SubState", ""),
        "unit_file_state": props.get("UnitFileState", ""),
        "fragment_path": props.get("FragmentPath", ""),
        "n_restarts": int(props["NRestarts"]) if props.get("NRestarts", "").isdigit() else None,
    }


def _state_text(state):
    return (
        "active_state=%(active_state)s\nsub_state=%(sub_state)s\nunit_file_state=%(unit_file_state)s\n"
        % state
    )


class UnitDisabler:
    """Turn one unit off: ``decide()`` reads (one ``systemctl show``, ``docker inspect``) and refuses or
    plans; ``act()`` carries the plan out. ``run(argv) -> (rc, stdout, stderr)`` runs commands."""

    def __init__(self, run, params, systemctl="systemctl", docker=None, booted=True):
        self.run = run
        self.params = params
        self.systemctl = systemctl
        self.docker = docker
        self.booted = booted
        self.unit = None
        self.result = {}

    # ---------------------------------------------------------------------------------- decide

    def _refuse(self, why, refusal, **extra):
        what = self.unit or self.result.get("requested") or "unit"
        raise DisableUnitError(
            "Failed to disable %s: %s" % (what, why), refusal=refusal, **dict(self.result, **extra)
        )

    def _show(self, unit):
        rc, out, err = self.run([self.systemctl, "show", "-p", _PROPS, "--", unit])
        if rc != 0:
            raise DisableUnitError("Failed to read unit %s: %s" % (unit, (err or out).strip()), **self.result)
        try:
            blocks = parse_show(out)
        except ValueError as exc:
            raise DisableUnitError("Failed to parse systemctl show for %s: %s" % (unit, exc), **self.result)
        return blocks[0] if blocks else {}

    def decide(self):
        params = self.params
        try:
            requested = normalize_unit_name(params["name"])
        except UnitNameError as exc:
            raise DisableUnitError("Failed to disable unit: %s" % exc, refusal="invalid")
        self.result = dict(unit=requested, requested=requested, names=[requested])
        problem = validate_unit_patterns(params["protected"])
        if problem:
            self._refuse(problem, "invalid")
        problem = validate_container_names(params["containers"])
        if problem:
            self._refuse(problem, "invalid")
        if not self.booted:
            raise DisableUnitError(
                "Failed to disable %s: this host is not running systemd" % requested, **self.result
            )

        # Who is this, really? Every check below is about the unit systemd would act on.
        props = self._show(requested)
        identity = unit_identity(props, requested)
        self.unit = identity["id"]
        self.result.update(unit=self.unit, names=identity["names"])
        kind = unit_type(self.unit)
        if kind not in DISABLEABLE_TYPES:
            self._refuse(
                "it is a %s unit; only %s units can be disabled"
                % (kind or "unknown", ", ".join(DISABLEABLE_TYPES)),
                "type",
            )
        match = protected_match(identity["names"], params["protected"])
        if match and not params["allow_protected"]:
            name, pattern = match
            alias = "" if name == self.unit else " (as %s)" % name
            self._refuse(
                "it is protected%s by %r (the way in, the bus, the network, systemd, the consoles or the node's "
                "agents and runtime); set allow_protected=true only if you are sure" % (alias, pattern),
                "protected",
            )
        before = _state(props)
        if before["load_state"] == "not-found" and before["unit_file_state"] != "masked":
            self._refuse("no such unit on this host", "not-found", before=before)

        containers = self._containers_present() if self.docker else []
        actions = []
        if before["active_state"] not in ("inactive", "failed") or before["sub_state"] == "auto-restart":
            actions.append("stop")
        # reset-failed while the unit is still loaded: a masked, stopped unit is unloaded right away.
        if before["active_state"] == "failed" or before["n_restarts"]:
            actions.append("reset-failed")
        if before["unit_file_state"] not in ("masked", "masked-runtime"):
            # disable needs the unit file (its [Install] section), so it comes before the file moves aside.
            if before["unit_file_state"] not in ("disabled", "static", "indirect", ""):
                actions.append("disable")
            fragment = before["fragment_path"]
            if (
                fragment.startswith("/etc/systemd/system/")
                and os.path.isfile(fragment)
                and not os.path.islink(fragment)
            ):
                actions.append("move %s to %s" % (fragment, params["backup_dir"]))
            actions.append("mask")
        actions.extend("docker rm -f %s" % c for c in containers)

        # reset-failed alone (a masked, dead unit that once failed) is not worth a change.
        changed = any(a != "reset-failed" for a in actions)
        after = (
            dict(before, active_state="inactive", sub_state="dead", unit_file_state="masked")
            if changed
            else before
        )
        if changed and "reset-failed" in actions:
            after["n_restarts"] = 0
        self.result.update(changed=changed, before=before, after=after, actions=actions if changed else [])
        return self.result

    def _containers_present(self):
        present = []
        for name in self.params["containers"]:
            rc, out, dummy = self.run([self.docker, "inspect", "--format", "{{.Id}}", "--", name])
            if rc == 0 and out.strip():
                present.append(name)
        return present

    def diff(self):
        return dict(
            before=_state_text(self.result["before"]),
            after=_state_text(self.result["after"]),
            before_header="%s (before)" % self.unit,
            after_header="%s (after)" % self.unit,
        )

    # ---------------------------------------------------------------------------------- act

    def _must(self, args, what):
        rc, out, err = self.run(args)
        if rc != 0:
            raise DisableUnitError(
                "Failed to %s %s: %s" % (what, self.unit, (err or out).strip()), **self.result
            )

    def act(self):
        unit, systemctl = self.unit, self.systemctl
        for action in self.result["actions"]:
            if action == "stop":
                self._must([systemctl, "stop", "--", unit], "stop")
            elif action.startswith("move "):
                backup_dir = self.params["backup_dir"]
                try:
                    if not os.path.isdir(backup_dir):
                        os.makedirs(backup_dir, 0o700)
                    shutil.move(self.result["before"]["fragment_path"], os.path.join(backup_dir, unit))
                except (OSError, IOError) as exc:
                    raise DisableUnitError(
                        "Failed to move the unit file of %s aside: %s" % (unit, exc), **self.result
                    )
            elif action == "disable":
                self._must([systemctl, "disable", "--", unit], "disable")
            elif action == "mask":
                self._must([systemctl, "mask", "--", unit], "mask")
            elif action == "reset-failed":
                # Best effort: it only clears the failed state and NRestarts; a unit already unloaded has neither.
                self.run([systemctl, "reset-failed", "--", unit])
            elif action.startswith("docker rm -f "):
                self._must(
                    [self.docker, "rm", "-f", "--", action[len("docker rm -f ") :]], "remove the container of"
                )
        self.result["after"] = _state(self._show(unit))
        return self.result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            containers=dict(type="list", elements="str", default=[]),
            protected=dict(type="list", elements="str", default=[]),
            allow_protected=dict(type="bool", default=False),
            backup_dir=dict(type="path", default="/var/lib/fleetops/disabled-units"),
        ),
        supports_check_mode=True,
    )
    booted = is_systemd_host()
    disabler = UnitDisabler(
        module.run_command,
        module.params,
        systemctl=module.get_bin_path("systemctl", required=booted) or "systemctl",
        docker=module.get_bin_path("docker"),
        booted=booted,
    )
    try:
        result = disabler.decide()
        if module._diff:
            result["diff"] = disabler.diff()
        if result["changed"] and not module.check_mode:
            disabler.act()
    except DisableUnitError as exc:
        module.fail_json(msg=str(exc), **exc.result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
