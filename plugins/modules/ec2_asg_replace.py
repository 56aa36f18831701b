#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ec2_asg_replace
short_description: Have an EC2 Auto Scaling group replace one of its instances, and wait for the new one
version_added: "0.1.0"
description:
  - The last rung of fleetops' remediation ladder, for a fault no software fix, reboot or stop-start
    clears. The instance's Auto Scaling group gives it up and launches a fresh one in its place.
  - Finds the instance's group (C(DescribeAutoScalingInstances)) and refuses, changing nothing, an
    instance in no group, an instance that is not C(InService), and a group that is already degraded
    (fewer of its other instances C(InService) and C(Healthy) than its desired capacity less one), as
    replacing one more would take it below what it should run.
  - O(method=terminate) calls C(TerminateInstanceInAutoScalingGroup) with
    C(ShouldDecrementDesiredCapacity=false), and the group launches a replacement at once.
    O(method=unhealthy) calls C(SetInstanceHealth) C(Unhealthy) (grace period not respected), and the group
    terminates and replaces it on its next health check.
  - Then waits, at most O(timeout) seconds, until the group is back at its desired capacity with every
    instance C(InService) and C(Healthy), the old instance gone from it (and C(shutting-down) or
    C(terminated) in EC2), and each new instance carrying the tags O(wait_for_tags) names. Returns the
    new instances with their private IPs, C(Name) tags and tags.
  - Runs on the controller (C(delegate_to=localhost)); it talks to the Auto Scaling and EC2 APIs with
    boto3 and tenacity, through the same settings, retries and error texts as the C(fleetops.node.ec2)
    inventory plugin.
  - Supports check mode, where it reads the group, refuses what it would refuse, and says what it
    would do, without calling anything that changes it.
options:
  instance_id:
    description: The instance to replace, e.g. the C(ec2_instance_id) hostvar of the C(fleetops.node.ec2) inventory.
    type: str
    required: true
  region:
    description:
      - The instance's region (the C(ec2_region) hostvar). Default C(AWS_REGION), else
        C(AWS_DEFAULT_REGION), else C(us-east-1).
    type: str
  method:
    description:
      - V(terminate) terminates the instance in its group without lowering the desired capacity;
        V(unhealthy) marks it C(Unhealthy) and lets the group replace it.
    type: str
    choices: [terminate, unhealthy]
    default: terminate
  timeout:
    description: Seconds to wait for the group to be back at its desired capacity with the new instance(s); 1 to 86400.
    type: int
    default: 600
  poll_interval:
    description: Seconds between two looks at the group while waiting.
    type: float
    default: 5.0
  wait_for_tags:
    description:
      - Tag keys every new instance must carry before the wait ends, e.g. one a launch lifecycle hook
        writes with the instance's name or address (the lab writes C(fleetops:lab:address)).
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - fleetops.node.aws
notes:
  - "IAM: C(autoscaling:DescribeAutoScalingInstances), C(autoscaling:DescribeAutoScalingGroups),
    C(autoscaling:TerminateInstanceInAutoScalingGroup) or C(autoscaling:SetInstanceHealth), and
    C(ec2:DescribeInstances)."
  - A timeout fails the module with C(changed=true). The instance was given up, and the group may still
    be launching its replacement.
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
seealso:
  - name: Replace an Auto Scaling instance
    description: Health checks and the replacement of unhealthy instances.
    link: https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-health-checks.html
author:
  - fleetops maintainers (@fleetops)
"""

EXAMPLES = r"""
- name: Replace this host's instance, keeping the group's desired capacity
  fleetops.node.ec2_asg_replace:
    instance_id: "{{ ec2_instance_id }}"
    region: "{{ ec2_region }}"
    timeout: 900
  delegate_to: localhost
  register: replaced

- name: Let the group replace it on its own health check instead
  fleetops.node.ec2_asg_replace:
    instance_id: i-0123456789abcdef0
    region: us-east-1
    method: unhealthy
  delegate_to: localhost
"""

RETURN = r"""
instance_id:
  description: The instance replaced.
  returned: always
  type: str
  sample: i-0123456789abcdef0
group:
  description: Its Auto Scaling group.
  returned: when the instance is in one
  type: str
  sample: gpu-workers
method:
  description: How it was replaced (O(method)).
  returned: always
  type: str
before:
  description: The group before (desired capacity, instance ids, how many InService and Healthy).
  returned: when the instance is in a group
  type: dict
  sample: {"desired_capacity": 2, "instances": ["i-0123456789abcdef0", "i-0fedcba9876543210"], "in_service_healthy": 2}
after:
  description: The group once back at its desired capacity (same keys as RV(before)).
  returned: when the replacement finished
  type: dict
new_instances:
  description: The instances the group launched in its place.
  returned: when the replacement finished
  type: list
  elements: dict
  sample: [{"instance_id": "i-0aaaabbbbccccdddd", "private_ip_address": "10.0.1.17", "name": "gpu-worker",
            "availability_zone": "us-east-1a", "state": "running", "tags": {"Name": "gpu-worker"}}]
waited:
  description: Seconds spent waiting for the group.
  returned: when the replacement was started
  type: float
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.fleetops.node.plugins.module_utils import aws

GONE_STATES = ("shutting-down", "terminated")
MAX_TIMEOUT_S = 86400


class ReplaceError(Exception):
    """The instance cannot be replaced (not in a group, not InService, group degraded, timed out)."""


def default_region():
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


def healthy(entry):
    return entry.get("LifecycleState") == "InService" and entry.get("HealthStatus") == "Healthy"


def group_view(group):
    """What the module reports of a group: desired capacity, its instances, how many serve."""
    instances = group.get("Instances") or []
    return {
        "desired_capacity": int(group.get("DesiredCapacity") or 0),
        "instances": sorted(i["InstanceId"] for i in instances),
        "in_service_healthy": sum(1 for i in instances if healthy(i)),
    }


def refusal(instance_id, group, entry):
    """Why ``instance_id`` must not be replaced now (None: it may), from its group's description."""
    if entry.get("LifecycleState") != "InService":
        return "it is %s in group %s, not InService" % (
            entry.get("LifecycleState"),
            group["AutoScalingGroupName"],
        )
    desired = int(group.get("DesiredCapacity") or 0)
    others = [i for i in group.get("Instances") or [] if i["InstanceId"] != instance_id]
    serving = sum(1 for i in others if healthy(i))
    if serving < desired - 1:
        return (
            "group %s is already degraded: %d of its other instances are InService and Healthy, fewer than its "
            "desired capacity %d less this one; replacing it would take the group lower (wait for it to recover)"
            % (group["AutoScalingGroupName"], serving, desired)
        )
    return None


def settled(group, old_id, before_ids, ec2_states, tags_of, wait_for_tags):
    """``(done, why not)``: the group is back at desired capacity with the replacement in service."""
    instances = group.get("Instances") or []
    desired = int(group.get("DesiredCapacity") or 0)
    ids = set(i["InstanceId"] for i in instances)
    if old_id in ids:
        entry = next(i for i in instances if i["InstanceId"] == old_id)
        return False, "%s still in the group (%s, %s)" % (
            old_id,
            entry.get("LifecycleState"),
            entry.get("HealthStatus"),
        )
    if ec2_states.get(old_id) not in GONE_STATES:
        return False, "%s is %s in EC2" % (old_id, ec2_states.get(old_id, "unknown"))
    waiting = sorted(
        "%s %s/%s" % (i["InstanceId"], i.get("LifecycleState"), i.get("HealthStatus"))
        for i in instances
        if not healthy(i)
    )
    if waiting:
        return False, "not yet InService and Healthy: %s" % ", ".join(waiting)
    if len(instances) != desired:
        return False, "%d of %d instances" % (len(instances), desired)
    new = sorted(ids - set(before_ids))
    if not new:
        return False, "no new instance yet"
    for iid in new:
        missing = [k for k in wait_for_tags if k not in tags_of.get(iid, {})]
        if missing:
            return False, "%s lacks the tag(s) %s" % (iid, ", ".join(missing))
    return True, ""


class Aws:
    """The few API calls, each under the settings' retry budget."""

    def __init__(self, settings, region):
        self.settings = settings
        self.region = region
        agent = "fleetops.node.ec2_asg_replace"
        self.asg = aws.client(settings, service="autoscaling", region=region, user_agent=agent)
        self.ec2 = aws.client(settings, service="ec2", region=region, user_agent=agent)

    def _call(self, service, operation, func):
        return aws.call(self.settings, operation, self.region, func, service=service)

    def membership(self, instance_id):
        answer = self._call(
            "autoscaling",
            "DescribeAutoScalingInstances",
            lambda: self.asg.describe_auto_scaling_instances(InstanceIds=[instance_id]),
        )
        found = answer.get("AutoScalingInstances") or []
        return found[0] if found else None

    def group(self, name):
        answer = self._call(
            "autoscaling",
            "DescribeAutoScalingGroups",
            lambda: self.asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name]),
        )
        groups = answer.get("AutoScalingGroups") or []
        if not groups:
            raise ReplaceError("its group %s no longer exists" % name)
        return groups[0]

    def instances(self, ids):
        """{instance id: its EC2 description} (ids EC2 does not know are left out)."""
        out = {}
        if not ids:
            return out
        paginator = self.ec2.get_paginator("describe_instances")

        def pages():
            return list(paginator.paginate(Filters=[{"Name": "instance-id", "Values": sorted(ids)}]))

        for page in self._call("ec2", "DescribeInstances", pages):
            for reservation in page.get("Reservations") or []:
                for inst in reservation.get("Instances") or []:
                    out[inst["InstanceId"]] = inst
        return out

    def terminate(self, instance_id):
        self._call(
            "autoscaling",
            "TerminateInstanceInAutoScalingGroup",
            lambda: self.asg.terminate_instance_in_auto_scaling_group(
                InstanceId=instance_id, ShouldDecrementDesiredCapacity=False
            ),
        )

    def mark_unhealthy(self, instance_id):
        self._call(
            "autoscaling",
            "SetInstanceHealth",
            lambda: self.asg.set_instance_health(
                InstanceId=instance_id, HealthStatus="Unhealthy", ShouldRespectGracePeriod=False
            ),
        )


def describe(inst):
    tags = dict((t["Key"], t["Value"]) for t in inst.get("Tags") or [])
    return {
        "instance_id": inst["InstanceId"],
        "private_ip_address": inst.get("PrivateIpAddress"),
        "name": tags.get("Name"),
        "availability_zone": (inst.get("Placement") or {}).get("AvailabilityZone"),
        "state": (inst.get("State") or {}).get("Name"),
        "tags": tags,
    }


def replace(module, api, result):
    params = module.params
    instance_id = params["instance_id"]
    entry = api.membership(instance_id)
    if entry is None:
        raise ReplaceError(
            "it is in no Auto Scaling group (only an instance a group replaces can be replaced; "
            "stop-start or terminate it by other means)"
        )
    name = entry["AutoScalingGroupName"]
    result["group"] = name
    group = api.group(name)
    before = group_view(group)
    result["before"] = before
    entry = next((i for i in group.get("Instances") or [] if i["InstanceId"] == instance_id), entry)
    why = refusal(instance_id, group, entry)
    if why:
        raise ReplaceError(why)
    verb = (
        "terminate it in group %s (desired capacity %d kept)" % (name, before["desired_capacity"])
        if params["method"] == "terminate"
        else "mark it Unhealthy in group %s" % name
    )
    if module.check_mode:
        result.update(
            changed=True,
            msg="would %s and wait up to %d s for the group to be back at %d InService and Healthy"
            % (verb, params["timeout"], before["desired_capacity"]),
        )
        return
    started = time.monotonic()
    if params["method"] == "terminate":
        api.terminate(instance_id)
    else:
        api.mark_unhealthy(instance_id)
    result["changed"] = True
    deadline = started + params["timeout"]
    why = ""
    while True:
        group = api.group(name)
        ids = set(i["InstanceId"] for i in group.get("Instances") or [])
        described = api.instances(ids | set([instance_id]))
        states = dict((iid, (inst.get("State") or {}).get("Name")) for iid, inst in described.items())
        tags_of = dict((iid, describe(inst)["tags"]) for iid, inst in described.items())
        done, why = settled(group, instance_id, before["instances"], states, tags_of, params["wait_for_tags"])
        result["waited"] = round(time.monotonic() - started, 1)
        if done:
            new = sorted(ids - set(before["instances"]))
            result.update(
                after=group_view(group),
                new_instances=[describe(described[i]) for i in new],
                msg="%s replaced by %s in group %s in %.1f s"
                % (instance_id, ", ".join(new), name, result["waited"]),
            )
            return
        if time.monotonic() >= deadline:
            raise ReplaceError(
                "group %s is not back at its desired capacity %d within %d s after the instance was %s: %s"
                % (
                    name,
                    before["desired_capacity"],
                    params["timeout"],
                    "terminated" if params["method"] == "terminate" else "marked Unhealthy",
                    why,
                )
            )
        time.sleep(max(0.0, min(params["poll_interval"], deadline - time.monotonic())))


def in_flight_record(settings, region, instance_id):
    """What a later pass needs to finish a replace of ``instance_id`` that a killed run leaves half done,
    read right before it starts (``remediate auto`` keeps it with its reservation in the shared store):
    the instance's group and the group's instances then, as a terminated instance soon leaves its group
    and EC2 drops its tags ({} for an instance in no group: the replace refuses it). aws.AwsError on failure."""
    api = Aws(settings, region)
    entry = api.membership(instance_id)
    if entry is None:
        return {}
    name = entry["AutoScalingGroupName"]
    return {"asg": name, "members": group_view(api.group(name))["instances"]}


def finish_instance(settings, record, timeout=600, poll_interval=5.0):
    """Finish, from the controller, a replace that a killed run left half done. ``record``: the reservation's
    journal (``instance``, ``region``, and ``in_flight_record``'s ``asg`` and ``members``). The old instance
    still InService and Healthy in its group: the replace never started, nothing to wait for. Otherwise
    waits, at most ``timeout`` seconds, for the group to be back at its desired capacity with the old
    instance gone, and returns the instances launched since (``new_instances``, ids): the caller must see
    them scan clean. ReplaceError or aws.AwsError on failure."""
    instance_id, name = record["instance"], record.get("asg")
    api = Aws(settings, record["region"])
    entry = api.membership(instance_id)
    state = ((api.instances([instance_id]).get(instance_id) or {}).get("State") or {}).get("Name")
    if entry is not None and healthy(entry) and state == "running":
        return {
            "changed": False,
            "new_instances": [],
            "msg": "the replace never started: %s is InService and Healthy in group %s"
            % (instance_id, entry["AutoScalingGroupName"]),
        }
    if not name:
        if entry is None:
            return {
                "changed": False,
                "new_instances": [],
                "msg": "the replace never started: %s was in no Auto Scaling group (refused)" % instance_id,
            }
        raise ReplaceError("its reservation names no Auto Scaling group (%s)" % entry["AutoScalingGroupName"])
    members = record.get("members") or []
    started = time.monotonic()
    deadline = started + timeout
    while True:
        group = api.group(name)
        ids = set(i["InstanceId"] for i in group.get("Instances") or [])
        described = api.instances(ids | set([instance_id]))
        states = dict((iid, (inst.get("State") or {}).get("Name")) for iid, inst in described.items())
        states.setdefault(instance_id, "terminated")  # EC2 forgets a terminated instance after a while
        tags_of = dict((iid, describe(inst)["tags"]) for iid, inst in described.items())
        done, why = settled(group, instance_id, members, states, tags_of, [])
        if done:
            new = sorted(ids - set(members))
            return {
                "changed": False,
                "new_instances": new,
                "msg": "%s was replaced by %s in group %s" % (instance_id, ", ".join(new), name),
            }
        if time.monotonic() >= deadline:
            raise ReplaceError(
                "group %s is not back at its desired capacity within %d s: %s" % (name, timeout, why)
            )
        time.sleep(max(0.0, min(poll_interval, deadline - time.monotonic())))


def argument_spec():
    """The module's options: its own, then the AWS connection's (module_utils/aws.py)."""
    spec = dict(
        instance_id=dict(type="str", required=True),
        region=dict(type="str"),
        method=dict(type="str", choices=["terminate", "unhealthy"], default="terminate"),
        timeout=dict(type="int", default=600),
        poll_interval=dict(type="float", default=5.0),
        wait_for_tags=dict(type="list", elements="str", default=[], no_log=False),
    )
    spec.update(aws.argument_spec())
    spec["aws_access_key"]["no_log"] = False  # an access key id is not a secret (the secret key is)
    return spec


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    params = module.params
    result = {"changed": False, "instance_id": params["instance_id"], "method": params["method"]}
    if not params["instance_id"].startswith("i-"):
        module.fail_json(
            msg="Failed to read the options: %r is not an EC2 instance id" % params["instance_id"], **result
        )
    if not 1 <= params["timeout"] <= MAX_TIMEOUT_S:
        module.fail_json(
            msg="Failed to read the options: timeout must be 1 to %d s, got %d"
            % (MAX_TIMEOUT_S, params["timeout"]),
            **result,
        )
    if not 0 < params["poll_interval"] <= 300:
        module.fail_json(
            msg="Failed to read the options: poll_interval must be above 0 and at most 300 s", **result
        )
    if not aws.HAS_BOTO3:
        module.fail_json(msg=missing_required_lib("boto3"), exception=aws.BOTO3_IMPORT_ERROR)
    if not aws.HAS_TENACITY:
        module.fail_json(msg=missing_required_lib("tenacity"), exception=aws.TENACITY_IMPORT_ERROR)
    try:
        settings = aws.ConnectionSettings.from_options(params, environ=os.environ)
    except aws.AwsSettingsError as e:
        module.fail_json(msg="Failed to read the AWS connection: %s" % e, **result)
    try:
        replace(module, Aws(settings, params["region"] or default_region()), result)
    except (ReplaceError, aws.AwsError) as e:
        module.fail_json(msg="Failed to replace instance %s: %s" % (params["instance_id"], e), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
