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

The tag's value is compact JSON of at most 256 bytes in UTF-8 (EC2 allows 256 Unicode characters;
bytes are the strictest reading): a long operator is shortened, never the JSON, so every
controller can read every lease, whatever alphabet its operator's name is in.

The EC2 endpoint, credentials and retry budget come from the inventory source's own options (and
the environment variables the plugin reads), resolved by the collection's ``module_utils/aws.py``,
the code the inventory plugin resolves them with, so the lease talks to exactly the endpoint the
inventory listed; its client factory, throttling retries (jittered exponential backoff, tenacity)
and error texts are the plugin's too. The collection's code is loaded through
``fleetops.ansible.collection`` only.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetops.ansible.collection import constant, module_utils
from fleetops.ansible.runner import ec2_sources
from fleetops.errors import FleetopsError, UsageError
from fleetops.util import ROLLOUT_ID_PATTERN, dead_here, process_id


# The protocol (tag key and value, who wins, the tag calls) is the collection's module_utils/lease.py,
# the code the playbooks' fleetops.node.ec2_lease module runs, so the CLI and AWX judge the same tags.
# Imported on first use (it imports boto3 and ansible); its constants are read from its source.
def _protocol() -> Any:
    return module_utils("lease")


KEY_PREFIX: str = constant("lease", "KEY_PREFIX")
TAG_VALUE_MAX: int = constant("lease", "TAG_VALUE_MAX")
DEFAULT_TTL_S: float = constant("lease", "DEFAULT_TTL_S")
DEFAULT_SETTLE_S: float = constant("lease", "DEFAULT_SETTLE_S")
# a crashed controller's lease blocks others this long at most
MAX_TTL_S: float = constant("lease", "MAX_TTL_S")
MAX_SETTLE_S: float = constant("lease", "MAX_SETTLE_S")
ROLLOUT_ID = re.compile(ROLLOUT_ID_PATTERN)
# the protocol's, on first use: ``encode`` (the tag's value: compact JSON, at most TAG_VALUE_MAX bytes)
# and ``LeaseRecord`` (one instance's lease tag of one rollout)
_FROM_PROTOCOL = ("encode", "LeaseRecord")


def __getattr__(name: str) -> Any:
    if name in _FROM_PROTOCOL:
        return getattr(_protocol(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class LeaseError(FleetopsError):
    """Another rollout holds a live lease on some of the instances (or won the race for them)."""

    exit_code = 4


class LeaseApiError(FleetopsError):
    """The EC2 API refused or failed a lease call after its retries."""

    exit_code = 3


def _aws() -> Any:
    """The collection's module_utils/aws.py: connection options, client factory, retries, error texts."""
    return module_utils("aws")


def _default(name: str) -> Any:
    return _aws().OPTIONS[name]["default"]


# --------------------------------------------------------------------------------------- connection


@dataclass(frozen=True)
class Ec2Connection:
    """Endpoint, credentials and retry budget, as the inventory plugin resolves them (module_utils/aws.py).

    Options left out get module_utils/aws.py's defaults; the values are checked as the plugin checks
    them (UsageError when one cannot work).
    """

    endpoint_url: str | None = None
    aws_profile: str | None = None
    aws_access_key: str | None = None
    aws_secret_key: str | None = field(default=None, repr=False)
    aws_session_token: str | None = field(default=None, repr=False)
    max_attempts: int = field(default_factory=lambda: int(_default("max_attempts")))
    initial_backoff: float = field(default_factory=lambda: float(_default("initial_backoff")))
    max_backoff: float = field(default_factory=lambda: float(_default("max_backoff")))
    connect_timeout: float = field(default_factory=lambda: float(_default("connect_timeout")))
    read_timeout: float = field(default_factory=lambda: float(_default("read_timeout")))
    regions: tuple[str, ...] = ()
    source: str = ""

    def __post_init__(self) -> None:
        self.settings()  # refuses values the plugin would refuse

    def settings(self) -> Any:
        """These values as module_utils/aws.py's ConnectionSettings (what its client() and call() take)."""
        aws = _aws()
        try:
            return aws.ConnectionSettings(**{name: getattr(self, name) for name in aws.OPTIONS})
        except aws.AwsSettingsError as exc:
            where = f" of {self.source}" if self.source else ""
            raise UsageError(f"Failed to read the EC2 connection{where}: {exc}") from None

    @classmethod
    def from_config(cls, config: Mapping[str, Any], source: str = "") -> Ec2Connection:
        """Each option as the plugin reads it: the source's value (or an alias), its env vars, its default."""
        aws = _aws()
        try:
            settings = aws.ConnectionSettings.from_options(config, environ=os.environ)
        except aws.AwsSettingsError as exc:
            where = f" of {source}" if source else ""
            raise UsageError(f"Failed to read the EC2 connection{where}: {exc}") from None
        regions = config.get("regions") or ()
        if isinstance(regions, str):  # Ansible's list type splits a string at commas
            regions = [r.strip() for r in regions.split(",") if r.strip()]
        return cls(**settings.as_dict(), regions=tuple(str(r) for r in regions), source=source)


def connection_for(inventories: Iterable[Path]) -> Ec2Connection | None:
    """The EC2 connection of the (first) fleetops.node.ec2 source; None when there is none."""
    found = next(ec2_sources(inventories), None)
    if found is None:
        return None
    path, config = found
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


def validate_settle(settle: float) -> float:
    """The lease's settle time (seconds between writing the tags and reading them back), checked."""
    if not isinstance(settle, (int, float)) or not math.isfinite(settle) or not 0 <= settle <= MAX_SETTLE_S:
        raise UsageError(
            f"the lease settle time must be between 0 and {MAX_SETTLE_S:g} seconds, got {settle!r}"
        )
    return float(settle)


def validate_ttl(ttl: float, settle: float = DEFAULT_SETTLE_S) -> float:
    """The lease TTL, checked: a finite number of seconds above the settle time, at most MAX_TTL_S.

    Call it when parsing the command line (UsageError, exit 2), before any lock is taken; Ec2Lease
    checks again when made.
    """
    settle = validate_settle(settle)
    if not isinstance(ttl, (int, float)) or not math.isfinite(ttl) or not settle < ttl <= MAX_TTL_S:
        raise UsageError(
            f"the lease TTL must be a number of seconds above the settle time ({settle:g}s) and at most "
            f"{MAX_TTL_S:g}, got {ttl!r}"
        )
    return float(ttl)


# --------------------------------------------------------------------------------------- the lease


def _iso(ts: float) -> str:
    return str(_protocol().iso(ts))


@dataclass
class Ec2Lease:
    """One rollout's lease on its EC2 instances: ``acquire``, ``start`` renewing, ``check``, ``release``.

    The tags, the take and the lost-race rules are module_utils/lease.py's (``encode``, ``plan_take``,
    ``beaten``, ``Ec2Tags``); this class adds the controller's part: the renewing thread and the guard.
    """

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
    store: Any = None  # module_utils/store.py's backend: the lease lives there, the tags are its mirror
    _tags: Any = None  # module_utils/lease.py Ec2Tags
    _held: Any = None  # module_utils/lease.py StoreLease, with a store
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self.ttl = validate_ttl(self.ttl, self.settle)
        self.settle = float(self.settle)
        regions = {target["instance"]: self._region_of(host) for host, target in self.instances.items()}
        self._tags = _protocol().Ec2Tags(
            self.connection.settings(), regions, user_agent="fleetops.rollout.lease"
        )
        if self.store is not None:
            self._held = _protocol().StoreLease(
                self.store,
                self.rollout,
                self._targets(),
                self.operator,
                self.ttl,
                tags=self._tags,
                clock=self.clock,
                controller=process_id(),
                dead=dead_here,
            )

    @property
    def key(self) -> str:
        return KEY_PREFIX + self.rollout

    def _region_of(self, host: str) -> str:
        region = self.instances[host].get("region") or ""
        if region:
            return region
        if self.connection.regions:
            return self.connection.regions[0]
        return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"

    def _targets(self) -> dict[str, str]:
        """{instance id: host}."""
        return {target["instance"]: host for host, target in self.instances.items()}

    def _api(self, func: Callable[..., Any], *args: Any) -> Any:
        """One of Ec2Tags' calls; its aws.AwsError (after the retries) as LeaseApiError."""
        aws = _aws()
        try:
            return func(*args)
        except aws.AwsError as exc:
            raise LeaseApiError(str(exc)) from None

    # the kill switch's EC2 channel (fleetops.rollout.locks) reads its tag through these: the lease's
    # clients and retry budget
    def _by_region(self) -> dict[str, list[str]]:
        """{region: [instance ids]}."""
        by_region: dict[str, list[str]] = self._tags.by_region()
        return by_region

    def _client(self, region: str) -> Any:
        return self._api(self._tags.client, region)

    def _call(self, operation: str, region: str, func: Callable[[], Any]) -> Any:
        """One request under the inventory's retry budget (module_utils/aws.py's call)."""
        return self._api(_aws().call, self._tags.settings, operation, region, func)

    def read(self) -> dict[str, dict[str, Any]]:
        """{instance id: {rollout: LeaseRecord}} for every lease tag on our instances."""
        leases: dict[str, dict[str, Any]] = self._api(self._tags.read)
        return leases

    # ---- the protocol ----------------------------------------------------------------------

    def _stored(self, func: Callable[..., Any], *args: Any) -> Any:
        """One of StoreLease's calls; a failing store or tag call as LeaseApiError, a refused take as
        LeaseError."""
        lease, store = _protocol(), module_utils("store")
        try:
            return func(*args)
        except lease.StoreLeaseError as exc:
            raise LeaseError(str(exc)) from None
        except store.StoreError as exc:
            raise LeaseApiError(f"Failed to use the shared store ({self.store.where()}): {exc}") from None
        except _aws().AwsError as exc:
            raise LeaseApiError(str(exc)) from None

    def _acquire_stored(self, break_lock: bool | str) -> None:
        held = self._held
        self._stored(self.store.ensure)  # the table is created on first use
        self._stored(held.acquire, break_lock)  # nothing is kept when it fails
        for line in held.broken:
            self.say(f"lease: {line}: its instances taken over")
        self.value, self.since, self.expires = held.tag_value, held.since, held.expires
        self.say(
            f"lease: took {len(self.instances)} instance(s) in the shared store ({self.store.where()}) as "
            f"rollout {self.rollout} until {_iso(self.expires)} (renewed every {self.ttl / 3:.0f}s; tags "
            f"{self.key} mirror it)"
        )

    def acquire(self, break_lock: bool | str = False) -> None:
        """Take the lease on every instance, or raise LeaseError naming who holds it (nothing kept)."""
        if not self.instances:
            return
        if self._held is not None:
            self._acquire_stored(break_lock)
            return
        now = self.clock()
        targets = self._targets()
        plan = _protocol().plan_take(targets, self.read(), self.rollout, now, break_lock)
        if plan["conflicts"]:
            raise LeaseError(
                _protocol().refusal(
                    plan["conflicts"], "Wait for it, resume it, or pass --break-lock [ROLLOUT] if it is stale"
                )
            )
        removals: dict[tuple[str, str], list[str]] = {}  # (their key, their value) -> instances
        for instance, record, why in plan["removals"]:
            what = "taking over the expired lease of" if why == "expired" else "breaking the lease of"
            self.say(f"lease: {_protocol().where(targets.get(instance, instance), instance)}: {what} "
                     f"{record.describe(now)}" + ("" if why == "expired" else " (--break-lock)"))  # fmt: skip
            removals.setdefault((KEY_PREFIX + record.rollout, record.value), []).append(instance)
        for (their_key, their_value), ids in removals.items():
            self._api(self._tags.delete, ids, their_key, their_value)
        # whole seconds: the tag stores whole seconds, and every rollout must compare the same values
        own_since = plan["own_since"]
        self.since = float(own_since) if own_since is not None else float(int(now))
        self.expires = now + self.ttl
        self.value = str(_protocol().encode(self.operator, self.since, self.expires))
        self._api(self._tags.write, list(targets), self.key, self.value)
        if self.settle > 0:
            time.sleep(self.settle)
        beaten = self._beaten(self.read(), self.clock())
        if beaten:
            self.release()
            raise LeaseError(_protocol().lost_race(beaten))
        self.say(
            f"lease: tagged {len(self.instances)} instance(s) {self.key} until {_iso(self.expires)} "
            f"(renewed every {self.ttl / 3:.0f}s)"
        )

    def _beaten(self, leases: dict[str, dict[str, Any]], now: float) -> list[str]:
        """Instances where our lease is gone, or a live lease taken before ours is there too."""
        lines: list[str] = _protocol().beaten(self._targets(), leases, self.rollout, self.since, now)
        return lines

    def renew(self) -> None:
        """Re-read, then extend our lease; marks it lost when it was broken or overtaken."""
        if self.lost is not None or self.value is None:
            return
        if self._held is not None:
            self._renew_stored()
            return
        now = self.clock()
        try:
            beaten = self._beaten(self.read(), now)
            if beaten:
                self.lost = "the EC2 lease was lost: " + "; ".join(beaten[:5])
                return
            expires = now + self.ttl
            value = str(_protocol().encode(self.operator, self.since, expires))
            self._api(self._tags.write, list(self._targets()), self.key, value)
        except LeaseApiError as exc:
            if self.clock() >= self.expires:
                self.lost = f"the EC2 lease expired: renewing it failed: {exc}"
            else:
                self.say(f"lease: renewing failed (will retry; it expires {_iso(self.expires)}): {exc}")
            return
        self.value, self.expires = value, expires

    def _renew_stored(self) -> None:
        try:
            self._stored(self._held.renew)
        except LeaseApiError as exc:
            if self.clock() >= self.expires:
                self.lost = f"the lease expired: renewing it failed: {exc}"
            else:
                self.say(f"lease: renewing failed (will retry; it expires {_iso(self.expires)}): {exc}")
            return
        except _protocol().StoreLeaseLost as exc:
            self.lost = str(exc)
            return
        self.value, self.expires = self._held.tag_value, self._held.expires

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
        if self._held is not None:
            self.value = None
            try:
                self._stored(self._held.release)
            except (LeaseApiError, LeaseError) as exc:
                self.say(f"lease: could not release it in the store (it expires {_iso(self.expires)}): {exc}")
            return
        value, self.value = self.value, None
        for region, ids in self._tags.by_region().items():
            try:
                self._api(self._tags.delete, ids, self.key, value)
            except LeaseApiError as exc:
                self.say(
                    f"lease: could not remove the lease tags in {region} (they expire {_iso(self.expires)}): {exc}"
                )
