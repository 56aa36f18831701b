#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: (c) 2026, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: slurm_node
short_description: Drain or resume a Slurm node as a fleetops quarantine
version_added: "0.1.0"
description:
  - The Slurm backend of the quarantine playbooks (C(fleetops.node.quarantine),
    C(fleetops.node.unquarantine)). Runs C(scontrol) on the controller (C(delegate_to=localhost)), each
    call an argument vector, never a shell.
  - >-
    V(drained) writes our record into the node's C(Comment) (C(fleetops:) and compact JSON of check, rollout
    and time; on a node in service always a fresh one, replacing any old record of ours left there, as the
    ladder's C(drain_wait) counts from its time), then runs C(scontrol update NodeName=<name> State=DRAIN Reason=<reason>) with the reason
    C(fleetops: <check>: <finding>), and reads the node again. Running jobs finish (the node is DRAINING,
    then DRAINED); none is cancelled.
  - A node drained, down, failed or in maintenance by someone else (no record of ours), or one with
    another's reason, is left as it is and reported (RV(note)); its reason is never overwritten. A node
    whose C(Comment) holds someone else's text fails the task untouched (fleetops records its drain there).
  - V(resumed) runs C(scontrol update NodeName=<name> State=RESUME) only for a node our record says fleetops
    drained, whose reason is ours or one Slurm writes itself (C(Node unexpectedly rebooted), C(Not
    responding)), then removes the record. A node drained or re-reasoned by someone else is left alone.
  - >-
    With O(requeue=true) (C(fleetops remediate quarantine --evict), a policy rung's C(evict: true)), a node
    fleetops drained (now, or before) also has its running jobs requeued once it is drained: C(squeue) lists
    them on the node and C(scontrol requeue) puts them back in the queue (Slurm kills them and starts them
    again elsewhere, from their start or their own checkpoint). A node someone else drained never has its
    jobs requeued. A job Slurm will not requeue (submitted with C(--no-requeue)) fails the task with
    scontrol's cause; the node stays drained.
  - C(scontrol) missing, not answering within O(timeout) or refusing (permission) fails the task with its
    cause; nothing else is run after a failed call.
  - Supports check mode (reads the node, says what it would do) and diff mode (state, reason, comment).
options:
  name:
    description:
      - The Slurm node name, one node (letters, digits, C(.), C(_), C(-); not starting with C(-); no
        hostlist expression).
    type: str
    required: true
  state:
    description: V(drained) quarantines the node, V(resumed) gives back a node fleetops drained.
    type: str
    choices: [drained, resumed]
    required: true
  check:
    description: The finding's check name (required with O(state=drained)); the reason's second part.
    type: str
  finding:
    description: What was found (free text, one line); the reason's last part.
    type: str
    default: ""
  rollout:
    description: The rollout id kept in the record.
    type: str
    default: fleetops
  refuse_checks:
    description:
      - >-
        With O(state=resumed), the checks a fresh scan of the host still finds (warning or critical); a node
        our record says was drained for one of them fails the task, refused and left drained. Unset: no
        such check.
    type: list
    elements: str
  requeue:
    description:
      - With O(state=drained), requeue the jobs running on a node fleetops drained (Slurm kills them and
        queues them again; they cannot start on the drained node).
    type: bool
    default: false
  scontrol:
    description: The scontrol to run.
    type: str
    default: scontrol
  squeue:
    description: The squeue to run (O(requeue) lists the node's jobs with it).
    type: str
    default: squeue
  slurm_conf:
    description: The slurm.conf scontrol reads (C(SLURM_CONF)); default scontrol's own.
    type: path
  timeout:
    description: Seconds each scontrol call may take (1..600).
    type: int
    default: 30
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
notes:
  - Needs C(scontrol) (Debian C(slurm-client)) and the cluster's munge key with a running C(munged) where it
    runs, and a Slurm user allowed to drain and resume (root, SlurmUser, or an operator account).
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
- name: Drain the host's Slurm node for a finding
  fleetops.node.slurm_node:
    name: "{{ fleetops_slurm_node | default(inventory_hostname) }}"
    state: drained
    check: gpu_health
    finding: 1 uncorrectable ECC error on GPU 0
  delegate_to: localhost

- name: Resume it (only if fleetops drained it)
  fleetops.node.slurm_node:
    name: gpu-017
    state: resumed
  delegate_to: localhost
"""

RETURN = r"""
node:
  description: The node name.
  returned: always
  type: str
before:
  description: The node before (state, flags, reason, comment); absent when it could not be read.
  returned: when the node was read
  type: dict
after:
  description: The node after (after a change; the same as before otherwise).
  returned: when the node was read
  type: dict
note:
  description: What was done or why the node was left alone (C(left alone:) ...).
  returned: always
  type: str
left_alone:
  description: Whether the node was left as it is because someone else drained or changed it.
  returned: always
  type: bool
requeued:
  description: The ids of the jobs requeued off the node (in check mode, those that would be).
  returned: with O(requeue=true)
  type: list
  elements: str
"""

import datetime

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.fleetops.node.plugins.module_utils import slurm


class Scontrol:
    def __init__(self, module, name, verb):
        self.module = module
        self.name = name
        self.verb = verb  # for messages: "drain" / "resume"
        self.result = {"changed": False, "node": name}  # what a failure returns (main keeps it current)
        p = module.params
        self.timeout = p["timeout"]
        self.env = {"SLURM_CONF": p["slurm_conf"]} if p["slurm_conf"] else {}
        self.scontrol = module.get_bin_path(p["scontrol"])
        if self.scontrol is None:
            self.fail("%s not found (install slurm-client on the controller)" % p["scontrol"])
        # coreutils timeout bounds each call (run_command has no time limit): exit 124 when it ran out
        self.limit = module.get_bin_path("timeout")
        if self.limit is None:
            self.fail("timeout (coreutils) not found")

    def fail(self, cause):
        self.module.fail_json(
            msg="Failed to %s Slurm node %s: %s" % (self.verb, self.name, cause), **self.result
        )

    def call(self, args, program=None, what="scontrol"):
        argv = [self.limit, "--kill-after=5", str(self.timeout), program or self.scontrol] + args
        rc, out, err = self.module.run_command(argv, environ_update=self.env)
        said = what + (" " + " ".join(args[:2]) if what == "scontrol" else "")
        if rc in (124, 137):
            self.fail("%s: no answer within %d s" % (said, self.timeout))
        if rc != 0:
            lines = (err.strip() or out.strip()).splitlines()
            self.fail("%s: %s" % (said, lines[-1] if lines else "exit %d" % rc))
        return out

    def jobs(self, squeue):
        """The ids of the jobs a requeue moves off the node (squeue, bounded as every call is)."""
        program = self.module.get_bin_path(squeue)
        if program is None:
            self.fail("%s not found (install slurm-client on the controller)" % squeue)
        try:
            return slurm.parse_job_ids(self.call(slurm.squeue_args(self.name), program, "squeue"))
        except slurm.SlurmError as e:
            self.fail(str(e))

    def requeue(self, ids):
        # the ids are checked digits; scontrol takes them as one comma-separated list
        self.call(["requeue", ",".join(ids)])

    def read(self):
        # The name is checked (one node, no leading '-'): scontrol has no '--' before it.
        text = self.call(["show", "node", self.name])
        node = slurm.parse_show_node(text)
        if node is None or node.get("NodeName") != self.name:
            self.fail("scontrol show node answered no node %s" % self.name)
        return node

    def update(self, *settings):
        self.call(["update", "NodeName=" + self.name] + list(settings))


def view(node):
    return {
        "state": node["state"],
        "flags": node["flags"],
        "phase": slurm.phase(node),
        "reason": node["reason"],
        "comment": node["comment"],
    }


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            state=dict(type="str", required=True, choices=["drained", "resumed"]),
            check=dict(type="str"),
            finding=dict(type="str", default=""),
            rollout=dict(type="str", default="fleetops"),
            scontrol=dict(type="str", default="scontrol"),
            slurm_conf=dict(type="path"),
            timeout=dict(type="int", default=30),
            refuse_checks=dict(type="list", elements="str"),
            requeue=dict(type="bool", default=False),
            squeue=dict(type="str", default="squeue"),
        ),
        required_if=[("state", "drained", ("check",))],
        supports_check_mode=True,
    )
    p = module.params
    name = p["name"]
    verb = "drain" if p["state"] == "drained" else "resume"
    result = dict(changed=False, node=name, left_alone=False, note="")
    try:
        slurm.check_node_name(name)
        reason = slurm.reason_text(p["check"], p["finding"]) if p["state"] == "drained" else ""
    except slurm.SlurmError as e:
        module.fail_json(msg="Failed to %s a Slurm node: %s" % (verb, e), **result)
    if not 1 <= p["timeout"] <= 600:
        module.fail_json(msg="Failed to %s Slurm node %s: timeout must be 1..600 s" % (verb, name), **result)
    sc = Scontrol(module, name, verb)
    sc.result = result
    node = sc.read()
    result["before"] = result["after"] = view(node)
    try:
        steps, note = slurm.plan_drain(node, reason) if p["state"] == "drained" else slurm.plan_resume(node)
    except slurm.SlurmError as e:
        sc.fail(str(e))
    record = slurm.parse_record(node["comment"])
    refused = p["refuse_checks"] is not None and record is not None and record["check"] in p["refuse_checks"]
    if p["state"] == "resumed" and refused and "resume" in steps:
        module.fail_json(
            msg="refused: its scan still finds %s: Slurm node %s left drained" % (record["check"], name),
            **result,
        )
    result["note"] = note
    result["left_alone"] = note.startswith("left alone")
    # a requeue moves the jobs off a node of ours only: drained by this run, or by fleetops before
    ours = "drain" in steps or (
        record is not None and slurm.phase(node) in ("drained", "draining") and not result["left_alone"]
    )
    requeue = p["state"] == "drained" and p["requeue"] and ours
    if not steps and not requeue:
        module.exit_json(**result)
    result["changed"] = bool(steps)
    if module.check_mode:
        result["note"] = ("would " + note) if steps else note
        if requeue:
            result["requeued"] = sc.jobs(p["squeue"])
            if result["requeued"]:
                result["changed"] = True
                result["note"] += "; would requeue job(s) %s" % ", ".join(result["requeued"])
        module.exit_json(**result)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    for step in steps:
        if step == "comment":  # first, so an interrupted run still knows the drain is ours
            sc.update("Comment=" + slurm.encode_record(p["check"], p["rollout"], now))
        elif step == "drain":
            sc.update("State=DRAIN", "Reason=" + reason)
        elif step == "resume":
            sc.update("State=RESUME")
        elif step == "uncomment":  # last, so an interrupted run can finish
            sc.update("Comment=")
    if requeue:  # after the drain: a requeued job cannot start on this node again
        ids = sc.jobs(p["squeue"])
        if ids:
            sc.requeue(ids)
            result["changed"] = True
            result["note"] += "; requeued job(s) %s" % ", ".join(ids)
        result["requeued"] = ids
    after = sc.read()
    result["after"] = view(after)
    if module._diff:
        result["diff"] = dict(before=result["before"], after=result["after"])
    if "drain" in steps and (slurm.phase(after) not in ("drained", "draining") or after["reason"] != reason):
        sc.fail("it is %s with reason %r after the drain" % (slurm.phase(after), after["reason"]))
    if p["state"] == "resumed" and slurm.phase(after) in ("drained", "draining", "down"):
        sc.fail("it is still %s after the resume" % slurm.phase(after))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
