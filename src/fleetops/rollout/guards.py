"""Rollout guards: pure checks the engine makes at plan time and before every batch (issue 14).

No I/O, no ansible: each function takes data and returns data or raises ``UsageError`` (exit 2)
with one line. The engine decides what a failed guard does to a running rollout (stop, exit 3).

- **Target names** (``check_target_names``): a batch reaches ansible as a ``--limit`` joined from
  inventory names, and inventory names are data (EC2 Name tags). ansible-core reads a limit as a
  pattern list (``lib/ansible/inventory/manager.py``): ``split_host_pattern`` splits on ``,`` (and,
  with no comma, on ``:``, whitespace and ``[..]``) and strips whitespace; ``order_patterns`` makes
  ``!x`` an exclusion and ``&x`` an intersection, and a limit made only of those means ``all`` minus
  / intersected with them (``--limit '!spare'`` selects every other host); ``_match_one_pattern``
  reads ``~x`` as a regex and ``* ? [ ]`` as a glob; ``_split_subscript`` reads a trailing ``[N]`` /
  ``[N:M]`` as a slice; ``subset`` reads ``@FILE`` as a file of names; a pattern equal to a group
  name (or ``all``) selects the group. ansible-core 2.21 tries "is this exactly a host?" before
  any of that, but only for a host that is *still in the inventory*: once an instance is gone (or
  renamed) between plan and batch, ``gpu-*`` or a group-named host is a pattern again and selects
  other hosts. So a name is accepted only if it means exactly itself whether or not it is there;
  everything else is refused at plan time. A leading ``-`` is refused because the name is an
  argument to ansible and kubectl. tests/fleetops/test_guards.py proves this against ansible
  itself.
- **Kubernetes node names** (``check_k8s_node_name``): RFC 1123 DNS subdomain, as the API server
  validates node names; kubectl gets them after ``--``.
- **Exact hosts** (``exact_hosts_check``): the hosts that reported must be the batch.
- **Empty never means all** (``require_targets``).
- **Capacity floor** (``MaxUnhealthy``, ``capacity_violation``).
- **Deadline** (``parse_not_after``, ``deadline_passed``).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from fractions import Fraction

from fleetops.errors import UsageError

# --------------------------------------------------------------------------------------- target names

# Characters ansible's host-pattern parser gives a meaning to, anywhere in a name.
PATTERN_CHARS = frozenset("!&~,*?[]:")
# Characters that mean something at the start of a limit or an argument list.
LEADING_CHARS = frozenset("-@")
# Group names every inventory has (a limit naming them selects the group, never a host).
BUILTIN_GROUPS = frozenset({"all", "ungrouped"})

RENAME_HINT = (
    "rename the host (its EC2 Name tag), or choose another hostname for it "
    "(the fleetops.node.ec2 inventory's hostnames preference, e.g. private-dns-name or instance-id)"
)


def target_name_problem(name: str, groups: Collection[str] = ()) -> str | None:
    """Why ``name`` cannot be targeted exactly through an ansible ``--limit``; None when it can.

    ``groups`` are the inventory's group names (``all`` and ``ungrouped`` are always added).
    """
    if name == "":
        return "is empty"
    for ch in name:
        if ch.isspace():
            return f"contains whitespace (U+{ord(ch):04X}), where ansible splits a host pattern"
        if not ch.isprintable():
            kind = unicodedata.category(ch)
            return f"contains a control or invisible character (U+{ord(ch):04X}, category {kind})"
    special = sorted(set(name) & PATTERN_CHARS)
    if special:
        shown = " ".join(special)
        return f"contains {shown}, which ansible reads as a host pattern (exclusion, intersection, regex, list, glob, range or port)"
    if name[0] == "-":
        return "starts with '-', which ansible and kubectl read as an option"
    if name[0] == "@":
        return "starts with '@', which ansible reads as '--limit @FILE' (a file of host names)"
    if name in BUILTIN_GROUPS:
        return f"is ansible's built-in group {name!r}, which selects every host"
    if name in groups:
        return f"is also the name of the inventory group {name!r}, which a limit selects instead once the host is gone"
    return None


def check_target_names(hosts: Sequence[str], groups: Iterable[str]) -> None:
    """Refuse (UsageError, one line) the first host whose name is not targeted exactly by a limit.

    Call at plan time on every targeted host, before anything runs (``fleetops plan``, ``remediate``,
    ``fix`` and a ``--resume``'s hosts), with every group name of the inventory.
    """
    group_set = frozenset(groups)
    bad = [(h, p) for h in hosts if (p := target_name_problem(h, group_set)) is not None]
    if not bad:
        return
    host, problem = bad[0]
    more = f" ({len(bad) - 1} more host name(s) refused too)" if len(bad) > 1 else ""
    raise UsageError(
        f"host name {host!r} {problem}: fleetops targets hosts by their exact name and refuses "
        f"names ansible or kubectl would read otherwise; {RENAME_HINT}{more}"
    )


def require_targets(hosts: Collection[str], what: str) -> None:
    """Empty never means all: refuse (UsageError) when ``what`` (e.g. "--limit 'gpu-*'", "the
    inventory inventory/lab.yml", "the fix plan fix.json") selects no host at all."""
    if not hosts:
        raise UsageError(f"{what} matches no host: nothing to do (an empty selection never means all hosts)")


def require_matched(unmatched: Collection[str], limit: str | None) -> None:
    """A selection never grows or shrinks unseen: refuse (UsageError) a ``limit`` of which any part
    (``inventory.unmatched_parts``: a typo, a group without hosts) selects no host, naming them all."""
    if unmatched:
        parts = ", ".join(repr(p) for p in unmatched)
        raise UsageError(
            f"--limit {limit!r}: {parts} match{'es' if len(unmatched) == 1 else ''} no host of the inventory "
            "(a typo, or a group without hosts): nothing run; fix or drop each part"
        )


def exact_hosts_check(batch: Iterable[str], reported: Iterable[str]) -> set[str]:
    """The hosts that reported results but are not in the batch (empty: the run was exact).

    A non-empty answer means the ``--limit`` selected hosts it should not have: stop the rollout
    (exit 3) naming them. Hosts of the batch that did not report at all are ``missing_hosts``.
    """
    return set(reported) - set(batch)


def missing_hosts(batch: Iterable[str], reported: Iterable[str]) -> set[str]:
    """The batch's hosts that reported nothing (the engine records them failed: never done)."""
    return set(batch) - set(reported)


def extra_hosts_reason(extra: Collection[str]) -> str:
    """The one-line stop reason for ``exact_hosts_check``'s non-empty answer."""
    names = " ".join(sorted(extra)[:10]) + (f" and {len(extra) - 10} more" if len(extra) > 10 else "")
    return (
        f"{len(extra)} host(s) outside the batch ran the playbook: {names}; "
        "the batch's limit selected more than its hosts (rollout stopped)"
    )


# --------------------------------------------------------------------------------------- kubernetes

K8S_NAME_MAX = 253
# Kubernetes' IsDNS1123Subdomain (k8s.io/apimachinery/pkg/util/validation): dot-separated labels of
# lowercase alphanumerics and '-', each starting and ending with an alphanumeric.
_K8S_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
K8S_NODE_NAME = re.compile(rf"{_K8S_LABEL}(\.{_K8S_LABEL})*")


def k8s_node_name_ok(name: str) -> bool:
    """Whether ``name`` is a valid Kubernetes node name (RFC 1123 subdomain, at most 253 chars)."""
    return len(name) <= K8S_NAME_MAX and K8S_NODE_NAME.fullmatch(name) is not None


def check_k8s_node_name(name: str, host: str | None = None) -> None:
    """Refuse (UsageError, one line) a node name kubectl must not be given; ``host`` is the
    inventory host it belongs to (its ``k8s_node_name`` hostvar, or its own name)."""
    if k8s_node_name_ok(name):
        return
    of = f" (of host {host!r})" if host is not None and host != name else ""
    why = (
        f"is {len(name)} characters, more than {K8S_NAME_MAX}"
        if len(name) > K8S_NAME_MAX
        else "is not an RFC 1123 DNS subdomain (lowercase letters, digits, '-' and '.', "
        "each dot-separated part starting and ending with a letter or digit)"
    )
    raise UsageError(
        f"Kubernetes node name {name!r}{of} {why}: set the host's k8s_node_name hostvar to its node's name"
    )


# --------------------------------------------------------------------------------------- capacity

DEFAULT_REBOOT_MAX_UNHEALTHY = "10%"
"""The default ``--max-unhealthy`` of a reboot rollout: 10% of each group, rounded down.

A rolling reboot takes capacity away on purpose; the floor is there so it never takes it from a
group that has already lost some on its own. 10% rounded down means a group of fewer than 10 hosts
tolerates *no* other unhealthy host while one of its hosts is rebooted (with one of three lab
hosts down, rebooting a second leaves one serving), 20 hosts tolerate 2, 200 tolerate 20.
Why not a count such as 1: at fleet scale a few percent of a large AZ is always broken, so a fixed
count stops every rollout there and teaches operators to turn the guard off. Why not higher: the
thresholds others use are for *involuntary* disruption and decide when to stop automatic repairs
(Kubernetes calls a zone "partially disrupted" at 55% of its nodes NotReady and slows evictions;
medik8s NHC's minHealthy defaults to 51%), while a planned reboot can simply wait; the AWS S3
outage of 2017 was a planned removal of capacity that went too far. The operator raises it
knowingly (``--max-unhealthy 1`` for a 3-host group with one host down), and ``0`` means none.
"""


@dataclass(frozen=True)
class MaxUnhealthy:
    """``--max-unhealthy N|P%|N,P%``: at most this many hosts of a batch's group may be unhealthy
    (not counting the batch) for the batch to start; with both a count and a percent, the smaller."""

    count: int | None = None
    percent: Fraction | None = None  # of the group's size, rounded down

    def __post_init__(self) -> None:
        if self.count is None and self.percent is None:
            raise UsageError("--max-unhealthy: give a host count, a percent, or both (N, P% or N,P%)")
        if self.count is not None and self.count < 0:
            raise UsageError(f"--max-unhealthy must not be negative, got {self.count}")
        if self.percent is not None and not 0 <= self.percent <= 100:
            raise UsageError(f"--max-unhealthy must be between 0% and 100%, got {_pct(self.percent)}%")

    @classmethod
    def parse(cls, text: str) -> MaxUnhealthy:
        """``"2"`` (hosts), ``"10%"`` / ``"12.5%"`` (of the group, rounded down), or ``"2,10%"``."""
        count: int | None = None
        percent: Fraction | None = None
        parts = [p.strip() for p in text.split(",")]
        if not 1 <= len(parts) <= 2:
            raise UsageError(f"--max-unhealthy: not N, P% or N,P%: {text!r}")
        for part in parts:
            if re.fullmatch(r"[0-9]+", part):
                if count is not None:
                    raise UsageError(f"--max-unhealthy: two host counts in {text!r}")
                count = int(part)
            elif re.fullmatch(r"[0-9]+(\.[0-9]+)?%", part):
                if percent is not None:
                    raise UsageError(f"--max-unhealthy: two percentages in {text!r}")
                percent = Fraction(part[:-1])
            else:
                raise UsageError(
                    f"--max-unhealthy: {part!r} is not a host count or a percentage (N, P% or N,P%)"
                )
        return cls(count=count, percent=percent)

    def allowed(self, group_size: int) -> int:
        """How many unhealthy hosts a group of ``group_size`` hosts tolerates."""
        limits: list[int] = []
        if self.count is not None:
            limits.append(self.count)
        if self.percent is not None:
            limits.append(math.floor(self.percent * group_size / 100))
        return min(limits)

    def __str__(self) -> str:
        parts = [] if self.count is None else [str(self.count)]
        if self.percent is not None:
            parts.append(f"{_pct(self.percent)}%")
        return ",".join(parts)


def _pct(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{float(value):g}"


NO_GROUP = "(no group)"


def group_sizes(group_of: Mapping[str, str | None]) -> Counter[str | None]:
    """Hosts per group, from ``{host: group}`` over every host of the rollout."""
    return Counter(group_of.values())


def named(hosts: Sequence[str], shown: int = 5) -> str:
    """The first ``shown`` of ``hosts``, then how many more: ``a b c d e and 7 more``."""
    return " ".join(hosts[:shown]) + (f" and {len(hosts) - shown} more" if len(hosts) > shown else "")


def capacity_violation(
    batch_hosts: Iterable[str],
    group_of: Mapping[str, str | None],
    sizes: Mapping[str | None, int] | None,
    unhealthy: Collection[str],
    limit: MaxUnhealthy,
) -> str | None:
    """Why the batch must not start (one line naming the group and the counts), or None.

    ``group_of`` maps every host of the rollout to its group (None: no group key; a host missing
    from it counts as no group); ``sizes`` are the groups' sizes (None: counted from ``group_of``);
    ``unhealthy`` are the hosts unreachable at preflight or at their last gate, failed or timed out.
    A group is checked when the batch has hosts in it; the batch's own hosts are not counted.
    """
    batch = list(dict.fromkeys(batch_hosts))
    batch_set = set(batch)
    sizes = sizes if sizes is not None else group_sizes(group_of)
    for group in dict.fromkeys(group_of.get(h) for h in batch):
        down = sorted(h for h in unhealthy if h not in batch_set and group_of.get(h) == group)
        size = sizes.get(group, 0)
        allowed = limit.allowed(size)
        if len(down) > allowed:
            label = NO_GROUP if group is None else f"group {group}"
            return (
                f"{label}: {len(down)} of its {size} hosts are unhealthy ({named(down)}), more than the "
                f"{allowed} that --max-unhealthy {limit} allows; its next batch would take more capacity away"
            )
    return None


# --------------------------------------------------------------------------------------- deadline

_DURATION = re.compile(r"(?:(?P<d>[0-9]+)d)?(?:(?P<h>[0-9]+)h)?(?:(?P<m>[0-9]+)m)?(?:(?P<s>[0-9]+)s)?")
_ISO_DURATION = re.compile(
    r"P(?:(?P<d>[0-9]+)D)?(?:T(?=[0-9])(?:(?P<h>[0-9]+)H)?(?:(?P<m>[0-9]+)M)?(?:(?P<s>[0-9]+)S)?)?"
)
MAX_DEADLINE = timedelta(days=366)


def _duration(text: str) -> int | None:
    """Seconds in ``90s``, ``30m``, ``2h``, ``1d``, ``1h30m`` or ISO 8601 ``PT1H30M``; None when not a duration."""
    m = _DURATION.fullmatch(text) or _ISO_DURATION.fullmatch(text)
    if m is None or not any(m.groupdict().values()):
        return None
    d, h, mi, s = (int(m.group(k) or 0) for k in ("d", "h", "m", "s"))
    return ((d * 24 + h) * 60 + mi) * 60 + s


def parse_not_after(text: str, now: datetime) -> datetime:
    """``--not-after TIME``: an ISO 8601 time (a naive one is local time) or a duration from ``now``.

    Returns a timezone-aware datetime. ``now`` must be aware (``datetime.now(UTC)``). Refuses
    (UsageError, one line) anything else, a time not after ``now``, and more than a year ahead.
    """
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("parse_not_after needs an aware 'now'")
    raw = text.strip()
    seconds = _duration(raw)
    if seconds is not None:
        if seconds <= 0:
            raise UsageError(f"--not-after {text!r}: the duration must be more than zero")
        if seconds > MAX_DEADLINE.total_seconds():
            raise UsageError(f"--not-after {text!r}: more than {MAX_DEADLINE.days} days ahead")
        return now + timedelta(seconds=seconds)
    try:
        when = datetime.fromisoformat(raw)
    except ValueError:
        raise UsageError(
            f"--not-after {text!r}: not an ISO 8601 time (2026-12-01T18:00, 2026-12-01T18:00:00Z, "
            "a naive time is local) or a duration (90s, 30m, 2h, 1d, 1h30m)"
        ) from None
    if when.tzinfo is None:
        when = when.astimezone()  # a naive time is the controller's local time
    if when <= now:
        raise UsageError(f"--not-after {text!r}: {when.isoformat()} is already past (now {now.isoformat()})")
    if when - now > MAX_DEADLINE:
        raise UsageError(f"--not-after {text!r}: more than {MAX_DEADLINE.days} days ahead")
    return when


def deadline_passed(not_after: datetime | None, now: datetime) -> bool:
    """Whether no batch may start any more (``now`` at or after ``not_after``; None: no deadline)."""
    return not_after is not None and now >= not_after


def deadline_reason(not_after: datetime) -> str:
    """The one-line stop reason when ``deadline_passed``."""
    return f"the deadline --not-after {not_after.isoformat()} has passed: no further batch starts"
