# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: ec2
short_description: EC2 inventory for GPU fleets, throttling-aware, with scheduled events
version_added: 0.1.0
description:
  - Lists EC2 instances with boto3 and adds them to the inventory, one host per instance.
  - Reads YAML configuration files whose names end with C(fleet_ec2.yml) or C(fleet_ec2.yaml),
    for example C(gpu.fleet_ec2.yml).
  - Option names follow C(amazon.aws.aws_ec2) where they mean the same thing, so an existing
    C(aws_ec2) configuration mostly works after changing O(plugin). Differences are documented per
    option; the plugin refuses the C(aws_ec2) options it does not implement instead of ignoring them.
  - Every host gets C(ec2_instance_id), C(ec2_instance_type), C(ec2_az), C(ec2_region),
    C(ec2_image_id), C(ec2_tags), C(ec2_private_ip), C(ec2_launch_time) (ISO 8601, UTC) and
    C(ec2_state); with O(include_events) also C(ec2_scheduled_events) and C(ec2_status_checks).
  - With O(aws_ec2_hostvars), the instance description is also exposed in snake_case as
    C(aws_ec2) does.
  - C(ansible_host) is the private IP address; use O(compose) to choose another address.
  - Every host is in the group C(ec2), in one group per availability zone (C(az_us_east_1a)) and in
    one group per instance type (C(type_g5_xlarge)), so a rollout can cap per AZ without extra
    configuration.
  - Listings use the API's paginators, one request per page. botocore's own retries are off; every
    request is retried with jittered exponential backoff on throttling (C(RequestLimitExceeded),
    C(Throttling), ...), HTTP 5xx and connection errors, up to O(max_attempts) attempts, and a
    budget that runs out fails with an error naming the call and the region.
  - Credentials, when not given, come from boto3's usual chain (C(AWS_ACCESS_KEY_ID),
    C(AWS_SECRET_ACCESS_KEY), C(AWS_SESSION_TOKEN), C(AWS_PROFILE), shared files, instance role).
author:
  - fleetops maintainers (@fleetops)
requirements:
  - boto3 >= 1.35
  - botocore >= 1.35
  - tenacity >= 8.2
extends_documentation_fragment:
  - constructed
  - inventory_cache
options:
  plugin:
    description: Marks this file as a configuration for this plugin.
    type: str
    required: true
    choices: [fleetops.node.ec2]
  regions:
    description:
      - The regions in which to list instances.
      - Each entry must be a region botocore knows (any partition); anything else is an error.
      - If empty (the default), all regions enabled for the account (C(ec2:DescribeRegions)).
    type: list
    elements: str
    default: []
  filters:
    description:
      - EC2 filters (name to value or list of values), as for C(aws ec2 describe-instances --filters).
      - Unlike C(aws_ec2) (default V({})), the default lists running instances only.
      - A set of filters that does not name C(instance-state-name) gets C(instance-state-name) in
        V(pending), V(running), V(stopping), V(stopped), as with C(aws_ec2).
      - When O(include_filters) is set and this option is not, the default does not apply.
    type: dict
    default:
      instance-state-name: running
  include_filters:
    description:
      - A list of filter sets. Instances matching at least one set (or O(filters)) are included.
      - Every entry costs one more listing per region.
    type: list
    elements: dict
    default: []
  exclude_filters:
    description:
      - A list of filter sets. Instances matching any of them are left out; this wins over
        O(filters) and O(include_filters).
      - Every entry costs one more listing per region.
    type: list
    elements: dict
    default: []
  hostnames:
    description:
      - The inventory hostname, as a list of preferences; the first that yields a value wins.
      - An entry is a C(describe-instances) filter name for an attribute (V(instance-id),
        V(private-ip-address), V(private-dns-name), V(dns-name), V(ip-address), ...), V(tag:NAME)
        (the tag's value), V(tag:NAME=VALUE) (V(NAME_VALUE) when the tag has that value), or
        V(tag:A,B) (the first of these tags that is set).
      - An entry can be a dictionary with C(name), C(prefix) and C(separator) (default V(_)); the
        hostname is then prefix value, separator, name value.
      - Instances for which no entry yields a value are left out. When two instances yield the same
        name, the first (regions in the order given, then instance IDs in order) keeps it and the
        other is left out with a warning.
      - Unlike C(aws_ec2) (default V(dns-name), V(private-dns-name)), the default is the instance
        ID, which is unique across regions and VPCs and never empty. An unknown entry is an error,
        not a literal hostname.
    type: list
    elements: raw
    default: [instance-id]
  aws_ec2_hostvars:
    description:
      - Also set the instance description in snake_case, as C(amazon.aws.aws_ec2) does
        (C(instance_type), C(placement.availability_zone), C(placement.region),
        C(private_ip_address), C(network_interfaces), ...), so its O(compose) and O(keyed_groups)
        expressions keep working. Except C(tags), a reserved name in Ansible; use C(ec2_tags), or
        set O(hostvars_prefix) or O(hostvars_suffix) to get it renamed.
      - Off by default, as it triples the cost of building the inventory (about 25 more variables
        per host). When it is off, an expression in O(compose), O(groups) or O(keyed_groups) that
        uses one of these names gets a warning naming the C(ec2_*) variable to use.
    type: bool
    default: false
  hostvars_prefix:
    description: Prefix for the snake_case host variables taken from the instance description (not the C(ec2_*) ones).
    type: str
    default: ''
  hostvars_suffix:
    description: Suffix for the snake_case host variables taken from the instance description (not the C(ec2_*) ones).
    type: str
    default: ''
  strict_permissions:
    description:
      - By default an C(UnauthorizedOperation) (HTTP 403) answer fails the inventory.
      - Set to V(false) to skip, with a warning, the regions where the caller may not list instances;
        where it may list them but not C(ec2:DescribeInstanceStatus), the hosts are kept without
        C(ec2_scheduled_events) and C(ec2_status_checks), with a warning.
    type: bool
    default: true
  include_events:
    description:
      - Ask C(ec2:DescribeInstanceStatus) for scheduled events and status checks, and set
        C(ec2_scheduled_events) (a list of C(code), C(description), C(not_before), C(not_after),
        C(not_before_deadline), C(instance_event_id)) and C(ec2_status_checks) (C(system),
        C(instance)) on every host.
      - For running instances it asks only what is not healthy, region-wide, with three calls per
        region sent beside the listing (pages of up to 1000), for the instances with a scheduled event
        (C(event.code) V(instance-reboot), V(system-reboot), V(system-maintenance),
        V(instance-retirement), V(instance-stop), the codes the API documents), and instances whose
        instance check or system check (C(instance-status.status), C(system-status.status)) is
        V(impaired), V(initializing), V(insufficient-data) or V(not-applicable). A running instance
        in none of these answers has no scheduled event and both checks V(ok), exactly what
        C(ec2:DescribeInstanceStatus) says of it. On a healthy fleet the answers are empty, however
        many instances are listed.
      - The kept instances in another state (pending, stopping, stopped, ...), which EC2 describes
        region-wide only with C(IncludeAllInstances), are asked about by ID (C(IncludeAllInstances),
        100 instance IDs per call), as soon as a page of C(ec2:DescribeInstances) names them (once
        the O(exclude_filters) listings are done, when there are some).
      - The region-wide answers can name unhealthy instances the filters leave out; they are not
        listed. With O(strict_permissions=false), where C(ec2:DescribeInstanceStatus) is denied the
        hosts are kept without either variable.
    type: bool
    default: true
  max_concurrent_requests:
    description:
      - The most API requests of one listing in flight at once, all regions and calls together
        (1 to 16). Regions, filter sets and C(ec2:DescribeInstanceStatus) calls run side by side
        within this bound; the pages of one listing follow each other.
      - Every request has its own retry budget (O(max_attempts)), so this also bounds how many
        requests wait and retry at once when the API throttles.
    type: int
    default: 4
  page_size:
    description: Items asked per C(ec2:DescribeInstances) page (5 to 1000).
    type: int
    default: 1000
  max_attempts:
    description:
      - Attempts per API call (the first one included) on throttling, HTTP 5xx and connection
        errors. botocore's own retries are disabled, so this is the whole budget.
    type: int
    default: 8
  initial_backoff:
    description: Upper bound in seconds of the first wait between attempts; each later bound doubles (full jitter).
    type: float
    default: 0.5
  max_backoff:
    description: Upper bound in seconds of any single wait between attempts.
    type: float
    default: 20.0
  connect_timeout:
    description: Seconds to wait for a connection to the endpoint.
    type: float
    default: 10.0
  read_timeout:
    description: Seconds to wait for an answer once connected.
    type: float
    default: 60.0
  endpoint_url:
    description:
      - Use this EC2 endpoint instead of AWS's, for example a local emulator (moto).
    type: str
    aliases: [aws_endpoint_url, ec2_url]
    env:
      - name: AWS_ENDPOINT_URL_EC2
      - name: AWS_ENDPOINT_URL
  aws_profile:
    description: The named profile (shared credentials/config files) to use. Mutually exclusive with O(aws_access_key).
    type: str
    aliases: [profile, boto_profile]
  aws_access_key:
    description: The AWS access key ID. Requires O(aws_secret_key).
    type: str
    aliases: [access_key, aws_access_key_id, ec2_access_key]
  aws_secret_key:
    description: The AWS secret access key. Requires O(aws_access_key).
    type: str
    aliases: [secret_key, aws_secret_access_key, ec2_secret_key]
  aws_session_token:
    description: The AWS session token, for temporary credentials.
    type: str
    aliases: [session_token, aws_security_token, security_token]
  store_table:
    description:
      - The DynamoDB table of fleetops' shared store (the pause, the budget ledger, the ladders and the
        auto pass's lease, all written with compare-and-swap). Unset, there is no store.
      - The inventory itself never reads it; the fleetops CLI and its modules read this option from the
        source, so C(-i) is all a command needs.
      - When it is set, the group C(ec2) gets the variables C(fleetops_store_table),
        C(fleetops_store_region) and C(fleetops_store_endpoint_url) (resolved, with the defaults below),
        which the playbooks hand to C(fleetops.node.ec2_lease), so an AWX job takes its lease in the same
        store as the CLI.
    type: str
    env:
      - name: FLEETOPS_STORE_TABLE
  store_region:
    description: The store table's region. Default, the first of O(regions).
    type: str
    env:
      - name: FLEETOPS_STORE_REGION
  store_endpoint_url:
    description: The DynamoDB endpoint of the store. Default, O(endpoint_url) (a local moto serves both).
    type: str
    env:
      - name: FLEETOPS_STORE_ENDPOINT_URL
      - name: AWS_ENDPOINT_URL_DYNAMODB
notes:
  - The connection options (O(endpoint_url), credentials, O(max_attempts), O(initial_backoff),
    O(max_backoff), O(connect_timeout), O(read_timeout)), their defaults, the client, the retries
    and the error texts are the collection's C(aws) module utilities, which the fleetops rollout's
    EC2 lease uses too, so both reach the same endpoint with the same budget.
  - A hostname several instances share (two C(Name) tags alike) is never dropped nor given to one
    of them; each of those instances is named C(<hostname>-<instance id>), with a warning.
  - These C(aws_ec2) options are not implemented, and refused when present so that nothing is
    silently ignored; C(iam_role_arn), C(use_ssm_inventory), C(allow_duplicated_hosts),
    C(use_contrib_script_compatible_sanitization), C(use_contrib_script_compatible_ec2_tag_keys).
    Nor are Jinja2 filters in O(hostnames).
  - With O(cache), the cache holds the hosts as listed (hostnames and host variables, before
    O(compose), O(groups) and O(keyed_groups), which apply on every listing). Its key covers the
    query (regions, filters, endpoint, credentials' identity, O(include_events)) and the options
    that shape hosts (O(hostnames), O(aws_ec2_hostvars), O(hostvars_prefix), O(hostvars_suffix)),
    so changing them never reads a cached result made with other values.
"""

EXAMPLES = r"""
# All running instances in two regions, named by instance ID, grouped by AZ and instance type.
plugin: fleetops.node.ec2
regions:
  - us-east-1
  - us-west-2

---
# Running GPU instances tagged fleetops=gpu, named by their Name tag when they have one.
plugin: fleetops.node.ec2
regions: [us-east-1]
filters:
  instance-state-name: running
  tag:fleetops: gpu
  instance-type: ["g5.*", "p4d.*", "p5.*"]
exclude_filters:
  - tag:fleetops-exclude: "true"
hostnames:
  - tag:Name
  - private-dns-name
  - instance-id
keyed_groups:
  - key: ec2_tags.team | default('none')
    prefix: team
groups:
  maintenance_due: ec2_scheduled_events | length > 0
compose:
  ansible_user: "'ubuntu'"
cache: true
cache_plugin: ansible.builtin.jsonfile
cache_connection: ~/.cache/fleetops/inventory
cache_timeout: 300

---
# An amazon.aws.aws_ec2 configuration, renamed: its compose and keyed_groups use aws_ec2's variables.
plugin: fleetops.node.ec2
regions: [us-east-1]
aws_ec2_hostvars: true
keyed_groups:
  - key: placement.region
    prefix: aws_region
compose:
  ansible_host: private_dns_name

---
# Against a local EC2 emulator, with a small retry budget.
plugin: fleetops.node.ec2
endpoint_url: http://127.0.0.1:5000
regions: [us-east-1]
max_attempts: 3
include_events: false
"""

import concurrent.futures
import datetime
import functools
import gc
import hashlib
import json
import os
import re
import threading
import time

import jinja2
import jinja2.meta
from ansible.errors import AnsibleError, AnsibleParserError
from ansible.module_utils.common.dict_transformations import camel_dict_to_snake_dict
from ansible.module_utils.common.text.converters import to_native
from ansible.plugins.inventory import BaseInventoryPlugin, Cacheable, Constructable
from ansible_collections.fleetops.node.plugins.module_utils import aws, store

try:
    from ansible.utils.vars import validate_variable_name
except ImportError:  # older ansible-core: every variable takes the ordinary path
    validate_variable_name = None

try:
    import botocore
    import botocore.paginate
    import botocore.session
    import botocore.utils
except ImportError:
    pass  # aws.HAS_BOTO3 says so; parse() refuses to run


CACHE_FORMAT = 2  # 2: [hostname, host variables] per instance (1: the API's instance descriptions)
STATUS_CHUNK = 100  # DescribeInstanceStatus takes at most 100 InstanceIds
STATUS_PAGE_SIZE = 1000  # MaxResults of a DescribeInstanceStatus without InstanceIds (5 to 1000)
# A running instance's DescribeInstanceStatus item is asked region-wide only when something in it is
# not 'ok': one call per filter below (EC2 ANDs filters, ORs a filter's values), running instances
# only (no IncludeAllInstances). A running instance in none of the answers has both checks 'ok' and
# no scheduled event: RUNNING_OK. The values are all the API reference documents besides 'ok'.
STATUS_NOT_OK = ["impaired", "initializing", "insufficient-data", "not-applicable"]
EVENT_CODES = ["instance-reboot", "system-reboot", "system-maintenance", "instance-retirement", "instance-stop"]
NOT_OK_FILTERS = (
    [{"Name": "event.code", "Values": EVENT_CODES}],
    [{"Name": "instance-status.status", "Values": STATUS_NOT_OK}],
    [{"Name": "system-status.status", "Values": STATUS_NOT_OK}],
)
RUNNING_OK = {"Events": [], "SystemStatus": {"Status": "ok"}, "InstanceStatus": {"Status": "ok"}}
MAX_CONCURRENT_REQUESTS = 16  # the upper bound of the option of that name (its default is in DOCUMENTATION)
MAX_DUPLICATE_WARNINGS = 10
# the store the source names, as variables of the ec2 group: what the playbooks hand fleetops.node.ec2_lease
STORE_VARS = ("fleetops_store_table", "fleetops_store_region", "fleetops_store_endpoint_url")

DEFAULT_STATES = ["pending", "running", "stopping", "stopped"]

# describe-instances filter name -> path into the instance description (lists are searched).
ATTRIBUTES = {
    "architecture": ("Architecture",),
    "availability-zone": ("Placement", "AvailabilityZone"),
    "dns-name": ("PublicDnsName",),
    "image-id": ("ImageId",),
    "instance-id": ("InstanceId",),
    "instance-lifecycle": ("InstanceLifecycle",),
    "instance-state-name": ("State", "Name"),
    "instance-type": ("InstanceType",),
    "ip-address": ("PublicIpAddress",),
    "ipv6-address": ("NetworkInterfaces", "Ipv6Addresses", "Ipv6Address"),
    "key-name": ("KeyName",),
    "launch-index": ("AmiLaunchIndex",),
    "network-interface.addresses.private-ip-address": (
        "NetworkInterfaces",
        "PrivateIpAddresses",
        "PrivateIpAddress",
    ),
    "network-interface.private-dns-name": ("NetworkInterfaces", "PrivateDnsName"),
    "owner-id": ("OwnerId",),
    "placement-group-name": ("Placement", "GroupName"),
    "platform": ("Platform",),
    "private-dns-name": ("PrivateDnsName",),
    "private-ip-address": ("PrivateIpAddress",),
    "reservation-id": ("ReservationId",),
    "subnet-id": ("SubnetId",),
    "vpc-id": ("VpcId",),
}

# Top-level host variables amazon.aws.aws_ec2 sets (the instance description in snake_case), with
# the ec2_* variable to use instead. Only with aws_ec2_hostvars (and never 'tags', a reserved name).
_EC2 = "the ec2_* variables"
AWS_EC2_HOSTVARS = {
    "ami_launch_index": _EC2,
    "architecture": _EC2,
    "block_device_mappings": _EC2,
    "boot_mode": _EC2,
    "capacity_reservation_specification": _EC2,
    "client_token": _EC2,
    "cpu_options": _EC2,
    "ebs_optimized": _EC2,
    "ena_support": _EC2,
    "enclave_options": _EC2,
    "hibernation_options": _EC2,
    "hypervisor": _EC2,
    "iam_instance_profile": _EC2,
    "image_id": "ec2_image_id",
    "instance_id": "ec2_instance_id",
    "instance_lifecycle": _EC2,
    "instance_type": "ec2_instance_type",
    "key_name": _EC2,
    "launch_time": "ec2_launch_time",
    "maintenance_options": _EC2,
    "metadata_options": _EC2,
    "monitoring": _EC2,
    "network_interfaces": _EC2,
    "owner_id": _EC2,
    "placement": "ec2_az / ec2_region",
    "platform": _EC2,
    "platform_details": _EC2,
    "private_dns_name": _EC2,
    "private_ip_address": "ec2_private_ip",
    "product_codes": _EC2,
    "public_dns_name": _EC2,
    "public_ip_address": _EC2,
    "requester_id": _EC2,
    "reservation_id": _EC2,
    "root_device_name": _EC2,
    "root_device_type": _EC2,
    "security_groups": _EC2,
    "source_dest_check": _EC2,
    "spot_instance_request_id": _EC2,
    "sriov_net_support": _EC2,
    "state": "ec2_state",
    "state_reason": _EC2,
    "state_transition_reason": _EC2,
    "subnet_id": _EC2,
    "tags": "ec2_tags",
    "usage_operation": _EC2,
    "virtualization_type": _EC2,
    "vpc_id": _EC2,
}

# amazon.aws.aws_ec2 options this plugin does not implement: refused with a clear message.
UNSUPPORTED_AWS_EC2_OPTIONS = frozenset(
    (
        "iam_role_arn",
        "use_ssm_inventory",
        "allow_duplicated_hosts",
        "use_contrib_script_compatible_sanitization",
        "use_contrib_script_compatible_ec2_tag_keys",
    )
)

_GROUP_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


def _group_name(prefix, value):
    return prefix + "_" + _GROUP_UNSAFE.sub("_", str(value)).lower()


_SNAKE_KEYS = {}


def _snake(value):
    """camel_dict_to_snake_dict for boto3 answers, with the key conversions memoized (they repeat)."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            name = _SNAKE_KEYS.get(key)
            if name is None:
                name = _SNAKE_KEYS[key] = next(iter(camel_dict_to_snake_dict({key: None})))
            out[name] = _snake(item)
        return out
    if isinstance(value, list):
        return [_snake(item) for item in value]
    return value


def _timestamp(value):
    """botocore's timestamp parser, with a fast path for the UTC form EC2 answers with (2026-12-07T04:40:00.000Z)."""
    if isinstance(value, str) and value.endswith("Z"):
        try:
            parsed = datetime.datetime.fromisoformat(value[:-1])
        except ValueError:
            parsed = None
        if parsed is not None and parsed.tzinfo is None:
            return parsed.replace(tzinfo=datetime.timezone.utc)
    return botocore.utils.parse_timestamp(value)


def _jsonable(value):
    """The boto3 answer with datetimes as ISO 8601 UTC strings (the cache stores JSON)."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return value.astimezone(datetime.timezone.utc).isoformat()
    return value


def _filter_list(filters):
    """{name: value | [values]} -> EC2 Filters, values as strings (booleans as true/false)."""
    result = []
    for name, value in filters.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        strings = []
        for v in values:
            if isinstance(v, bool):
                strings.append("true" if v else "false")
            else:
                strings.append(str(v))
        result.append({"Name": str(name), "Values": strings})
    if not any(f["Name"] == "instance-state-name" for f in result):
        result.append({"Name": "instance-state-name", "Values": list(DEFAULT_STATES)})
    return result


def _lookup(obj, path):
    """First non-empty value along path; lists are searched element by element."""
    if not path:
        return obj if obj not in (None, "", [], {}) else None
    if isinstance(obj, list):
        for item in obj:
            found = _lookup(item, path)
            if found is not None:
                return found
        return None
    if isinstance(obj, dict):
        return _lookup(obj.get(path[0]), path[1:])
    return None


def _tags(instance):
    return {t["Key"]: t.get("Value", "") for t in instance.get("Tags") or [] if "Key" in t}


def _tag_hostname(spec, tags):
    for part in spec.split(","):
        if "=" in part:
            key, value = part.split("=", 1)
            if tags.get(key) == value:
                return "%s_%s" % (key, value)
        elif tags.get(part):
            return tags[part]
    return None


def _distance(a, b):
    """Optimal string alignment distance: edits, a swap of two neighbours counting as one."""
    prev2, prev = None, list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
            if prev2 is not None and i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], prev2[j - 2] + 1)
        prev2, prev = prev, row
    return prev[len(b)]


def _closest(name, candidates):
    """The candidate a typo (or a shortened name) most likely meant, or None."""
    starting = sorted(c for c in candidates if c.startswith(name))
    if name and len(starting) == 1:
        return starting[0]
    best = min(sorted(candidates), key=lambda c: _distance(name, c), default=None)
    if best is None or _distance(name, best) > max(2, len(name) // 4):
        return None
    return best


def _first_page(paginator, pagination, kwargs):
    """One request: the first page of a fresh paginator (started at pagination's StartingToken)."""
    return next(iter(paginator.paginate(PaginationConfig=pagination, **kwargs)))


_UNSET = object()
_SCRATCH = "_fleetops_ec2_hostvars"  # set and removed at once by _HostvarsWriter


class _HostvarsWriter:
    """Sets a new host's variables through one set_variable call instead of one per variable.

    The inventory ansible-core (2.19 and later) gives a plugin runs every value set_variable gets
    through its variable visitor: it checks the type, copies containers and tags every value with
    the inventory source as origin (for error messages). At 5,000 hosts and a dozen variables each
    that is 60,000 visits, most of a listing from the cache. Here a new host's variables go to
    set_variable as one mapping, under a scratch name: the visitor checks, copies and tags each
    value exactly as it would one at a time; the visited values then become the host's variables,
    where Host.set_variable would only have stored them (a new host has none of them yet, and each
    name gets Ansible's check once). Values met before (zones, types, images, states, status
    checks, empty tags) are passed as visited the first time: the visitor keeps such a string as it
    is and copies such a container without tagging it again, so the result is the same as for a
    fresh value, for less work (a string is then shared by the hosts, as strings are immutable;
    every host still gets its own copy of a container).

    A host that another source made first, one whose name is also a group's, a name Ansible would
    warn about, or an inventory that does not keep the mapping where expected, take the ordinary
    path: one set_variable per variable.
    """

    batch = True  # False: always the ordinary path (the tests and the benchmark compare both)

    def __init__(self, inventory):
        self._inventory = inventory
        self._set_variable = inventory.set_variable
        self._seen = {}  # _flat_key() of a value -> that value as the inventory stored it
        self._good_names = set()
        self._batch = self.batch

    def _names_ok(self, names):
        if validate_variable_name is None:
            return False
        for name in names:
            if name not in self._good_names:
                try:
                    validate_variable_name(name)
                except AnsibleError:
                    return False
                self._good_names.add(name)
        return True

    def set(self, hostname, hostvars, new):
        inventory = self._inventory
        if (
            new
            and self._batch
            and hostname not in inventory.groups
            and (hostvars.keys() <= self._good_names or self._names_ok(hostvars))
        ):
            seen = self._seen
            given = {}
            keys = {}  # name -> _flat_key() of its value, for the values not seen before
            fresh = {}  # a new string -> the first name it is given under
            again = {}  # name -> an earlier name of this host with the same new string
            for name, value in hostvars.items():
                key = value if isinstance(value, str) else _flat_key(value)
                if key is not None:
                    stored = seen.get(key)
                    if stored is not None:
                        value = stored
                    elif isinstance(key, str) and key in fresh:
                        again[name] = fresh[key]  # ansible_host, the private IP: visited once
                        continue
                    else:
                        keys[name] = key
                        if isinstance(key, str):
                            fresh[key] = name
                given[name] = value
            self._set_variable(hostname, _SCRATCH, given)
            host_vars = inventory.hosts[hostname].vars
            visited = host_vars.pop(_SCRATCH, _UNSET)
            if isinstance(visited, dict) and visited.keys() == given.keys():
                if again:
                    visited = {name: visited[again.get(name, name)] for name in hostvars}
                host_vars.update(visited)
                for name, key in keys.items():
                    # a container only when the inventory stored a copy: hosts never share one
                    if isinstance(key, str) or visited[name] is not given[name]:
                        seen[key] = visited[name]
                return
            self._batch = False  # not stored as expected: from now on, the ordinary path
        for name, value in hostvars.items():
            self._set_variable(hostname, name, value)


def _flat_key(value):
    """A key for a string, or for a dict or list holding only strings and None; None for anything else.

    Values of the same key are equal, and of the same types all the way down (host variables here
    come from JSON or boto3: plain str, dict and list), so one the inventory stored can stand for
    another.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        for item in value.values():
            if item is not None and not isinstance(item, str):
                return None
        return (dict, tuple(value.items()))
    if isinstance(value, list):
        for item in value:
            if item is not None and not isinstance(item, str):
                return None
        return (list, tuple(value))
    return None


def _running(instance):
    return (instance.get("State") or {}).get("Name") == "running"


class _RegionDenied(Exception):
    """UnauthorizedOperation in a region, with strict_permissions off."""


class _RegionListing:
    """One region's listings and status calls, as tasks of the plugin's pool; records() waits for them.

    A running instance's status item comes from the region-wide NOT_OK_FILTERS calls (RUNNING_OK
    when none of them names it); a kept instance in another state (pending, stopping, stopped, ...)
    is asked about by ID, with IncludeAllInstances, as EC2 answers region-wide for running ones only.
    """

    def __init__(self, plugin, pool, region, include_events):
        self._plugin = plugin
        self._pool = pool
        self.region = region
        self._include_events = include_events
        self._lock = threading.Lock()
        self._asked = set()  # instance IDs a status call was (or is about to be) sent for
        self._pending = []  # kept instance IDs not yet in a status call
        self._status_calls = []
        settings = plugin._settings
        # With exclude sets, which instances are kept is known only once they are listed.
        self._early_status = include_events and not settings["exclude_sets"]
        on_page = self._page_listed if self._early_status else None
        self._excludes = [
            pool.submit(plugin._list_instances, region, filters) for filters in settings["exclude_sets"]
        ]
        self._includes = [
            pool.submit(plugin._list_instances, region, filters, on_page) for filters in settings["filter_sets"]
        ]
        self._not_ok = []
        if include_events:  # they depend on no listing: sent at once, answered while the listing goes on
            self._not_ok = [pool.submit(plugin._not_ok_statuses, region, filters) for filters in NOT_OK_FILTERS]
        self.started = time.monotonic()

    def _page_listed(self, instances):
        """In a listing's thread: send a status call for every full chunk of newly kept instance IDs
        of instances that are not running (the NOT_OK_FILTERS calls cover the running ones)."""
        with self._lock:
            for instance in instances:
                instance_id = instance["InstanceId"]
                if _running(instance):
                    continue
                if instance_id not in self._asked:
                    self._asked.add(instance_id)
                    self._pending.append(instance_id)
            while len(self._pending) >= STATUS_CHUNK:
                self._send(self._pending[:STATUS_CHUNK])
                del self._pending[:STATUS_CHUNK]

    def _send(self, chunk):
        self._status_calls.append(self._pool.submit(self._plugin._statuses, self.region, chunk))

    def records(self):
        plugin, region = self._plugin, self.region
        try:
            excluded = set()
            for future in self._excludes:
                excluded.update(i["InstanceId"] for i in future.result())
            found = {}
            for future in self._includes:
                for instance in future.result():
                    if instance["InstanceId"] not in excluded:
                        found.setdefault(instance["InstanceId"], instance)
        except _RegionDenied as e:
            plugin.display.warning("fleetops.node.ec2: skipping %s: %s" % (region, e))
            for future in self._status_calls + self._not_ok:
                future.cancel()
            return []
        listed = time.monotonic()
        statuses = None
        if self._include_events:
            with self._lock:
                if not self._early_status:
                    self._pending = sorted(i for i, instance in found.items() if not _running(instance))
                for start in range(0, len(self._pending), STATUS_CHUNK):
                    self._send(self._pending[start : start + STATUS_CHUNK])
                self._pending = []
                calls = list(self._status_calls)
            try:
                statuses = {}
                not_ok = {}
                for future in calls:
                    for status in future.result():
                        statuses[status["InstanceId"]] = status
                for future in self._not_ok:
                    for status in future.result():
                        not_ok[status["InstanceId"]] = status
                for instance_id, instance in found.items():
                    if _running(instance):
                        statuses[instance_id] = not_ok.get(instance_id, RUNNING_OK)
            except _RegionDenied as e:
                statuses = None
                plugin.display.warning(
                    "fleetops.node.ec2: no scheduled events or status checks in %s (its hosts "
                    "get neither variable): %s" % (region, e)
                )
        plugin.display.vvv(
            "fleetops.node.ec2: %s: %d instances listed in %.2fs, statuses done %.2fs later"
            % (region, len(found), listed - self.started, time.monotonic() - listed)
        )
        records = []
        for instance_id in sorted(found):
            # status: the DescribeInstanceStatus item ({} when EC2 had none), None when not asked
            status = None if statuses is None else statuses.get(instance_id, {})
            records.append(
                {
                    "region": str(region),
                    "instance": _jsonable(found[instance_id]),
                    "status": _jsonable(status) if status is not None else None,
                }
            )
        return records


class InventoryModule(BaseInventoryPlugin, Constructable, Cacheable):
    NAME = "fleetops.node.ec2"

    def __init__(self):
        super().__init__()
        self._session = None
        self._clients = {}
        self._settings = {}
        self._connection = None  # aws.ConnectionSettings

    # ---- plugin entry points -------------------------------------------------------------------

    def verify_file(self, path):
        if not super().verify_file(path):
            return False
        return str(path).endswith(("fleet_ec2.yml", "fleet_ec2.yaml"))

    def get_cache_key(self, path):
        """The path's key plus a digest of the query and of the host variables' shape.

        The cache holds shaped hosts, so another query, or options that shape hostnames and host
        variables differently, never read this one's data.
        """
        query = {
            k: self._settings.get(k)
            for k in (
                "regions",
                "filter_sets",
                "exclude_sets",
                "endpoint_url",
                "include_events",
                "aws_profile",
                "aws_access_key",
                "strict_permissions",
                "hostnames",
                "aws_ec2_hostvars",
                "hostvars_prefix",
                "hostvars_suffix",
            )
        }
        digest = hashlib.sha256(json.dumps(query, sort_keys=True, default=str).encode()).hexdigest()[:12]
        return "%s_%s" % (super().get_cache_key(path), digest)

    def parse(self, inventory, loader, path, cache=True):
        super().parse(inventory, loader, path)
        if not aws.HAS_BOTO3:
            raise AnsibleError(
                "The fleetops.node.ec2 inventory plugin requires boto3 and botocore (pip install boto3)."
            )
        if not aws.HAS_TENACITY:
            raise AnsibleError(
                "The fleetops.node.ec2 inventory plugin requires tenacity (pip install tenacity)."
            )

        config = self._read_config_data(path)
        self._check_option_names(config, path)
        self._settings = self._validated_settings(config)
        self._warn_about_aws_ec2_names()

        # Building thousands of hosts allocates about a million tracked objects, and every full
        # collection of CPython's cyclic GC walks all live objects again: at 5,000 instances that
        # is ~45% of the time, growing faster than the fleet. Reference counting still frees
        # everything that is not cyclic; the previous GC state comes back when parsing ends.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            self._load(path, cache)
        finally:
            if gc_was_enabled:
                gc.enable()

    def _load(self, path, cache):
        cache_key = self.get_cache_key(path)
        use_cache = self.get_option("cache") and cache
        update_cache = self.get_option("cache") and not cache
        hosts = None
        if use_cache:
            try:
                cached = self._cache[cache_key]
            except KeyError:
                update_cache = True
            else:
                hosts = self._hosts_from_cache(cached)
                if hosts is None:
                    update_cache = True
                else:
                    self.display.vvv("fleetops.node.ec2: %d instances from the cache" % len(hosts))
        if hosts is None:
            hosts = self._shape(self._query())
        if update_cache:
            # The shaped hosts (hostname and host variables), not the API's answers: a listing from
            # the cache reshapes nothing and decodes a tenth of the data. One JSON string: cache
            # plugins decode nested data slowly (every dict and string is visited); the stdlib
            # decoder reads 5,000 hosts in about 15 ms.
            self._cache[cache_key] = {
                "format": CACHE_FORMAT,
                "hosts": json.dumps(hosts, separators=(",", ":")),
            }

        self._populate(hosts)

    @staticmethod
    def _hosts_from_cache(cached):
        if not isinstance(cached, dict) or cached.get("format") != CACHE_FORMAT:
            return None
        try:
            hosts = json.loads(str(cached.get("hosts")))
        except ValueError:
            return None
        if not isinstance(hosts, list) or not all(
            isinstance(h, list)
            and len(h) == 2
            and (h[0] is None or isinstance(h[0], str))
            and isinstance(h[1], dict)
            for h in hosts
        ):
            return None
        return hosts

    # ---- configuration -------------------------------------------------------------------------

    def _check_option_names(self, config, path):
        known = {"plugin"}
        for name, definition in self.option_definitions.items():
            known.add(name)
            known.update(definition.get("aliases") or [])
        unknown = sorted(str(k) for k in config if k not in known)
        if not unknown:
            return
        problems = []
        for name in unknown:
            if name in UNSUPPORTED_AWS_EC2_OPTIONS:
                problems.append("'%s' (an amazon.aws.aws_ec2 option this plugin does not implement)" % name)
                continue
            close = _closest(name, known)
            problems.append("'%s'%s" % (name, " (did you mean '%s'?)" % close if close else ""))
        raise AnsibleParserError(
            "%s: unknown option%s for fleetops.node.ec2: %s"
            % (path, "s" if len(problems) > 1 else "", ", ".join(problems))
        )

    def _validated_settings(self, config):
        s = {}
        s["regions"] = self._validated_regions(self.get_option("regions"))

        filters = self.get_option("filters")
        include = self.get_option("include_filters")
        exclude = self.get_option("exclude_filters")
        for label, sets in (("include_filters", include), ("exclude_filters", exclude)):
            for entry in sets:
                if not isinstance(entry, dict) or not entry:
                    raise AnsibleParserError(
                        "%s: every entry must be a non-empty mapping of EC2 filters, got %r" % (label, entry)
                    )
        filters_given = "filters" in config
        filter_sets = []
        if filters_given or not include:
            filter_sets.append(filters or {})
        filter_sets.extend(include)
        s["filter_sets"] = [_filter_list(f) for f in filter_sets]
        s["exclude_sets"] = [_filter_list(f) for f in exclude]

        hostnames = self.get_option("hostnames") or ["instance-id"]
        for entry in hostnames:
            names = [entry.get("name"), entry.get("prefix")] if isinstance(entry, dict) else [entry]
            if isinstance(entry, dict) and not entry.get("name"):
                raise AnsibleParserError("hostnames: a mapping entry needs a 'name', got %r" % (entry,))
            for name in names:
                if name is None or name == "":
                    continue
                if not isinstance(name, str) or not (
                    name.startswith("tag:") and len(name) > 4 or name in ATTRIBUTES
                ):
                    close = _closest(str(name), ATTRIBUTES)
                    raise AnsibleParserError(
                        "hostnames: unknown entry %r%s; use tag:NAME, tag:NAME=VALUE or one of: %s"
                        % (
                            name,
                            " (did you mean '%s'?)" % close if close else "",
                            ", ".join(sorted(ATTRIBUTES)),
                        )
                    )
        s["hostnames"] = hostnames

        page_size = self.get_option("page_size")
        if not 5 <= page_size <= 1000:
            raise AnsibleParserError("page_size must be between 5 and 1000, got %d" % page_size)
        s["page_size"] = page_size
        workers = self.get_option("max_concurrent_requests")
        if not 1 <= workers <= MAX_CONCURRENT_REQUESTS:
            raise AnsibleParserError(
                "max_concurrent_requests must be between 1 and %d, got %d" % (MAX_CONCURRENT_REQUESTS, workers)
            )
        s["max_concurrent_requests"] = workers

        # The connection options as module_utils/aws.py resolves and validates them (Ansible has
        # applied the aliases, environment variables and defaults it documents, the same ones).
        try:
            connection = aws.ConnectionSettings.from_options(
                dict((name, self.get_option(name)) for name in aws.OPTIONS), environ=os.environ
            )
        except aws.AwsSettingsError as e:
            raise AnsibleParserError(to_native(e)) from None
        self._connection = connection
        s["endpoint_url"] = connection.endpoint_url or None
        try:
            found = store.resolve(
                dict((name, self.get_option(name)) for name in store.OPTIONS), s["regions"], s["endpoint_url"]
            )
        except ValueError as e:
            raise AnsibleParserError("fleetops.node.ec2: %s" % e)
        s["store"] = dict((STORE_VARS[n], value) for n, value in enumerate(found or ()) if value)
        s["aws_profile"] = connection.aws_profile
        s["aws_access_key"] = connection.aws_access_key
        s["include_events"] = self.get_option("include_events")
        s["aws_ec2_hostvars"] = self.get_option("aws_ec2_hostvars")
        s["hostvars_prefix"] = self.get_option("hostvars_prefix") or ""
        s["hostvars_suffix"] = self.get_option("hostvars_suffix") or ""
        s["strict_permissions"] = self.get_option("strict_permissions")
        return s

    def _validated_regions(self, regions):
        if not regions:
            return []
        # partitions.json: every region of every partition botocore knows (a few ms to load).
        partitions = botocore.session.get_session().get_data("partitions").get("partitions", [])
        known = {r for p in partitions for r in p.get("regions", {}) if not r.endswith("-global")}
        result = []
        for region in regions:
            if not isinstance(region, str) or region not in known:
                close = _closest(str(region), known)
                raise AnsibleParserError(
                    "regions: %r is not an AWS region%s (botocore %s knows %d; a region newer than that "
                    "needs a newer botocore)"
                    % (
                        region,
                        ", did you mean '%s'?" % close if close else "",
                        botocore.__version__,
                        len(known),
                    )
                )
            if str(region) not in result:
                result.append(str(region))
        return result

    def _warn_about_aws_ec2_names(self):
        """Warn once per expression that uses amazon.aws.aws_ec2 variables this configuration does not set.

        With strict off, constructed features skip what fails to evaluate: without this warning an
        aws_ec2 configuration would silently lose its groups and composed variables.
        """
        if self.get_option("hostvars_prefix") or self.get_option("hostvars_suffix"):
            return
        missing = set(AWS_EC2_HOSTVARS) - {"tags"} if not self._settings["aws_ec2_hostvars"] else set()
        missing.add("tags")
        missing -= set(self.get_option("compose") or {})  # a composed variable of that name is there
        expressions = []
        for name, expr in (self.get_option("compose") or {}).items():
            expressions.append(("compose.%s" % name, expr))
        for name, expr in (self.get_option("groups") or {}).items():
            expressions.append(("groups.%s" % name, expr))
        for i, keyed in enumerate(self.get_option("keyed_groups") or []):
            if isinstance(keyed, dict):
                expressions.append(("keyed_groups[%d].key" % i, keyed.get("key")))
        env = jinja2.Environment()
        for where, expr in expressions:
            if not isinstance(expr, str):
                continue
            try:
                names = jinja2.meta.find_undeclared_variables(env.parse("{{ %s }}" % expr))
            except jinja2.TemplateError:
                continue  # Constructable reports it (fatally with strict)
            for name in sorted(names & missing):
                hint = AWS_EC2_HOSTVARS[name]
                if name == "tags":
                    advice = "use %s ('tags' is reserved in Ansible)" % hint
                else:
                    advice = "set aws_ec2_hostvars: true, or use %s" % hint
                self.display.warning(
                    "fleetops.node.ec2: %s uses %r, an amazon.aws.aws_ec2 host variable this "
                    "configuration does not set; %s" % (where, name, advice)
                )

    # ---- AWS calls -----------------------------------------------------------------------------

    def _get_session(self):
        if self._session is None:
            core = botocore.session.get_session()
            # The answers' timestamps become ISO 8601 strings again (_jsonable): parse the ones EC2
            # writes with the stdlib, not dateutil (a third of the CPU of parsing DescribeInstances).
            core.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=_timestamp)
            try:
                self._session = aws.session(self._connection, botocore_session=core)
            except aws.AwsError as e:
                raise AnsibleError(to_native(e)) from None
        return self._session

    def _client(self, region):
        if region in self._clients:
            return self._clients[region]
        try:
            client = aws.client(
                self._connection,
                "ec2",
                region,
                aws_session=self._get_session(),
                user_agent="fleetops.node.ec2",
            )
        except aws.AwsError as e:
            raise AnsibleError(to_native(e)) from None
        self._clients[region] = client
        return client

    def _call(self, operation, region, func):
        """Run one API request under our retry budget; AnsibleError naming the call when it runs out."""
        try:
            return aws.call(
                self._connection,
                operation,
                region,
                func,
                on_retry=lambda line: self.display.vvv("fleetops.node.ec2: " + line),
            )
        except aws.AwsError as e:
            if e.code == "UnauthorizedOperation" and not self.get_option("strict_permissions"):
                raise _RegionDenied(e.cause) from None
            raise AnsibleError(to_native(e)) from None

    def _pages(self, region, operation, method, kwargs, page_size=None):
        """Every page of a paginated call; each page is one retried request.

        A botocore PageIterator cannot go on after an exception, so every page gets a fresh
        paginator started at the previous page's token: a throttled page is retried alone.
        """
        client = self._client(region)
        paginator = client.get_paginator(method)
        encoder = botocore.paginate.TokenEncoder()
        token = None
        seen = set()
        while True:
            pagination = {}
            if page_size:
                pagination["PageSize"] = page_size
            if token:
                pagination["StartingToken"] = encoder.encode({"NextToken": token})

            page = self._call(
                operation, region, functools.partial(_first_page, paginator, pagination, kwargs)
            )
            yield page
            token = page.get("NextToken")
            if not token:
                return
            if token in seen:
                raise AnsibleError(
                    "Failed to call ec2:%s in %s: the endpoint repeated pagination token %r"
                    % (operation, region, token)
                )
            seen.add(token)

    def _regions(self):
        if self._settings["regions"]:
            return self._settings["regions"]
        region = self._get_session().region_name or "us-east-1"
        answer = self._call("DescribeRegions", region, lambda: self._client(region).describe_regions())
        return sorted(r["RegionName"] for r in answer.get("Regions", []))

    def _list_instances(self, region, filters, on_page=None):
        """Every instance the filters match in region, in the API's order; on_page(instances) hears of each page."""
        instances = []
        for page in self._pages(
            region,
            "DescribeInstances",
            "describe_instances",
            {"Filters": filters},
            page_size=self._settings["page_size"],
        ):
            listed = []
            for reservation in page.get("Reservations", []):
                for instance in reservation.get("Instances", []):
                    instance["OwnerId"] = reservation.get("OwnerId", "")
                    instance["RequesterId"] = reservation.get("RequesterId", "")
                    instance["ReservationId"] = reservation.get("ReservationId", "")
                    listed.append(instance)
            instances.extend(listed)
            if on_page is not None:
                on_page(listed)
        return instances

    def _statuses(self, region, chunk):
        """DescribeInstanceStatus for at most STATUS_CHUNK instance IDs (the API's limit): their items."""
        kwargs = {"InstanceIds": chunk, "IncludeAllInstances": True}
        return [
            status
            for page in self._pages(region, "DescribeInstanceStatus", "describe_instance_status", kwargs)
            for status in page.get("InstanceStatuses", [])
        ]

    def _not_ok_statuses(self, region, filters):
        """DescribeInstanceStatus of the region's running instances the filters match (one of NOT_OK_FILTERS)."""
        return [
            status
            for page in self._pages(
                region,
                "DescribeInstanceStatus",
                "describe_instance_status",
                {"Filters": filters},
                page_size=STATUS_PAGE_SIZE,
            )
            for status in page.get("InstanceStatuses", [])
        ]

    def _query(self):
        """Every region's instances and statuses, as records in a stable order (regions as given, then IDs).

        The requests run in one pool of max_concurrent_requests threads: every listing (a region's
        filter sets and exclude sets) is one task, its pages one after another; the status calls
        are tasks too: the region's NOT_OK_FILTERS calls, sent with the listings, and for the kept
        instances that are not running, calls of up to STATUS_CHUNK instance IDs, sent as soon as
        a page names them (after the region's exclude listings, when it has some), so they overlap
        the listing. The clients are made here, before the threads start: one per region, shared
        by its tasks (a boto3 client is thread-safe, a session is not).
        """
        regions = self._regions()
        for region in regions:
            self._client(region)
        include_events = self._settings["include_events"]
        with concurrent.futures.ThreadPoolExecutor(
            max_workers=self._settings["max_concurrent_requests"], thread_name_prefix="fleetops-ec2"
        ) as pool:
            try:
                listings = [_RegionListing(self, pool, region, include_events) for region in regions]
                records = []
                for listing in listings:
                    records.extend(listing.records())
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)  # no request is sent after a failure
                raise
        return records

    # ---- inventory -----------------------------------------------------------------------------

    def _hostname(self, instance, tags):
        for entry in self._settings["hostnames"]:
            if isinstance(entry, dict):
                name = self._one_hostname(entry["name"], instance, tags)
                prefix = self._one_hostname(entry["prefix"], instance, tags) if entry.get("prefix") else None
                if name and prefix:
                    name = "%s%s%s" % (prefix, entry.get("separator", "_"), name)
            else:
                name = self._one_hostname(entry, instance, tags)
            if name:
                return str(name)  # _populate makes names with ':' safe, as Ansible's settings say now
        return None

    @staticmethod
    def _one_hostname(entry, instance, tags):
        if entry.startswith("tag:"):
            return _tag_hostname(entry[4:], tags)
        return _lookup(instance, ATTRIBUTES[entry])

    def _hostvars(self, record, tags):
        instance = record["instance"]
        placement = instance.get("Placement") or {}
        az = placement.get("AvailabilityZone", "")
        hostvars = {}
        if self._settings["aws_ec2_hostvars"]:
            hostvars = _snake({k: v for k, v in instance.items() if k != "Tags"})
            hostvars.setdefault("placement", {})["region"] = record["region"]
            prefix, suffix = self._settings["hostvars_prefix"], self._settings["hostvars_suffix"]
            if prefix or suffix:
                # 'tags' is a reserved name (a play keyword); only a renamed copy can be a host variable.
                hostvars["tags"] = tags
                hostvars = {prefix + k + suffix: v for k, v in hostvars.items()}
        hostvars.update(
            {
                "ec2_instance_id": instance.get("InstanceId"),
                "ec2_instance_type": instance.get("InstanceType"),
                "ec2_az": az,
                "ec2_region": record["region"],
                "ec2_image_id": instance.get("ImageId"),
                "ec2_tags": tags,
                "ec2_private_ip": instance.get("PrivateIpAddress"),
                "ec2_launch_time": instance.get("LaunchTime"),
                "ec2_state": (instance.get("State") or {}).get("Name"),
            }
        )
        status = record.get("status")
        if self._settings["include_events"] and status is not None:
            hostvars["ec2_scheduled_events"] = [
                {
                    "code": event.get("Code"),
                    "description": event.get("Description"),
                    "not_before": event.get("NotBefore"),
                    "not_after": event.get("NotAfter"),
                    "not_before_deadline": event.get("NotBeforeDeadline"),
                    "instance_event_id": event.get("InstanceEventId"),
                }
                for event in status.get("Events") or []
            ]
            hostvars["ec2_status_checks"] = {
                "system": (status.get("SystemStatus") or {}).get("Status"),
                "instance": (status.get("InstanceStatus") or {}).get("Status"),
            }
        if instance.get("PrivateIpAddress"):
            hostvars["ansible_host"] = instance["PrivateIpAddress"]
        return hostvars

    def _shape(self, records):
        """[hostname (None when no preference yields one), host variables] per instance, as cached."""
        hosts = []
        for record in records:
            tags = _tags(record["instance"])
            hosts.append([self._hostname(record["instance"], tags), self._hostvars(record, tags)])
        return hosts

    def _populate(self, hosts):
        strict = self.get_option("strict")
        compose = self.get_option("compose")
        groups = self.get_option("groups")
        keyed_groups = self.get_option("keyed_groups")
        inventory = self.inventory
        add_host = inventory.add_host
        known_hosts = inventory.hosts
        known_groups = inventory.groups
        add_child = inventory.add_child
        writer = _HostvarsWriter(inventory)
        default_groups = {}  # ("az" | "type", value) -> group name
        inventory.add_group("ec2")
        for name, value in sorted(self._settings.get("store", {}).items()):
            inventory.set_variable("ec2", name, value)  # the playbooks hand them to fleetops.node.ec2_lease
        named = []
        for hostname, hostvars in hosts:
            if not hostname:
                self.display.vvv(
                    "fleetops.node.ec2: %s has no hostname from %s; left out"
                    % (hostvars.get("ec2_instance_id"), self._settings["hostnames"])
                )
                continue
            if ":" in hostname:
                hostname = self._sanitize_group_name(hostname)
            named.append((hostname, hostvars))
        # A hostname several instances share (two EC2 Name tags alike) is never dropped silently nor
        # given to one of them: each of those instances is named "<hostname>-<instance id>".
        sharing = {}
        for hostname, hostvars in named:
            sharing.setdefault(hostname, []).append(hostvars.get("ec2_instance_id"))
        duplicates = [(h, ids) for h, ids in sharing.items() if len(ids) > 1]
        for hostname, hostvars in named:
            instance_id = hostvars.get("ec2_instance_id")
            if len(sharing[hostname]) > 1:
                hostname = "%s-%s" % (hostname, instance_id)
            new = hostname not in known_hosts
            add_host(hostname, group="ec2")
            writer.set(hostname, hostvars, new)
            for prefix, value in (("az", hostvars["ec2_az"]), ("type", hostvars["ec2_instance_type"])):
                if value:
                    group = default_groups.get((prefix, value))
                    if group is None:
                        group = default_groups[(prefix, value)] = inventory.add_group(
                            _group_name(prefix, value)
                        )
                    if hostname in known_groups:
                        add_host(hostname, group=group)
                    else:  # the same, a little cheaper: add_child takes a name as a group's first
                        add_child(group, hostname)
            if compose:
                self._set_composite_vars(compose, hostvars, hostname, strict=strict)
            if groups:
                self._add_host_to_composed_groups(groups, hostvars, hostname, strict=strict)
            if keyed_groups:
                self._add_host_to_keyed_groups(keyed_groups, hostvars, hostname, strict=strict)
        for hostname, ids in duplicates[:MAX_DUPLICATE_WARNINGS]:
            self.display.warning(
                "fleetops.node.ec2: %d instances share hostname %r (%s); each is named %r"
                % (len(ids), hostname, ", ".join(str(i) for i in ids), hostname + "-<instance id>")
            )
        if len(duplicates) > MAX_DUPLICATE_WARNINGS:
            self.display.warning(
                "fleetops.node.ec2: %d more shared hostnames, named the same way; choose hostnames that are "
                "unique (instance-id is)" % (len(duplicates) - MAX_DUPLICATE_WARNINGS)
            )
