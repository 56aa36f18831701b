"""What holds a pass's decisions back before it acts: the unreachable hosts it tolerates, the schedulers'
view of the nodes, a group whose capacity is unknown, a Slurm node still draining, the storm brakes and
the capacity floors."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from fleetops.ansible import facts
from fleetops.auto.actions import disruptive
from fleetops.auto.context import PassBase
from fleetops.auto.seen import SEEN_FRESH_S
from fleetops.policy import (
    NO_GROUP,
    Decision,
    LadderState,
    fmt_duration,
    hold_for_brakes,
    hold_for_floors,
    storm_brakes,
)
from fleetops.remediations import REMEDIATIONS


class Guards(PassBase):
    """The holds of a pass (see :mod:`fleetops.auto`)."""

    def count_unreachable(self) -> None:
        """The hosts the scan could not reach; within the policy's share (``unreachable.max_pct``) they do
        not fail the pass (the floors count them either way). One line when there are any."""
        hosts = self.inputs.scan_report.get("hosts") or {}
        result, share = self.result, self.inputs.policy.unreachable
        result.unreachable = sorted(
            h for h, e in hosts.items() if isinstance(e, Mapping) and e.get("status") == "unreachable"
        )
        result.unreachable_limit = share.limit(len(hosts))
        count, limit = len(result.unreachable), result.unreachable_limit
        if not count or not share.max_pct:  # none tolerated: each host's own line says it was not scanned
            return
        told = f"{count} of {len(hosts)} host(s) unreachable"
        if count <= limit:
            self.say(
                f"{told}, within the policy's {share.max_pct:g}% ({limit}): reported, left at their ladders and "
                "counted against the floors; the pass does not fail for them",
                "warning",
            )
        else:
            self.warn(
                f"{told}, more than the policy's unreachable.max_pct {share.max_pct:g}% ({limit}): the pass fails"
            )

    def read_nodes(self) -> None:
        """The schedulers' view (``inputs.nodes``): one line for the nodes out of scheduling, one per backend
        that could not be read (the pass fails) or was not read."""
        reading, result = self.inputs.nodes, self.result
        if reading is None:
            return
        out = reading.out()
        result.nodes_out = {h: s.to_dict() for h, s in sorted(out.items())}
        if out:
            shown = "; ".join(f"{h} {s.why()}" for h, s in sorted(out.items())[:20])
            more = f"; and {len(out) - 20} more" if len(out) > 20 else ""
            self.say(f"nodes out of scheduling: {len(out)} ({shown}{more})", "dim")
        for line in reading.skipped:
            self.say(f"nodes: {line}", "dim")
        for line in reading.failures:
            result.node_failures.append(line)
            self.warn(f"nodes: {line}: the pass fails, and takes no disruptive action in its hosts' groups")

    def outside(self) -> list[str]:
        """The fleet's hosts this pass did not scan (outside its limit, left out with --exclude)."""
        scanned = self.inputs.scan_report.get("hosts") or {}
        return sorted(h for h in self.fleet if h not in scanned)

    def hold_unknown_capacity(self, now: float) -> None:
        """A disruptive rung in a group whose nodes could not be read (``inputs.nodes.unknown``) waits
        (status ``floor``): the group's capacity is unknown. So does one under a floor in a group with a
        host outside this pass that the fleet record has not seen within ``SEEN_FRESH_S``
        (:mod:`fleetops.auto.seen`): nobody knows whether it is in service. One line when there are any."""
        reading, policy = self.inputs.nodes, self.inputs.policy
        # group -> why, and whether only a rung under a floor waits for it (an unrecorded host)
        unknown: dict[str, tuple[str, bool]] = {
            self.group_of(h) or NO_GROUP: (why, False)
            for h, why in (reading.unknown.items() if reading else ())
        }
        fresh = self.seen.fresh(now)
        unseen: dict[str, list[str]] = {}
        for host in self.outside():
            if host not in fresh:
                unseen.setdefault(self.group_of(host) or NO_GROUP, []).append(host)
        self.result.unrecorded = {g: list(hs) for g, hs in sorted(unseen.items())}
        window = fmt_duration(int(SEEN_FRESH_S))
        settings = {f.unrecorded for f in (policy.floor, *(r.floor for r in policy.rules)) if f is not None}
        if unseen:
            hosts = [h for hs in unseen.values() for h in hs]
            shown = f"{', '.join(hosts[:5])}{', ...' if len(hosts) > 5 else ''}"
            told = f"fleet record: {len(hosts)} host(s) outside this pass seen by no pass within {window} ({shown})"
            if "unknown" in settings:
                also = (
                    " (a floor with unrecorded: available counts them in service)"
                    if "available" in settings
                    else ""
                )
                self.say(
                    f"{told}: the capacity of group(s) {', '.join(sorted(unseen))} is unknown; a disruptive "
                    f"rung under a floor there waits{also}",
                    "warning",
                )
            else:
                self.say(f"{told}: counted in service (the policy's floors say unrecorded: available)", "dim")
        for group, hs in unseen.items():
            unknown.setdefault(
                group, (f"{len(hs)} of its hosts outside this pass have no record within {window}", True)
            )

        def held(d: Decision) -> bool:
            if d.status != "act" or not disruptive(d.action) or d.group not in unknown:
                return False
            found = policy.rule(d.rule) if d.rule else None
            floor = policy.floor_of(found) if found is not None else None
            return not unknown[d.group][1] or (floor is not None and floor.unrecorded == "unknown")

        self.result.decisions = [
            dataclasses.replace(
                d,
                status="floor",
                action=None,
                reason=f"floor: the capacity of group {d.group} is unknown ({unknown[d.group][0]})",
            )
            if held(d)
            else d
            for d in self.result.decisions
        ]

    def wait_for_drains(self, now: float) -> None:
        """A disruptive rung (reboot, stop-start, replace) on a Slurm node that fleetops drained and whose
        jobs still run waits (status ``wait``) until the node is DRAINED: a pass never kills a job by
        acting before its node has drained — unless the rung's ``drain_wait`` since the drain has passed,
        as the policy says; then it acts, and says so."""
        reading = self.inputs.nodes
        if reading is None:
            return
        decisions = []
        for d in self.result.decisions:
            state = reading.states.get(d.host)
            draining = (
                state is not None and state.backend == "slurm" and state.phase == "draining" and state.ours
            )
            if (
                state is None
                or not draining
                or d.status != "act"
                or d.action == "quarantine"
                or not disruptive(d.action)
            ):
                decisions.append(d)
                continue
            rule = self.inputs.policy.rule(d.rule) if d.rule is not None else None
            rung = rule.ladder[d.rung] if rule is not None and d.rung is not None else None
            bound = f" or {rung.drain_wait} after the drain (drain_wait)" if rung and rung.drain_wait else ""
            waited = now - state.since if state.since is not None else None
            if (
                rung is not None
                and rung.drain_wait_s is not None
                and waited is not None
                and waited >= rung.drain_wait_s
            ):
                self.warn(
                    f"{d.host}: Slurm node {state.node} still drains {fmt_duration(int(waited))} after fleetops "
                    f"drained it, past the rung's drain_wait {rung.drain_wait}: {d.action} goes ahead on the jobs "
                    "still running"
                )
                decisions.append(d)
                continue
            decisions.append(
                dataclasses.replace(
                    d,
                    status="wait",
                    action=None,
                    reason=f"waits for Slurm node {state.node} to drain (its jobs still run): {d.rung_action} "
                    f"starts once it is DRAINED{bound}",
                )
            )
        self.result.decisions = decisions

    def apply_brakes(self, ladder: LadderState, now: float) -> None:
        """The storm brake: rules this pass shows in a storm trip (recorded with ``apply``, told once), and
        every brake in force holds its rule's braked rungs (reboot, stop-start, replace) fleet-wide. A rule
        counts the hosts this pass matched and, outside it, those whose latest record within
        ``SEEN_FRESH_S`` matched it or whose ladder on it started within that window."""
        inputs, result = self.inputs, self.result
        failed = {
            h: self.group_of(h) or NO_GROUP
            for h, state in (inputs.nodes.states.items() if inputs.nodes is not None else ())
            if state.failed
        }
        fresh = self.seen.fresh(now)
        elsewhere: dict[str, dict[str, str]] = {}
        for host in self.outside():
            rules = fresh[host].matching(now - SEEN_FRESH_S) if host in fresh else set()
            rules |= {
                r for r, rec in ladder.hosts.get(host, {}).items() if rec.first_tried >= now - SEEN_FRESH_S
            }
            for rule in rules:
                elsewhere.setdefault(rule, {})[host] = self.group_of(host) or NO_GROUP
        tripped = storm_brakes(inputs.policy, result.decisions, self.sizes, failed, elsewhere)
        in_force = {r: str(b.get("why") or "") for r, b in self.brakes.items()}
        new = {r: w for r, w in tripped.items() if r not in in_force}
        in_force.update(new)
        if not in_force:
            return
        result.decisions = hold_for_brakes(
            result.decisions, in_force, lambda a: a in REMEDIATIONS and REMEDIATIONS[a].braked
        )
        result.brakes = {
            r: {"why": w, "since": self.brakes.get(r, {}).get("since"), "new": r in new}
            for r, w in in_force.items()
        }
        for rule, why in sorted(in_force.items()):
            if rule in new:
                self.warn(
                    f"storm brake tripped on rule {rule}: {why}; its reboot, stop-start and replace rungs are held "
                    f"fleet-wide until a person lifts it ('fleetops brake lift {rule}')"
                )
            else:
                self.say(f"storm brake on rule {rule} holds: {why}", "dim")
        if inputs.apply and new:
            self.trip(new)

    def recorded_out(self, now: float) -> dict[str, tuple[str, str]]:
        """The hosts outside this pass that the latest pass or scan that recorded them within
        ``SEEN_FRESH_S`` could not scan (unreachable, failed): host -> (its group, why). The floors count
        them unavailable (a limited pass scans only its limit: issue 38)."""
        fresh, out = self.seen.fresh(now), {}
        for host in self.outside():
            seen = fresh.get(host)
            if seen is not None and seen.status not in facts.answered_statuses():
                out[host] = (self.group_of(host) or NO_GROUP, seen.says(now))
        return out

    def apply_floors(self, ladder: LadderState, now: float) -> None:
        """The capacity floors (the policy's ``floor``): per group, the hosts out of service now —
        unreachable or failed in the scan, quarantined (a ladder's or a cleared ladder's taint), in a batch
        another pass reserved in the store or left half done by a dead pass (``in_flight``), out of
        scheduling (``inputs.nodes``), an instance the inventory lists as not running (``inputs.stopped``),
        and outside this pass, not scanned by the latest pass or scan that recorded it (the fleet record) —
        and the ones this pass takes; a disruptive action that would
        leave its group below the floor waits (status ``floor``). One line per group with such an action."""
        inputs, result = self.inputs, self.result
        policy = inputs.policy
        if policy.floor is None and not any(r.floor is not None for r in policy.rules):
            return
        unavailable: dict[str, tuple[str, str]] = {}
        for host, entry in (inputs.scan_report.get("hosts") or {}).items():
            if isinstance(entry, Mapping) and not facts.answered(entry):
                unavailable[host] = (
                    self.group_of(host) or NO_GROUP,
                    str(entry.get("status") or "not scanned"),
                )
        for host, why in inputs.stopped.items():
            unavailable.setdefault(host, (self.group_of(host) or NO_GROUP, why))
        unavailable.update(self.recorded_out(now))
        quarantined = {
            host: self.group_of(host) or NO_GROUP
            for host, rules in ladder.hosts.items()
            if any(rec.quarantined for rec in rules.values())
        }
        quarantined.update({d.host: d.group for d in result.decisions if d.still_quarantined})
        for host, group in quarantined.items():
            unavailable.setdefault(host, (group, "quarantined"))
        out = set(unavailable)  # out of service as the scan, the inventory, the ladders and the nodes show
        for host, why in self.in_flight.items():
            unavailable.setdefault(host, (self.group_of(host) or NO_GROUP, why))
        for host, state in (inputs.nodes.out() if inputs.nodes is not None else {}).items():
            if state.ours:  # a quarantine of ours a cleared ladder left standing counts against the cap
                quarantined.setdefault(host, self.group_of(host) or NO_GROUP)
            unavailable.setdefault(host, (self.group_of(host) or NO_GROUP, state.why()))
            out.add(host)
        result.decisions, capacity = hold_for_floors(
            policy,
            result.decisions,
            self.sizes,
            unavailable,
            quarantined,
            disruptive,
            # on the store's record alone (a batch reserved, a step a dead pass left, maybe never acted on):
            # it may be serving, so taking it costs its group (the simulation's --outages, seed 3)
            maybe_serving={h for h in self.in_flight if h not in out},
        )
        result.capacity = [
            {"group": c.group, "size": c.size, "unavailable": dict(c.unavailable), "taken": list(c.taken),
             "keep": c.keep, "held": list(c.held)}
            for c in capacity
        ]  # fmt: skip
        for c in capacity:
            self.say(c.line(), "warning" if c.held else "dim")
