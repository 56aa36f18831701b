"""Rollout planning: rolling batches under a global cap, a per-group (AZ) cap and a canary (design §5).

Ansible's ``serial`` cannot say "at most N per AZ while AZs proceed in parallel"
(ansible/ansible#85965), so fleetops plans the batches itself and runs each one as its own
``--limit``. This module is pure: no I/O, no ansible; the same input always gives the same plan.

The plan is optimal. With ``R`` hosts left after the canary, ``r_g`` of them in group ``g``, a
global cap ``G`` and a per-group cap ``P``, no plan can take fewer than
``max(ceil(R / G), max_g ceil(r_g / P))`` batches after the canary, and this planner takes exactly
that many. Each batch is filled one host at a time from the group with the most hosts left that
is still under ``P`` in this batch ("water-filling"), up to ``G`` hosts. Why that reaches the bound:
a batch that stops short of ``G`` took everything every group could give, so the global term drops
by one; a batch of ``G`` hosts leaves no group above ``(B - 1) * P`` — if one did, every pick came
from a group at least that full, which would make ``R > B * G``. Taking ``P`` from each of the
largest groups in turn is *not* optimal: ``G=6, P=2`` over four groups of 3 needs 3 batches that way
and 2 this way. The canary's hosts are chosen to keep that bound as low as any canary can, and
spread over as many groups as possible after that.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from fractions import Fraction
from typing import Protocol

from fleetops.errors import UsageError

UNGROUPED = "ungrouped"
_GLOB_CHARS = frozenset("*?[")


class PlanError(UsageError):
    """The caps, canary, exclusions or hosts cannot make a valid plan: exit 2."""


class GroupedHost(Protocol):
    """What the planner needs of a host: its name and its group key (None or "" = no key)."""

    @property
    def name(self) -> str: ...

    @property
    def group(self) -> str | None: ...


@dataclass(frozen=True)
class Host:
    """A plain host for the planner (``fleetops.ansible.inventory.InventoryHost`` fits the same shape)."""

    name: str
    group: str | None = None


def natural_key(text: str) -> tuple[tuple[str | int, ...], str]:
    """Sort key that orders digit runs by value: lab-2 < lab-10 (the text itself breaks ties)."""
    parts = re.split(r"(\d+)", text)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), text


def group_key(group: str) -> tuple[bool, tuple[tuple[str | int, ...], str]]:
    """Groups in natural order, with "ungrouped" last."""
    return group == UNGROUPED, natural_key(group)


@dataclass(frozen=True)
class MaxParallel:
    """The global cap as the operator gave it: a host count, or a percent of the targeted hosts."""

    count: int | None = None
    percent: Fraction | None = None

    def __post_init__(self) -> None:
        if (self.count is None) == (self.percent is None):
            raise PlanError("max parallel: give either a host count or a percent")
        if self.count is not None and self.count < 1:
            raise PlanError(f"max parallel must be at least 1 host, got {self.count}")
        if self.percent is not None and not 0 < self.percent <= 100:
            raise PlanError(f"max parallel must be more than 0% and at most 100%, got {_pct(self.percent)}%")

    @classmethod
    def parse(cls, text: str) -> MaxParallel:
        """``"25"`` (hosts) or ``"10%"`` / ``"12.5%"`` (of the targeted hosts)."""
        raw = text.strip()
        if raw.endswith("%"):
            try:
                value = Fraction(raw[:-1].strip())
            except (ValueError, ZeroDivisionError):
                raise PlanError(f"not a percentage: {text!r}") from None
            return cls(percent=value)
        try:
            return cls(count=int(raw))
        except ValueError:
            raise PlanError(f"not a host count or a percentage (N or P%): {text!r}") from None

    def resolve(self, targeted: int) -> int:
        """Hosts per batch for this many targeted hosts: a percent rounds down, but never below 1."""
        if self.count is not None:
            return self.count
        assert self.percent is not None
        return max(1, math.floor(self.percent * targeted / 100))

    def __str__(self) -> str:
        return str(self.count) if self.count is not None else f"{_pct(self.percent or Fraction(0))}%"


def _pct(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{float(value):g}"


@dataclass(frozen=True)
class Caps:
    """The caps a plan was made under, resolved against its hosts."""

    max_parallel: str  # as given: "10%" or "25"
    max_parallel_hosts: int  # what that means for this plan's hosts
    per_group_max: int | None  # None: no per-group cap
    canary: int


@dataclass(frozen=True)
class Plan:
    """Ordered batches of host names; the first is the canary batch when ``caps.canary`` > 0."""

    batches: list[list[str]]
    excluded: list[str]
    caps: Caps
    lower_bound: int
    groups: dict[str, list[str]]  # planned hosts per group; groups in natural order, "ungrouped" last
    notes: list[str] = field(default_factory=list)

    @property
    def hosts(self) -> int:
        return sum(len(b) for b in self.batches)

    @property
    def has_canary(self) -> bool:
        return self.caps.canary > 0 and bool(self.batches)


def limiting_cap(result: Plan) -> str:
    """Which cap sets the plan's batch count, in words: the term of the bound (module docstring) that
    is largest after the canary, with the numbers that make it (``""`` for an empty plan)."""
    if not result.batches:
        return ""
    canary = set(result.batches[0]) if result.has_canary else set()
    left = {g: sum(h not in canary for h in names) for g, names in result.groups.items()}
    caps = result.caps
    rest = sum(left.values())
    by_global = -(-rest // caps.max_parallel_hosts)
    head = "1 canary batch, then " if canary else ""
    if caps.per_group_max is not None and rest:
        group, biggest = max(left.items(), key=lambda kv: kv[1])  # the first of the largest, in group order
        by_group = -(-biggest // caps.per_group_max)
        if by_group > by_global:
            return (
                f"{head}{by_group:,} batch(es) set by --per-group-max {caps.per_group_max}: the largest group, "
                f"{group}, has {biggest:,} host(s) left (raise --per-group-max to go faster; "
                f"--max-parallel alone would allow {by_global:,})"
            )
    return (
        f"{head}{by_global:,} batch(es) set by --max-parallel {caps.max_parallel} "
        f"({caps.max_parallel_hosts:,} host(s) a batch) over {rest:,} host(s)"
    )


def lower_bound(remaining: Iterable[int], max_parallel: int, per_group_max: int | None) -> int:
    """Fewest batches any plan needs for groups of these sizes: max(ceil(R/G), max ceil(r_g/P))."""
    sizes = [n for n in remaining if n > 0]
    if not sizes:
        return 0
    bound = -(-sum(sizes) // max_parallel)
    if per_group_max is not None:
        bound = max(bound, max(-(-n // per_group_max) for n in sizes))
    return bound


def plan(
    hosts: Sequence[GroupedHost],
    *,
    max_parallel: MaxParallel | int | str = "10%",
    per_group_max: int | None = 1,
    canary: int = 1,
    exclude: Sequence[str] = (),
) -> Plan:
    """Plan rolling batches over ``hosts`` (see the module docstring for the caps and the bound).

    ``exclude`` holds host names or shell-style patterns (``lab-1*``); each must match a host,
    so a misspelt exclusion cannot quietly leave a host in the rollout. The percent form of
    ``max_parallel`` is taken of the hosts left after exclusions.
    """
    cap_spec = _max_parallel(max_parallel)
    if per_group_max is not None and per_group_max < 1:
        raise PlanError(f"per-group max must be at least 1, got {per_group_max}")
    if canary < 0:
        raise PlanError(f"canary must be 0 or more hosts, got {canary}")

    seen: set[str] = set()
    dupes: set[str] = set()
    for h in hosts:
        if not h.name:
            raise PlanError("a host has an empty name")
        (dupes if h.name in seen else seen).add(h.name)
    if dupes:
        raise PlanError(f"duplicate host names: {', '.join(sorted(dupes, key=natural_key))}")

    excluded = _excluded(seen, exclude)
    targets = [h for h in hosts if h.name not in excluded]
    groups: dict[str, list[str]] = {}
    no_key = 0
    for h in targets:
        group = h.group if h.group else UNGROUPED
        no_key += not h.group
        groups.setdefault(group, []).append(h.name)
    groups = {g: sorted(groups[g], key=natural_key) for g in sorted(groups, key=group_key)}

    global_cap = cap_spec.resolve(len(targets))
    caps = Caps(str(cap_spec), global_cap, per_group_max, canary)
    if canary > global_cap:
        raise PlanError(
            f"canary ({canary}) is larger than the global cap ({global_cap} host(s) from max parallel {cap_spec})"
        )
    notes: list[str] = []
    if no_key:
        notes.append(f"{no_key} host(s) have no group key: planned as group {UNGROUPED!r}")
    if not targets:
        return Plan([], sorted(excluded, key=natural_key), caps, 0, groups, notes)

    group_cap = per_group_max if per_group_max is not None else len(targets)
    left = {g: len(names) for g, names in groups.items()}
    batch_counts: list[dict[str, int]] = []
    if canary:
        batch_counts.append(_canary_counts(left, canary, global_cap, group_cap, per_group_max))
        for g, n in batch_counts[0].items():
            left[g] -= n
    bound = len(batch_counts) + lower_bound(left.values(), global_cap, per_group_max)
    batch_counts.extend(_water_fill(left, global_cap, group_cap))

    taken = dict.fromkeys(groups, 0)
    batches: list[list[str]] = []
    for counts in batch_counts:
        batch: list[str] = []
        for g in groups:  # natural group order, then natural host order inside each group
            n = counts.get(g, 0)
            batch.extend(groups[g][taken[g] : taken[g] + n])
            taken[g] += n
        batches.append(batch)
    return Plan(batches, sorted(excluded, key=natural_key), caps, bound, groups, notes)


def _max_parallel(value: MaxParallel | int | str) -> MaxParallel:
    if isinstance(value, MaxParallel):
        return value
    if isinstance(value, int):
        return MaxParallel(count=value)
    return MaxParallel.parse(value)


def _excluded(names: set[str], patterns: Sequence[str]) -> set[str]:
    excluded: set[str] = set()
    unmatched: list[str] = []
    for pattern in patterns:
        if _GLOB_CHARS.intersection(pattern):
            hits = {n for n in names if fnmatchcase(n, pattern)}
        else:
            hits = {pattern} & names
        if not hits:
            unmatched.append(pattern)
        excluded |= hits
    if unmatched:
        raise PlanError(f"--exclude matches no targeted host: {', '.join(unmatched)}")
    return excluded


def _canary_counts(
    left: dict[str, int], canary: int, global_cap: int, group_cap: int, per_group_max: int | None
) -> dict[str, int]:
    """How many canary hosts to take from each group.

    First the fewest per group that keep the bound after the canary as low as any canary can
    (taking enough from the largest groups), then the rest spread: one per group, groups with
    none yet first, larger groups first, until ``canary`` hosts.
    """
    room = {g: min(n, group_cap) for g, n in left.items()}
    if canary > sum(room.values()):
        why = f"at most {per_group_max} per group over " if per_group_max is not None else ""
        raise PlanError(
            f"canary ({canary}) cannot be met: {why}{len(left)} group(s) and {sum(left.values())} "
            f"host(s) allow at most {sum(room.values())} host(s) in the first batch"
        )
    after = sum(left.values()) - canary
    floor = -(-after // global_cap)  # the global term of the bound, whichever hosts the canary takes
    level = max(floor, max(-(-max(0, n - group_cap) // group_cap) for n in left.values()))
    while sum(max(0, n - level * group_cap) for n in left.values()) > canary:
        level += 1
    counts = {g: max(0, n - level * group_cap) for g, n in left.items()}
    spare = canary - sum(counts.values())
    order = sorted(left, key=lambda g: (-(left[g] - counts[g]), group_key(g)))
    while spare:
        # one more host from each group that has the fewest canary hosts so far and room left
        fewest = min(counts[g] for g in order if counts[g] < room[g])
        for g in order:
            if spare and counts[g] == fewest and counts[g] < room[g]:
                counts[g] += 1
                spare -= 1
    return {g: n for g, n in counts.items() if n}


def _water_fill(left: dict[str, int], global_cap: int, group_cap: int) -> list[dict[str, int]]:
    """Per-batch counts per group: each host from the fullest group still under ``group_cap``.

    One heap over the groups for the whole plan (fullest first, then ``group_key`` order); a
    group that reaches ``group_cap`` sits out the rest of the batch. O(hosts * log(groups)).
    """
    rank = {g: i for i, g in enumerate(sorted(left, key=group_key))}
    heap = [(-n, rank[g], g) for g, n in left.items() if n > 0]
    heapq.heapify(heap)
    batches: list[dict[str, int]] = []
    while heap:
        counts: dict[str, int] = {}
        sitting_out: list[tuple[int, int, str]] = []
        taken = 0
        while heap and taken < global_cap:
            neg_left, r, g = heapq.heappop(heap)
            counts[g] = counts.get(g, 0) + 1
            taken += 1
            if neg_left + 1 < 0:  # g still has hosts
                if counts[g] < group_cap:
                    heapq.heappush(heap, (neg_left + 1, r, g))
                else:
                    sitting_out.append((neg_left + 1, r, g))
        for item in sitting_out:
            heapq.heappush(heap, item)
        batches.append(counts)
    return batches


def one_per_batch(plan_: Plan, key_of: Callable[[str], str | None], what: str) -> Plan:
    """``plan_`` with no two hosts of one key (an Auto Scaling group, say) in a batch: the second and
    later are moved to batches of their own right after it, in order. Hosts without a key are left
    as they are. A note says how many hosts were moved, and why (``what``)."""
    out: list[list[str]] = []
    moved: set[str] = set()
    for batch in plan_.batches:
        rest = list(batch)
        while rest:
            seen: set[str] = set()
            now: list[str] = []
            later: list[str] = []
            for host in rest:
                key = key_of(host)
                if key is None or key not in seen:
                    now.append(host)
                    if key is not None:
                        seen.add(key)
                else:
                    later.append(host)
            out.append(now)
            moved.update(later)
            rest = later
    if not moved:
        return plan_
    note = f"{len(moved)} host(s) moved to later batches: {what}"
    return replace(plan_, batches=out, notes=[*plan_.notes, note])
