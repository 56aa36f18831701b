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
  - A unit whose file lives in C(/etc/systemd/system) cannot be masked in place (the mask is a symlink
    at that path); the file is then moved to O(backup_dir) first, so the change can be undone.
  - Idempotent; supports check mode and diff. Refuses protected units (sshd, systemd-*, dbus, the
    network stack, kubelet, containerd, docker, and O(protected)) unless O(allow_protected=true).
options:
  name:
    description:
      - The unit. A name without a type suffix means C(.service).
      - Must be a valid systemd unit name; anything else (for example shell metacharacters) is refused.
    type: str
    required: true
  containers:
    description:
      - Docker containers the unit ran, removed (C(docker rm -f)) when docker is present.
      - Hosts without docker ignore this option.
    type: list
    elements: str
    default: []
  protected:
    description: More unit names or shell-style patterns to refuse, on top of the built-in list.
    type: list
    elements: str
    default: []
  allow_protected:
    description: Override the protected-unit refusal. Only for an operator who knows the unit is the culprit.
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
"""

RETURN = r"""
unit:
  description: The full unit name acted on.
  returned: always
  type: str
  sample: ecs.service
before:
  description: The unit's state before the change.
  returned: always
  type: dict
  sample: {"active_state": "activating", "sub_state": "auto-restart", "unit_file_state": "enabled", "n_restarts": 412}
after:
  description: The unit's state after the change (predicted in check mode).
  returned: always
  type: dict
  sample: {"active_state": "inactive", "sub_state": "dead", "unit_file_state": "masked", "n_restarts": 0}
actions:
  description: What was done (or would be, in check mode), in order.
  returned: always
  type: list
  elements: str
  sample: ["stop", "reset-failed", "disable", "mask", "docker rm -f ecs-agent"]
"""

import os
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.fleetops.node.plugins.module_utils.systemd import (
    UnitNameError,
    is_protected,
    is_systemd_host,
    normalize_unit_name,
    parse_show,
)

_PROPS = "Id,LoadState,ActiveState,SubState,UnitFileState,FragmentPath,NRestarts"


def _state(props):
    return {
        "load_state": props.get("LoadState", ""),
        "active_state": props.get("ActiveState", ""),
        "sub_state": props.get("SubState", ""),
        "unit_file_state": props.get("UnitFileState", ""),
        "fragment_path": props.get("FragmentPath", ""),
        "n_restarts": int(props["NRestarts"]) if props.get("NRestarts", "").isdigit() else None,
    }


def _show(module, systemctl, unit):
    rc, out, err = module.run_command([systemctl, "show", "-p", _PROPS, "--", unit])
    if rc != 0:
        module.fail_json(msg="Failed to read unit %s: %s" % (unit, (err or out).strip()))
    try:
        blocks = parse_show(out)
    except ValueError as exc:
        module.fail_json(msg="Failed to parse systemctl show for %s: %s" % (unit, exc))
    return _state(blocks[0] if blocks else {})


def _containers_present(module, docker, names):
    present = []
    for name in names:
        rc, out, dummy = module.run_command([docker, "inspect", "--format", "{{.Id}}", "--", name])
        if rc == 0 and out.strip():
            present.append(name)
    return present


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
    try:
        unit = normalize_unit_name(module.params["name"])
    except UnitNameError as exc:
        module.fail_json(msg="Failed to disable unit: %s" % exc)
    if is_protected(unit, module.params["protected"]) and not module.params["allow_protected"]:
        module.fail_json(
            msg="Failed to disable unit %s: it is protected (the way in, the bus, the network, systemd or the "
            "node's runtime); set allow_protected=true only if you are sure" % unit,
            unit=unit,
        )
    if not is_systemd_host():
        module.fail_json(msg="Failed to disable unit %s: this host is not running systemd" % unit, unit=unit)
    systemctl = module.get_bin_path("systemctl", required=True)
    before = _show(module, systemctl, unit)
    if before["load_state"] == "not-found" and before["unit_file_state"] != "masked":
        module.fail_json(msg="Failed to disable unit %s: no such unit on this host" % unit, unit=unit, before=before)

    docker = module.get_bin_path("docker")
    containers = _containers_present(module, docker, module.params["containers"]) if docker else []

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
        if fragment.startswith("/etc/systemd/system/") and os.path.isfile(fragment) and not os.path.islink(fragment):
            actions.append("move %s to %s" % (fragment, module.params["backup_dir"]))
        actions.append("mask")
    actions.extend("docker rm -f %s" % c for c in containers)

    # reset-failed alone (a masked, dead unit that once failed) is not worth a change.
    changed = any(a != "reset-failed" for a in actions)
    after = dict(before, active_state="inactive", sub_state="dead", unit_file_state="masked") if changed else before
    if changed and "reset-failed" in actions:
        after["n_restarts"] = 0
    result = dict(changed=changed, unit=unit, before=before, after=after, actions=actions if changed else [])
    if module._diff:
        result["diff"] = dict(
            before="active_state=%(active_state)s\nsub_state=%(sub_state)s\nunit_file_state=%(unit_file_state)s\n"
            % before,
            after="active_state=%(active_state)s\nsub_state=%(sub_state)s\nunit_file_state=%(unit_file_state)s\n"
            % after,
            before_header="%s (before)" % unit,
            after_header="%s (after)" % unit,
        )
    if not changed or module.check_mode:
        module.exit_json(**result)

    def run(args, what):
        rc, out, err = module.run_command(args)
        if rc != 0:
            module.fail_json(msg="Failed to %s %s: %s" % (what, unit, (err or out).strip()), **result)

    for action in actions:
        if action == "stop":
            run([systemctl, "stop", "--", unit], "stop")
        elif action.startswith("move "):
            backup_dir = module.params["backup_dir"]
            try:
                if not os.path.isdir(backup_dir):
                    os.makedirs(backup_dir, 0o700)
                shutil.move(before["fragment_path"], os.path.join(backup_dir, unit))
            except (OSError, IOError) as exc:
                module.fail_json(msg="Failed to move unit file of %s aside: %s" % (unit, exc), **result)
        elif action == "disable":
            run([systemctl, "disable", "--", unit], "disable")
        elif action == "mask":
            run([systemctl, "mask", "--", unit], "mask")
        elif action == "reset-failed":
            # Best effort: it only clears the failed state and NRestarts; a unit already unloaded has neither.
            module.run_command([systemctl, "reset-failed", "--", unit])
        elif action.startswith("docker rm -f "):
            run([docker, "rm", "-f", "--", action[len("docker rm -f "):]], "remove the container of")
    result["after"] = _show(module, systemctl, unit)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
