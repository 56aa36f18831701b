"""The kill switch: ``fleetops stop [ROLLOUT | --all] [--reason TEXT]`` (issue 14).

A running rollout asks before every batch whether someone asked it to stop; if so it stops after
its current batch (state saved, exit 3) and says who stopped it, when and why. Two channels:

- **On this controller**: a small JSON file in ``<state home>/stops/`` (0600 in a 0700 directory):
  ``stop-<rollout id>.json`` for one rollout, ``stop-all.json`` for every rollout::

      {"schema": "fleetops.rollout.stop/v1", "rollout": "20261129T170102Z-3fa9c1" | null,
       "operator": "alice@bastion", "requested": 1795971662.5, "requested_at": "2026-11-29T17:01:02Z",
       "reason": "wrong AMI"}

  Written atomically: a temporary file created with ``O_EXCL | O_NOFOLLOW`` in the directory
  (opened ``O_NOFOLLOW``, so neither a link planted at the temporary name nor the directory being a
  link is followed), fsync, then a rename over the target (a link planted at the target is replaced,
  never written through), then fsync of the directory. Read without following links and without
  trusting the content: a file that exists but cannot be parsed (or is a link, a FIFO, garbage) still
  means STOP, with reason "malformed stop file" and its own mtime as the time.
- **On any controller** (EC2): the rollout's lease tags its instances ``fleetops:lease:<id>``
  (``fleetops.rollout.lease``); ``fleetops stop`` tags the same instances ``fleetops:stop`` with a
  JSON value of at most 256 characters::

      {"rollout": "20261129T170102Z-3fa9c1" | "*", "operator": "alice@bastion", "at": "...Z", "reason": "..."}

  (the operator and reason are shortened so the JSON fits; the JSON itself is never cut). An
  instance's tag that is not such JSON still means STOP. Each running rollout reads the tag on
  its own instances before every batch.

**Which rollouts a stop affects**: only those running when it was requested. A request applies to a
run when its rollout matches (``--all`` matches any) and it was requested at or after the time the
run started (``running_since``: when ``Engine.run`` began, so a ``--resume`` started after a stop is
not stopped by it). So ``stop-all.json`` needs no clearing: later rollouts ignore it (``fleetops stop
--clear`` removes it anyway). A rollout that honours a stop removes its own ``stop-<id>.json`` /
its own-valued ``fleetops:stop`` tag (``clear_stop``, ``clear_stop_ec2``). EC2 times come from
another controller's clock: a tag applies when requested up to ``EC2_CLOCK_SKEW_S`` before the run
started (a stop issued moments before a start may stop it too — the safe side).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from fleetops.errors import FleetopsError, UsageError
from fleetops.exitcodes import ExitCode
from fleetops.paths import state_home
from fleetops.rollout.lease import KEY_PREFIX, ROLLOUT_ID
from fleetops.util import iso_utc
from fleetops.values import CAUSE_MAX

SCHEMA = "fleetops.rollout.stop/v1"
STOP_DIR = "stops"
ALL_FILE = "stop-all.json"
MAX_FILE_BYTES = 64 * 1024
MAX_REASON = CAUSE_MAX  # the CLI refuses a longer --reason (values.cause): none given is cut
STOP_TAG = "fleetops:stop"
TAG_ALL = "*"
TAG_VALUE_MAX = 256
TAG_OPERATOR_MAX = 64
EC2_CLOCK_SKEW_S = 300.0
FILTER_CHUNK = 200  # values per DescribeTags filter
TAG_CHUNK = 500  # resources per CreateTags / DeleteTags call
MALFORMED_FILE = "malformed stop file"
MALFORMED_TAG = "malformed stop tag"

# How an EC2 call is made: (operation name, the call) -> its answer. The engine passes the lease's
# retrying caller (``lambda op, f: lease._call(op, region, f)``); the default calls once.
Ec2Call = Callable[[str, Callable[[], Any]], Any]


def _once(_operation: str, func: Callable[[], Any]) -> Any:
    return func()


class KillSwitchError(FleetopsError):
    """The stop request could not be written or removed (the stop directory is unsafe or unwritable)."""

    exit_code = ExitCode.FAILED


@dataclass(frozen=True)
class StopRequest:
    """One request to stop: a rollout (None: every rollout), by whom, when (epoch seconds) and why."""

    rollout: str | None
    operator: str
    requested: float
    reason: str
    source: str  # the stop file, or "EC2 tag fleetops:stop on i-..."
    raw: str | None = None  # an EC2 tag's exact value (what a conditional DeleteTags must name)
    scope: str | None = None  # what asked, when not `fleetops stop` (``fleetops pause``)

    def applies_to(self, rollout_id: str, running_since: float, skew: float = 0.0) -> bool:
        """Whether this request stops the run of ``rollout_id`` that started at ``running_since``."""
        matches = self.rollout is None or self.rollout == rollout_id
        return matches and self.requested >= running_since - skew

    def describe(self) -> str:
        """One line: ``stopped by alice@bastion at 2026-11-29T17:01:02Z (fleetops stop --all): wrong AMI``."""
        when = "an unknown time" if not math.isfinite(self.requested) else iso_utc(self.requested)
        scope = self.scope or (
            "fleetops stop --all" if self.rollout is None else f"fleetops stop {self.rollout}"
        )
        return f"stopped by {self.operator} at {when} ({scope}; {self.source}): {self.reason}"


def _parse_iso(text: str) -> float:
    import calendar

    return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))


def one_line(text: str, limit: int) -> str:
    """``text`` as one printable line of at most ``limit`` characters (whitespace runs become one space)."""
    cleaned = "".join(ch if ch.isprintable() and not ch.isspace() else " " for ch in text)
    cleaned = " ".join(cleaned.split())
    return cleaned if len(cleaned) <= limit else cleaned[: max(limit - 1, 0)] + "…"


def _check_rollout_id(rollout_id: str) -> None:
    if not ROLLOUT_ID.fullmatch(rollout_id):
        raise UsageError(f"not a rollout id (like 20261129T170102Z-3fa9c1): {rollout_id!r}")


def _file_name(rollout_id: str | None) -> str:
    if rollout_id is None:
        return ALL_FILE
    _check_rollout_id(rollout_id)
    return f"stop-{rollout_id}.json"


def stop_dir(directory: Path | None = None) -> Path:
    """Where stop files live: ``<state home>/stops`` ($FLEETOPS_STATE_DIR, as the engine's state)."""
    return directory if directory is not None else state_home() / STOP_DIR


# --------------------------------------------------------------------------------------- local files


def _open_dir(directory: Path, create: bool) -> int | None:
    """The stop directory, opened without following a link; created 0700 (and made 0700) to write."""
    if create:
        directory.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise KillSwitchError(
                f"Failed to create the stop directory {directory}: {exc.strerror}"
            ) from None
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        if create:
            raise KillSwitchError(f"Failed to open the stop directory {directory}: it vanished") from None
        return None
    except OSError as exc:
        raise KillSwitchError(
            f"Failed to open the stop directory {directory}: {exc.strerror} (a link or not a directory?)"
        ) from None
    if create:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            os.close(fd)
            raise KillSwitchError(
                f"Failed to write to the stop directory {directory}: it belongs to uid {st.st_uid}, not to us"
            )
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.fchmod(fd, 0o700)
    return fd


def _write_atomic(dir_fd: int, name: str, data: bytes) -> None:
    """Create a temporary file exclusively (never through a link), fsync, rename over ``name``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    candidates = [f".{name}.{os.getpid()}.tmp"] + [f".{name}.{secrets.token_hex(8)}.tmp" for _ in range(20)]
    for tmp in candidates:
        try:
            fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
        except FileExistsError:  # something sits at that name (perhaps a planted link): next name
            continue
        break
    else:
        raise KillSwitchError(f"Failed to write {name}: no free temporary name in the stop directory")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.fsync(dir_fd)


def request_stop(
    rollout_id: str | None,
    reason: str,
    who: str,
    *,
    directory: Path | None = None,
    now: float | None = None,
) -> Path:
    """Ask one rollout (``None``: every rollout running now) on this controller to stop after its
    current batch; returns the stop file. ``who`` is ``engine.operator()`` (user@controller)."""
    name = _file_name(rollout_id)
    requested = time.time() if now is None else now
    record = {
        "schema": SCHEMA,
        "rollout": rollout_id,
        "operator": one_line(who, 200) or "unknown",
        "requested": requested,
        "requested_at": iso_utc(requested),
        "reason": one_line(reason, MAX_REASON) or "no reason given",
    }
    folder = stop_dir(directory)
    dir_fd = _open_dir(folder, create=True)
    assert dir_fd is not None
    try:
        _write_atomic(dir_fd, name, (json.dumps(record, indent=2) + "\n").encode())
    except OSError as exc:
        raise KillSwitchError(f"Failed to write the stop file {folder / name}: {exc.strerror}") from None
    finally:
        os.close(dir_fd)
    return folder / name


def _read_file(dir_fd: int, name: str, folder: Path, rollout_id: str | None) -> StopRequest | None:
    """The stop request in ``name`` (None: no such file); anything unreadable is a malformed STOP."""
    source = str(folder / name)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError:  # a link (ELOOP), a socket, no permission: it is there, so it means stop
        try:
            mtime = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mtime
        except FileNotFoundError:
            return None
        except OSError:
            mtime = math.inf
        return StopRequest(
            rollout_id, "unknown", mtime, f"{MALFORMED_FILE} (not a readable regular file)", source
        )
    try:
        st = os.fstat(fd)
        data = os.read(fd, MAX_FILE_BYTES + 1) if stat.S_ISREG(st.st_mode) else b""
    finally:
        os.close(fd)
    malformed = StopRequest(rollout_id, "unknown", st.st_mtime, MALFORMED_FILE, source)
    if not stat.S_ISREG(st.st_mode) or len(data) > MAX_FILE_BYTES:
        return malformed
    try:
        record = json.loads(data)
        requested = float(record["requested"])
        operator, reason = record["operator"], record["reason"]
        valid = (
            record.get("schema") == SCHEMA
            and record.get("rollout") == rollout_id
            and math.isfinite(requested)
            and isinstance(operator, str)
            and isinstance(reason, str)
        )
    except (ValueError, TypeError, KeyError, UnicodeDecodeError):
        return malformed
    if not valid:
        return malformed
    return StopRequest(rollout_id, one_line(operator, 200), requested, one_line(reason, MAX_REASON), source)


def pending_stop(
    rollout_id: str, running_since: float, *, directory: Path | None = None
) -> StopRequest | None:
    """The stop request that applies to this run of ``rollout_id`` (its own first, then ``--all``), or None.

    Ask before every batch; ``running_since`` is when this run (``Engine.run``) started.
    """
    _check_rollout_id(rollout_id)
    folder = stop_dir(directory)
    try:
        dir_fd = _open_dir(folder, create=False)
    except KillSwitchError as exc:  # the stop directory is a link or not a directory: stop, say why
        return StopRequest(None, "unknown", math.inf, f"{MALFORMED_FILE}: {exc}", str(folder))
    if dir_fd is None:
        return None
    try:
        for owner in (rollout_id, None):
            request = _read_file(dir_fd, _file_name(owner), folder, owner)
            if request is not None and request.applies_to(rollout_id, running_since):
                return request
    finally:
        os.close(dir_fd)
    return None


def clear_stop(rollout_id: str | None, *, directory: Path | None = None) -> bool:
    """Remove the stop file of ``rollout_id`` (None: ``stop-all.json``), never another; True if one was there.

    The engine calls it for its own rollout once it has honoured the stop; ``fleetops stop --clear``
    calls it too. A link there is removed, not followed.
    """
    name = _file_name(rollout_id)
    folder = stop_dir(directory)
    dir_fd = _open_dir(folder, create=False)
    if dir_fd is None:
        return False
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise KillSwitchError(f"Failed to remove the stop file {folder / name}: {exc.strerror}") from None
    finally:
        os.close(dir_fd)
    return True


# --------------------------------------------------------------------------------------- EC2 tags


def stop_tag_value(rollout_id: str | None, reason: str, who: str, now: float) -> str:
    """The ``fleetops:stop`` tag's value: JSON of at most 256 characters (operator and reason shortened)."""
    operator = one_line(who, TAG_OPERATOR_MAX) or "unknown"
    why = one_line(reason, TAG_VALUE_MAX) or "no reason given"

    def encode(operator: str, why: str) -> str:
        record = {"rollout": rollout_id or TAG_ALL, "operator": operator, "at": iso_utc(now), "reason": why}
        return json.dumps(record, separators=(",", ":"), ensure_ascii=False)

    if len(encode(operator, why)) > TAG_VALUE_MAX:
        # the longest start of the reason that fits (escapes make the JSON longer than the text)
        lo, hi = 0, len(why)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if len(encode(operator, why[:mid] + "…")) <= TAG_VALUE_MAX:
                lo = mid
            else:
                hi = mid - 1
        why = why[:lo] + "…"
    while len(encode(operator, why)) > TAG_VALUE_MAX and len(operator) > 1:
        operator = operator[:-1]
    value = encode(operator, why)
    return value


def parse_stop_tag(value: str, source: str) -> StopRequest:
    """A ``fleetops:stop`` tag's request; a value that is not such JSON is a malformed STOP for every rollout."""
    try:
        record = json.loads(value)
        rollout, operator, reason = record["rollout"], record["operator"], record["reason"]
        requested = _parse_iso(record["at"])
        if not (isinstance(operator, str) and isinstance(reason, str)):
            raise TypeError
        if rollout != TAG_ALL and not (isinstance(rollout, str) and ROLLOUT_ID.fullmatch(rollout)):
            raise ValueError
    except (ValueError, TypeError, KeyError):
        return StopRequest(None, "unknown", math.inf, MALFORMED_TAG, source, value)
    return StopRequest(
        None if rollout == TAG_ALL else rollout,
        one_line(operator, TAG_OPERATOR_MAX),
        requested,
        one_line(reason, TAG_VALUE_MAX),
        source,
        value,
    )


def _describe_tags(client: Any, filters: list[dict[str, Any]], call: Ec2Call) -> list[dict[str, Any]]:
    tags: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"Filters": filters, "MaxResults": 1000}
        if token:
            kwargs["NextToken"] = token
        page = call("DescribeTags", partial(client.describe_tags, **kwargs))
        tags.extend(page.get("Tags", []))
        token = page.get("NextToken")
        if not token:
            return tags


def leased_instances(client: Any, rollout_id: str | None, *, call: Ec2Call = _once) -> list[str]:
    """The instances (of ``client``'s region) that carry the EC2 lease of ``rollout_id`` (None: of any rollout)."""
    if rollout_id is not None:
        _check_rollout_id(rollout_id)
    key = KEY_PREFIX + (rollout_id or "*")
    filters = [{"Name": "key", "Values": [key]}, {"Name": "resource-type", "Values": ["instance"]}]
    return sorted({str(t["ResourceId"]) for t in _describe_tags(client, filters, call)})


@dataclass(frozen=True)
class Ec2StopWrite:
    """What ``request_stop_ec2`` wrote: the tag's value and the instances it tagged."""

    value: str
    instances: tuple[str, ...]


def request_stop_ec2(
    client: Any,
    rollout_id: str | None,
    reason: str,
    who: str,
    instance_ids: Sequence[str] | None = None,
    *,
    now: float | None = None,
    call: Ec2Call = _once,
) -> Ec2StopWrite:
    """Tag ``fleetops:stop`` on the instances (None: those leased by ``rollout_id``, or by any rollout
    for ``--all``), so the rollouts holding them stop after their current batch, on any controller.
    No instance: nothing is written (``instances`` is empty; the CLI says no rollout holds a lease)."""
    if rollout_id is not None:
        _check_rollout_id(rollout_id)
    ids = (
        sorted(set(instance_ids))
        if instance_ids is not None
        else leased_instances(client, rollout_id, call=call)
    )
    value = stop_tag_value(rollout_id, reason, who, time.time() if now is None else now)
    for start in range(0, len(ids), TAG_CHUNK):
        chunk = ids[start : start + TAG_CHUNK]
        call(
            "CreateTags",
            partial(client.create_tags, Resources=chunk, Tags=[{"Key": STOP_TAG, "Value": value}]),
        )
    return Ec2StopWrite(value, tuple(ids))


def pending_stop_ec2(
    client: Any,
    instance_ids: Iterable[str],
    rollout_id: str,
    running_since: float,
    *,
    skew: float = EC2_CLOCK_SKEW_S,
    call: Ec2Call = _once,
) -> StopRequest | None:
    """The ``fleetops:stop`` request on any of the rollout's instances that applies to this run, or None.

    Ask before every batch with the instances of the rollout's lease in ``client``'s region.
    """
    _check_rollout_id(rollout_id)
    ids = sorted(set(instance_ids))
    found: list[StopRequest] = []
    for start in range(0, len(ids), FILTER_CHUNK):
        filters = [
            {"Name": "resource-id", "Values": ids[start : start + FILTER_CHUNK]},
            {"Name": "key", "Values": [STOP_TAG]},
        ]
        for tag in _describe_tags(client, filters, call):
            if tag.get("Key") == STOP_TAG and tag.get("ResourceId") in ids:
                where = f"EC2 tag {STOP_TAG} on {tag['ResourceId']}"
                found.append(parse_stop_tag(str(tag.get("Value", "")), where))
    applying = [r for r in found if r.applies_to(rollout_id, running_since, skew)]
    # our own rollout's request first, then --all, then malformed ones; the earliest of each kind
    applying.sort(
        key=lambda r: (r.rollout != rollout_id, not math.isfinite(r.requested), r.requested, r.source)
    )
    return applying[0] if applying else None


def clear_stop_ec2(
    client: Any, instance_ids: Iterable[str], request: StopRequest, *, call: Ec2Call = _once
) -> None:
    """Remove the ``fleetops:stop`` tag from the instances where it still has ``request``'s value
    (EC2 deletes a tag given with a value only while it has that value: a newer stop stays)."""
    if request.raw is None:
        raise ValueError("clear_stop_ec2 needs a request read from an EC2 tag")
    ids = sorted(set(instance_ids))
    for start in range(0, len(ids), TAG_CHUNK):
        chunk = ids[start : start + TAG_CHUNK]
        call(
            "DeleteTags",
            partial(client.delete_tags, Resources=chunk, Tags=[{"Key": STOP_TAG, "Value": request.raw}]),
        )
