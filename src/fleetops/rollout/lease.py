"""An EC2 tag lease: the rollout's lock on EC2 instances, seen by every controller that can read tags.

The local lock files (``fleetops.rollout.engine.HostLocks``) stop two rollouts on one controller; two
controllers (an operator's laptop and AWX) share nothing but the fleet. When the targets come from
the ``fleetops.node.ec2`` inventory (hostvar ``ec2_instance_id``), the rollout also tags every
targeted instance for its lifetime:

    fleetops:lease:<rollout id> = {"operator": "alice@bastion", "since": "...Z", "expires": "...Z"}

- **Take**: read the instances' ``fleetops:lease:*`` tags (DescribeTags). A live lease of another
  rollout refuses the rollout (exit 4, naming the holder and when its lease expires); an expired one
  is removed and taken over; ``--break-lock`` removes a live one too (``--break-lock ROLLOUT``: only
  that rollout's). Then CreateTags writes ours on every instance.
- **The race**: EC2 tags have no compare-and-swap, so two controllers can both find the instances
  free and both write. That is why every rollout writes its *own* key instead of overwriting one
  shared ``fleetops:lease``: nobody's write erases another's. After writing, the rollout waits
  ``settle`` seconds and reads the tags again; on every instance, of the live leases there, the one
  taken first wins (its ``since``, then the lower rollout id on a tie), and a loser removes its own
  tags and refuses. Both sides read the same tags, so they agree on the winner — provided both
  writes are visible to both re-reads: EC2's tag API is eventually consistent, and a write that
  shows up later than ``settle`` (or clocks that disagree by more than the gap between the two
  starts) can still let both proceed. The lease narrows the window to about ``settle`` seconds; it
  is not a consensus protocol, and the local lock still guards each controller.
- **Renew**: a thread re-reads and rewrites the lease every ``ttl / 3`` seconds. When our tag was
  removed (someone broke the lease), a lease taken earlier appeared, or renewing keeps failing until
  the lease expires, the lease is *lost* and the rollout stops before its next batch.
- **Release** at the end, on a stop and on Ctrl-C: DeleteTags with our key *and value*: EC2 deletes
  a tag given with a value only while it still has that value, so we never remove a lease we no
  longer hold.

The EC2 endpoint, credentials and retry budget come from the inventory source's own options (and
the environment variables the plugin reads), resolved from the plugin's documented options, so the
lease talks to exactly the endpoint the inventory listed; throttling is retried with the plugin's
own retry predicate (jittered exponential backoff, tenacity).
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from fleetops import paths
from fleetops.errors import FleetopsError

KEY_PREFIX = "fleetops:lease:"
PLUGIN_NAMES = ("fleetops.node.ec2",)
PLUGIN_MODULE = "ansible_collections.fleetops.node.plugins.inventory.ec2"
DEFAULT_TTL_S = 900.0
DEFAULT_SETTLE_S = 2.0
FILTER_CHUNK = 200  # values per DescribeTags filter
TAG_CHUNK = 500  # resources per CreateTags / DeleteTags call
ROLLOUT_ID = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{6}$")
CONNECTION_OPTIONS = (
    "endpoint_url",
    "aws_profile",
    "aws_access_key",
    "aws_secret_key",
    "aws_session_token",
    "max_attempts",
    "initial_backoff",
    "max_backoff",
    "connect_timeout",
    "read_timeout",
    "regions",
)


class LeaseError(FleetopsError):
    """Another rollout holds a live lease on some of the instances (or won the race for them)."""

    exit_code = 4


class LeaseApiError(FleetopsError):
    """The EC2 API refused or failed a lease call after its retries."""

    exit_code = 3


@cache
def _plugin() -> Any:
    """The fleetops.node.ec2 inventory plugin module: its retry predicate, error text and option docs."""
    try:
        return importlib.import_module(PLUGIN_MODULE)
    except ImportError:
        pass
    candidates = [paths.collections_path()]
    candidates += [Path(p) for p in os.environ.get("ANSIBLE_COLLECTIONS_PATH", "").split(os.pathsep) if p]
    candidates += [Path.home() / ".ansible" / "collections", Path("/usr/share/ansible/collections")]
    for folder in candidates:
        if folder is not None and (folder / "ansible_collections" / "fleetops" / "node").is_dir():
            if str(folder) not in sys.path:
                sys.path.append(str(folder))
            return importlib.import_module(PLUGIN_MODULE)
    raise LeaseApiError("Failed to take the EC2 lease: the fleetops.node collection is not installed")


# --------------------------------------------------------------------------------------- connection


@dataclass(frozen=True)
class Ec2Connection:
    """Endpoint, credentials and retry budget, as the inventory plugin resolves them."""

    endpoint_url: str | None = None
    aws_profile: str | None = None
    aws_access_key: str | None = None
    aws_secret_key: str | None = None
    aws_session_token: str | None = None
    max_attempts: int = 8
    initial_backoff: float = 0.5
    max_backoff: float = 20.0
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    regions: tuple[str, ...] = ()
    source: str = ""

    @classmethod
    def from_config(cls, config: Mapping[str, Any], source: str = "") -> Ec2Connection:
        """Each option as the plugin reads it: the source's value (or an alias), its env vars, its default."""
        options = yaml.safe_load(_plugin().DOCUMENTATION)["options"]
        values: dict[str, Any] = {}
        for name in CONNECTION_OPTIONS:
            doc = options[name]
            value = next(
                (config[k] for k in (name, *doc.get("aliases", ())) if config.get(k) not in (None, "")),
                None,
            )
            if value is None:
                value = next(
                    (os.environ[e["name"]] for e in doc.get("env", ()) if os.environ.get(e["name"])), None
                )
            if value is None:
                value = doc.get("default")
            if value is not None:
                kind = doc.get("type")
                if kind == "int":
                    value = int(value)
                elif kind == "float":
                    value = float(value)
                elif kind == "list":
                    value = tuple(str(v) for v in value)
                else:
                    value = str(value)
                values[name] = value
        return cls(**values, source=source)


def ec2_sources(inventories: Iterable[Path]) -> list[tuple[Path, dict[str, Any]]]:
    """The fleetops.node.ec2 inventory sources among ``inventories`` (files, or files in a folder)."""
    found: list[tuple[Path, dict[str, Any]]] = []
    for inv in inventories:
        files = sorted(p for p in inv.iterdir() if p.suffix in (".yml", ".yaml")) if inv.is_dir() else [inv]
        for path in files:
            try:
                data = yaml.safe_load(path.read_text())
            except (OSError, UnicodeDecodeError, yaml.YAMLError):
                continue
            if isinstance(data, dict) and data.get("plugin") in PLUGIN_NAMES:
                found.append((path, data))
    return found


def connection_for(inventories: Iterable[Path]) -> Ec2Connection | None:
    """The EC2 connection of the (first) fleetops.node.ec2 source; None when there is none."""
    sources = ec2_sources(inventories)
    if not sources:
        return None
    path, config = sources[0]
    return Ec2Connection.from_config(config, source=str(path))


def lease_targets(hosts: Iterable[Any]) -> dict[str, dict[str, str]]:
    """{host: {"instance": id, "region": region}} for the hosts whose hostvars name an EC2 instance."""
    targets: dict[str, dict[str, str]] = {}
    for host in hosts:
        hv = host.hostvars
        instance = hv.get("ec2_instance_id")
        if isinstance(instance, str) and instance:
            region = hv.get("ec2_region") or (hv.get("placement") or {}).get("region") or ""
            targets[host.name] = {"instance": instance, "region": str(region)}
    return targets


def rollout_id(text: str) -> str:
    """argparse type for ``--break-lock ROLLOUT``."""
    import argparse

    if not ROLLOUT_ID.match(text):
        raise argparse.ArgumentTypeError(
            f"not a rollout id (like 20261129T170102Z-3fa9c1): {text!r}; use --break-lock alone for any stale lock"
        )
    return text


# --------------------------------------------------------------------------------------- records


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _parse_iso(text: str) -> float:
    import calendar

    return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))


@dataclass(frozen=True)
class LeaseRecord:
    """One instance's lease tag of one rollout."""

    rollout: str
    operator: str
    since: float
    expires: float
    value: str  # the tag's exact value (what a conditional DeleteTags must name)

    @classmethod
    def parse(cls, key: str, value: str) -> LeaseRecord:
        rollout = key[len(KEY_PREFIX) :]
        try:
            data = json.loads(value)
            return cls(
                rollout, str(data["operator"]), _parse_iso(data["since"]), _parse_iso(data["expires"]), value
            )
        except (ValueError, KeyError, TypeError):
            # unreadable: its expiry is unknown, so it holds until someone breaks it (--break-lock)
            return cls(rollout, "unknown (unreadable lease tag)", 0.0, float("inf"), value)

    def order(self) -> tuple[float, str]:
        return (self.since, self.rollout)

    def live(self, now: float) -> bool:
        return self.expires > now

    def describe(self, now: float) -> str:
        if self.expires == float("inf"):
            return f"rollout {self.rollout} ({self.operator})"
        left = self.expires - now
        when = f"expires {_iso(self.expires)}" + (f" (in {left:.0f}s)" if left > 0 else " (expired)")
        return f"rollout {self.rollout} by {self.operator}, {when}"


def encode(operator: str, since: float, expires: float) -> str:
    value = json.dumps(
        {"operator": operator[:150], "since": _iso(since), "expires": _iso(expires)}, separators=(",", ":")
    )
    return value[:256]


# --------------------------------------------------------------------------------------- the lease


@dataclass
class Ec2Lease:
    """One rollout's lease on its EC2 instances: ``acquire``, ``start`` renewing, ``check``, ``release``."""

    connection: Ec2Connection
    instances: Mapping[str, Mapping[str, str]]  # host -> {"instance", "region"}
    rollout: str
    operator: str
    ttl: float = DEFAULT_TTL_S
    settle: float = DEFAULT_SETTLE_S
    say: Callable[[str], None] = field(default=lambda _line: None)
    clock: Callable[[], float] = time.time
    value: str | None = None  # our tag's value, once written
    since: float = 0.0
    expires: float = 0.0
    lost: str | None = None
    _clients: dict[str, Any] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def key(self) -> str:
        return KEY_PREFIX + self.rollout

    # ---- EC2 calls -------------------------------------------------------------------------

    def _region_of(self, host: str) -> str:
        region = self.instances[host].get("region") or ""
        if region:
            return region
        if self.connection.regions:
            return self.connection.regions[0]
        return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"

    def _by_region(self) -> dict[str, dict[str, str]]:
        """{region: {instance id: host}}."""
        out: dict[str, dict[str, str]] = {}
        for host, target in self.instances.items():
            out.setdefault(self._region_of(host), {})[target["instance"]] = host
        return out

    def _client(self, region: str) -> Any:
        if region not in self._clients:
            import boto3  # type: ignore[import-untyped]
            import botocore.config  # type: ignore[import-untyped]

            c = self.connection
            kwargs: dict[str, Any] = {}
            if c.aws_profile:
                kwargs["profile_name"] = c.aws_profile
            if c.aws_access_key:
                kwargs["aws_access_key_id"] = c.aws_access_key
                kwargs["aws_secret_access_key"] = c.aws_secret_key
                kwargs["aws_session_token"] = c.aws_session_token or None
            config = botocore.config.Config(
                retries={"total_max_attempts": 1, "mode": "standard"},  # tenacity is the whole budget
                connect_timeout=c.connect_timeout,
                read_timeout=c.read_timeout,
                user_agent_extra="fleetops.rollout.lease",
            )
            try:
                session = boto3.session.Session(**kwargs)
                self._clients[region] = session.client(
                    "ec2", region_name=region, endpoint_url=c.endpoint_url, config=config
                )
            except Exception as exc:  # botocore's errors share no base with ValueError
                raise LeaseApiError(
                    f"Failed to create an EC2 client for {region}: {_plugin()._error_text(exc)}"
                ) from None
        return self._clients[region]

    def _call(self, operation: str, region: str, func: Callable[[], Any]) -> Any:
        """One request under the inventory's retry budget (the plugin's retry predicate)."""
        import botocore.exceptions  # type: ignore[import-untyped]
        import tenacity

        plugin = _plugin()
        c = self.connection
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(c.max_attempts),
            wait=tenacity.wait_random_exponential(multiplier=c.initial_backoff, max=c.max_backoff),
            retry=tenacity.retry_if_exception(plugin._is_retryable),
            reraise=True,
        )
        try:
            return retrying(func)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            attempts = retrying.statistics.get("attempt_number", 1)
            raise LeaseApiError(
                f"Failed to call ec2:{operation} in {region}"
                f"{f' after {attempts} attempts' if attempts > 1 else ''}: {plugin._error_text(exc)}"
            ) from None

    def read(self) -> dict[str, dict[str, LeaseRecord]]:
        """{instance id: {rollout: lease}} for every lease tag on our instances."""
        leases: dict[str, dict[str, LeaseRecord]] = {}
        for region, ids in self._by_region().items():
            client = self._client(region)
            id_list = sorted(ids)
            for start in range(0, len(id_list), FILTER_CHUNK):
                filters = [
                    {"Name": "resource-id", "Values": id_list[start : start + FILTER_CHUNK]},
                    {"Name": "key", "Values": [KEY_PREFIX + "*"]},
                ]
                token: str | None = None
                while True:
                    kwargs: dict[str, Any] = {"Filters": filters, "MaxResults": 1000}
                    if token:
                        kwargs["NextToken"] = token
                    page = self._call(
                        "DescribeTags", region, functools.partial(client.describe_tags, **kwargs)
                    )
                    for tag in page.get("Tags", []):
                        key = str(tag.get("Key", ""))
                        if key.startswith(KEY_PREFIX) and tag.get("ResourceId") in ids:
                            record = LeaseRecord.parse(key, str(tag.get("Value", "")))
                            leases.setdefault(str(tag["ResourceId"]), {})[record.rollout] = record
                    token = page.get("NextToken")
                    if not token:
                        break
        return leases

    def _tag_chunks(
        self, operation: str, region: str, instance_ids: Iterable[str], key: str, value: str
    ) -> None:
        """CreateTags / DeleteTags of ``key`` = ``value`` on the instances, in chunks the API accepts."""
        client = self._client(region)
        method = client.create_tags if operation == "CreateTags" else client.delete_tags
        ids = sorted(instance_ids)
        for start in range(0, len(ids), TAG_CHUNK):
            chunk = ids[start : start + TAG_CHUNK]
            self._call(
                operation,
                region,
                functools.partial(method, Resources=chunk, Tags=[{"Key": key, "Value": value}]),
            )

    def _write(self, value: str) -> None:
        for region, ids in self._by_region().items():
            self._tag_chunks("CreateTags", region, ids, self.key, value)

    def _delete(self, region: str, instance_ids: Sequence[str], key: str, value: str) -> None:
        """Remove ``key`` where it still has ``value`` (EC2 leaves a tag whose value differs)."""
        self._tag_chunks("DeleteTags", region, instance_ids, key, value)

    def _host(self, instance: str) -> str:
        return next((h for h, t in self.instances.items() if t["instance"] == instance), instance)

    def _region_of_instance(self, instance: str) -> str:
        return self._region_of(self._host(instance))

    # ---- the protocol ----------------------------------------------------------------------

    def acquire(self, break_lock: bool | str = False) -> None:
        """Take the lease on every instance, or raise LeaseError naming who holds it (nothing kept)."""
        if not self.instances:
            return
        now = self.clock()
        leases = self.read()
        conflicts: list[str] = []
        removals: dict[tuple[str, str, str], list[str]] = {}  # (region, key, value) -> instances
        own_since: float | None = None
        for instance, held in sorted(leases.items()):
            for rid, record in held.items():
                if rid == self.rollout:  # ours, from before a kill or a stop: resume keeps its place
                    if record.live(now):
                        own_since = min(own_since or record.since, record.since)
                    continue
                if not record.live(now):
                    self.say(f"lease: {self._host(instance)} ({instance}): taking over the expired lease of "
                             f"{record.describe(now)}")  # fmt: skip
                elif break_lock is True or break_lock == rid:
                    self.say(f"lease: {self._host(instance)} ({instance}): breaking the lease of "
                             f"{record.describe(now)} (--break-lock)")  # fmt: skip
                else:
                    conflicts.append(f"{self._host(instance)} ({instance}): {record.describe(now)}")
                    continue
                where = (self._region_of_instance(instance), KEY_PREFIX + rid, record.value)
                removals.setdefault(where, []).append(instance)
        if conflicts:
            raise LeaseError(
                f"Failed to take the EC2 lease on {len(conflicts)} instance(s) held by another rollout: "
                + "; ".join(conflicts[:5])
                + (f" and {len(conflicts) - 5} more" if len(conflicts) > 5 else "")
                + ". Wait for it, resume it, or pass --break-lock [ROLLOUT] if it is stale"
            )
        for (region, their_key, their_value), ids in removals.items():
            self._delete(region, ids, their_key, their_value)
        # whole seconds: the tag stores whole seconds, and every rollout must compare the same values
        self.since = own_since if own_since is not None else float(int(now))
        self.expires = now + self.ttl
        self.value = encode(self.operator, self.since, self.expires)
        self._write(self.value)
        if self.settle > 0:
            time.sleep(self.settle)
        beaten = self._beaten(self.read(), self.clock())
        if beaten:
            self.release()
            raise LeaseError(
                f"Failed to take the EC2 lease: another rollout took it at the same time and was first on "
                f"{len(beaten)} instance(s): {'; '.join(beaten[:5])}. Nothing was changed; try again later"
            )
        self.say(
            f"lease: tagged {len(self.instances)} instance(s) {self.key} until {_iso(self.expires)} "
            f"(renewed every {self.ttl / 3:.0f}s)"
        )

    def _beaten(self, leases: dict[str, dict[str, LeaseRecord]], now: float) -> list[str]:
        """Instances where our lease is gone, or a live lease taken before ours is there too."""
        mine = (self.since, self.rollout)
        lost: list[str] = []
        for host, target in sorted(self.instances.items()):
            held = leases.get(target["instance"], {})
            if self.rollout not in held:
                lost.append(
                    f"{host} ({target['instance']}): our lease tag is gone (broken by another rollout?)"
                )
                continue
            first = min(
                (r for r in held.values() if r.live(now) or r.rollout == self.rollout), key=LeaseRecord.order
            )
            if first.order() < mine:
                lost.append(f"{host} ({target['instance']}): {first.describe(now)}")
        return lost

    def renew(self) -> None:
        """Re-read, then extend our lease; marks it lost when it was broken or overtaken."""
        if self.lost is not None or self.value is None:
            return
        now = self.clock()
        try:
            beaten = self._beaten(self.read(), now)
            if beaten:
                self.lost = "the EC2 lease was lost: " + "; ".join(beaten[:5])
                return
            expires = now + self.ttl
            value = encode(self.operator, self.since, expires)
            self._write(value)
        except LeaseApiError as exc:
            if self.clock() >= self.expires:
                self.lost = f"the EC2 lease expired: renewing it failed: {exc}"
            else:
                self.say(f"lease: renewing failed (will retry; it expires {_iso(self.expires)}): {exc}")
            return
        self.value, self.expires = value, expires

    def check(self) -> str | None:
        """Why the rollout must not start another batch (lease lost or expired); None when held."""
        if self.lost is None and self.value is not None and self.clock() >= self.expires:
            self.lost = f"the EC2 lease expired at {_iso(self.expires)} without being renewed"
        return self.lost

    def start(self) -> None:
        """Renew in a daemon thread every ttl/3 seconds until ``release``."""
        if not self.instances or self.value is None or self._thread is not None:
            return
        interval = max(self.ttl / 3, 0.2)

        def loop() -> None:
            while not self._stop.wait(interval):
                self.renew()
                if self.lost is not None:
                    return

        self._thread = threading.Thread(target=loop, name="fleetops-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop renewing; remove our tags where they still carry our value."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(self.connection.read_timeout, 5.0) * 2)
            self._thread = None
        if self.value is None:
            return
        value, self.value = self.value, None
        for region, ids in self._by_region().items():
            try:
                self._delete(region, list(ids), self.key, value)
            except LeaseApiError as exc:
                self.say(
                    f"lease: could not remove the lease tags in {region} (they expire {_iso(self.expires)}): {exc}"
                )
