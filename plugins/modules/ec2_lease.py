#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ec2_lease
short_description: Take, renew, check or release the fleetops lease on EC2 instances
version_added: "0.1.0"
description:
  - The lock that keeps two rollouts off the same hosts, whoever runs them; an operator's
    C(fleetops remediate) (the CLI) and the remediation and reboot playbooks (AWX jobs, or
    C(ansible-playbook) by hand) write and judge the same EC2 tags, so an AWX job refuses the
    instances a CLI rollout holds and the other way round.
  - Each rollout tags every instance with its own key, C(fleetops:lease:<rollout>), whose value is
    compact JSON of at most 256 bytes (C({"operator":"alice@bastion","since":"...Z","expires":"...Z"})).
  - V(acquired) reads the instances' lease tags. A live lease of another rollout refuses the whole
    take (the module fails naming the holder, its operator and when its lease expires) and nothing is
    written. Expired leases of other rollouts are removed and taken over. Then our tag is written on
    every instance, and after O(settle) seconds the tags are read again. EC2 tags have no
    compare-and-swap, so two takers can both write; of the live leases on an instance the one taken
    first wins (its C(since), then the lower rollout id) and a loser removes its own tags and fails.
    Taking a lease the rollout already holds renews it and keeps its place (its C(since)).
  - V(renewed) fails when our lease was removed or a lease taken earlier appeared (the lease is
    lost), else pushes its expiry O(ttl) seconds on.
  - With a store, V(acquired) and V(renewed) also fail while automation is paused (C(fleetops pause)
    writes the store's C(pause) item), naming who paused it, when and why; the playbooks take the lease
    before each batch, so a paused AWX job stops before its next batch, as a CLI rollout does.
  - V(checked) changes nothing and fails unless the rollout holds a live lease on every instance and
    was first there (a playbook that the CLI runs checks the CLI's lease this way).
  - V(released) removes our tag where it still has the value read (a tag rewritten by someone else in
    between is left alone). Releasing what is not held changes nothing.
  - Runs on the controller (C(delegate_to=localhost), C(run_once=true)); it talks to the EC2 API with
    boto3 and tenacity, through the same settings, retries and error texts as the C(fleetops.node.ec2)
    inventory plugin. Without instances there is nothing to lock and no EC2 call is made (boto3 is then
    not needed).
  - Supports check mode, where it reads the tags and reports what it would do (a take that would be
    refused still fails), without writing.
  - The lease only narrows the race to about O(settle) seconds, provided both writes are visible to both
    re-reads (EC2's tag API is eventually consistent) and the controllers' clocks agree; it is not a
    consensus protocol. A lease is only as long as its O(ttl); renew it between batches that may take
    longer.
  - With a shared store (O(store_table), which the C(fleetops.node.ec2) inventory publishes as the
    C(fleetops_store_table) variable when its source names one) the lease lives in the store's DynamoDB
    table, with compare-and-swap, and the tags are its mirror. One item per rollout holds its expiry,
    one item per instance names its holder; each is written only at the version read, and the
    instances are taken in sorted order, so of two takers one wins and the other gives back what it
    took and fails. An expired lease is taken over, and then its holder's next renewal fails. The
    mirror tags carry the same value as a tag lease, so a controller that still uses tags alone sees
    the lease; a live tag lease of a rollout the store does not know refuses the take. There is no
    O(settle) wait. The controller's clock must agree with the store's within 30 seconds.
options:
  state:
    description:
      - V(acquired) takes (or renews) the lease, V(renewed) renews a lease held, V(checked) verifies it
        is held, V(released) removes it.
    type: str
    choices: [acquired, renewed, checked, released]
    default: acquired
  rollout:
    description:
      - The rollout's id, the key's last part (C(fleetops:lease:<rollout>)). The CLI's rollout ids look
        like C(20261129T170102Z-3fa9c1); playbooks in AWX use C(awx-job-<job id>).
      - Letters, digits and the characters C(+-=._:/@), at most 113 characters.
    type: str
    required: true
  instances:
    description:
      - The instances, host name (used in messages) to EC2 instance id, e.g. built from the hosts'
        C(ec2_instance_id) hostvar (set by the C(fleetops.node.ec2) inventory).
      - Give this or O(instance_ids); both empty means there is nothing to lock.
    type: dict
    default: {}
  instance_ids:
    description: Instance ids without host names (each is its own name in messages).
    type: list
    elements: str
    default: []
  instance_regions:
    description:
      - The region of each instance, by host name or instance id (the C(ec2_region) hostvar). An instance
        without one is in O(region).
    type: dict
    default: {}
  region:
    description:
      - The region of instances O(instance_regions) does not name. Default C(AWS_REGION), else
        C(AWS_DEFAULT_REGION), else C(us-east-1).
    type: str
  operator:
    description:
      - Who holds the lease, written into the tag and named to whoever is refused; C(user@controller).
      - Default the user running the module (C(SUDO_USER), C(FLEETOPS_OPERATOR) or the login name) at
        this machine's host name, as the CLI writes it.
    type: str
  ttl:
    description:
      - Seconds the lease lives from the moment it is taken or renewed; above O(settle), at most 86400.
    type: float
    default: 900.0
  settle:
    description:
      - Seconds between writing the tags and reading them back (V(acquired)), at most 300. Not used with
        a store.
    type: float
    default: 2.0
  store_table:
    description:
      - The DynamoDB table of the shared store; the lease is taken there and the tags mirror it. Default
        C(FLEETOPS_STORE_TABLE); unset, the lease is the tags alone.
      - The playbooks pass the C(fleetops_store_table) variable the C(fleetops.node.ec2) inventory sets.
    type: str
  store_region:
    description:
      - The store table's region. Default C(FLEETOPS_STORE_REGION), else O(region), else C(AWS_REGION),
        C(AWS_DEFAULT_REGION) or C(us-east-1).
    type: str
  store_endpoint_url:
    description:
      - The store's DynamoDB endpoint. Default C(FLEETOPS_STORE_ENDPOINT_URL), else
        C(AWS_ENDPOINT_URL_DYNAMODB), else O(endpoint_url).
    type: str
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - fleetops.node.aws
notes:
  - "IAM: C(ec2:DescribeTags), C(ec2:CreateTags) and C(ec2:DeleteTags) on the instances."
  - >-
    IAM with a store: C(dynamodb:DescribeTable), C(dynamodb:CreateTable) (the table is created on first
    use), C(dynamodb:GetItem), C(dynamodb:PutItem), C(dynamodb:DeleteItem) and C(dynamodb:Scan) on the
    table.
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
seealso:
  - name: EC2 tag restrictions
    description: Key and value lengths and characters.
    link: https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/Using_Tags.html#tag-restrictions
author:
  - fleetops maintainers (@fleetops)
"""

EXAMPLES = r"""
- name: Take the lease on the play's EC2 instances before changing anything
  fleetops.node.ec2_lease:
    state: acquired
    rollout: "awx-job-{{ awx_job_id }}"
    operator: "{{ awx_user_name }}@awx"
    instances: "{{ dict(_ec2 | map(attribute='inventory_hostname') | zip(_ec2 | map(attribute='ec2_instance_id'))) }}"
    instance_regions: "{{ dict(_ec2 | map(attribute='inventory_hostname') | zip(_ec2 | map(attribute='ec2_region'))) }}"
    ttl: 3600
  vars:
    _ec2: "{{ ansible_play_hosts_all | map('extract', hostvars) | selectattr('ec2_instance_id', 'defined') | list }}"
  delegate_to: localhost
  run_once: true

- name: Release it
  fleetops.node.ec2_lease:
    state: released
    rollout: "awx-job-{{ awx_job_id }}"
    instance_ids: [i-0123456789abcdef0]
    region: us-east-1
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
rollout:
  description: The rollout id.
  returned: always
  type: str
  sample: awx-job-42
key:
  description: The tag key of the lease.
  returned: always
  type: str
  sample: "fleetops:lease:awx-job-42"
instances:
  description: The instances, with their host names and regions.
  returned: always
  type: list
  elements: dict
  sample: [{"host": "gpu-1", "instance_id": "i-0123456789abcdef0", "region": "us-east-1"}]
value:
  description: The tag value written (V(acquired), V(renewed); what would be written in check mode).
  returned: when a lease is written
  type: str
  sample: '{"operator":"alice@bastion","since":"2026-12-01T10:00:00Z","expires":"2026-12-01T10:15:00Z"}'
since:
  description: When the lease was first taken (ISO 8601, UTC).
  returned: when a lease is written
  type: str
expires:
  description: When the lease expires unless renewed (ISO 8601, UTC).
  returned: when a lease is written
  type: str
taken_over:
  description: Leases of other rollouts that were removed because they had expired.
  returned: state is acquired
  type: list
  elements: str
leases:
  description: Every lease tag read, by instance id (rollout, operator, since, expires, live).
  returned: always
  type: dict
released:
  description: The instances whose tag (or, with a store, lease item) was removed (V(released)).
  returned: state is released
  type: list
  elements: str
store:
  description: The store the lease lives in, when there is one.
  returned: with a store
  type: str
  sample: DynamoDB table fleetops in us-east-1
"""

import getpass
import os
import socket
import time

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.fleetops.node.plugins.module_utils import aws
from ansible_collections.fleetops.node.plugins.module_utils import lease as lp
from ansible_collections.fleetops.node.plugins.module_utils import store as sp


def default_operator():
    """``user@controller`` as the CLI writes it (fleetops.rollout.state)."""
    user = os.environ.get("SUDO_USER") or os.environ.get("FLEETOPS_OPERATOR")
    if not user:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = "uid%d" % os.getuid()
    return "%s@%s" % (user, socket.gethostname())


def default_region():
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


def targets_of(params):
    """``({instance id: host}, {instance id: region})``; ValueError for a bad entry."""
    hosts, regions = {}, {}
    named = [(str(host), instance) for host, instance in sorted(params["instances"].items())]
    named += [(str(instance), instance) for instance in params["instance_ids"]]
    fallback = params["region"] or default_region()
    for host, instance in named:
        if not isinstance(instance, str) or not instance.startswith("i-"):
            raise ValueError("%s: %r is not an EC2 instance id" % (host, instance))
        if instance in hosts and hosts[instance] != host:
            raise ValueError("%s and %s name the same instance %s" % (hosts[instance], host, instance))
        hosts[instance] = host
        region = params["instance_regions"].get(host) or params["instance_regions"].get(instance)
        regions[instance] = str(region or fallback)
    return hosts, regions


class Runner:
    def __init__(self, module, tags, hosts):
        self.module = module
        self.tags = tags
        self.hosts = hosts
        self.rollout = module.params["rollout"]
        self.key = lp.KEY_PREFIX + self.rollout
        self.result = {"changed": False, "rollout": self.rollout, "key": self.key}

    def _read(self):
        leases = self.tags.read()
        now = time.time()
        self.result["leases"] = dict(
            (instance, dict((rid, rec.as_dict(now)) for rid, rec in sorted(held.items())))
            for instance, held in sorted(leases.items())
        )
        return leases, now

    def _wrote(self, value, since, expires):
        self.result.update(changed=True, value=value, since=lp.iso(since), expires=lp.iso(expires))

    def acquired(self, ttl, settle, operator):
        leases, now = self._read()
        plan = lp.plan_take(self.hosts, leases, self.rollout, now)
        if plan["conflicts"]:
            self.fail(lp.refusal(plan["conflicts"], "Wait for it, or release it if it is stale"))
        self.result["taken_over"] = [
            "%s: %s" % (lp.where(self.hosts[instance], instance), record.describe(now))
            for instance, record, _why in plan["removals"]
        ]
        since = plan["own_since"] if plan["own_since"] is not None else float(int(now))
        expires = now + ttl
        value = lp.encode(operator, since, expires)
        self._wrote(value, since, expires)
        if self.module.check_mode:
            return
        for instance, record, _why in plan["removals"]:
            self.tags.delete([instance], lp.KEY_PREFIX + record.rollout, record.value)
        self.tags.write(list(self.hosts), self.key, value)
        if settle > 0:
            time.sleep(settle)
        leases, now = self._read()
        lost = lp.beaten(self.hosts, leases, self.rollout, since, now)
        if lost:
            self._remove_ours(leases)
            self.fail(lp.lost_race(lost))

    def _held(self, leases, now):
        """``(problems, since, expires)``: why the rollout does not hold the lease (empty when it does)."""
        ours = dict((i, held[self.rollout]) for i, held in leases.items() if self.rollout in held)
        problems = []
        for instance in sorted(self.hosts):
            record = ours.get(instance)
            if record is None:
                problems.append("%s: no lease of this rollout" % lp.where(self.hosts[instance], instance))
            elif not record.live(now):
                problems.append(
                    "%s: its lease expired %s"
                    % (lp.where(self.hosts[instance], instance), lp.iso(record.expires))
                )
        if problems:
            return problems, None, None
        records = [ours[i] for i in self.hosts]
        since = min(r.since for r in records)
        return lp.beaten(self.hosts, leases, self.rollout, since, now), since, min(r.expires for r in records)

    def _problems(self, verb, problems):
        self.fail(
            "Failed to %s the EC2 lease of rollout %s: %s%s"
            % (
                verb,
                self.rollout,
                "; ".join(problems[:5]),
                " and %d more" % (len(problems) - 5) if len(problems) > 5 else "",
            )
        )

    def renewed(self, ttl, operator):
        leases, now = self._read()
        problems, since, _expires = self._held(leases, now)
        if problems:
            self._problems("renew", problems)
        expires = now + ttl
        value = lp.encode(operator, since, expires)
        self._wrote(value, since, expires)
        if not self.module.check_mode:
            self.tags.write(list(self.hosts), self.key, value)

    def checked(self):
        leases, now = self._read()
        problems, since, expires = self._held(leases, now)
        if problems:
            self._problems("check", problems)
        self.result.update(since=lp.iso(since), expires=lp.iso(expires))

    def released(self):
        leases, _now = self._read()
        mine = sorted(i for i, held in leases.items() if self.rollout in held and i in self.hosts)
        self.result["released"] = mine
        self.result["changed"] = bool(mine)
        if not self.module.check_mode:
            self._remove_ours(leases)

    def _remove_ours(self, leases):
        for instance, held in sorted(leases.items()):
            if self.rollout in held and instance in self.hosts:
                self.tags.delete([instance], self.key, held[self.rollout].value)

    def fail(self, msg):
        self.module.fail_json(msg=msg, **self.result)


class StoreRunner(Runner):
    """The same states with the lease in the shared store (module_utils/lease.py's StoreLease), the
    tags its mirror."""

    def __init__(self, module, tags, hosts, backend, operator, ttl):
        Runner.__init__(self, module, tags, hosts)
        self.backend = backend
        self.lease = lp.StoreLease(backend, self.rollout, hosts, operator, ttl, tags=tags, controller="ansible")
        self.result["store"] = backend.where()

    def _leases(self, instances, rollouts):
        """The result's ``leases``: as the store had them when read."""
        now = time.time()
        leases = self.lease.leases(instances, rollouts, now)
        self.result["leases"] = dict(
            (instance, dict((rid, rec.as_dict(now)) for rid, rec in sorted(held.items())))
            for instance, held in sorted(leases.items())
        )
        return now

    def _read_store(self):
        instances, rollouts = self.lease.load()
        return instances, rollouts, self._leases(instances, rollouts)

    def _not_paused(self):
        """``fleetops pause`` holds every rollout, AWX's too: no lease is taken or renewed while it is
        there, so a playbook stops before its first batch or its next one."""
        paused = sp.pause_line(self.backend.get(sp.PAUSE_KEY))
        if paused is not None:
            self.fail("Failed to take the lease of rollout %s: %s ('fleetops unpause' lifts it)" % (self.rollout, paused))

    def acquired(self, ttl, settle, operator):
        self._not_paused()
        if not self.module.check_mode:
            self.backend.ensure()
        try:
            plan = self.lease.acquire(dry_run=self.module.check_mode)
        except lp.StoreLeaseError as e:
            self._leases(*self.lease.seen)
            self.fail(str(e))
        self._leases(*self.lease.seen)
        self.result["taken_over"] = [
            "rollout %s (%s)" % (rid, why) for rid, (_v, _record, why) in sorted(plan["breaks"].items())
        ]
        lease = self.lease
        if self.module.check_mode:
            now = time.time()
            since = plan["own_since"] if plan["own_since"] is not None else float(int(now))
            self._wrote(lp.encode(operator, since, now + ttl), since, now + ttl)
        else:
            self._wrote(lease.tag_value, lease.since, lease.expires)

    def renewed(self, ttl, operator):
        self._not_paused()
        instances, rollouts, now = self._read_store()
        problems = self.lease.problems(instances, rollouts, now)
        if problems:
            self._problems("renew", problems)
        expires = now + ttl
        self._wrote(lp.encode(operator, self.lease.since, expires), self.lease.since, expires)
        if not self.module.check_mode:
            try:
                self.lease.renew()
            except lp.StoreLeaseLost as e:
                self.fail(str(e))
            self._wrote(self.lease.tag_value, self.lease.since, self.lease.expires)

    def checked(self):
        instances, rollouts, now = self._read_store()
        problems = self.lease.problems(instances, rollouts, now)
        if problems:
            self._problems("check", problems)
        self.result.update(since=lp.iso(self.lease.since), expires=lp.iso(self.lease.expires))

    def released(self):
        self._read_store()
        mine = sorted(self.lease.held)
        self.result["changed"] = bool(mine) or self.lease.version is not None
        self.result["released"] = mine
        if not self.module.check_mode:
            self.result["released"] = self.lease.release()


def main():
    argument_spec = dict(
        state=dict(type="str", choices=["acquired", "renewed", "checked", "released"], default="acquired"),
        rollout=dict(type="str", required=True),
        instances=dict(type="dict", default={}),
        instance_ids=dict(type="list", elements="str", default=[]),
        instance_regions=dict(type="dict", default={}),
        region=dict(type="str"),
        operator=dict(type="str"),
        ttl=dict(type="float", default=lp.DEFAULT_TTL_S),
        settle=dict(type="float", default=lp.DEFAULT_SETTLE_S),
    )
    argument_spec.update(aws.argument_spec())
    argument_spec.update(sp.argument_spec())
    argument_spec["aws_access_key"]["no_log"] = False  # an access key id is not a secret (the secret key is)
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    params = module.params
    state = params["state"]
    try:
        lp.check_rollout(params["rollout"])
        ttl, settle = lp.check_times(params["ttl"], params["settle"])
        hosts, regions = targets_of(params)
    except ValueError as e:
        module.fail_json(msg="Failed to read the lease options: %s" % e)
    instances = [
        {"host": hosts[i], "instance_id": i, "region": regions[i]} for i in sorted(hosts, key=hosts.get)
    ]
    if not hosts:
        module.exit_json(
            changed=False,
            rollout=params["rollout"],
            key=lp.KEY_PREFIX + params["rollout"],
            instances=[],
            leases={},
            msg="no EC2 instances: nothing to lock",
        )
    if not aws.HAS_BOTO3:
        module.fail_json(msg=missing_required_lib("boto3"), exception=aws.BOTO3_IMPORT_ERROR)
    if not aws.HAS_TENACITY:
        module.fail_json(msg=missing_required_lib("tenacity"), exception=aws.TENACITY_IMPORT_ERROR)
    try:
        settings = aws.ConnectionSettings.from_options(params, environ=os.environ)
    except aws.AwsSettingsError as e:
        module.fail_json(msg="Failed to read the EC2 connection: %s" % e)
    operator = params["operator"] or default_operator()
    tags = lp.Ec2Tags(settings, regions, user_agent="fleetops.node.ec2_lease")
    try:
        backend = sp.open_backend(
            params, settings, [params["region"] or default_region()], user_agent="fleetops.node.ec2_lease"
        )
    except (ValueError, aws.AwsSettingsError) as e:
        module.fail_json(msg="Failed to read the store options: %s" % e)
    if backend is None:
        runner = Runner(module, tags, hosts)
    else:
        runner = StoreRunner(module, tags, hosts, backend, operator, ttl)
    runner.result["instances"] = instances
    try:
        if state == "acquired":
            runner.acquired(ttl, settle, operator)
        elif state == "renewed":
            runner.renewed(ttl, operator)
        elif state == "checked":
            runner.checked()
        else:
            runner.released()
    except sp.StoreError as e:
        runner.fail("Failed to %s the lease in the store: %s" % (
            {"acquired": "take", "renewed": "renew", "checked": "check", "released": "release"}[state], e,
        ))  # fmt: skip
    except aws.AwsError as e:
        runner.fail("Failed to %s the EC2 lease: %s" % (
            {"acquired": "take", "renewed": "renew", "checked": "check", "released": "release"}[state], e,
        ))  # fmt: skip
    module.exit_json(**runner.result)


if __name__ == "__main__":
    main()
