"""The rollout planner: examples, then properties over random fleets (hypothesis)."""

from __future__ import annotations

import itertools
from collections import Counter
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetops.errors import UsageError
from fleetops.planner import (
    UNGROUPED,
    Host,
    MaxParallel,
    Plan,
    PlanError,
    lower_bound,
    natural_key,
    plan,
)


def fleet(**sizes: int) -> list[Host]:
    return [Host(f"{az}-{i}", az) for az, n in sizes.items() for i in range(1, n + 1)]


def group_counts(p: Plan, hosts: list[Host]) -> list[Counter[str]]:
    group_of = {h.name: h.group or UNGROUPED for h in hosts}
    return [Counter(group_of[h] for h in batch) for batch in p.batches]


# --- examples -----------------------------------------------------------------------------------


def test_natural_order_inside_batches_and_groups() -> None:
    hosts = [Host(f"lab-{i}", "a") for i in (10, 2, 1, 11, 3)]
    p = plan(hosts, max_parallel=5, per_group_max=None, canary=0)
    assert p.batches == [["lab-1", "lab-2", "lab-3", "lab-10", "lab-11"]]
    assert p.groups == {"a": ["lab-1", "lab-2", "lab-3", "lab-10", "lab-11"]}
    assert sorted(["lab-10", "lab-2", "lab-1"], key=natural_key) == ["lab-1", "lab-2", "lab-10"]
    assert sorted(["az-10", "az-9", "az-1b", "az-1a"], key=natural_key) == ["az-1a", "az-1b", "az-9", "az-10"]


def test_groups_proceed_in_parallel_one_per_group() -> None:
    hosts = fleet(a=3, b=2, c=1)
    p = plan(hosts, max_parallel=10, per_group_max=1, canary=0)
    assert p.batches == [["a-1", "b-1", "c-1"], ["a-2", "b-2"], ["a-3"]]
    assert p.lower_bound == 3


def test_canary_first_then_rest() -> None:
    hosts = fleet(a=4, b=4, c=4)
    p = plan(hosts, max_parallel=3, per_group_max=2, canary=1)
    assert p.batches[0] == ["a-1"]
    assert p.has_canary
    assert [len(b) for b in p.batches] == [1, 3, 3, 3, 2]
    assert len(p.batches) == p.lower_bound == 1 + 4  # ceil(11 / 3)


def test_canary_spreads_over_groups() -> None:
    hosts = fleet(a=10, b=10, c=10)
    p = plan(hosts, max_parallel=5, per_group_max=3, canary=3)
    assert p.batches[0] == ["a-1", "b-1", "c-1"]


def test_canary_takes_from_the_bottleneck_group_when_spreading_would_cost_a_batch() -> None:
    # one from each group leaves a=3 (2 more batches at 2 per group); two from a leaves 1 batch.
    hosts = fleet(a=4, b=1)
    p = plan(hosts, max_parallel=3, per_group_max=2, canary=2)
    assert p.batches == [["a-1", "a-2"], ["a-3", "a-4", "b-1"]]
    assert p.lower_bound == 2


def test_canary_spreads_what_the_bound_leaves_free() -> None:
    hosts = fleet(a=10, b=1, c=1)
    p = plan(hosts, max_parallel=3, per_group_max=3, canary=3)
    assert p.batches[0] == ["a-1", "b-1", "c-1"]
    assert len(p.batches) == p.lower_bound == 4


def test_water_filling_beats_taking_the_cap_from_the_largest_groups_in_turn() -> None:
    # P=2 from the largest groups in turn: a2 b2 c2 | a1 b1 c1 d2 | d1 -> 3 batches; the bound is 2.
    hosts = fleet(a=3, b=3, c=3, d=3)
    p = plan(hosts, max_parallel=6, per_group_max=2, canary=0)
    assert p.lower_bound == 2
    assert len(p.batches) == 2
    assert all(n <= 2 for counts in group_counts(p, hosts) for n in counts.values())


def test_percent_cap_rounds_down_but_never_below_one() -> None:
    assert MaxParallel.parse("10%").resolve(39) == 3
    assert MaxParallel.parse("10%").resolve(5) == 1
    assert MaxParallel.parse("10%").resolve(0) == 1
    assert MaxParallel.parse("12.5%").resolve(16) == 2
    assert MaxParallel.parse("100%").resolve(7) == 7
    assert MaxParallel.parse("5%").resolve(7500) == 375
    assert MaxParallel.parse("0.1%").resolve(7500) == 7
    assert MaxParallel.parse(" 25 ").resolve(3) == 25
    assert str(MaxParallel.parse("12.5%")) == "12.5%"
    assert str(MaxParallel.parse("10%")) == "10%"
    assert MaxParallel.parse("12.5%").percent == Fraction(25, 2)


def test_percent_is_of_the_hosts_left_after_exclusions() -> None:
    hosts = fleet(a=20)
    p = plan(hosts, max_parallel="50%", per_group_max=None, canary=0, exclude=["a-1*"])
    assert p.excluded == ["a-1", *(f"a-{i}" for i in range(10, 20))]
    assert p.caps.max_parallel_hosts == 4  # 50% of the 9 hosts left
    assert p.caps.max_parallel == "50%"


def test_exclusions_by_name_and_pattern() -> None:
    hosts = fleet(a=3, b=3)
    p = plan(hosts, max_parallel=10, per_group_max=None, canary=0, exclude=["a-2", "b-[13]"])
    assert p.excluded == ["a-2", "b-1", "b-3"]
    assert p.batches == [["a-1", "a-3", "b-2"]]
    assert "a-2" not in p.groups["a"]


def test_exclusion_that_matches_nothing_is_an_error() -> None:
    with pytest.raises(PlanError, match=r"--exclude matches no targeted host: a-9, z\*"):
        plan(fleet(a=3), exclude=["a-1", "a-9", "z*"])


def test_everything_excluded_is_an_empty_plan() -> None:
    p = plan(fleet(a=2), exclude=["*"])
    assert p.batches == []
    assert p.lower_bound == 0
    assert p.excluded == ["a-1", "a-2"]
    assert not p.has_canary


def test_hosts_without_group_key_are_ungrouped_and_said_so() -> None:
    hosts = [Host("n-1", None), Host("n-2", ""), Host("g-1", "az1")]
    p = plan(hosts, max_parallel=10, per_group_max=1, canary=0)
    assert p.groups == {"az1": ["g-1"], UNGROUPED: ["n-1", "n-2"]}
    assert p.batches == [["g-1", "n-1"], ["n-2"]]  # "ungrouped" is capped like any group
    assert p.notes == ["2 host(s) have no group key: planned as group 'ungrouped'"]


def test_no_notes_when_every_host_has_a_group() -> None:
    assert plan(fleet(a=2)).notes == []


def test_caps_are_reported() -> None:
    p = plan(fleet(a=30), max_parallel="10%", per_group_max=2, canary=1)
    assert p.caps.max_parallel == "10%"
    assert p.caps.max_parallel_hosts == 3
    assert p.caps.per_group_max == 2
    assert p.caps.canary == 1


def test_defaults_are_ten_percent_one_per_group_canary_one() -> None:
    p = plan(fleet(a=20, b=20))
    assert (p.caps.max_parallel, p.caps.max_parallel_hosts, p.caps.per_group_max, p.caps.canary) == (
        "10%",
        4,
        1,
        1,
    )
    assert p.batches[0] == ["a-1"]
    assert len(p.batches) == p.lower_bound == 1 + 20


def test_lower_bound_function() -> None:
    assert lower_bound([3000, 2500, 2000], 375, 125) == 24
    assert lower_bound([10, 1], 100, None) == 1
    assert lower_bound([], 5, 1) == 0
    assert lower_bound([0, 0], 5, 1) == 0


def test_plan_error_is_a_usage_error() -> None:
    assert issubclass(PlanError, UsageError)
    assert PlanError("x").exit_code == 2


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"max_parallel": 0}, "max parallel must be at least 1 host, got 0"),
        ({"max_parallel": -3}, "max parallel must be at least 1 host, got -3"),
        ({"max_parallel": "0%"}, "more than 0% and at most 100%, got 0%"),
        ({"max_parallel": "150%"}, "more than 0% and at most 100%, got 150%"),
        ({"max_parallel": "-5%"}, "got -5%"),
        ({"max_parallel": "lots"}, "not a host count or a percentage (N or P%): 'lots'"),
        ({"max_parallel": "1.5"}, "not a host count or a percentage"),
        ({"max_parallel": "x%"}, "not a percentage: 'x%'"),
        ({"per_group_max": 0}, "per-group max must be at least 1, got 0"),
        ({"per_group_max": -1}, "per-group max must be at least 1, got -1"),
        ({"canary": -1}, "canary must be 0 or more hosts, got -1"),
        ({"canary": 5, "max_parallel": 4}, "canary (5) is larger than the global cap (4 host(s)"),
        ({"canary": 2, "max_parallel": "10%"}, "canary (2) is larger than the global cap (1 host(s)"),
        (
            {"canary": 3, "max_parallel": 10, "per_group_max": 1},
            "canary (3) cannot be met: at most 1 per group over 2 group(s) and 4 host(s) allow at most 2",
        ),
        ({"canary": 5, "max_parallel": 10, "per_group_max": None}, "allow at most 4 host(s) in the first"),
    ],
)
def test_invalid_input(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(PlanError) as info:
        plan(fleet(a=2, b=2), **kwargs)  # type: ignore[arg-type]
    assert needle in str(info.value)


def test_duplicate_host_names() -> None:
    with pytest.raises(PlanError, match="duplicate host names: a-1, b-2"):
        plan([Host("b-2", "b"), Host("a-1", "a"), Host("a-1", "b"), Host("b-2", "b")])


def test_empty_host_name() -> None:
    with pytest.raises(PlanError, match="empty name"):
        plan([Host("", "a")])


def test_no_hosts_is_an_empty_plan() -> None:
    p = plan([], canary=1)
    assert p.batches == [] and p.lower_bound == 0 and p.groups == {}


# --- properties ---------------------------------------------------------------------------------


@st.composite
def fleets(draw: st.DrawFn) -> list[Host]:
    sizes = draw(st.lists(st.integers(1, 25), min_size=1, max_size=6))
    ungrouped = draw(st.integers(0, 4))
    hosts = [Host(f"az{g}-h{i}", f"az-{g}") for g, n in enumerate(sizes) for i in range(n)]
    hosts += [Host(f"loose-{i}", draw(st.sampled_from([None, ""]))) for i in range(ungrouped)]
    return draw(st.permutations(hosts))


caps_st = st.one_of(
    st.integers(1, 40).map(str),
    st.integers(1, 100).map(lambda n: f"{n}%"),
    st.sampled_from(["12.5%", "0.5%", "33.3%"]),
)


def capacity(hosts: list[Host], global_cap: int, per_group_max: int | None) -> int:
    sizes = Counter(h.group or UNGROUPED for h in hosts)
    per_group = per_group_max if per_group_max is not None else len(hosts)
    return min(global_cap, sum(min(n, per_group) for n in sizes.values()))


@settings(max_examples=400, deadline=None)
@given(
    hosts=fleets(),
    cap=caps_st,
    per_group_max=st.one_of(st.none(), st.integers(1, 8)),
    canary=st.integers(0, 6),
    data=st.data(),
)
def test_plan_properties(
    hosts: list[Host], cap: str, per_group_max: int | None, canary: int, data: st.DataObject
) -> None:
    names = [h.name for h in hosts]
    exclude = data.draw(st.lists(st.sampled_from(names), unique=True, max_size=4))
    kept = [h for h in hosts if h.name not in exclude]
    global_cap = MaxParallel.parse(cap).resolve(len(kept))
    # a canary above the global cap is bad input even with no hosts left; with hosts, the caps must fit it
    feasible = canary <= global_cap and (not kept or canary <= capacity(kept, global_cap, per_group_max))
    try:
        p = plan(hosts, max_parallel=cap, per_group_max=per_group_max, canary=canary, exclude=exclude)
    except PlanError:
        assert not feasible
        return
    assert feasible
    # every host not excluded appears exactly once; the excluded are listed
    planned = [h for b in p.batches for h in b]
    assert sorted(planned) == sorted(h.name for h in kept)
    assert sorted(p.excluded) == sorted(exclude)
    # no cap broken
    for counts, batch in zip(group_counts(p, hosts), p.batches, strict=True):
        assert 0 < len(batch) <= p.caps.max_parallel_hosts == global_cap
        if per_group_max is not None:
            assert max(counts.values()) <= per_group_max
    # the canary batch has exactly the canary size
    if kept and canary:
        assert len(p.batches[0]) == canary
    # the fewest batches the caps allow
    assert len(p.batches) == p.lower_bound
    # deterministic, whatever order the hosts came in
    again = plan(
        list(reversed(hosts)), max_parallel=cap, per_group_max=per_group_max, canary=canary, exclude=exclude
    )
    assert again == p


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    global_cap=st.integers(1, 12),
    per_group_max=st.integers(1, 4),
    canary=st.integers(0, 6),
)
def test_lower_bound_is_the_minimum_over_every_canary_choice(
    sizes: list[int], global_cap: int, per_group_max: int, canary: int
) -> None:
    """No choice of canary hosts gives a plan with fewer batches than this planner's."""
    hosts = [Host(f"g{g}-{i}", f"g{g}") for g, n in enumerate(sizes) for i in range(n)]
    rooms = [range(min(n, per_group_max) + 1) for n in sizes]
    choices = [c for c in itertools.product(*rooms) if sum(c) == canary]
    if canary == 0:
        p = plan(hosts, max_parallel=global_cap, per_group_max=per_group_max, canary=0)
        assert p.lower_bound == len(p.batches) == lower_bound(sizes, global_cap, per_group_max)
        return
    if canary > global_cap or not choices:
        with pytest.raises(PlanError):
            plan(hosts, max_parallel=global_cap, per_group_max=per_group_max, canary=canary)
        return
    best = min(
        1 + lower_bound([n - k for n, k in zip(sizes, c, strict=True)], global_cap, per_group_max)
        for c in choices
    )
    p = plan(hosts, max_parallel=global_cap, per_group_max=per_group_max, canary=canary)
    assert p.lower_bound == len(p.batches) == best


@st.composite
def tight_fleets(draw: st.DrawFn) -> tuple[list[int], int, int]:
    """Near-equal groups just above (B-1)*P hosts and a global cap between P and all groups' P:
    where taking P from the largest groups in turn loses a batch (about 1 draw in 130)."""
    per_group_max = draw(st.integers(1, 4))
    bound = draw(st.integers(2, 4))
    sizes = draw(
        st.lists(st.integers((bound - 1) * per_group_max + 1, bound * per_group_max), min_size=2, max_size=6)
    )
    global_cap = draw(st.integers(per_group_max, len(sizes) * per_group_max))
    return sizes, global_cap, per_group_max


@settings(max_examples=1000, deadline=None)
@given(case=tight_fleets())
def test_batch_count_is_the_lower_bound_on_tight_fleets(case: tuple[list[int], int, int]) -> None:
    sizes, global_cap, per_group_max = case
    hosts = [Host(f"g{g}-{i}", f"g{g}") for g, n in enumerate(sizes) for i in range(n)]
    p = plan(hosts, max_parallel=global_cap, per_group_max=per_group_max, canary=0)
    assert len(p.batches) == p.lower_bound == lower_bound(sizes, global_cap, per_group_max)
    for counts in group_counts(p, hosts):
        assert sum(counts.values()) <= global_cap and max(counts.values()) <= per_group_max


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 12), min_size=1, max_size=8),
    global_cap=st.integers(1, 20),
    per_group_max=st.integers(1, 5),
)
def test_batches_are_as_full_as_the_caps_allow_until_the_end(
    sizes: list[int], global_cap: int, per_group_max: int
) -> None:
    """Without a canary, batch sizes never grow: the plan front-loads, it never idles capacity early."""
    hosts = [Host(f"g{g}-{i}", f"g{g}") for g, n in enumerate(sizes) for i in range(n)]
    p = plan(hosts, max_parallel=global_cap, per_group_max=per_group_max, canary=0)
    lens = [len(b) for b in p.batches]
    assert lens == sorted(lens, reverse=True)
    assert lens[0] == min(global_cap, sum(min(n, per_group_max) for n in sizes))


def test_one_per_batch_splits_only_hosts_sharing_a_key_keeping_order() -> None:
    from fleetops.planner import one_per_batch

    keys = {"a1": "A", "a2": "A", "a3": "A", "b1": "B", "b2": "B", "n1": None}
    p = plan([Host(h, "g") for h in keys], max_parallel="100%", per_group_max=None, canary=1)
    assert p.batches == [["a1"], ["a2", "a3", "b1", "b2", "n1"]]
    split = one_per_batch(p, keys.get, "why")
    assert split.batches == [["a1"], ["a2", "b1", "n1"], ["a3", "b2"]]
    assert split.notes[-1] == "2 host(s) moved to later batches: why"
    assert sorted(h for b in split.batches for h in b) == sorted(keys)  # nobody lost or doubled
    assert one_per_batch(p, lambda h: None, "why") is p  # nothing to split: the same plan
