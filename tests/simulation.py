"""A simulated fleet under the real auto pass: ``python -m tests.simulation --days 30 --hosts 2000``.

The real ``fleetops.auto.run_pass`` (decide, the storm brake, reservations, settling, recovery, the
pass lease, the pause) and the real ``fleetops.store`` over ``module_utils/store.py``'s MemoryStore (the
same compare-and-swap contract as DynamoDB) run against a simulated fleet, with a fake clock and a
deterministic scheduler: every controller runs in a thread of its own, and only the one the scheduler
picks runs, from one store call (or one step of an action) to the next. At those points the scheduler
also kills controllers (the thread's store calls fail from then on and its actions stop: nothing it would
have done after the kill, its ``finally`` blocks included, reaches the store or the fleet), stalls them
past their lease (another pass takes over, and the stalled one's next write is refused), throttles the
store, and skews clocks. Faults of every kind the default policy acts on arrive at random, and in storms.

What cannot run here is stood in for, as the test files say: the actions' rollouts (a quarantine cordons,
a stop-start stops the instance, yields, and starts it, a fix clears a software fault with some chance,
...; each rollout a canary and batches that take time, minutes to an hour and more, its pass's lease
renewed meanwhile, each host's act time reported back as the engine's batches report it), EC2's tag mirror (not written) and the module that finishes a stop-start (it starts the simulated
instance). Everything the store and the policy do is the product's own code.

At every act, and after every round (the passes of one hour), it checks the invariants: no budget
exceeded in any window (fleet and per group, from what was really done), no instance left stopped by a pass that completed, no
reservation left unsettled after a completed pass, nothing acted on without a finding its rule's ladder
acts on, no rung run twice in one fault episode, no action started after its pass saw the pause, and
every action done in the ledger, at the time its batch acted. At every disruptive action it checks the capacity floor from the fleet's
truth: the host's group keeps its floor counting hosts stopped, cordoned by a pass or by a person (the
pass reads the cordons as the schedulers' view, ``fleetops.nodes``) and those the pass took before, and no
quarantine goes past the group's cap. One small group (5 hosts) is where floors bind. It counts kills,
compare-and-swap conflicts, lease races and stalls, and the actions the floors held. With ``outages``
(``--outages``), two hosts of the small group go down (unreachable, still in the inventory) for hours
now and then, and the alert bursts go there: the floor check counts them out, as they really are.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetops import auto, store
from fleetops.ansible.collection import module_utils
from fleetops.auto import context as auto_context
from fleetops.auto import finish as auto_finish
from fleetops.auto.seen import SEEN_FRESH_S
from fleetops.nodes import NodeReading, NodeState
from fleetops.policy import Policy, default_policy_path, load_policy
from fleetops.policy.language import Storm
from fleetops.remediations import REMEDIATIONS

mu = module_utils("store")
T0 = 1_800_000_000.0
HOUR = 3600.0
SMALL = 5  # hosts in the small group
# an action's rollout takes time: a canary of one host, then batches of BATCH hosts, each between BATCH_S
# seconds apart (the action and its gate's scan: a reboot, the node back) and COOLDOWN_S after the one before
BATCH = 4
BATCH_S = (300.0, 1500.0)
COOLDOWN_S = 300.0

# A finding per acting rule of the default policy (checked against it at start: a policy change that
# moves one to another rule fails the simulation loudly).
FINDINGS: dict[str, dict[str, Any]] = {
    "gpu-fatal": {"check": "gpu_health", "severity": "critical", "data": {"xid": {"79": 1}, "gpus": []}},
    "gpu-reset-required": {"check": "gpu_health", "severity": "critical", "data": {"xid": {}, "gpus": []}},
    "gpu-remap-pending": {
        "check": "gpu_health",
        "severity": "warning",
        "data": {"xid": {"63": 1}, "gpus": []},
    },
    "ec2-hardware-event": {
        "check": "ec2_scheduled_event",
        "severity": "warning",
        "data": {"code": "instance-retirement"},
    },
    "ec2-instance-reboot": {
        "check": "ec2_scheduled_event",
        "severity": "warning",
        "data": {"code": "instance-reboot"},
    },
    "zombie-memcg": {"check": "zombie_memcg", "severity": "warning", "data": {}},
    "ucx-mmap-hooks": {"check": "ucx_mmap_hooks", "severity": "warning", "data": {"fixable_unit": True}},
    "crashloop": {"check": "crashloop_unit", "severity": "warning", "data": {}},
    "ena-resets": {"check": "ena_resets", "severity": "warning", "data": {}},
}
HARDWARE = {"gpu-fatal", "gpu-reset-required", "ec2-hardware-event", "ena-resets"}
# the faults an alert burst brings (one rule on several hosts at once): rules whose first rung is braked
BURST_RULES = ["ec2-hardware-event", "ec2-instance-reboot", "gpu-remap-pending", "ena-resets"]
# what each action clears, and how often (the rest stays: the ladder climbs)
CLEARS: dict[str, tuple[frozenset[str], float]] = {
    "fix": (frozenset({"crashloop", "zombie-memcg", "ucx-mmap-hooks"}), 0.7),
    "reclaim": (frozenset({"zombie-memcg"}), 0.5),
    "reboot": (
        frozenset(
            {
                "zombie-memcg",
                "ucx-mmap-hooks",
                "gpu-remap-pending",
                "gpu-reset-required",
                "ec2-instance-reboot",
                "ena-resets",
            }
        ),
        0.7,
    ),
    "stop-start": (frozenset(HARDWARE | {"gpu-remap-pending"}), 0.8),
    "replace": (frozenset(FINDINGS), 1.0),
}


class Killed(BaseException):
    """Raised in a controller's thread at the point the scheduler killed it (SIGKILL)."""


@dataclass
class Fleet:
    """The ground truth: each host's fault (a rule's name) and episode, its instance state, its cordon,
    and every action really started."""

    hosts: list[str]
    group_of: dict[str, str]
    fault: dict[str, str | None] = field(default_factory=dict)
    episode: dict[str, int] = field(default_factory=dict)
    stopped: dict[str, float] = field(default_factory=dict)  # host -> when its instance was stopped
    cordoned: set[str] = field(default_factory=set)  # by a pass's quarantine
    foreign: set[str] = field(default_factory=set)  # cordoned by a person (maintenance), not by fleetops
    # powered off or cut off, still listed in the inventory: host -> when it comes back (a scan: unreachable)
    down: dict[str, float] = field(default_factory=dict)
    actions: list[tuple[float, str, str, str, int]] = field(
        default_factory=list
    )  # t, who, action, host, episode

    def inject(self, host: str, rule: str) -> None:
        if self.fault.get(host) is None:
            self.fault[host] = rule
            self.episode[host] = self.episode.get(host, 0) + 1

    def scan(self) -> dict[str, Any]:
        """The report of a scan of the running instances (an inventory of running instances; a host down:
        unreachable)."""
        hosts: dict[str, dict[str, Any]] = {}
        for h in self.hosts:
            if h in self.stopped:
                continue
            if h in self.down:
                hosts[h] = {"status": "unreachable", "findings": []}
                continue
            rule = self.fault.get(h)
            hosts[h] = {"status": "ok", "findings": [dict(FINDINGS[rule])] if rule else []}
        return {"hosts": hosts}


@dataclass
class Stats:
    passes: int = 0
    completed: int = 0
    kills: int = 0
    stalls: int = 0
    conflicts: int = 0
    lease_races: int = 0  # passes refused because another held or took the lease at the same time
    takeovers: int = 0  # leases taken over after they expired
    throttled: int = 0
    skew_refusals: int = 0
    paused_passes: int = 0
    faults: int = 0
    storms: int = 0
    foreign_cordons: int = 0
    floor_held: int = 0  # decisions a capacity floor held back
    actions: Counter[str] = field(default_factory=Counter)
    batches: int = 0  # the stand-in rollouts' batches (a canary is one)
    longest_rollout: float = 0.0  # seconds, from its first batch's start to its last batch's end
    checks: int = 0
    violations: list[str] = field(default_factory=list)
    bursts: int = 0  # alert bursts: one pass limited to each alerting host, one after another
    limited_passes: int = 0
    outages: int = 0  # hosts of the small group down for hours (two at a time), still in the inventory
    limited_floor_held: int = 0  # decisions of limited passes a floor held, counting the unavailable hosts

    def table(self) -> str:
        rows = [
            ("passes (completed)", f"{self.passes} ({self.completed})"),
            ("faults injected (storms)", f"{self.faults} ({self.storms})"),
            (
                "cordons by a person / decisions held by a floor",
                f"{self.foreign_cordons} / {self.floor_held}",
            ),
            ("actions", ", ".join(f"{a} {n}" for a, n in sorted(self.actions.items())) or "none"),
            ("rollout batches / longest rollout", f"{self.batches} / {self.longest_rollout / 60:.0f} min"),
            ("kills / stalls past the lease", f"{self.kills} / {self.stalls}"),
            ("compare-and-swap conflicts", str(self.conflicts)),
            ("lease races / takeovers", f"{self.lease_races} / {self.takeovers}"),
            ("store throttled / clock-skew refusals", f"{self.throttled} / {self.skew_refusals}"),
            ("passes held by a pause", str(self.paused_passes)),
            ("invariant checks (violations)", f"{self.checks} ({len(self.violations)})"),
            ("alert bursts (limited passes)", f"{self.bursts} ({self.limited_passes})"),
        ]
        if self.outages:
            rows.append(
                (
                    "outages / limited passes' decisions held by a floor",
                    f"{self.outages} / {self.limited_floor_held}",
                )
            )
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


class Scheduler:
    """One controller thread runs at a time, from one point to the next; the main thread picks which."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.turn: str | None = None
        self.parked: set[str] = set()
        self.finished: set[str] = set()
        self.killed: set[str] = set()

    def point(self) -> None:
        name = threading.current_thread().name
        with self.cv:
            if name in self.killed:
                raise Killed
            self.parked.add(name)
            if self.turn == name:
                self.turn = None  # its step is over: it waits to be picked again
            self.cv.notify_all()
            while self.turn != name:
                self.cv.wait()
            self.parked.discard(name)
            if name in self.killed:
                raise Killed

    def done(self, name: str) -> None:
        with self.cv:
            self.finished.add(name)
            self.parked.discard(name)
            if self.turn == name:
                self.turn = None
            self.cv.notify_all()

    def wait_settled(self, names: Sequence[str]) -> None:
        """Until every controller is parked at a point or finished."""
        with self.cv:
            while not all(n in self.parked or n in self.finished for n in names) or (
                self.turn is not None and self.turn not in self.parked and self.turn not in self.finished
            ):
                self.cv.wait(timeout=10)

    def give(self, name: str) -> None:
        with self.cv:
            self.turn = name
            self.parked.discard(name)
            self.cv.notify_all()
            while name not in self.parked and name not in self.finished:
                self.cv.wait(timeout=10)
            if self.turn == name and name in self.finished:
                self.turn = None


@dataclass
class Controller:
    name: str
    skew: float
    state_dir: Path
    last_pause_seen: bool | None = None
    taken: set[str] = field(default_factory=set)  # the hosts its pass took with a disruptive action
    saw: dict[str, str | None] = field(default_factory=dict)  # its scan: host -> the rule its fault matches


class Simulation:
    def __init__(
        self,
        hosts: int,
        seed: int,
        conditional: bool = True,
        fault_rate: float = 0.002,
        floors: bool = True,
        limited: bool = True,
        storm: Storm | None = None,
        acts_told: bool = True,
        outages: bool = False,
    ) -> None:
        self.rng = random.Random(seed)
        # outages=True (a targeted scenario, issue 38 item 1): two hosts of the small group go down for
        # hours now and then, and most alert bursts land there meanwhile: a limited pass must count the down
        # hosts outside its limit, which only the fleet record tells it, against the floor
        self.outages = outages
        self.burst_hosts: list[str] = []  # the hosts of the last round's alert burst
        # acts_told=False: the stand-in says every host was acted on when its rollout started (the
        # reservation's time), as passes stamped budgets before issue 38: the checks must find it
        self.acts_told = acts_told
        self.leases: dict[str, store.PassLease] = {}  # each controller's pass's lease, renewed as time passes
        self.policy: Policy = load_policy(default_policy_path())
        # what the passes run (floors=False: without the capacity floors, which the checks still hold them to)
        self.pass_policy = (
            self.policy
            if floors
            else self.policy.model_copy(
                update={
                    "floor": None,
                    "rules": [r.model_copy(update={"floor": None}) for r in self.policy.rules],
                }
            )
        )
        for rule, finding in FINDINGS.items():
            found = self.policy.rule_for(finding)
            assert found is not None and found.name == rule, f"{rule}: the default policy takes it as {found}"
        names = [f"sim-{i:05d}" for i in range(hosts)]
        groups = [f"az-{c}" for c in "abcd"]
        # the first SMALL hosts are a group of their own (a small pool), where the floors bind
        self.fleet = Fleet(
            names, {h: "az-small" if i < SMALL else groups[i % len(groups)] for i, h in enumerate(names)}
        )
        self.members: dict[str, list[str]] = defaultdict(list)
        for h in names:
            self.members[self.fleet.group_of[h]].append(h)
        self.sizes = Counter(self.fleet.group_of.values())
        self.now = T0
        self.data: dict[str, Any] = {}
        self.conditional = conditional
        self.fault_rate = fault_rate
        self.stats = Stats()
        self.sched = Scheduler()
        self.controllers: dict[str, Controller] = {}
        self.tmp = Path(tempfile.mkdtemp(prefix="fleetops-sim-"))
        self.backends: list[Any] = []
        self.limited = limited  # alert bursts of single-host passes between the scheduled passes
        # what the completed passes saw: host -> (when, the rule its fault matched or None)
        self.observed: dict[str, tuple[float, str | None]] = {}
        if storm is not None:  # a targeted scenario: storm limits below the budgets, so the brake binds
            self.policy = self.policy.model_copy(update={"storm": storm})
            self.pass_policy = self.pass_policy.model_copy(update={"storm": storm})

    # ---- the store, as each controller reaches it

    def store_for(self, ctl: Controller) -> store.Store:
        def clock() -> float:
            return self.now + ctl.skew

        def hook(operation: str) -> None:
            name = threading.current_thread().name
            if name not in self.controllers:  # a lease's renewing thread: the simulation renews nothing
                raise mu.StoreError("simulation: no background renewal")
            self.sched.point()
            self.now += 0.05
            if self.rng.random() < 0.002:
                self.stats.throttled += 1
                raise mu.StoreError(f"Failed to call dynamodb:{operation}: ThrottlingException (simulated)")

        backend = mu.MemoryStore(conditional=self.conditional, clock=clock, fail=hook)
        backend.data = self.data  # one table, every controller's view of it
        backend.skew = ctl.skew
        self.backends.append(backend)
        shared = store.Store(backend, clock=clock)
        real_paused = shared.paused

        def paused() -> store.PauseRecord | None:
            found = real_paused()
            self.controllers[threading.current_thread().name].last_pause_seen = found is not None
            return found

        shared.paused = paused  # type: ignore[method-assign]
        return shared

    # ---- the actions' stand-in

    def run_action(
        self, ctl: Controller
    ) -> Callable[[str, Sequence[str], Mapping[str, Any]], auto.ActionRun]:
        def run(action: str, hosts: Sequence[str], params: Mapping[str, Any]) -> auto.ActionRun:
            if ctl.last_pause_seen:
                self.violate(f"{ctl.name} started {action} on {list(hosts)} after its pass saw the pause")
            started = self.now + ctl.skew
            acted = self.run_batches(ctl, action, hosts)
            return auto.ActionRun(
                action,
                tuple(hosts),
                params,
                attempted=frozenset(hosts),
                done=frozenset(hosts),
                acted=acted if self.acts_told else dict.fromkeys(hosts, started),
            )

        return run

    def run_batches(self, ctl: Controller, action: str, hosts: Sequence[str]) -> dict[str, float]:
        """The stand-in rollout: a canary, then batches of BATCH hosts, each as long as BATCH_S allows and
        COOLDOWN_S after the one before; each host is acted on at its batch's start. Returns host -> that time, on the
        controller's clock (what the engine's ``batches`` say and api.auto hands the pass)."""
        acted: dict[str, float] = {}
        first = self.now
        batches = [list(hosts[:1])] + [list(hosts[i : i + BATCH]) for i in range(1, len(hosts), BATCH)]
        for index, batch in enumerate(batches):
            if index:
                self.elapse(ctl, COOLDOWN_S)
            started = self.now
            self.stats.batches += 1
            for h in batch:
                self.sched.point()
                self.act(ctl, action, h, started)
                acted[h] = started + ctl.skew
            self.elapse(ctl, self.rng.uniform(*BATCH_S))
        self.stats.longest_rollout = max(self.stats.longest_rollout, self.now - first)
        return acted

    def elapse(self, ctl: Controller, seconds: float) -> None:
        """``seconds`` pass in ``ctl``'s rollout; its pass's lease is renewed every half of its TTL (its
        renewing thread: every third; a half still outlasts the clocks' skew), a store call each: the
        scheduler may switch, kill or throttle there."""
        end = self.now + seconds
        while self.now < end:
            self.now = min(end, self.now + store.PASS_LEASE_TTL_S / 2)
            lease = self.leases.get(ctl.name)
            if lease is not None:
                lease.renew()

    def act(self, ctl: Controller, action: str, host: str, started: float) -> None:
        fleet = self.fleet
        rule = fleet.fault.get(host)
        episode = fleet.episode.get(host, 0)
        if rule is None or action not in [r.action for r in self.policy.rule(rule).ladder]:  # type: ignore[union-attr]
            self.violate(f"{ctl.name}: {action} on {host} without a finding its ladder acts on ({rule})")
        if any(
            a == action and h == host and e == episode and rule is not None
            for _t, _w, a, h, e in fleet.actions[-2000:]
        ):
            self.violate(f"{ctl.name}: {action} on {host} twice in fault episode {episode} ({rule})")
        if REMEDIATIONS[action].disruptive:
            self.check_floor(ctl, action, host, rule)
        if REMEDIATIONS[action].braked:
            self.check_brake(ctl, action, host, rule)
        fleet.actions.append((started, ctl.name, action, host, episode))
        self.stats.actions[action] += 1
        self.check_budget_window(ctl, action, host, started)
        if action == "quarantine":
            fleet.cordoned.add(host)
        elif action == "stop-start":
            fleet.stopped[host] = self.now
            self.sched.point()  # a kill here leaves the instance stopped
            self.now += 30
            self.start(host)
        elif action == "replace":
            fleet.cordoned.discard(host)
        self.now += 10
        clears, chance = CLEARS.get(action, (frozenset(), 0.0))
        if rule in clears and self.rng.random() < chance:
            fleet.fault[host] = None

    def check_floor(self, ctl: Controller, action: str, host: str, rule: str | None) -> None:
        """The host's group keeps its floor after this action takes it (a host already out costs nothing),
        and a quarantine stays within the group's cap: from the fleet's truth, not the pass's view."""
        fleet, group = self.fleet, self.fleet.group_of[host]
        found = self.policy.rule(rule) if rule is not None else None
        floor = self.policy.floor_of(found) if found is not None else self.policy.floor
        if floor is None:
            return
        members = self.members[group]
        out = {
            h
            for h in members
            if h in fleet.stopped or h in fleet.cordoned or h in fleet.foreign or h in fleet.down
        }
        if host not in out:
            ctl.taken.add(host)
        available = len(members) - len(out | {h for h in ctl.taken if fleet.group_of[h] == group})
        self.stats.checks += 1
        if host not in out and available < floor.keep(len(members)):
            self.violate(
                f"{ctl.name}: {action} on {host} leaves group {group} {available} of {len(members)} available "
                f"(the floor keeps {floor.keep(len(members))}; out: {sorted(out)}, taken: {sorted(ctl.taken)})"
            )
        cap = floor.quarantine_cap(len(members))
        if action == "quarantine" and cap is not None and host not in fleet.cordoned:
            self.stats.checks += 1
            standing = sum(1 for h in members if h in fleet.cordoned) + 1
            if standing > cap:
                self.violate(
                    f"{ctl.name}: quarantine on {host}: {standing} quarantined in {group} (cap {cap})"
                )

    def check_budget_window(self, ctl: Controller, action: str, host: str, t: float) -> None:
        """At every act: the window of ``action``'s budget that ends at this act (``t``) holds no more acts
        than the budget allows, across the fleet and in the host's group, from what was really started (a
        window's edge moves with the clocks' bound, as in ``check_budgets``)."""
        budget = self.policy.limits.get(action)
        if budget is None:
            return
        window = budget.window_s - store.MAX_SKEW_S - 1
        group = self.fleet.group_of[host]
        fleet = in_group = 0
        for u, _w, a, h, _e in reversed(self.fleet.actions):
            if u <= t - window - HOUR:  # acts are appended in time order, give or take one rollout's batch
                break
            if a == action and t - window < u <= t:
                fleet += 1
                in_group += self.fleet.group_of[h] == group
        self.stats.checks += 1
        if budget.max is not None and fleet > budget.max:
            self.violate(
                f"{ctl.name}: {action} on {host}: {fleet} in {budget.window} across the fleet (max {budget.max})"
            )
        limit = budget.group_limit(self.sizes[group])
        if limit is not None and in_group > limit[0]:
            self.violate(
                f"{ctl.name}: {action} on {host}: {in_group} in group {group} within {budget.window} "
                f"(limit {limit[1]})"
            )

    def start(self, host: str) -> None:
        self.fleet.stopped.pop(host, None)
        if self.fleet.fault.get(host) in CLEARS["stop-start"][0] and self.rng.random() < 0.8:
            self.fleet.fault[host] = None

    def finisher(self) -> Any:
        sim = self

        class Module:
            @staticmethod
            def in_flight_record(settings: Any, region: str, instance_id: str) -> dict[str, Any]:
                return {}

            @staticmethod
            def finish_instance(settings: Any, record: dict[str, Any]) -> dict[str, Any]:
                sim.sched.point()
                instance_id = record["instance"]
                host = instance_id.removeprefix("i-")
                if host in sim.fleet.stopped:
                    sim.start(host)
                    return {"msg": f"instance {instance_id} started", "changed": True}
                return {
                    "msg": f"instance {instance_id} is running: nothing to finish",
                    "changed": False,
                }

        return Module

    # ---- one controller's pass

    def run_pass(self, ctl: Controller, only: Sequence[str] | None = None) -> None:
        """One pass over the running instances (``only``: a pass limited to those hosts, an alert's)."""
        name = ctl.name
        try:
            self.leases.pop(name, None)
            self.sched.point()
            shared = self.store_for(ctl)
            ctl.last_pause_seen = None
            scan = self.fleet.scan()
            if only is not None:
                scan = {"hosts": {h: e for h, e in scan["hosts"].items() if h in only}}
            ctl.saw = {
                h: self.fleet.fault.get(h) if h not in self.fleet.down else None for h in scan["hosts"]
            }
            tags = {h: auto.TagTarget(f"i-{h}", "sim", None, None) for h in scan["hosts"]}
            inputs = auto.PassInputs(
                policy=self.pass_policy,
                policy_source="default policy",
                scan_report=scan,
                group_of={h: self.fleet.group_of[h] for h in scan["hosts"]},
                fleet=dict(self.fleet.group_of),
                state_dir=ctl.state_dir,
                apply=True,
                tags=tags,
                connection=_SimConnection(),  # type: ignore[arg-type]
                store=shared,
                operator=f"sim@{name}",
                # the schedulers' view, read once before deciding: a pass's cordons and a person's
                nodes=NodeReading(
                    {
                        **{h: NodeState("kubernetes", h, "cordoned", ours=True) for h in self.fleet.cordoned},
                        **{h: NodeState("kubernetes", h, "cordoned") for h in self.fleet.foreign},
                    }
                ),
            )
            started = self.now
            self.stats.passes += 1
            try:
                result = auto.run_pass(
                    inputs, self.run_action(ctl), lambda text, style: None, clock=shared.clock
                )
            except store.StoreLockedError:
                self.stats.lease_races += 1
                return
            except store.StoreFailure as exc:
                if "off the store's" in str(exc):
                    self.stats.skew_refusals += 1
                return
            if result.paused:
                self.stats.paused_passes += 1
            if any("took over" in w for w in result.warnings):
                self.stats.takeovers += 1
            if result.store_failure:
                return
            self.stats.completed += 1
            self.stats.floor_held += sum(1 for d in result.decisions if d.status == "floor")
            if only is not None:
                self.stats.limited_floor_held += sum(
                    1
                    for d in result.decisions
                    if d.status == "floor" and " unavailable, " in (d.reason or "")
                )
            self.after_completed(ctl, result, started)
            self.observe(ctl, result, started)
        except Killed:
            self.stats.kills += 1
        finally:
            self.sched.done(name)

    def after_completed(self, ctl: Controller, result: auto.PassResult, started: float) -> None:
        """A pass that ran to its end: what a dead pass left is finished, nothing is left reserved."""
        self.stats.checks += 2
        for host, since in self.fleet.stopped.items():
            if since < started and not any(host in u for u in result.unfinished):
                self.violate(
                    f"{ctl.name}: {host} stopped since {since - T0:.0f}s, left stopped by a completed pass"
                )
        for key, (_v, raw) in list(self.data.items()):
            if key.startswith(store.LEDGER_PREFIX) and '"state":"reserved"' in raw:
                self.violate(f"{ctl.name}: a reservation left unsettled in {key} after a completed pass")

    # ---- the rounds

    def violate(self, line: str) -> None:
        self.stats.violations.append(f"t+{self.now - T0:.0f}s {line}")

    def inject_faults(self) -> None:
        rng, fleet = self.rng, self.fleet
        for h in sorted(fleet.cordoned):  # a person releases a quarantined host whose fault is gone
            if fleet.fault.get(h) is None and rng.random() < 0.3:
                fleet.cordoned.discard(h)
        for h in sorted(fleet.foreign):  # a person's maintenance ends
            if rng.random() < 0.2:
                fleet.foreign.discard(h)
        if rng.random() < 0.1:  # a person cordons a host for maintenance (the small group now and then)
            group = "az-small" if rng.random() < 0.5 else rng.choice(sorted(self.sizes))
            fleet.foreign.add(rng.choice(self.members[group]))
            self.stats.foreign_cordons += 1
        if self.outages:
            self.outage()
        rules = sorted(FINDINGS)
        for h in fleet.hosts:
            if rng.random() < self.fault_rate:
                fleet.inject(h, rng.choice(rules))
                self.stats.faults += 1
        # a storm: one fault on a whole group (a bad driver, an AZ event); none with outages, whose bursts
        # are the small group's faults (a storm there would hold its rungs for good: the brake)
        if rng.random() < 0.03 and not self.outages:
            group = "az-small" if rng.random() < 0.3 else rng.choice(sorted(self.sizes))
            rule = rng.choice(["gpu-fatal", "ec2-hardware-event", "zombie-memcg"])
            for h in fleet.hosts:
                if fleet.group_of[h] == group:
                    fleet.inject(h, rule)
            self.stats.storms += 1

    def outage(self) -> None:
        """At a round's start, before its scheduled passes: down hosts whose time is up come back, and now
        and then two hosts of the small group go down (powered off, cut off) for 2 to 8 hours, still listed
        in the inventory. Only at a round's start: its full passes record them unreachable before any alert
        burst, so that a limited pass can know them (the fleet record) — and must. Where no full pass of
        the round recorded, the newest record of a host is an hour old (too old: its group's capacity is
        unknown, and the limited pass holds) unless the last round's burst passes saw it: those are not
        taken down, so that every host really down is one a limited pass could know of."""
        rng, fleet = self.rng, self.fleet
        for h, until in sorted(fleet.down.items()):
            if until <= self.now:
                del fleet.down[h]
        small = [h for h in self.members["az-small"] if h not in self.burst_hosts]
        if not fleet.down and len(small) >= 2 and rng.random() < 0.5:
            until = self.now + rng.uniform(2 * HOUR, 8 * HOUR)
            fleet.down.update(dict.fromkeys(rng.sample(small, 2), until))
            self.stats.outages += 1

    def round(self, index: int) -> None:
        rng = self.rng
        done_before, round_start = len(self.fleet.actions), self.now
        self.inject_faults()
        paused = store.PAUSE_KEY in self.data
        if rng.random() < (0.25 if paused else 0.01):  # a person pauses, and lifts it within hours
            self.toggle_pause()
        names = ["awx", "eda"] if rng.random() < 0.4 else ["awx"]
        ctls = []
        for name in names:
            skew = rng.choice([0.0] * 30 + [5.0, -12.0, 45.0])
            ctl = Controller(name, skew, self.tmp / f"{name}-{index % 3}")  # state directories come and go
            self.controllers[name] = ctl
            ctls.append(ctl)
        self.sched = Scheduler()
        threads = [threading.Thread(target=self.run_pass, args=(c,), name=c.name, daemon=True) for c in ctls]
        for t in threads:
            t.start()
        alive = [c.name for c in ctls]
        while True:
            self.sched.wait_settled(alive)
            runnable = [n for n in alive if n not in self.sched.finished]
            if not runnable:
                break
            pick = rng.choice(runnable)
            roll = rng.random()
            if roll < 0.004:
                self.sched.killed.add(pick)
            elif roll < 0.006:  # the pick stalls (GC, a partition) past its lease; the others go on
                self.stats.stalls += 1
                self.now += store.PASS_LEASE_TTL_S + 5
                others = [n for n in runnable if n != pick]
                if others:
                    pick = rng.choice(others)
            self.sched.give(pick)
        for t in threads:
            t.join(timeout=30)
        self.alert_burst()
        self.stats.conflicts = sum(b.conflicts for b in self.backends)
        self.check_budgets()
        self.check_ledger(done_before, round_start)

    # ---- the alert path (issue 38): passes limited to one host, between the scheduled ones

    def alert_burst(self) -> None:
        """Now and then, mid-hour (after the schedule's passes), one fault arrives on several hosts of one
        group at once, and each alerting host gets a pass limited to it, one after another, as the
        rulebook sends them (kills and stalls as in any pass)."""
        rng, fleet = self.rng, self.fleet
        self.burst_hosts = []
        if not self.limited or rng.random() >= (0.4 if self.outages else 0.15):
            return
        self.now += 600
        group = rng.choice(sorted(self.sizes))
        if self.outages and fleet.down and rng.random() < 0.8:
            group = "az-small"
        rule = rng.choice(BURST_RULES)
        healthy = [
            h
            for h in self.members[group]
            if fleet.fault.get(h) is None and h not in fleet.stopped and h not in fleet.down
        ]
        hosts = rng.sample(healthy, min(len(healthy), rng.randint(2, 12)))
        for h in hosts:
            fleet.inject(h, rule)
            self.stats.faults += 1
        self.burst_hosts = hosts
        self.stats.bursts += 1
        for h in hosts:
            self.stats.limited_passes += 1
            self.drive([Controller("alert", rng.choice([0.0] * 10 + [5.0, -12.0]), self.tmp / "alert")], [h])

    def drive(self, ctls: Sequence[Controller], only: Sequence[str] | None = None) -> None:
        """Run ``ctls``' passes to their end under the scheduler, killing and stalling now and then."""
        rng = self.rng
        for ctl in ctls:
            self.controllers[ctl.name] = ctl
        self.sched = Scheduler()
        threads = [
            threading.Thread(target=self.run_pass, args=(c, only), name=c.name, daemon=True) for c in ctls
        ]
        for t in threads:
            t.start()
        alive = [c.name for c in ctls]
        while True:
            self.sched.wait_settled(alive)
            runnable = [n for n in alive if n not in self.sched.finished]
            if not runnable:
                break
            pick = rng.choice(runnable)
            roll = rng.random()
            if roll < 0.004:
                self.sched.killed.add(pick)
            elif roll < 0.006:
                self.stats.stalls += 1
                self.now += store.PASS_LEASE_TTL_S + 5
            self.sched.give(pick)
        for t in threads:
            t.join(timeout=30)

    def observe(self, ctl: Controller, result: auto.PassResult, started: float) -> None:
        """What a completed pass saw (the record it left for the passes that see less)."""
        if any("fleet record of group" in w for w in result.warnings):
            return  # its record was refused: the others cannot know what it saw
        for host, rule in ctl.saw.items():
            self.observed[host] = (started, rule)

    def check_brake(self, ctl: Controller, action: str, host: str, rule: str | None) -> None:
        """A braked rung acts only while its rule matches no more hosts than its storm limit allows, counting
        every host the passes saw it on within the fleet record's freshness window (fleet-wide, whichever
        pass saw them), as the acting pass saw its own."""
        found = self.policy.rule(rule) if rule is not None else None
        if found is None:
            return
        window = SEEN_FRESH_S - 60  # the controllers' clocks may disagree by up to a minute here
        known = {h for h, r in ctl.saw.items() if r == rule} | {host}
        known |= {
            h
            for h, (t, r) in self.observed.items()
            if r == rule and t >= self.now - window and h not in ctl.saw
        }
        groups = Counter(self.fleet.group_of[h] for h in known)
        why = self.policy.storm_of(found).tripped(
            len(known), len(self.fleet.hosts), {g: (n, self.sizes[g]) for g, n in groups.items()}
        )
        self.stats.checks += 1
        if why is not None:
            self.violate(f"{ctl.name}: {action} on {host} past the storm brake of rule {rule}: {why}")

    def toggle_pause(self) -> None:
        backend = mu.MemoryStore(clock=lambda: self.now)
        backend.data = self.data
        person = store.Store(backend, clock=lambda: self.now)
        if person.paused() is None:
            person.pause("sre@laptop", "simulated pause")
        else:
            person.unpause("sre@laptop", "simulated")

    def check_ledger(self, done_before: int, round_start: float) -> None:
        """The ledger equals what was done this round: every action started has its entry (reserved
        before it, within the clocks' bound), and every entry settled ``done`` was started."""
        slack = store.MAX_SKEW_S + 15
        entries: dict[tuple[str, str], list[tuple[float, str]]] = defaultdict(list)
        for key, (_version, raw) in self.data.items():
            if key.startswith(store.LEDGER_PREFIX):
                for e in json.loads(raw).get("entries", []):
                    entries[(key[len(store.LEDGER_PREFIX) :], e["host"])].append(
                        (e["at"], e.get("state", ""))
                    )
        new = self.fleet.actions[done_before:]
        for t, who, action, host, _e in new:
            self.stats.checks += 1
            # an entry settled at its batch's start; one a dead pass left: reserved before the act (spent
            # whatever its time), or in doubt from when the next pass found it, after the act
            if not any(
                abs(at - t) < slack
                or (state == store.RESERVED and at < t + slack)
                or (state == store.IN_DOUBT and at > t - slack)
                for at, state in entries.get((action, host), [])
            ):
                self.violate(f"{who}: {action} on {host} at t+{t - T0:.0f}s is not in the ledger")
        for (action, host), found in entries.items():
            for at, state in found:
                if state == store.DONE and at >= round_start:
                    self.stats.checks += 1
                    if not any(a == action and h == host and abs(at - t) < slack for t, _w, a, h, _e in new):
                        self.violate(
                            f"ledger#{action}: {host} settled done at t+{at - T0:.0f}s, never started"
                        )

    def check_budgets(self) -> None:
        """From what was really started: no budget's limit exceeded in any window, fleet-wide or per group."""
        recent = [a for a in self.fleet.actions if a[0] > self.now - 2 * HOUR - 3600]
        by_action: dict[str, list[tuple[float, str]]] = defaultdict(list)
        for t, _who, action, host, _e in recent:
            by_action[action].append((t, self.fleet.group_of[host]))
        for action, budget in self.policy.limits.items():
            events = sorted(by_action.get(action, []))
            # the clocks may disagree by up to the store's bound: a window's edge moves with them
            window = budget.window_s - store.MAX_SKEW_S - 1
            for i, (t, group) in enumerate(events):
                inside = [(u, g) for u, g in events[: i + 1] if u > t - window]
                self.stats.checks += 1
                if budget.max is not None and len(inside) > budget.max:
                    self.violate(
                        f"{action}: {len(inside)} in {budget.window} across the fleet (max {budget.max})"
                    )
                limit = budget.group_limit(self.sizes[group])
                n = sum(1 for _u, g in inside if g == group)
                if limit is not None and n > limit[0]:
                    self.violate(f"{action}: {n} in group {group} within {budget.window} (limit {limit[1]})")

    def run(self, days: float, step: float = HOUR) -> Stats:
        real = auto_context.write_tags, auto_finish.load, store.PassLease._renew_loop, store.PassLease.take
        auto_context.write_tags = lambda *a, **k: {}  # type: ignore[assignment]  # no EC2 tag mirror here
        auto_finish.load = lambda relative: self.finisher()  # type: ignore[assignment]
        # no renewing thread: a rollout renews its pass's lease as simulated time passes (``elapse``)
        store.PassLease._renew_loop = lambda self: None  # type: ignore[method-assign]
        store.PassLease.take = self.lease_taken(real[3])  # type: ignore[method-assign]
        try:
            rounds = int(days * 86400 / step)
            for i in range(rounds):
                self.round(i)
                self.now += step - (self.now - T0) % step if (self.now - T0) % step else step
        finally:
            (auto_context.write_tags, auto_finish.load, store.PassLease._renew_loop, store.PassLease.take) = (
                real  # type: ignore[assignment,method-assign]
            )
        return self.stats

    def lease_taken(self, take: Callable[[store.PassLease], None]) -> Callable[[store.PassLease], None]:
        """``PassLease.take``, remembering each controller's lease for its rollout to renew."""

        def taken(lease: store.PassLease) -> None:
            take(lease)
            self.leases[threading.current_thread().name] = lease

        return taken


class _SimConnection:
    regions = ("sim",)

    def settings(self) -> None:
        return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.simulation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=float, default=30)
    parser.add_argument("--hosts", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-condition", action="store_true", help="a store without compare-and-swap")
    parser.add_argument(
        "--acts-at-start",
        action="store_true",
        help="the stand-in says every host was acted on when its rollout started (budgets from the reservation)",
    )
    parser.add_argument(
        "--outages",
        action="store_true",
        help="two hosts of the small group down for hours now and then, the alert bursts there (issue 38)",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    sim = Simulation(
        args.hosts,
        args.seed,
        conditional=not args.no_condition,
        acts_told=not args.acts_at_start,
        outages=args.outages,
    )
    stats = sim.run(args.days)
    print(
        f"simulated {args.days:g} days over {args.hosts} hosts (seed {args.seed}) in {time.monotonic() - started:.0f} s"
    )
    print(stats.table())
    for line in stats.violations[:20]:
        print("VIOLATION", line)
    return 1 if stats.violations else 0


if __name__ == "__main__":
    sys.exit(main())
