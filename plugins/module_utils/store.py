# -*- coding: utf-8 -*-

# Copyright: (c) 2026, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The shared store: what every controller must agree on, with compare-and-swap.

EC2 tags have no conditional write: two controllers that read at the start and write at the end
both spend the same budget. The store is one DynamoDB table (on-demand billing) whose items are
versioned documents; every write names the version it read (``put(key, doc, expect=3)``), or says
the item must not exist yet (``expect=None``), and DynamoDB refuses it when another writer came
first (``Conflict``). The writer then reads again and decides again: nothing is ever spent on a
stale read.

An item::

    {"pk": {"S": "pause"}, "v": {"N": "3"}, "doc": {"S": "<compact JSON>"}}

- ``pk``: the key, the table's only key attribute (a table made by ``ensure`` has just this one);
- ``v``: the version, 1 on creation, +1 on each write;
- ``doc``: the document as JSON text (at most DOC_MAX bytes: DynamoDB's item limit is 400 KB).

Keys are ``<kind>`` or ``<kind>#<name>`` (``ledger#reboot``, ``ladder#gpu-7``, ``audit#...``);
``items(prefix)`` lists every item whose key starts with ``prefix`` (a paginated, consistent Scan).

**One clock.** Every answer carries the store's ``Date`` header; ``skew`` is the controller's clock
minus the store's (whole seconds, so up to a second plus the round trip is noise). The controller
refuses to act when it exceeds ``MAX_SKEW_S`` (``check_skew``): budgets are windows of time, and a
controller whose clock runs slow would see entries expire early.

The calls go through ``module_utils/aws.py`` (client factory, throttling retries with jittered
backoff, error texts without secrets); a failure after the retries is ``StoreError``, a refused
condition is ``Conflict`` (never retried: the caller must read again). ``MemoryStore`` keeps the
same contract in a dict, for the simulation (``conditional=False`` drops the condition, so a test
can show that the simulation catches a store without compare-and-swap).

Importable on Python >= 3.9.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import calendar
import email.utils
import functools
import json
import os
import time
import uuid

from ansible_collections.fleetops.node.plugins.module_utils import aws

DEFAULT_TABLE = "fleetops"
PAUSE_KEY = "pause"  # fleetops pause: {"operator", "since", "reason"}; while it is there nothing acts
KEY = "pk"
VERSION = "v"
DOC = "doc"
DOC_MAX = 350 * 1024  # bytes of JSON: DynamoDB's item limit is 400 KB, key and attribute names included
MAX_SKEW_S = 30.0  # the controller's clock may differ from the store's by this much, no more
CREATE_WAIT_S = 120.0  # a new table is ACTIVE within seconds on AWS; give up after this
# a refused condition; a transaction is cancelled as a whole when one of its conditions fails (or another
# transaction is on one of its items): either way the writer must read again
CONFLICT_CODES = frozenset(("ConditionalCheckFailedException", "TransactionCanceledException"))
TRANSACT_MAX = 100  # DynamoDB's TransactWriteItems takes at most 100 actions
MISSING_TABLE_CODES = frozenset(("ResourceNotFoundException",))

# The store's options: beside the fleetops.node.ec2 source's own (the inventory plugin documents
# exactly these; a unit test compares), each defaulting to the source's: its first region, its
# endpoint and its credentials. A source without ``store_table`` has no store.
OPTIONS = {
    "store_table": {
        "type": "str",
        "env": ["FLEETOPS_STORE_TABLE"],
        "description": "The DynamoDB table of the shared store (pause, budgets, ladders, the auto pass's "
        "lease). Unset: no store.",
    },
    "store_region": {
        "type": "str",
        "env": ["FLEETOPS_STORE_REGION"],
        "description": "The store table's region. Default: the first of O(regions).",
    },
    "store_endpoint_url": {
        "type": "str",
        "env": ["FLEETOPS_STORE_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB"],
        "description": "The DynamoDB endpoint. Default: O(endpoint_url) (a local moto serves both).",
    },
}


def argument_spec():
    """The store's options as an AnsibleModule argument_spec (their environment variables are read by
    ``resolve``, which a module calls with ``module.params``)."""
    return dict((name, {"type": option["type"]}) for name, option in OPTIONS.items())


def resolve(options, regions=(), endpoint_url=None, environ=None):
    """``(table, region, endpoint)`` of the store ``options`` name (each option's value, else its
    environment variables); None when no table is named. The region defaults to the first of
    ``regions`` (the EC2 source's), else us-east-1; the endpoint to ``endpoint_url`` (the EC2 one's).
    ValueError for a value that is not a string."""
    environ = os.environ if environ is None else environ
    values = {}
    for name, option in OPTIONS.items():
        value = options.get(name)
        if value in (None, ""):
            value = next((environ[e] for e in option.get("env", []) if environ.get(e)), None)
        if value is not None and not isinstance(value, str):
            raise ValueError("%s must be a string, got %r" % (name, value))
        values[name] = value
    if not values["store_table"]:
        return None
    region = values["store_region"] or (list(regions)[0] if regions else "") or "us-east-1"
    return values["store_table"], region, values["store_endpoint_url"] or endpoint_url


def open_backend(options, settings, regions=(), environ=None, user_agent="fleetops.store"):
    """The DynamoStore the options name, with ``settings``' credentials and retry budget (module_utils/
    aws.py's ConnectionSettings, the EC2 source's) and its endpoint unless the store names its own;
    None without a table. ValueError / aws.AwsSettingsError for options that cannot work."""
    found = resolve(options, regions, settings.endpoint_url, environ)
    if found is None:
        return None
    table, region, endpoint = found
    own = aws.ConnectionSettings(**dict(settings.as_dict(), endpoint_url=endpoint))
    return DynamoStore(own, table, region, user_agent=user_agent)


def pause_line(item):
    """``automation is paused by OPERATOR since TIME: REASON`` for the pause item (an unreadable one is
    still a pause), or None when there is none."""
    if item is None:
        return None
    doc = item.doc if isinstance(item.doc, dict) else {}
    try:
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(doc["since"])))
        return "automation is paused by %s since %s: %s" % (doc["operator"], since, doc.get("reason") or "")
    except (KeyError, TypeError, ValueError, OverflowError):
        return "automation is paused (an unreadable pause item: still paused)"


class StoreError(Exception):
    """A store call failed after its retries, or the store cannot be used. One line."""


class Conflict(StoreError):
    """A conditional write was refused: the item is not at the version the writer read."""


class MissingTable(StoreError):
    """The table does not exist (yet): nothing is stored, so reads find nothing."""


class SkewError(StoreError):
    """The controller's clock and the store's differ by more than the bound."""


class Item:
    """One stored document: ``key``, ``version``, ``doc`` (parsed JSON; None when it did not parse)
    and ``raw`` (the text as stored: an unreadable item is reported and kept, never overwritten)."""

    __slots__ = ("key", "version", "doc", "raw")

    def __init__(self, key, version, raw):
        self.key = key
        self.version = version
        self.raw = raw
        try:
            self.doc = json.loads(raw)
        except ValueError:
            self.doc = None

    def __repr__(self):
        return "Item(%r, v%d, %s)" % (self.key, self.version, self.raw[:80])


def encode(doc):
    """Compact, sorted JSON of at most DOC_MAX bytes (StoreError beyond: never cut)."""
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if len(text.encode("utf-8")) > DOC_MAX:
        raise StoreError(
            "a store document of %d bytes is over the %d-byte limit" % (len(text.encode("utf-8")), DOC_MAX)
        )
    return text


def check_expect(expect):
    if expect is not None and (isinstance(expect, bool) or not isinstance(expect, int) or expect < 1):
        raise ValueError("expect must be None or a version >= 1, got %r" % (expect,))


def check_skew(skew, bound=MAX_SKEW_S):
    """SkewError when ``skew`` (controller minus store, seconds) is beyond ``bound`` either way."""
    if skew is not None and abs(skew) > bound:
        raise SkewError(
            "this controller's clock is %+.0f s off the store's (at most %g s allowed): budgets are "
            "windows of time, so nothing is done until the clock is set right (NTP)" % (skew, bound)
        )


def _http_date(text):
    parsed = email.utils.parsedate_tz(text or "")
    if parsed is None:
        return None
    return float(calendar.timegm(parsed[:9])) - (parsed[9] or 0)


class DynamoStore:
    """The store in a DynamoDB table. ``settings``: module_utils/aws.py's ConnectionSettings (the
    endpoint already the store's); every failure is a StoreError naming the call."""

    def __init__(self, settings, table, region, user_agent="fleetops.store", on_retry=None, clock=time.time):
        if not table:
            raise StoreError("the store needs a table name (store_table)")
        self.settings = settings
        self.table = table
        self.region = region
        self.user_agent = user_agent
        self.on_retry = on_retry
        self.clock = clock
        self.skew = None  # controller minus store, from the last answer's Date header
        self._client = None

    def where(self):
        return "DynamoDB table %s in %s" % (self.table, self.region)

    @property
    def client(self):
        if self._client is None:
            try:
                self._client = aws.client(self.settings, "dynamodb", self.region, user_agent=self.user_agent)
            except aws.AwsError as exc:
                raise StoreError("Failed to reach the store (%s): %s" % (self.where(), exc)) from None
        return self._client

    def _call(self, operation, **kwargs):
        func = functools.partial(getattr(self.client, _snake(operation)), **kwargs)
        try:
            answer = aws.call(
                self.settings, operation, self.region, func, service="dynamodb", on_retry=self.on_retry
            )
        except aws.AwsError as exc:
            if exc.code in CONFLICT_CODES:
                raise Conflict(
                    "%s: %s changed since it was read"
                    % (self.where(), kwargs.get("Key") or "an item of the transaction")
                ) from None
            if exc.code in MISSING_TABLE_CODES:
                raise MissingTable("%s (%s)" % (exc, self.where())) from None
            raise StoreError("%s (%s)" % (exc, self.where())) from None
        stamp = _http_date(((answer or {}).get("ResponseMetadata") or {}).get("HTTPHeaders", {}).get("date"))
        if stamp is not None:
            self.skew = self.clock() - (stamp + 0.5)  # the Date header is whole seconds: its middle
        return answer

    def ensure(self):
        """Create the table when it is missing (on-demand billing, key ``pk``) and wait until it is
        ACTIVE; True when it was created. Its IAM actions: dynamodb:DescribeTable, CreateTable."""
        try:
            self._call("DescribeTable", TableName=self.table)
            return False
        except MissingTable:
            pass
        try:
            self._call(
                "CreateTable",
                TableName=self.table,
                KeySchema=[{"AttributeName": KEY, "KeyType": "HASH"}],
                AttributeDefinitions=[{"AttributeName": KEY, "AttributeType": "S"}],
                BillingMode="PAY_PER_REQUEST",
            )
        except StoreError as exc:
            if "ResourceInUseException" not in str(exc):  # another controller created it meanwhile
                raise
        deadline = time.monotonic() + CREATE_WAIT_S
        while True:
            status = self._call("DescribeTable", TableName=self.table)["Table"].get("TableStatus")
            if status == "ACTIVE":
                return True
            if time.monotonic() > deadline:
                raise StoreError("%s is still %s after %g s" % (self.where(), status, CREATE_WAIT_S))
            time.sleep(1.0)

    def get(self, key):
        """The item at ``key`` (a strongly consistent read), or None (also when there is no table yet)."""
        try:
            item = self._call(
                "GetItem", TableName=self.table, Key={KEY: {"S": key}}, ConsistentRead=True
            ).get("Item")
        except MissingTable:
            return None
        return _item(item) if item else None

    def _put_request(self, key, doc, expect):
        """``(PutItem's arguments, the Item it writes)``: ``doc`` at ``key`` if at version ``expect``."""
        check_expect(expect)
        raw = encode(doc)
        version = 1 if expect is None else expect + 1
        request = {
            "TableName": self.table,
            "Item": {KEY: {"S": key}, VERSION: {"N": str(version)}, DOC: {"S": raw}},
        }
        if expect is None:
            request["ConditionExpression"] = "attribute_not_exists(%s)" % KEY
        else:
            request["ConditionExpression"] = "%s = :v" % VERSION
            request["ExpressionAttributeValues"] = {":v": {"N": str(expect)}}
        return request, Item(key, version, raw)

    def _delete_request(self, key, expect):
        check_expect(expect)
        return {
            "TableName": self.table,
            "Key": {KEY: {"S": key}},
            "ConditionExpression": "%s = :v" % VERSION,
            "ExpressionAttributeValues": {":v": {"N": str(expect)}},
        }

    def put(self, key, doc, expect):
        """Write ``doc`` at ``key`` if the item is at version ``expect`` (None: absent); the new Item.
        Conflict when it is not."""
        request, item = self._put_request(key, doc, expect)
        self._call("PutItem", **request)
        return item

    def delete(self, key, expect):
        """Delete ``key`` if it is at version ``expect``; Conflict when it is not (or is gone)."""
        self._call("DeleteItem", **self._delete_request(key, expect))

    def transact(self, ops):
        """All of ``ops`` or none (one TransactWriteItems, at most TRANSACT_MAX): each ``("put", key, doc,
        expect)`` or ``("delete", key, expect)``, with put's and delete's conditions. The new Item of each
        put (None for a delete); Conflict when a condition fails. Retried with the same request token, so
        a retry after a lost answer is not taken for a conflict."""
        actions, out = [], []
        for op in ops:
            if op[0] == "put":
                request, item = self._put_request(op[1], op[2], op[3])
                actions.append({"Put": request})
                out.append(item)
            else:
                actions.append({"Delete": self._delete_request(op[1], op[2])})
                out.append(None)
        if len(actions) > TRANSACT_MAX:
            raise StoreError("a transaction of %d writes is over DynamoDB's %d" % (len(actions), TRANSACT_MAX))
        if actions:
            self._call("TransactWriteItems", TransactItems=actions, ClientRequestToken=uuid.uuid4().hex)
        return out

    def items(self, prefix):
        """Every item whose key starts with ``prefix``, sorted by key (a consistent, paginated Scan)."""
        out = []
        kwargs = {
            "TableName": self.table,
            "ConsistentRead": True,
            "FilterExpression": "begins_with(%s, :p)" % KEY,
            "ExpressionAttributeValues": {":p": {"S": prefix}},
        }
        while True:
            try:
                page = self._call("Scan", **kwargs)
            except MissingTable:
                return []
            out.extend(_item(i) for i in page.get("Items", []))
            if not page.get("LastEvaluatedKey"):
                break
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return sorted(out, key=lambda i: i.key)


def _snake(operation):
    return "".join("_" + c.lower() if c.isupper() else c for c in operation).lstrip("_")


def _item(raw):
    try:
        return Item(raw[KEY]["S"], int(raw[VERSION]["N"]), raw[DOC]["S"])
    except (KeyError, TypeError, ValueError):
        key = (raw.get(KEY) or {}).get("S", "?") if isinstance(raw, dict) else "?"
        return Item(key, int(((raw.get(VERSION) or {}).get("N") or 0)) if isinstance(raw, dict) else 0, "")


class MemoryStore:
    """The same contract in a dict (the simulation's store). ``conditional=False`` ignores ``expect``
    (a store without compare-and-swap: the simulation must catch it). ``fail``: a callable called
    with the operation name before each call; it may raise StoreError (throttling, an outage)."""

    def __init__(self, conditional=True, clock=time.time, fail=None):
        self.data = {}
        self.conditional = conditional
        self.clock = clock
        self.fail = fail
        self.skew = 0.0
        self.conflicts = 0
        self.calls = 0

    def where(self):
        return "memory store"

    def _enter(self, operation):
        self.calls += 1
        if self.fail is not None:
            self.fail(operation)

    def ensure(self):
        return False

    def get(self, key):
        self._enter("GetItem")
        found = self.data.get(key)
        return Item(key, found[0], found[1]) if found else None

    def _check(self, key, expect):
        check_expect(expect)
        have = self.data.get(key)
        if self.conditional and (have[0] if have else None) != expect:
            self.conflicts += 1
            raise Conflict("memory store: %s changed since it was read" % key)

    def _apply(self, op):
        """One ``("put", key, doc, expect)`` or ``("delete", key, expect)``, its condition checked."""
        if op[0] != "put":
            self.data.pop(op[1], None)
            return None
        key, expect = op[1], op[3]
        raw = encode(op[2])
        have = self.data.get(key)
        version = (have[0] if have else 0) + 1 if not self.conditional else (1 if expect is None else expect + 1)
        self.data[key] = (version, raw)
        return Item(key, version, raw)

    def put(self, key, doc, expect):
        self._enter("PutItem")
        self._check(key, expect)
        return self._apply(("put", key, doc, expect))

    def delete(self, key, expect):
        self._enter("DeleteItem")
        self._check(key, expect)
        self._apply(("delete", key, expect))

    def transact(self, ops):
        self._enter("TransactWriteItems")
        if len(ops) > TRANSACT_MAX:
            raise StoreError("a transaction of %d writes is over DynamoDB's %d" % (len(ops), TRANSACT_MAX))
        for op in ops:  # every condition first: all or nothing
            self._check(op[1], op[3] if op[0] == "put" else op[2])
        return [self._apply(op) for op in ops]

    def items(self, prefix):
        self._enter("Scan")
        return [Item(k, v, raw) for k, (v, raw) in sorted(self.data.items()) if k.startswith(prefix)]
