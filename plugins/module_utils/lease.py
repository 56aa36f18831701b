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
import contextlib
import functools
import json
import math
import re
import time

from ansible_collections.fleetops.node.plugins.module_utils import aws
from ansible_collections.fleetops.node.plugins.module_utils import store as sp

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


# ---- the lease in the shared store ---------------------------------------------------------------
#
# With a shared store (module_utils/store.py: DynamoDB, every write conditional on the version read),
# the store is the lease's source of truth and the tags above are its mirror:
#
# - ``rollout#<id>`` = {"operator", "since", "expires", "controller", "instances"}: one item per
#   rollout; renewing writes it alone (conditional on its version).
# - ``lease#<instance id>`` = {"rollout": id}: who holds the instance. Taken with a conditional put:
#   when the item is absent, when its rollout's item is gone (released, or broken), or after deleting
#   that rollout's item at the version read because it expired (or ``break_lock`` names it). Deleting
#   the holder's item first is what fences it: its next renewal is refused, so it knows it lost.
# - The writes go in transactions of at most 100 (store.TRANSACT_MAX): a take of up to about a hundred
#   instances is all or nothing. A larger one takes its instances in sorted order, so of two takers whose
#   sets overlap one always wins the first instance they share and the other rolls back what it took
#   (nothing is kept) and refuses.
# - The tags are written after the store take, with the same value a tag lease has, so a controller
#   that still uses tags alone sees who holds the instance; a live tag of a rollout the store does not
#   know (such a controller's) refuses the take. Releasing removes the tags, then the items.
ROLLOUT_ITEM = "rollout#"
INSTANCE_ITEM = "lease#"
BROKEN_WHY = {
    "expired": "its lease had expired",
    "dead": "its process on this controller is gone",
    "broken": "broken (--break-lock)",
}
TAKE_TRIES = 3  # a take that meets a concurrent change reads again this many times before refusing


class StoreLeaseError(Exception):
    """The take is refused: another rollout holds (or took at the same time) some of the instances."""


class StoreLeaseLost(Exception):
    """Our rollout item was broken, taken over or is gone: we hold nothing any more."""


def holder_of(item):
    """The rollout a ``lease#`` item names, or None when it names none readably."""
    holder = item.doc.get("rollout") if isinstance(item.doc, dict) else None
    return holder if isinstance(holder, str) and holder else None


def rollout_record(rollout, item):
    """The LeaseRecord of a ``rollout#`` item (an unreadable one never expires: someone must break it)."""
    doc = item.doc if isinstance(item.doc, dict) else None
    try:
        return LeaseRecord(rollout, str(doc["operator"]), float(doc["since"]), float(doc["expires"]), item.raw)
    except (TypeError, KeyError, ValueError):
        return LeaseRecord(rollout, UNREADABLE, 0.0, float("inf"), item.raw)


def plan_store_take(targets, instances, rollouts, rollout, now, break_lock=False, dead=None):
    """What taking ``targets`` ({instance id: host}) in the store must do, given what was read.

    ``instances``: {instance id: Item of ``lease#<id>``}; ``rollouts``: {rollout id: Item}. A dict:
    ``conflicts`` (lines, as plan_take's), ``breaks`` ({rollout id: (version, LeaseRecord, why)}: their
    items to delete first), ``claims`` ([(instance id, version expected or None)]: the lease items to
    write; an instance already ours is not written: ``ours`` {instance id: version}), ``own`` (our
    rollout Item or None) and
    ``own_since`` (the ``since`` of our live rollout item: a resumed rollout keeps its place).
    ``dead``: a predicate on a holder's ``controller``: True when its process is known to be gone (on
    this machine, in this PID namespace: fleetops.util.dead_here), so its live lease is taken over at once
    instead of waited out."""
    conflicts, breaks, claims, ours = [], {}, [], {}
    own = rollouts.get(rollout)
    own_since = None
    if own is not None:
        record = rollout_record(rollout, own)
        if record.live(now) and record.expires != float("inf"):
            own_since = record.since
    for instance in sorted(targets):
        host = targets[instance]
        item = instances.get(instance)
        if item is None:
            claims.append((instance, None))
            continue
        holder = holder_of(item)
        if holder is None:
            if break_lock is True:  # --break-lock without a rollout: any stale lock, this one too
                claims.append((instance, item.version))
            else:
                conflicts.append(
                    "%s: an unreadable lease item in the store (kept; --break-lock takes it)" % where(host, instance)
                )
            continue
        if holder == rollout:
            if own is None:  # our rollout item is gone: ours no longer (a resume takes it again)
                claims.append((instance, item.version))
            else:
                ours[instance] = item.version
            continue
        theirs = rollouts.get(holder)
        if theirs is None:  # released, or broken: the item is left over
            claims.append((instance, item.version))
            continue
        record = rollout_record(holder, theirs)
        if not record.live(now):
            breaks.setdefault(holder, (theirs.version, record, "expired"))
        elif dead is not None and isinstance(theirs.doc, dict) and dead(theirs.doc.get("controller")):
            breaks.setdefault(holder, (theirs.version, record, "dead"))
        elif break_lock is True or (break_lock and break_lock == holder):
            breaks.setdefault(holder, (theirs.version, record, "broken"))
        else:
            conflicts.append("%s: %s" % (where(host, instance), record.describe(now)))
            continue
        claims.append((instance, item.version))
    return {
        "conflicts": conflicts,
        "breaks": breaks,
        "claims": claims,
        "ours": ours,
        "own": own,
        "own_since": own_since,
    }


def store_leases(backend, now):
    """Every rollout lease in the store, for people: ``[(LeaseRecord, [instance ids])]`` sorted by when
    it was taken; a lease item whose rollout item is gone (released or broken midway) is left out."""
    rollouts = dict((i.key[len(ROLLOUT_ITEM):], i) for i in backend.items(ROLLOUT_ITEM))
    held = {}
    for item in backend.items(INSTANCE_ITEM):
        holder = holder_of(item)
        if holder in rollouts:
            held.setdefault(holder, []).append(item.key[len(INSTANCE_ITEM):])
    records = [rollout_record(rid, item) for rid, item in rollouts.items()]
    return [(r, sorted(held.get(r.rollout, []))) for r in sorted(records, key=LeaseRecord.order)]


class StoreLease:
    """One rollout's lease on its instances in the shared store, with the tags as its mirror.

    ``backend``: module_utils/store.py's DynamoStore or MemoryStore; ``targets``: {instance id: host};
    ``tags``: an Ec2Tags for the mirror (None: no mirror). ``acquire``, ``renew``, ``problems`` (why it
    is not held: what the module's checked state reads), ``release``; ``load`` fills what a fresh process
    (the module's renewed, checked and released) needs. store.StoreError for a store that fails; aws.AwsError for
    the mirror's tag calls; StoreLeaseError for a refused take; StoreLeaseLost when it is not held."""

    def __init__(
        self, backend, rollout, targets, operator, ttl, tags=None, clock=time.time, controller="", dead=None
    ):
        self.backend = backend
        self.rollout = rollout
        self.targets = dict(targets)
        self.operator = operator
        self.ttl = float(ttl)
        self.tags = tags
        self.clock = clock
        self.controller = controller
        self.dead = dead  # see plan_store_take
        self.version = None  # our rollout item's
        self.since = None
        self.expires = None
        self.created = False  # this take wrote our rollout item first (a rollback deletes it)
        self.held = {}  # instance id -> the version of its lease item we wrote or read
        self.taken = set()  # the lease items this take wrote (a rollback deletes them)
        self.tag_value = None
        self.broken = []  # lines: whose leases this take broke or took over
        self.seen = ({}, {})  # what the last take read: ({instance id: Item}, {rollout id: Item})

    @property
    def key(self):
        return KEY_PREFIX + self.rollout

    def _doc(self, since, expires):
        return {
            "operator": self.operator,
            "since": since,
            "expires": expires,
            "controller": self.controller,
            "instances": len(self.targets),
        }

    def _skew(self):
        sp.check_skew(self.backend.skew)

    def read(self):
        """``({instance id: Item}, {rollout id: Item})``: our instances' lease items and every rollout item."""
        instances = dict(
            (i.key[len(INSTANCE_ITEM):], i)
            for i in self.backend.items(INSTANCE_ITEM)
            if i.key[len(INSTANCE_ITEM):] in self.targets
        )
        rollouts = dict((i.key[len(ROLLOUT_ITEM):], i) for i in self.backend.items(ROLLOUT_ITEM))
        return instances, rollouts

    def leases(self, instances, rollouts, now):
        """{instance id: {rollout: LeaseRecord}} as the store has them (the module's ``leases``)."""
        out = {}
        for instance, item in sorted(instances.items()):
            holder = holder_of(item)
            if holder in rollouts:
                out[instance] = {holder: rollout_record(holder, rollouts[holder])}
        return out

    def acquire(self, break_lock=False, dry_run=False):
        """Take every instance, or raise StoreLeaseError (nothing kept). The plan when ``dry_run``."""
        for attempt in range(TAKE_TRIES):
            instances, rollouts = self.seen = self.read()
            self._skew()
            now = self.clock()
            plan = plan_store_take(self.targets, instances, rollouts, self.rollout, now, break_lock, self.dead)
            if plan["conflicts"]:
                raise StoreLeaseError(refusal(plan["conflicts"], "Wait for it, resume it, or break it if it is stale"))
            mirror = self._mirror_plan(plan, rollouts, now, break_lock)
            since = plan["own_since"] if plan["own_since"] is not None else float(int(now))
            if dry_run:
                return plan
            try:
                self._take(plan, since, now)
            except sp.Conflict:
                self._rollback()
                if attempt + 1 < TAKE_TRIES:
                    continue
                raise StoreLeaseError(
                    "Failed to take the lease in the store: another rollout took some of the instances at the "
                    "same time. Nothing was kept; try again later"
                )
            except BaseException:  # a store that failed midway, or a signal: give back what was taken
                self._rollback()
                raise
            self.broken = [
                "rollout %s: %s" % (rid, BROKEN_WHY[why]) for rid, (_v, _record, why) in sorted(plan["breaks"].items())
            ]
            try:
                self._write_mirror(mirror)
            except BaseException:  # the mirror could not be written (or a signal): hold nothing
                with contextlib.suppress(Exception):
                    self.release()
                raise
            return plan
        raise AssertionError("unreachable")

    def _take(self, plan, since, now):
        """Our rollout item, the breaks and the claims, in that order, in transactions of at most
        TRANSACT_MAX writes: a take of up to about a hundred instances is all or nothing; a larger one
        is given back by ``_rollback`` when a later transaction is refused."""
        expires = now + self.ttl
        own = plan["own"]
        ops = [("put", ROLLOUT_ITEM + self.rollout, self._doc(since, expires), own.version if own else None)]
        # deleting a holder's item fences it: its next renewal is refused
        ops += [("delete", ROLLOUT_ITEM + rid, version) for rid, (version, _r, _w) in sorted(plan["breaks"].items())]
        ops += [("put", INSTANCE_ITEM + instance, {"rollout": self.rollout}, expect) for instance, expect in plan["claims"]]
        self.held, self.taken = dict(plan["ours"]), set()
        for start in range(0, len(ops), sp.TRANSACT_MAX):
            chunk = ops[start : start + sp.TRANSACT_MAX]
            written = self.backend.transact(chunk)
            for n, op in enumerate(chunk):
                item = written[n]
                if op[1] == ROLLOUT_ITEM + self.rollout:
                    self.version, self.since, self.expires, self.created = item.version, since, expires, own is None
                elif op[1].startswith(INSTANCE_ITEM):
                    instance = op[1][len(INSTANCE_ITEM):]
                    self.held[instance] = item.version
                    self.taken.add(instance)

    def _rollback(self):
        """Give back what a refused take wrote (each conditional: what someone else changed is theirs)."""
        for instance in sorted(self.taken):
            if instance in self.held:
                with contextlib.suppress(sp.StoreError):
                    self.backend.delete(INSTANCE_ITEM + instance, self.held[instance])
        self.held, self.taken = {}, set()
        if self.created and self.version is not None:
            with contextlib.suppress(sp.StoreError):
                self.backend.delete(ROLLOUT_ITEM + self.rollout, self.version)
        self.version = None
        self.created = False

    def _mirror_plan(self, plan, rollouts, now, break_lock):
        """The mirror's tags read: a live tag lease of a rollout the store does not know (a controller
        that uses tags alone) refuses; its expired ones are removed, and so are the mirror tags of the
        holders ``plan`` breaks (their items go, their tags go with them). None without a mirror."""
        if self.tags is None:
            return None
        tagged = self.tags.read()
        foreign = dict(
            (instance, dict((rid, rec) for rid, rec in held.items() if rid not in rollouts and rid != self.rollout))
            for instance, held in tagged.items()
        )
        mirror = plan_take(self.targets, foreign, self.rollout, now, break_lock)
        if mirror["conflicts"]:
            raise StoreLeaseError(refusal(mirror["conflicts"], "It is a lease in EC2 tags only: wait for it"))
        mirror["removals"] += [
            (instance, record, "broken")
            for instance, held in sorted(tagged.items())
            for rid, record in sorted(held.items())
            if rid in plan["breaks"]
        ]
        return mirror

    def _write_mirror(self, plan):
        if self.tags is None:
            return
        for instance, record, _why in (plan or {}).get("removals", []):
            self.tags.delete([instance], KEY_PREFIX + record.rollout, record.value)
        self.tag_value = encode(self.operator, self.since, self.expires)
        self.tags.write(sorted(self.targets), self.key, self.tag_value)

    def load(self):
        """Read our rollout item and lease items (a fresh process's renew, check or release); the
        ``(instances, rollouts)`` read."""
        instances, rollouts = self.read()
        own = rollouts.get(self.rollout)
        if own is not None:
            record = rollout_record(self.rollout, own)
            self.version, self.since, self.expires = own.version, record.since, record.expires
        self.held = dict((i, item.version) for i, item in instances.items() if holder_of(item) == self.rollout)
        return instances, rollouts

    def problems(self, instances, rollouts, now):
        """Why the rollout does not hold every instance (lines; empty when it does)."""
        own = rollouts.get(self.rollout)
        if own is None:
            return ["rollout %s has no lease in the store (released, or broken by another rollout)" % self.rollout]
        record = rollout_record(self.rollout, own)
        if not record.live(now):
            return ["the lease of rollout %s expired %s" % (self.rollout, iso(record.expires))]
        lines = []
        for instance in sorted(self.targets):
            holder = holder_of(instances[instance]) if instance in instances else None
            if holder != self.rollout:
                lines.append(
                    "%s: %s" % (where(self.targets[instance], instance), "held by rollout %s" % holder if holder else "not held")
                )
        return lines

    def renew(self):
        """Push our expiry ``ttl`` on (one conditional write), then the mirror's. StoreLeaseLost when
        our item changed or is gone: someone broke or took over the lease."""
        if self.version is None:
            raise StoreLeaseLost("rollout %s holds no lease in the store" % self.rollout)
        now = self.clock()
        expires = now + self.ttl
        try:
            item = self.backend.put(ROLLOUT_ITEM + self.rollout, self._doc(self.since, expires), self.version)
        except sp.Conflict:
            self.version = None
            raise StoreLeaseLost(
                "the lease of rollout %s in the store was broken or taken over by another rollout" % self.rollout
            )
        self.version, self.expires = item.version, expires
        self._skew()
        if self.tags is not None:
            self.tag_value = encode(self.operator, self.since, expires)
            self.tags.write(sorted(self.targets), self.key, self.tag_value)

    def release(self):
        """Remove the mirror's tags (where they still have our value), then our lease items and our
        rollout item, each at the version we hold: what another rollout took meanwhile is left alone.
        The instances released."""
        if self.tags is not None and self.tag_value is not None:
            self.tags.delete(sorted(self.targets), self.key, self.tag_value)
        elif self.tags is not None:  # a fresh process: the values are read
            for instance, held in sorted(self.tags.read().items()):
                if self.rollout in held and instance in self.targets:
                    self.tags.delete([instance], self.key, held[self.rollout].value)
        self.tag_value = None
        ops = [("delete", INSTANCE_ITEM + instance, version) for instance, version in sorted(self.held.items())]
        if self.version is not None:
            ops.append(("delete", ROLLOUT_ITEM + self.rollout, self.version))
        released = []
        for start in range(0, len(ops), sp.TRANSACT_MAX):
            chunk = ops[start : start + sp.TRANSACT_MAX]
            try:
                self.backend.transact(chunk)
                done = chunk
            except sp.Conflict:  # another rollout took some after ours was broken: theirs now
                done = []
                for op in chunk:
                    with contextlib.suppress(sp.Conflict):
                        self.backend.delete(op[1], op[2])
                        done.append(op)
            released += [op[1][len(INSTANCE_ITEM):] for op in done if op[1].startswith(INSTANCE_ITEM)]
        self.held, self.version = {}, None
        return released
