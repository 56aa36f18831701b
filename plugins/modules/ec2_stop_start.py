#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ec2_stop_start
short_description: Stop an EC2 instance, wait until it is stopped, start it, wait until it runs
version_added: "0.1.0"
description:
  - Moves an EBS-backed EC2 instance to other hardware, the documented answer to an instance-retirement
    or system-maintenance event and to hardware faults a reboot cannot fix (a GPU with uncorrectable ECC
    errors, a failed row remap). EC2 places a stopped-and-started instance on another host.
  - C(StopInstances), then C(DescribeInstances) every O(poll_interval) seconds until the instance is
    C(stopped) (at most O(stop_timeout) seconds), then C(StartInstances), then the same until it is
    C(running) (at most O(start_timeout) seconds). An instance found C(stopping) is waited for, one found
    C(stopped) is only started.
  - EC2 says C(running) before the operating system answers; wait for the host itself afterwards
    (M(ansible.builtin.wait_for_connection)) and check its boot id changed.
  - Refuses an instance whose root device is not EBS (C(RootDeviceType) C(instance-store)); such an
    instance cannot be stopped, only terminated. Refuses a terminated or shutting-down instance.
  - Runs on the controller (C(delegate_to=localhost)); it talks to the EC2 API with boto3 and tenacity,
    through the same settings, throttling retries and error texts as the C(fleetops.node.ec2) inventory
    plugin.
  - In check mode it only describes the instance and reports what it would do.
  - Always changes an instance it acts on; a stop-start is an action, not a state, and running it again
    moves the instance again (O(finish=true) only completes one already under way).
options:
  instance_id:
    description: The instance, e.g. the C(ec2_instance_id) hostvar the C(fleetops.node.ec2) inventory sets.
    type: str
    required: true
  region:
    description:
      - The instance's region (the C(ec2_region) hostvar). Default C(AWS_REGION), else C(AWS_DEFAULT_REGION),
        else C(us-east-1).
    type: str
  stop_timeout:
    description: Seconds to wait for the instance to be C(stopped), 1 to 86400.
    type: int
    default: 600
  start_timeout:
    description: Seconds to wait for the instance to be C(running) again, 1 to 86400.
    type: int
    default: 600
  poll_interval:
    description: Seconds between two reads of the instance's state while waiting (above 0, at most 60).
    type: float
    default: 5.0
  finish:
    description:
      - Only finish a stop-start that a killed run left half done, never begin one. An instance found
        C(stopping) is waited for and started, one found C(stopped) is started; one C(running) or
        C(pending) is left alone (not changed).
      - The C(fleetops.node.stop_start) playbook uses it when C(fleetops remediate --resume) probes a host
        caught mid-batch, so a controller killed between the stop and the start does not leave the
        instance stopped.
    type: bool
    default: false
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - fleetops.node.aws
notes:
  - C(fleetops remediate stop-start) hands ansible-playbook its inventory's EC2 connection in the
    environment.
  - "IAM: C(ec2:DescribeInstances), C(ec2:StopInstances) and C(ec2:StartInstances) on the instance."
  - An instance's instance-store volumes (if any besides its EBS root) lose their data on a stop.
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
seealso:
  - name: Stop and start Amazon EC2 instances
    description: What a stop and start does, and that the instance moves to new hardware.
    link: https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/Stop_Start.html
  - name: Scheduled events for your instances
    description: Stop and start an EBS-backed instance to complete an instance-retirement or maintenance event.
    link: https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/monitoring-instances-status-check_sched.html
author:
  - fleetops maintainers (@fleetops)
"""

EXAMPLES = r"""
- name: Move the host's instance to other hardware
  fleetops.node.ec2_stop_start:
    instance_id: "{{ ec2_instance_id }}"
    region: "{{ ec2_region }}"
    stop_timeout: 600
    start_timeout: 600
  delegate_to: localhost
  become: false

- name: Then wait for the host to answer again
  ansible.builtin.wait_for_connection:
    timeout: 600
"""

RETURN = r"""
instance_id:
  description: The instance.
  returned: always
  type: str
  sample: i-0123456789abcdef0
region:
  description: Its region.
  returned: always
  type: str
  sample: us-east-1
before:
  description: The instance as described before anything was done.
  returned: when the instance was described
  type: dict
  sample:
    state: running
    root_device_type: ebs
    instance_type: p5e.48xlarge
    availability_zone: us-east-1a
    private_ip: 10.0.1.17
    launch_time: "2026-12-01T10:00:00+00:00"
after:
  description: The instance as described once it runs again (not in check mode).
  returned: when the instance was stopped and started
  type: dict
  sample:
    state: running
    root_device_type: ebs
    instance_type: p5e.48xlarge
    availability_zone: us-east-1a
    private_ip: 10.0.1.17
    launch_time: "2026-12-01T12:34:56+00:00"
actions:
  description: What was done (in check mode, what would be done), in order.
  returned: always
  type: list
  elements: str
  sample: [stop, wait stopped, start, wait running]
stop_seconds:
  description: Seconds from StopInstances until the instance was stopped.
  returned: when the instance was stopped
  type: float
start_seconds:
  description: Seconds from StartInstances until the instance was running.
  returned: when the instance was started
  type: float
msg:
  description: One line saying what was (or would be) done.
  returned: always
  type: str
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.fleetops.node.plugins.module_utils import aws

MAX_TIMEOUT_S = 86400
UNMOVABLE = ("shutting-down", "terminated")


class StopStartError(Exception):
    """A step failed; ``str(err)`` is the whole message ("Failed to ...: <cause>")."""


def default_region():
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


def summary(instance):
    """The parts of a DescribeInstances item the module reports."""
    launch = instance.get("LaunchTime")
    return {
        "state": (instance.get("State") or {}).get("Name"),
        "root_device_type": instance.get("RootDeviceType"),
        "instance_type": instance.get("InstanceType"),
        "availability_zone": (instance.get("Placement") or {}).get("AvailabilityZone"),
        "private_ip": instance.get("PrivateIpAddress"),
        "launch_time": launch.isoformat() if hasattr(launch, "isoformat") else launch,
    }


def check_options(params):
    """ValueError for an option value that cannot work."""
    if not params["instance_id"].startswith("i-"):
        raise ValueError("instance_id %r is not an EC2 instance id" % params["instance_id"])
    for name in ("stop_timeout", "start_timeout"):
        if not 1 <= params[name] <= MAX_TIMEOUT_S:
            raise ValueError("%s must be 1 .. %d seconds, got %d" % (name, MAX_TIMEOUT_S, params[name]))
    if not 0 < params["poll_interval"] <= 60:
        raise ValueError(
            "poll_interval must be above 0 and at most 60 seconds, got %r" % params["poll_interval"]
        )


class Instance:
    """One instance's EC2 calls, each under the connection's retry budget (module_utils/aws.py)."""

    def __init__(self, settings, region, instance_id, poll_interval, clock=time.monotonic, sleep=time.sleep):
        self.settings = settings
        self.region = region
        self.id = instance_id
        self.poll_interval = poll_interval
        self.clock = clock
        self.sleep = sleep
        self.ec2 = aws.client(settings, "ec2", region, user_agent="fleetops.node.ec2_stop_start")

    def _call(self, operation, func):
        return aws.call(self.settings, operation, self.region, func)

    def describe(self):
        answer = self._call("DescribeInstances", lambda: self.ec2.describe_instances(InstanceIds=[self.id]))
        found = [
            i
            for r in answer.get("Reservations", [])
            for i in r.get("Instances", [])
            if i.get("InstanceId") == self.id
        ]
        if not found:
            raise StopStartError(
                "Failed to find instance %s in %s: DescribeInstances does not list it"
                % (self.id, self.region)
            )
        return found[0]

    def stop(self):
        self._call("StopInstances", lambda: self.ec2.stop_instances(InstanceIds=[self.id]))

    def start(self):
        self._call("StartInstances", lambda: self.ec2.start_instances(InstanceIds=[self.id]))

    def wait_for(self, wanted, timeout, verb):
        """Read the state until it is ``wanted``; the last description. StopStartError after ``timeout`` s
        or when the instance goes where it cannot come back from."""
        deadline = self.clock() + timeout
        while True:
            instance = self.describe()
            state = (instance.get("State") or {}).get("Name")
            if state == wanted:
                return instance
            if state in UNMOVABLE:
                raise StopStartError(
                    "Failed to %s instance %s: it is %s (while waiting for %s)"
                    % (verb, self.id, state, wanted)
                )
            if self.clock() >= deadline:
                raise StopStartError(
                    "Failed to %s instance %s: still %s after %d s (waited for %s)"
                    % (verb, self.id, state, timeout, wanted)
                )
            self.sleep(min(self.poll_interval, max(0.0, deadline - self.clock())))


def plan(state):
    """What a stop-start does from ``state``."""
    if state in ("running", "pending"):
        return ["stop", "wait stopped", "start", "wait running"]
    if state == "stopping":
        return ["wait stopped", "start", "wait running"]
    if state == "stopped":
        return ["start", "wait running"]
    return []


def run(module, instance, params, result):
    """The whole stop-start, filling ``result`` (``exit_json`` keywords) as it goes: a failure half way
    still reports what was read and done."""
    described = instance.describe()
    before = summary(described)
    result["before"] = before
    if before["root_device_type"] != "ebs":
        raise StopStartError(
            "Failed to stop-start instance %s: its root device is %s, not EBS: such an instance cannot be "
            "stopped, only terminated (replace it instead)"
            % (instance.id, before["root_device_type"] or "unknown")
        )
    actions = plan(before["state"])
    if params["finish"] and before["state"] in ("running", "pending"):
        result.update(
            actions=[], msg="instance %s is %s: no stop-start to finish" % (instance.id, before["state"])
        )
        return result
    if not actions:
        raise StopStartError(
            "Failed to stop-start instance %s: it is %s, not running, stopping or stopped"
            % (instance.id, before["state"])
        )
    result.update(changed=True, actions=actions)
    if module.check_mode:
        result["msg"] = "would %s instance %s (now %s)" % (", ".join(actions), instance.id, before["state"])
        return result
    result["actions"] = []  # from here: what was done
    if "stop" in actions:
        instance.stop()
        result["actions"].append("stop")
    started = instance.clock()
    instance.wait_for("stopped", params["stop_timeout"], "stop")
    result["stop_seconds"] = round(instance.clock() - started, 3)
    result["actions"].append("wait stopped")
    instance.start()
    result["actions"].append("start")
    started = instance.clock()
    after = instance.wait_for("running", params["start_timeout"], "start")
    result["start_seconds"] = round(instance.clock() - started, 3)
    result["actions"].append("wait running")
    result["after"] = summary(after)
    result["msg"] = "instance %s stopped (%.1f s) and started again (%.1f s)" % (
        instance.id,
        result["stop_seconds"],
        result["start_seconds"],
    )
    return result


class _NotCheckMode:
    check_mode = False


def in_flight_record(settings, region, instance_id):
    """What a later pass needs to finish a stop-start a killed run leaves half done, beyond the instance
    and its region: nothing."""
    return {}


def finish_instance(settings, record, stop_timeout=600, start_timeout=600, poll_interval=5.0):
    """Finish, from the controller, a stop-start that a killed run left half done: the C(finish) option's
    ``run`` (a stopping instance waited for and started, a stopped one started, a running one left
    alone). ``remediate auto`` calls it for a stop-start a dead pass reserved and never settled, whose
    instance an inventory of running instances no longer lists; ``record``: the reservation's journal
    (``instance``, ``region``). StopStartError or aws.AwsError on failure."""
    instance_id = record["instance"]
    instance = Instance(settings, record["region"], instance_id, poll_interval)
    params = {"finish": True, "stop_timeout": stop_timeout, "start_timeout": start_timeout}
    return run(_NotCheckMode(), instance, params, {"changed": False, "instance_id": instance_id})


def argument_spec():
    """The module's options: its own and module_utils/aws.py's connection options."""
    spec = dict(
        instance_id=dict(type="str", required=True),
        region=dict(type="str"),
        stop_timeout=dict(type="int", default=600),
        start_timeout=dict(type="int", default=600),
        poll_interval=dict(type="float", default=5.0),
        finish=dict(type="bool", default=False),
    )
    spec.update(aws.argument_spec())
    spec["aws_access_key"]["no_log"] = False  # an access key id is not a secret (the secret key is)
    return spec


ARGUMENT_SPEC = argument_spec()


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    try:
        check_options(params)
    except ValueError as e:
        module.fail_json(msg="Failed to read the stop-start options: %s" % e)
    if not aws.HAS_BOTO3:
        module.fail_json(msg=missing_required_lib("boto3"), exception=aws.BOTO3_IMPORT_ERROR)
    if not aws.HAS_TENACITY:
        module.fail_json(msg=missing_required_lib("tenacity"), exception=aws.TENACITY_IMPORT_ERROR)
    region = params["region"] or default_region()
    try:
        settings = aws.ConnectionSettings.from_options(params, environ=os.environ)
    except aws.AwsSettingsError as e:
        module.fail_json(msg="Failed to read the EC2 connection: %s" % e)
    result = {"changed": False, "instance_id": params["instance_id"], "region": region, "actions": []}
    try:
        instance = Instance(settings, region, params["instance_id"], params["poll_interval"])
        run(module, instance, params, result)
    except StopStartError as e:
        module.fail_json(msg=str(e), **result)
    except aws.AwsError as e:
        module.fail_json(msg="Failed to stop-start instance %s: %s" % (params["instance_id"], e), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
