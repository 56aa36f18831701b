# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The EC2 tag lease's protocol: one lock on EC2 instances for the CLI's rollouts and for AWX jobs.

Shared by the controller's ``fleetops.rollout.lease`` (an operator's ``fleetops remediate``) and the
module ``fleetops.node.ec2_lease`` (the remediation and reboot playbooks, in AWX or by hand), so both
write, read and judge the same tags:

    fleetops:lease:<rollout id> = {"operator":"alice@bastion","since":"...Z","expires":"...Z"}

- every rollout writes its *own* key (EC2 tags have no compare-and-swap: nobody's write erases
  another's); the value is compact JSON of at most 256 bytes of UTF-8 (``encode``: a long operator
  is shortened, never the JSON);
- a lease is live until ``expires``; an unreadable value never expires (someone must break it);
- of the live leases on an instance, the one taken first wins: the lower ``since``, then the lower
  rollout id (``LeaseRecord.order``); after writing, a taker waits ``settle`` seconds, reads the
  tags again and gives up (removing its own tags) where it is not first (``beaten``);
- removal names the key *and* the value: EC2 deletes such a tag only while it still has that value,
  so a lease nobody holds any more is never removed by mistake.

The pure parts (``encode``, ``LeaseRecord``, ``plan_take``, ``beaten``, ``check_times``) need only the
standard library; ``Ec2Tags`` does the DescribeTags / CreateTags / DeleteTags calls through
``module_utils/aws.py`` (client factory, retries, error texts), so its errors are ``aws.AwsError``.
Importable on Python >= 3.9.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import calendar
import functools
import json
import math
import re
import time

from ansible_collections.fleetops.node.plugins.module_utils import aws

KEY_PREFIX = "fleetops:lease:"
DEFAULT_TTL_S = 900.0
DEFAULT_SETTLE_S = 2.0
MAX_TTL_S = 86400.0  # a crashed controller's lease blocks others this long at most
MAX_SETTLE_S = 300.0
TAG_VALUE_MAX = 256  # EC2: 256 Unicode characters; kept to 256 bytes of UTF-8, which satisfies any count
TAG_KEY_MAX = 128  # EC2: 128 characters
ELLIPSIS = "\u2026"
FILTER_CHUNK = 200  # values per DescribeTags filter
TAG_CHUNK = 500  # resources per CreateTags / DeleteTags call
# A rollout id as a tag key part: the characters EC2 allows in a key (no spaces), within the key's limit.
ROLLOUT_NAME = re.compile(r"^[A-Za-z0-9+\-=._:/@]{1,%d}$" % (TAG_KEY_MAX - len(KEY_PREFIX)))
UNREADABLE = "unknown (unreadable lease tag)"


class LeaseSettingsError(ValueError):
    """A TTL, settle time or rollout id that cannot work."""


def iso(ts):
    """``2026-01-01T00:00:00Z`` (whole seconds, UTC)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def parse_iso(text):
    return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))


def check_settle(settle):
    if (
        isinstance(settle, bool)
        or not isinstance(settle, (int, float))
        or not math.isfinite(settle)
        or not 0 <= settle <= MAX_SETTLE_S
    ):
        raise LeaseSettingsError(
            "the lease settle time must be between 0 and %g seconds, got %r" % (MAX_SETTLE_S, settle)
        )
    return float(settle)


def check_times(ttl, settle=DEFAULT_SETTLE_S):
    """``(ttl, settle)`` as floats, checked: settle in [0, MAX_SETTLE_S], settle < ttl <= MAX_TTL_S."""
    settle = check_settle(settle)
    if (
        isinstance(ttl, bool)
        or not isinstance(ttl, (int, float))
        or not math.isfinite(ttl)
        or not settle < ttl <= MAX_TTL_S
    ):
        raise LeaseSettingsError(
            "the lease TTL must be a number of seconds above the settle time (%gs) and at most %g, got %r"
            % (settle, MAX_TTL_S, ttl)
        )
    return float(ttl), settle


def check_rollout(rollout):
    if not isinstance(rollout, str) or not ROLLOUT_NAME.match(rollout):
        raise LeaseSettingsError(
            "a rollout id is 1 to %d of the characters A-Z a-z 0-9 + - = . _ : / @, got %r"
            % (TAG_KEY_MAX - len(KEY_PREFIX), rollout)
        )
    return rollout


# ---- the tag value -------------------------------------------------------------------------------


def _size(text):
    """Bytes of ``text`` in the tag value: JSON-escaped (ensure_ascii off), in UTF-8."""
    return len(json.dumps(text, ensure_ascii=False).encode("utf-8")) - 2


def _fit(text, budget):
    """``text``, or its longest prefix + an ellipsis, of at most ``budget`` bytes (whole characters)."""
    if _size(text) <= budget:
        return text
    room, kept = budget - _size(ELLIPSIS), []
    for ch in text:
        room -= _size(ch)
        if room < 0:
            break
        kept.append(ch)
    return "".join(kept) + ELLIPSIS


def _shorten(operator, budget):
    """``user@controller`` in ``budget`` bytes: a part that fits in half is kept whole, the rest shortened."""
    if "@" not in operator:
        return _fit(operator, budget)
    user, host = operator.rsplit("@", 1)
    room = budget - 1
    if _size(host) <= room // 2:
        return _fit(user, room - _size(host)) + "@" + host
    if _size(user) <= room // 2:
        return user + "@" + _fit(host, room - _size(user))
    return _fit(user, room // 2) + "@" + _fit(host, room - room // 2)


def encode(operator, since, expires):
    """The lease tag's value: compact JSON of at most TAG_VALUE_MAX bytes; the operator is shortened to fit.

    Non-ASCII is written as is (``\\u00e9`` would take 6 bytes for a 2-byte character); lone
    surrogates (an undecodable user name) become ``?``.
    """
    operator = operator.encode("utf-8", "replace").decode("utf-8")

    def dump(op):
        data = {"operator": op, "since": iso(since), "expires": iso(expires)}
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))

    value = dump(operator)
    if len(value.encode("utf-8")) > TAG_VALUE_MAX:
        value = dump(_shorten(operator, TAG_VALUE_MAX - len(dump("").encode("utf-8"))))
    return value


class LeaseRecord:
    """One instance's lease tag of one rollout: rollout, operator, since, expires, value (exact)."""

    __slots__ = ("rollout", "operator", "since", "expires", "value")

    def __init__(self, rollout, operator, since, expires, value):
        self.rollout = rollout
        self.operator = operator
        self.since = since
        self.expires = expires
        self.value = value  # the tag's exact value (what a conditional DeleteTags must name)

    @classmethod
    def parse(cls, key, value):
        rollout = key[len(KEY_PREFIX) :]
        try:
            data = json.loads(value)
            return cls(
                rollout, str(data["operator"]), parse_iso(data["since"]), parse_iso(data["expires"]), value
            )
        except (ValueError, KeyError, TypeError):
            # unreadable: its expiry is unknown, so it holds until someone breaks it
            return cls(rollout, UNREADABLE, 0.0, float("inf"), value)

    def __eq__(self, other):
        return isinstance(other, LeaseRecord) and all(
            getattr(self, name) == getattr(other, name) for name in self.__slots__
        )

    def __hash__(self):
        return hash(tuple(getattr(self, name) for name in self.__slots__))

    def __repr__(self):
        return "LeaseRecord(%s)" % ", ".join("%s=%r" % (n, getattr(self, n)) for n in self.__slots__)

    def order(self):
        """Who wins among live leases: the lowest (since, rollout)."""
        return (self.since, self.rollout)

    def live(self, now):
        return self.expires > now

    def describe(self, now):
        """``rollout R by alice@bastion, expires 2026-...Z (in 840s)``."""
        if self.expires == float("inf"):
            return "rollout %s (%s)" % (self.rollout, self.operator)
        left = self.expires - now
        when = "expires %s" % iso(self.expires) + (" (in %.0fs)" % left if left > 0 else " (expired)")
        return "rollout %s by %s, %s" % (self.rollout, self.operator, when)

    def as_dict(self, now):
        return {
            "rollout": self.rollout,
            "operator": self.operator,
            "since": iso(self.since) if self.expires != float("inf") else None,
            "expires": iso(self.expires) if self.expires != float("inf") else None,
            "live": self.live(now),
        }


# ---- the rules -----------------------------------------------------------------------------------


def where(host, instance):
    """``gpu-1 (i-0abc...)``, or the instance id alone when it is the host's name."""
    return instance if host == instance else "%s (%s)" % (host, instance)


def plan_take(targets, leases, rollout, now, break_lock=False):
    """What taking the lease on ``targets`` ({instance id: host}) must do, given the tags read.

    ``leases``: {instance id: {rollout: LeaseRecord}}. Returns a dict:

    - ``conflicts``: ["host (i-...): rollout R by op, expires ..."], live leases of other rollouts
      (refuse when not empty);
    - ``removals``: [(instance id, LeaseRecord, why)] of other rollouts' leases to remove first: the
      expired ones (why ``"expired"``), and live ones ``break_lock`` names (True: any; a rollout id:
      that one; why ``"broken"``);
    - ``own_since``: the earliest ``since`` of our own live lease (a resumed rollout keeps its place),
      or None.
    """
    conflicts, removals, own_since = [], [], None
    for instance in sorted(leases):
        host = targets.get(instance, instance)
        for rid, record in sorted(leases[instance].items()):
            if rid == rollout:
                if record.live(now):
                    own_since = record.since if own_since is None else min(own_since, record.since)
                continue
            if not record.live(now):
                removals.append((instance, record, "expired"))
            elif break_lock is True or (break_lock and break_lock == rid):
                removals.append((instance, record, "broken"))
            else:
                conflicts.append("%s: %s" % (where(host, instance), record.describe(now)))
    return {"conflicts": conflicts, "removals": removals, "own_since": own_since}


def beaten(targets, leases, rollout, since, now):
    """Instances where our lease is gone, or a live lease taken before ours is there too.

    ``targets``: {instance id: host}; ``since``: when we took ours. A line per such instance.
    """
    mine = (since, rollout)
    lost = []
    for instance in sorted(targets):
        host = targets[instance]
        held = leases.get(instance, {})
        if rollout not in held:
            lost.append("%s: our lease tag is gone (broken by another rollout?)" % where(host, instance))
            continue
        first = min((r for r in held.values() if r.live(now) or r.rollout == rollout), key=LeaseRecord.order)
        if first.order() < mine:
            lost.append("%s: %s" % (where(host, instance), first.describe(now)))
    return lost


def refusal(conflicts, hint=""):
    """The one line that refuses a take: how many instances, who holds them, until when."""
    return "Failed to take the EC2 lease on %d instance(s) held by another rollout: %s%s.%s" % (
        len(conflicts),
        "; ".join(conflicts[:5]),
        " and %d more" % (len(conflicts) - 5) if len(conflicts) > 5 else "",
        " " + hint if hint else "",
    )


def lost_race(lines):
    return (
        "Failed to take the EC2 lease: another rollout took it at the same time and was first on %d "
        "instance(s): %s. Nothing was changed; try again later" % (len(lines), "; ".join(lines[:5]))
    )


# ---- the EC2 calls -------------------------------------------------------------------------------


class Ec2Tags:
    """The lease's EC2 calls for instances spread over regions, under module_utils/aws.py's budget.

    ``regions``: {instance id: region}. Every failure is an ``aws.AwsError`` naming the call.
    """

    def __init__(self, settings, regions, user_agent="fleetops.lease", on_retry=None):
        self.settings = settings
        self.regions = dict(regions)
        self.user_agent = user_agent
        self.on_retry = on_retry
        self._session = None
        self._clients = {}

    def by_region(self, instance_ids=None):
        """{region: [instance ids]} of ``instance_ids`` (default: all), sorted."""
        out = {}
        for instance in sorted(self.regions if instance_ids is None else instance_ids):
            out.setdefault(self.regions[instance], []).append(instance)
        return out

    def client(self, region):
        if region not in self._clients:
            if self._session is None:
                self._session = aws.session(self.settings)
            self._clients[region] = aws.client(
                self.settings, "ec2", region, aws_session=self._session, user_agent=self.user_agent
            )
        return self._clients[region]

    def _call(self, operation, region, func):
        return aws.call(self.settings, operation, region, func, on_retry=self.on_retry)

    def read(self):
        """{instance id: {rollout: LeaseRecord}} for every lease tag on the instances."""
        leases = {}
        for region, ids in self.by_region().items():
            client = self.client(region)
            wanted = set(ids)
            for start in range(0, len(ids), FILTER_CHUNK):
                filters = [
                    {"Name": "resource-id", "Values": ids[start : start + FILTER_CHUNK]},
                    {"Name": "key", "Values": [KEY_PREFIX + "*"]},
                ]
                token = None
                while True:
                    kwargs = {"Filters": filters, "MaxResults": 1000}
                    if token:
                        kwargs["NextToken"] = token
                    page = self._call(
                        "DescribeTags", region, functools.partial(client.describe_tags, **kwargs)
                    )
                    for tag in page.get("Tags", []):
                        key = str(tag.get("Key", ""))
                        if key.startswith(KEY_PREFIX) and tag.get("ResourceId") in wanted:
                            record = LeaseRecord.parse(key, str(tag.get("Value", "")))
                            leases.setdefault(str(tag["ResourceId"]), {})[record.rollout] = record
                    token = page.get("NextToken")
                    if not token:
                        break
        return leases

    def _chunks(self, operation, instance_ids, key, value):
        for region, ids in self.by_region(instance_ids).items():
            client = self.client(region)
            method = client.create_tags if operation == "CreateTags" else client.delete_tags
            for start in range(0, len(ids), TAG_CHUNK):
                self._call(
                    operation,
                    region,
                    functools.partial(
                        method, Resources=ids[start : start + TAG_CHUNK], Tags=[{"Key": key, "Value": value}]
                    ),
                )

    def write(self, instance_ids, key, value):
        """CreateTags ``key`` = ``value`` on the instances."""
        self._chunks("CreateTags", instance_ids, key, value)

    def delete(self, instance_ids, key, value):
        """DeleteTags ``key`` where it still has ``value`` (EC2 leaves a tag whose value differs)."""
        self._chunks("DeleteTags", instance_ids, key, value)
