"""The in-flight marks: without a shared store, a disruptive EC2 step a later pass may have to finish
(``Remediation.in_flight``: a stop-start, a replace) is also marked on its instance, so a pass in a fresh
container (an empty state directory) over an inventory of running instances still finds it.

- The mark is the tag ``IN_FLIGHT_TAG`` (continued, past EC2's 256 characters a value, in
  ``fleetops:in-flight:2``, ``:3``...), a JSON object: the host, the action, the pass, when, its rule,
  rung and check, and what finishing needs (the module's ``in_flight_record``: a replace's group and its
  instances). It is written before the batch's first disruptive call and removed when the batch settles
  (an attempted host its action did not finish keeps it: the next pass finishes it).
- Every applying pass finds the marked instances with one filtered DescribeInstances call per region
  (``tag-key``), whatever its inventory's filters: a stopped instance is not in a running-only inventory.
  It finishes each with the same finisher the store path uses (:class:`fleetops.auto.finish.Finishers`);
  one not finished keeps its mark, with the failed attempts and their cause (``fleetops.journal``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fleetops.ansible.collection import module_utils
from fleetops.rollout.lease import Ec2Connection

IN_FLIGHT_TAG = "fleetops:in-flight"
TAG_VALUE_MAX = 256  # EC2's limit on a tag's value
MAX_PARTS = 8  # of the 50 tags an instance may carry
DEFAULT_REGION = "us-east-1"
# what the mark names besides what finishing needs
FIELDS = ("host", "action", "pass", "at", "rule", "rung", "check")


class MarkError(ValueError):
    """A mark that does not fit on the instance, or does not parse."""


def part_key(n: int) -> str:
    return IN_FLIGHT_TAG if n == 0 else f"{IN_FLIGHT_TAG}:{n + 1}"


def encode(record: Mapping[str, Any]) -> dict[str, str]:
    """The mark's tags: {key: value}, each value at most ``TAG_VALUE_MAX`` characters (ASCII JSON)."""
    text = json.dumps(dict(record), separators=(",", ":"), sort_keys=True)
    parts = [text[i : i + TAG_VALUE_MAX] for i in range(0, len(text), TAG_VALUE_MAX)]
    if len(parts) > MAX_PARTS:
        raise MarkError(f"its in-flight mark takes {len(text)} characters, more than {MAX_PARTS} tags hold")
    return {part_key(n): part for n, part in enumerate(parts)}


def decode(tags: Mapping[str, str]) -> dict[str, Any]:
    """The mark the instance's ``tags`` carry; MarkError when it does not parse or lacks a field."""
    parts, n = [], 0
    while part_key(n) in tags:
        parts.append(tags[part_key(n)])
        n += 1
    try:
        record = json.loads("".join(parts))
    except ValueError as exc:
        raise MarkError(f"tag {IN_FLIGHT_TAG} is not JSON: {exc}") from None
    if not isinstance(record, dict):
        raise MarkError(f"tag {IN_FLIGHT_TAG} is not a JSON object")
    ok = (
        all(isinstance(record.get(k), str) and record[k] for k in ("host", "action", "pass"))
        and isinstance(record.get("at"), int | float)
        and not isinstance(record.get("at"), bool)
    )
    if not ok:
        raise MarkError(f"tag {IN_FLIGHT_TAG} lacks its host, action, pass or time")
    return record


@dataclass(frozen=True)
class Mark:
    """An instance's mark as a pass found it."""

    instance: str
    region: str
    record: dict[str, Any]
    keys: tuple[str, ...]  # the mark's tag keys on the instance (all removed when it is finished)


class InFlightMarks:
    """The marks' EC2 calls (module_utils/aws.py's clients, retries and budget). aws.AwsError on failure."""

    def __init__(self, connection: Ec2Connection) -> None:
        self.aws = module_utils("aws")
        self.settings = connection.settings()
        self.regions = tuple(connection.regions) or (DEFAULT_REGION,)
        self._session: Any = None
        self._clients: dict[str, Any] = {}

    def client(self, region: str) -> Any:
        if region not in self._clients:
            if self._session is None:
                self._session = self.aws.session(self.settings)
            self._clients[region] = self.aws.client(
                self.settings, "ec2", region, aws_session=self._session, user_agent="fleetops.auto"
            )
        return self._clients[region]

    def _call(self, operation: str, region: str, func: Any) -> Any:
        return self.aws.call(self.settings, operation, region, func)

    def write(self, instance: str, region: str, record: Mapping[str, Any], old: Iterable[str] = ()) -> None:
        """Mark ``instance`` (one CreateTags call; parts of an older, longer mark in ``old`` removed)."""
        tags = encode(record)
        self._call(
            "CreateTags",
            region,
            functools.partial(
                self.client(region).create_tags,
                Resources=[instance],
                Tags=[{"Key": k, "Value": v} for k, v in tags.items()],
            ),
        )
        stale = sorted(set(old) - set(tags))
        if stale:
            self.remove(instance, region, stale)

    def remove(self, instance: str, region: str, keys: Iterable[str]) -> None:
        """Remove the mark's tags ``keys`` from ``instance`` (one DeleteTags call)."""
        self._call(
            "DeleteTags",
            region,
            functools.partial(
                self.client(region).delete_tags, Resources=[instance], Tags=[{"Key": k} for k in sorted(keys)]
            ),
        )

    def find(self) -> tuple[list[Mark], list[str]]:
        """Every marked instance in the connection's regions, whatever its state (one DescribeInstances
        call per region, filtered on the tag's key, paged), and one line per mark that does not parse
        (left as found for a person)."""
        marks, bad = [], []
        for region in self.regions:
            client = self.client(region)
            filters = [{"Name": "tag-key", "Values": [IN_FLIGHT_TAG]}]
            token = None
            while True:
                kwargs: dict[str, Any] = {"Filters": filters, "MaxResults": 1000}
                if token:
                    kwargs["NextToken"] = token
                page = self._call(
                    "DescribeInstances", region, functools.partial(client.describe_instances, **kwargs)
                )
                for reservation in page.get("Reservations") or []:
                    for inst in reservation.get("Instances") or []:
                        iid = str(inst.get("InstanceId", ""))
                        tags = {str(t.get("Key")): str(t.get("Value", "")) for t in inst.get("Tags") or []}
                        keys = tuple(
                            k for k in tags if k == IN_FLIGHT_TAG or k.startswith(IN_FLIGHT_TAG + ":")
                        )
                        try:
                            record = decode(tags)
                        except MarkError as exc:
                            bad.append(f"{iid} ({region}): {exc}: ignored, and left as it is for a person")
                            continue
                        marks.append(Mark(iid, region, record, keys))
                token = page.get("NextToken")
                if not token:
                    break
        return sorted(marks, key=lambda m: (float(m.record["at"]), m.instance)), bad
