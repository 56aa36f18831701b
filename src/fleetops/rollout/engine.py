"""The rollout engine: every remediation runs through it, batch by batch, safely and resumably.

- **One batch = one run of the batch runner** (in production one ansible-runner invocation limited
  to the batch's hosts: ``fleetops.rollout.batch``).
- **Gate** after each batch: the batch is scanned again (the scanner): the host must answer, the
  finding the remediation fixed must be gone, and no new critical finding may appear; for a reboot
  the boot id must have changed (``fleetops.rollout.gate``). Then a cooldown.
- **Circuit breaker**: once failed hosts pass ``max_failures`` (exactly that many are tolerated),
  the rollout stops; hosts not yet reached stay untouched (``pending``).
- **State** on disk after every step (``fleetops.rollout.state``; a resume probes hosts caught
  mid-batch by a kill instead of redoing them blindly), an **audit log** line per host change.
- **Stop**: ``request_stop()`` ends the rollout after the current batch (state saved,
  ``interrupted``); ``abort()`` cancels the running batch, leaving its hosts ``running`` (in doubt)
  for a resume to probe. Signals are the caller's: the API maps Ctrl-C, SIGTERM and SIGHUP onto
  these two (``abort(reason)`` names the signal).
- **Guards** (issue 14, ``fleetops.rollout.guards``): the hosts that ran must be exactly the batch
  (else stop, exit 3, the extra hosts audited); before each batch the kill switch
  (``fleetops stop``), the EC2 lease, the deadline (``--not-after``) and the capacity floor
  (``--max-unhealthy``) are asked, any of them stops the rollout with the rest pending. A host past
  its time limit (``--host-timeout``) fails "timed out after S s" and counts for the breaker.
  Their settings live in ``rollout.plan["guards"]`` (``GUARDS_KEY``), so a resume keeps them.

The engine neither prints nor renders: it tells its observer (``RolloutObserver``) what happens.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from fleetops.ansible.runner import PlaybookRun, TaskResult
from fleetops.rollout import guards, killswitch
from fleetops.rollout.audit import audit
from fleetops.rollout.gate import GateCheck, judge, replacement_entry
from fleetops.rollout.outcome import HostOutcome, host_outcome, notes_of
from fleetops.rollout.state import HOST_DONE, HOST_FAILED, HOST_PENDING, HOST_RUNNING, HOST_SKIPPED, Rollout

GUARDS_KEY = "guards"  # rollout.plan[GUARDS_KEY]: {"max_unhealthy", "not_after", "group_of"}
# rollout.stopped["kind"] of a rollout the kill switch stopped (`fleetops stop`): a person asked for it
STOP_KILL_SWITCH = "kill_switch"
# the message of a host the remediation refused (Remediation.refuse): left out untouched, so not unhealthy
REFUSED = "refused: "
HOST_TIMEOUT_VAR = "fleetops_host_timeout"  # the playbooks' per-task time limit (seconds)

# What every batch run passes to the remediation playbooks (their `serial` / `max_fail_percentage` knobs):
# the batch is the plan's, all of it at once, failures judged by the breaker (the playbooks default to
# one host at a time and stop at the first failure, for plain runs).
BATCH_VARS: dict[str, Any] = {"fleetops_serial": "100%", "fleetops_max_fail_percentage": 100}
LEASE_VAR = "fleetops_lease"  # false: the playbooks run no EC2 lease task


class BatchRunner(Protocol):
    """Runs the remediation playbook on exactly ``hosts``; ``on_result`` sees each task result as it lands."""

    def __call__(
        self,
        hosts: Sequence[str],
        extravars: dict[str, Any],
        *,
        check: bool,
        on_result: Callable[[TaskResult], None] | None,
        cancel: threading.Event | None,
    ) -> PlaybookRun: ...


class Scanner(Protocol):
    """Scans ``hosts``: ``{host: its fleetops.scan/v1 entry}``."""

    def __call__(self, hosts: Sequence[str]) -> dict[str, dict[str, Any]]: ...


class RolloutObserver(Protocol):
    """What the engine reports as it goes (the CLI renders it; a library caller may log or ignore it)."""

    def rollout_started(self, rollout: Rollout) -> None: ...

    def rollout_finished(self, rollout: Rollout) -> None: ...

    def message(self, text: str, style: str = "") -> None:
        """A line for the operator; ``style``: "" | "dim" | "note" | "warning" | "error"."""

    def batch_started(self, index: int, total: int, hosts: Sequence[str]) -> None: ...

    def host_finished(self, host: str) -> None:
        """A host of the running batch answered its remediation task (progress)."""

    def host_recorded(self, host: str, outcome: HostOutcome) -> None:
        """A host's final outcome in its batch (gate and post pass included)."""

    def batch_finished(self, index: int, total: int) -> None: ...

    def interrupted(self, rollout: Rollout) -> None:
        """The rollout stopped on request (``rollout.stopped`` says after which batch, what is left)."""

    def stopped(self, rollout: Rollout, breaker: bool) -> None:
        """The circuit breaker (``breaker``) or the guard stopped the rollout."""


class NullObserver:
    """An observer that ignores everything (library callers that only want the result)."""

    def rollout_started(self, rollout: Rollout) -> None:
        pass

    def rollout_finished(self, rollout: Rollout) -> None:
        pass

    def message(self, text: str, style: str = "") -> None:
        pass

    def batch_started(self, index: int, total: int, hosts: Sequence[str]) -> None:
        pass

    def host_finished(self, host: str) -> None:
        pass

    def host_recorded(self, host: str, outcome: HostOutcome) -> None:
        pass

    def batch_finished(self, index: int, total: int) -> None:
        pass

    def interrupted(self, rollout: Rollout) -> None:
        pass

    def stopped(self, rollout: Rollout, breaker: bool) -> None:
        pass


class _Aborted(Exception):
    """abort() was called while a batch ran."""


def refused(outcome: HostOutcome | None) -> bool:
    """The host was refused by its remediation (``REFUSED``): left out untouched."""
    return outcome is not None and outcome.status == "skipped" and (outcome.msg or "").startswith(REFUSED)


class _Violation(Exception):
    """A guard failed mid-batch (hosts outside the batch ran): stop now, the batch's hosts in doubt."""


@dataclass(frozen=True)
class FleetCapacity:
    """The live fleet, as a rollout's capacity floor sees it before a batch: every group's size in the whole
    inventory, the hosts whose nodes are out of scheduling (host -> group), and the groups whose scheduler
    could not be read (group -> why)."""

    sizes: dict[str | None, int]
    out: dict[str, str | None]
    unknown: dict[str | None, str] = field(default_factory=dict)


def guard_settings(rollout: Rollout) -> dict[str, Any]:
    """The rollout's guard settings (``rollout.plan[GUARDS_KEY]``; empty for a rollout from before them)."""
    settings = rollout.plan.get(GUARDS_KEY)
    return settings if isinstance(settings, dict) else {}


def host_timeout_of(rollout: Rollout) -> int | None:
    value = rollout.extravars.get(HOST_TIMEOUT_VAR)
    return (
        int(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else None
    )


def timed_out(outcome: HostOutcome, host_timeout: int | None) -> HostOutcome:
    """A failure because a task ran past its ``timeout:`` said so: "timed out after S s: ..."
    (ansible-core marks such a result ``timedout: {period: S}``)."""
    if outcome.status != "failed" or (outcome.msg or "").startswith("timed out after"):
        return outcome
    period = ((outcome.result or {}).get("timedout") or {}).get("period")
    if isinstance(period, int | float) and not isinstance(period, bool):
        return outcome.with_changes(msg=f"timed out after {period:g} s: {outcome.msg or 'task timed out'}")
    return outcome


@dataclass
class Engine:
    """Runs (or resumes) one rollout with the batch runner, scanner and observer it is given."""

    rollout: Rollout
    actions: tuple[str, ...]  # the remediation's module(s): their result is the host's
    runner: BatchRunner
    scanner: Scanner
    observer: RolloutObserver = field(default_factory=NullObserver)
    gate_check: GateCheck | None = None
    # the remediation replaces each host (replace): its gate judges the playbook's scan of the new host,
    # without a baseline (the old host's findings excuse nothing on the new one); the old one is not scanned
    replaces_host: bool = False
    probe_vars: dict[str, Any] | None = None  # extra vars that make the playbook only probe (resume)
    # extra vars for a second pass over the hosts that passed their gate (reboot: uncordon, post hook)
    post_vars: dict[str, Any] | None = None
    guard: Callable[[], str | None] | None = None  # why no further batch may start (EC2 lease lost)
    # the kill switch's EC2 channel: the stop request tagged on the rollout's instances (None: none)
    ec2_stop: Callable[[float], killswitch.StopRequest | None] | None = None
    # the live fleet's capacity for the floor, read before each batch (None: the rollout's own hosts only)
    fleet: Callable[[], FleetCapacity] | None = None
    baseline: dict[str, dict[str, Any]] = field(default_factory=dict)  # host -> scan entry before
    stop_requested: threading.Event = field(default_factory=threading.Event)
    abort_requested: threading.Event = field(default_factory=threading.Event)
    abort_reason: str = "aborted mid-batch (Ctrl-C twice)"
    abort_signal: int | None = None  # the signal that aborted the rollout (SIGTERM, SIGHUP): exit 128+N
    stop_kind: str | None = None  # STOP_KILL_SWITCH when the kill switch stopped it
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    running_since: float = 0.0

    # ------------------------------------------------------------------ control (from any thread)

    def request_stop(self) -> None:
        """Stop after the current batch (or cooldown), state saved: status ``interrupted``."""
        self.stop_requested.set()

    def abort(self, reason: str | None = None, signum: int | None = None) -> None:
        """Cancel the running batch now; its hosts stay ``running`` (in doubt) for a resume to probe.

        ``signum``: the signal that asked for it (recorded in ``rollout.stopped["signal"]``)."""
        if reason:
            self.abort_reason = reason
        if signum is not None:
            self.abort_signal = signum
        self.stop_requested.set()
        self.abort_requested.set()

    # ------------------------------------------------------------------ runs

    def _run(self, hosts: Sequence[str], extravars: dict[str, Any], check: bool | None = None) -> PlaybookRun:
        observer = self.observer

        def seen(tr: TaskResult) -> None:
            if tr.action in self.actions or tr.status in ("failed", "unreachable"):
                observer.host_finished(tr.host)

        # the playbook's EC2 lease tasks never run under the CLI: it holds its own lease and checks it
        # before each batch (the guard). Checking it in the playbook too (fleetops_lease_rollout) needs
        # the inventory's EC2 connection in the runner's environment, which it does not get yet.
        run = self.runner(
            list(hosts),
            {**BATCH_VARS, LEASE_VAR: False, **extravars},
            check=(not self.rollout.apply) if check is None else check,
            on_result=seen,
            cancel=self.abort_requested,
        )
        if self.abort_requested.is_set():
            raise _Aborted
        extra = guards.exact_hosts_check(hosts, run.hosts())
        if extra:
            reason = guards.extra_hosts_reason(extra)
            for host in sorted(extra):
                audit(
                    self.rollout, host, HostOutcome(status="failed", msg=f"ran outside its batch: {reason}")
                )
            raise _Violation(reason)
        return run

    def _run_batch(
        self, hosts: Sequence[str], extravars: dict[str, Any], check: bool | None = None
    ) -> dict[str, HostOutcome]:
        run = self._run(hosts, extravars, check)
        limit = host_timeout_of(self.rollout)
        out: dict[str, HostOutcome] = {}
        for h in hosts:
            outcome = timed_out(host_outcome(run.results_for(h), self.actions), limit)
            if run.status == "timeout" and outcome.status != "ok":
                outcome = outcome.with_changes(
                    status="failed",
                    msg=f"timed out after {limit} s: the batch's ansible run was ended at its time limit",
                )
            out[h] = outcome
        return out

    def _scan(self, hosts: Sequence[str]) -> dict[str, dict[str, Any]]:
        return self.scanner(list(hosts)) if hosts else {}

    def _record(self, host: str, outcome: HostOutcome) -> None:
        self.rollout.hosts[host] = HOST_DONE if outcome.ok else HOST_FAILED
        self.rollout.results[host] = outcome
        if self.rollout.apply:
            audit(self.rollout, host, outcome)
        self.observer.host_recorded(host, outcome)

    def _post(self, outcomes: dict[str, HostOutcome]) -> dict[str, HostOutcome]:
        """After the gate: the second pass (uncordon, post hook) for the hosts that passed it.

        A host that failed its gate gets none: a node that came back broken stays cordoned.
        """
        if self.post_vars is None or not self.rollout.apply:
            return outcomes
        out = dict(outcomes)
        passed = [h for h, o in outcomes.items() if o.ok]
        for host, outcome in outcomes.items():
            if host not in passed and outcome.gate:
                out[host] = outcome.with_changes(
                    gate=outcome.gate + " (post-reboot hooks not run: a cordoned node stays cordoned)"
                )
        if not passed:
            return out
        run = self._run(passed, {**self.rollout.extravars, **self.post_vars}, check=False)
        for host in passed:
            results = run.results_for(host)
            outcome = out[host]
            bad = next((tr for tr in reversed(results) if tr.status in ("failed", "unreachable")), None)
            if bad is not None:
                outcome = outcome.with_changes(
                    status="failed", msg=f"post-reboot hook failed ({bad.task}): {bad.msg}"
                )
            elif not results:
                outcome = outcome.with_changes(status="failed", msg="post-reboot hooks did not run")
            notes = notes_of(results)
            if notes:
                outcome = outcome.with_changes(notes=(*outcome.notes, *notes))
            out[host] = outcome
        return out

    def _say_notes(self, outcomes: dict[str, HostOutcome]) -> None:
        for note in dict.fromkeys(n for o in outcomes.values() for n in o.notes):
            self.observer.message(f"note: {note}", "note")

    def _gate_one(self, host: str, outcome: HostOutcome, after: dict[str, Any] | None = None) -> HostOutcome:
        if after is None:
            after = self._scan([host]).get(host, {"status": "missing"})
        return judge(host, outcome, self.baseline.get(host), after, self.rollout.extravars, self.gate_check)

    def recover(self) -> None:
        """On resume: hosts caught mid-batch by a kill (``running``) and hosts that failed before
        (``failed``: they are not done) are probed, then run again; none is marked done unverified.

        Without a probe (idempotent remediations) they simply run again in their batch. With one
        (reboot): a host whose boot id changed since its last "before" already rebooted: it is not
        rebooted again but judged by its gate (verified, or failed); one that does not answer stays
        failed (it may be mid-reboot: a later resume checks it again); the others run again.
        """
        caught = [h for h, s in self.rollout.hosts.items() if s == HOST_RUNNING]
        failed = [h for h, s in self.rollout.hosts.items() if s == HOST_FAILED]
        if caught:
            self.observer.message(
                f"resume: {len(caught)} host(s) were mid-batch when the rollout stopped: {' '.join(caught)}"
            )
        if failed:
            self.observer.message(
                f"resume: {len(failed)} host(s) failed before and run again: {' '.join(failed)}"
            )
        todo = caught + failed
        if not todo:
            return
        if self.probe_vars is None or not self.rollout.apply:
            for host in todo:  # idempotent remediations: simply run them again
                self.rollout.hosts[host] = HOST_PENDING
            self.rollout.save()
            return
        probed = self._run_batch(todo, {**self.rollout.extravars, **self.probe_vars}, check=False)

        def before_of(host: str) -> dict[str, Any]:
            previous = self.rollout.results.get(host)
            return (previous.before if previous is not None else None) or {}

        def changed_boot(host: str) -> bool:
            before, now = before_of(host).get("boot_id"), (probed[host].before or {}).get("boot_id")
            return bool(before and now and now != before)

        done_already = [h for h in todo if changed_boot(h)]
        after = self._scan(done_already)  # one gate scan for the hosts that already rebooted
        rebooted: dict[str, HostOutcome] = {}
        for host in todo:
            before, now = before_of(host), probed[host].before or {}
            if host in done_already:
                self.observer.message(f"  {host}: already rebooted (boot id changed): not rebooting again")
                outcome = HostOutcome(status="ok", changed=True, before=before, after=now, result={})
                rebooted[host] = self._gate_one(host, outcome, after.get(host, {"status": "missing"}))
            elif probed[host].status != "ok":
                # It may be mid-reboot: never act on it blindly; a later resume re-checks it.
                self._record(host, HostOutcome(
                    status="failed", before=before,
                    msg=f"not answering on resume ({probed[host].msg}): it may be mid-reboot",
                ))  # fmt: skip
            else:
                self.rollout.hosts[host] = HOST_PENDING
        for host, outcome in self._post(rebooted).items():
            self._record(host, outcome)
        self.rollout.save()

    def run(self) -> Rollout:
        r = self.rollout
        r.status = "running"
        r.stopped = None
        r.save()
        self.running_since = time.time()
        self.held_back: list[str] = []  # capacity-floor reasons; their hosts stay pending
        self.capacity_told = False  # the live fleet's capacity, told once per run (the first batch's reading)
        self.observer.rollout_started(r)
        try:
            return self._run_all()
        except (KeyboardInterrupt, _Aborted):
            self._interrupted(aborted=True)
            return r
        except _Violation as exc:
            self._stop(sum(1 for b in r.batches if b.get("finished")), str(exc))
            return r
        finally:
            self.observer.rollout_finished(r)

    def _before_batch(self, batch: Sequence[str]) -> str | None:
        """Why the next batch must not start (kill switch, lease, deadline, capacity), or None."""
        r = self.rollout
        request = killswitch.pending_stop(r.id, self.running_since)
        if request is None and self.ec2_stop is not None:
            request = self.ec2_stop(self.running_since)
        if request is not None:
            if request.rollout == r.id and request.raw is None:
                killswitch.clear_stop(r.id)  # honoured: our own stop file goes
            self.stop_kind = STOP_KILL_SWITCH
            return request.describe()
        reason = self.guard() if self.guard is not None else None
        if reason:
            return reason
        settings = guard_settings(r)
        not_after = settings.get("not_after")
        if not_after:
            deadline = datetime.fromisoformat(str(not_after))
            if guards.deadline_passed(deadline, self.clock()):
                return guards.deadline_reason(deadline)
        return None

    def _capacity_hold(self, batch: Sequence[str]) -> tuple[list[str], list[str]]:
        """The capacity floor (``--max-unhealthy``), group by group: ``(hosts that may run, reasons)``.

        The hosts of a group that already has more unhealthy hosts than allowed (unreachable at
        preflight or their gate, failed, timed out; the batch's own hosts not counted) are held back,
        pending; the batch's hosts of other groups run: a degraded AZ never blocks a healthy one.

        With the live fleet (``fleet``, read before each batch), a group's size is the whole inventory's
        and its nodes out of scheduling (cordoned, drained, down: by anyone) count as unhealthy too; a
        group whose scheduler could not be read is held (its capacity is unknown).
        """
        r = self.rollout
        limit = guard_settings(r).get("max_unhealthy")
        if not limit:
            return list(batch), []
        group_of: dict[str, str | None] = dict(guard_settings(r).get("group_of") or {})
        for host in r.hosts:
            group_of.setdefault(host, None)
        unhealthy = [
            h
            for h, s in r.hosts.items()
            if s in (HOST_FAILED, HOST_SKIPPED) and not refused(r.results.get(h))
        ]
        sizes: dict[str | None, int] | None = None
        unknown: dict[str | None, str] = {}
        if self.fleet is not None:
            seen = self.fleet()
            sizes = guards.group_sizes(group_of)
            for group, size in seen.sizes.items():
                sizes[group] = max(size, sizes.get(group, 0))
            known = set(unhealthy)
            for host, group in seen.out.items():
                group_of.setdefault(host, group)
                if host not in known:
                    unhealthy.append(host)
            unknown = dict(seen.unknown)
        parsed = guards.MaxUnhealthy.parse(str(limit))
        if self.fleet is not None and not self.capacity_told and sizes is not None:
            self.capacity_told = True
            self._tell_capacity(group_of, sizes, unhealthy, unknown, parsed)
        by_group: dict[str | None, list[str]] = {}
        for host in batch:
            by_group.setdefault(group_of.get(host), []).append(host)
        held: set[str] = set()
        reasons: list[str] = []
        for group, hosts in by_group.items():
            reason = guards.capacity_violation(hosts, group_of, sizes, unhealthy, parsed)
            if reason is None and group in unknown:
                label = guards.NO_GROUP if group is None else f"group {group}"
                reason = f"{label}: its capacity is unknown ({unknown[group]}); its next batch waits"
            if reason:
                held.update(hosts)
                reasons.append(reason)
        return [h for h in batch if h not in held], reasons

    def _tell_capacity(
        self,
        group_of: dict[str, str | None],
        sizes: dict[str | None, int],
        unhealthy: Sequence[str],
        unknown: dict[str | None, str],
        limit: guards.MaxUnhealthy,
    ) -> None:
        """One line per group the rollout still has hosts to act on: its size in the inventory, its hosts
        unhealthy now (nodes out of scheduling by anyone, this rollout's failures), and how many more the
        floor lets it lose: what an operator checks before an apply (a dry run prints it too)."""
        r = self.rollout
        groups = dict.fromkeys(group_of.get(h) for h, s in r.hosts.items() if s == HOST_PENDING)
        for group in groups:
            label = guards.NO_GROUP if group is None else f"group {group}"
            if group in unknown:
                self.observer.message(
                    f"capacity: {label}: unknown ({unknown[group]}): its batches wait", "warning"
                )
                continue
            down = sorted(h for h in unhealthy if group_of.get(h) == group)
            allowed = limit.allowed(sizes.get(group, 0))
            self.observer.message(
                f"capacity: {label}: {sizes.get(group, 0)} hosts in the inventory, {len(down)} unhealthy now"
                + (f" ({guards.named(down)})" if down else "")
                + f"; --max-unhealthy {limit} allows {allowed}: "
                + (f"{allowed - len(down)} more may be lost" if len(down) <= allowed else "its batches wait"),
                "dim" if len(down) <= allowed else "warning",
            )

    def _run_all(self) -> Rollout:
        r = self.rollout
        if r.apply and r.gate:
            self.baseline = self._scan([h for h, s in r.hosts.items() if s != HOST_SKIPPED])
        self.recover()
        batches = r.plan["batches"]
        for index, batch in enumerate(batches, start=1):
            if r.failures() > r.max_failures:
                self._stop(index - 1)
                return r
            todo = [h for h in batch if r.hosts.get(h) == HOST_PENDING]
            if not todo:
                continue
            if self.stop_requested.is_set():
                self._interrupted(aborted=False)
                return r
            reason = self._before_batch(todo)
            if reason:
                self._stop(index - 1, reason)
                return r
            todo, reasons = self._capacity_hold(todo)
            for reason in reasons:
                if reason not in self.held_back:
                    self.held_back.append(reason)
                    self.observer.message(f"holding back: {reason}", "warning")
            if not todo:
                continue
            self._batch(index, len(batches), todo)
            if r.failures() > r.max_failures:
                self._stop(index)
                return r
            more = any(r.hosts.get(h) == HOST_PENDING for b in batches[index:] for h in b)
            if more and self.stop_requested.is_set():
                self._interrupted(aborted=False)
                return r
            if r.apply and r.cooldown and more:
                self.observer.message(f"cooldown {r.cooldown:g}s", "dim")
                self.stop_requested.wait(r.cooldown)  # a stop request ends the cooldown at once
        if self.held_back:  # the rest of a degraded group stays pending for --resume: exit 3
            self._stop(sum(1 for b in r.batches if b.get("finished")), "; ".join(self.held_back))
            return r
        r.status = "done"
        r.stopped = None
        r.save()
        return r

    def _batch(self, index: int, total: int, todo: list[str]) -> None:
        r = self.rollout
        for host in todo:
            r.hosts[host] = HOST_RUNNING
        r.batches.append({"index": index, "hosts": todo, "started": time.time(), "finished": None})
        self.observer.batch_started(index, total, todo)
        if r.apply and self.probe_vars is not None:
            # Record what "before" looks like (e.g. the boot id) before acting, so a resume after
            # a kill mid-batch can tell a host that already rebooted from one that did not.
            probed = self._run_batch(todo, {**r.extravars, **self.probe_vars}, check=False)
            for host in todo:
                r.results[host] = HostOutcome(status="running", before=probed[host].before)
        r.save()
        outcomes = self._run_batch(todo, r.extravars)
        for host in todo:  # the pre-reboot boot id is saved before the gate (resume needs it)
            r.results[host] = outcomes[host]
        r.save()
        self._say_notes(outcomes)
        if r.apply and r.gate:
            after = self._scan([] if self.replaces_host else todo)
            for host in todo:
                if outcomes[host].status != "ok":
                    continue
                if self.replaces_host:
                    outcomes[host] = judge(
                        host,
                        outcomes[host],
                        None,
                        replacement_entry(outcomes[host]),
                        r.extravars,
                        self.gate_check,
                    )
                else:
                    outcomes[host] = self._gate_one(
                        host, outcomes[host], after.get(host, {"status": "missing"})
                    )
        outcomes = self._post(outcomes)
        for host in todo:
            self._record(host, outcomes[host])
        r.batches[-1]["finished"] = time.time()
        r.save()
        self.observer.batch_finished(index, total)

    def _interrupted(self, aborted: bool) -> None:
        """Stopped on request: save the state. Aborted mid-batch: its hosts stay ``running``
        (in doubt): a resume probes them first, as after a kill."""
        r = self.rollout
        in_doubt = [h for h, s in r.hosts.items() if s == HOST_RUNNING]
        r.status = "interrupted"
        r.stopped = {
            "after_batch": sum(1 for b in r.batches if b.get("finished")),
            "reason": self.abort_reason if aborted else "stopped after the batch (Ctrl-C)",
            "pending": r.pending(),
            "in_doubt": in_doubt,
        }
        if aborted and self.abort_signal is not None:
            r.stopped["signal"] = self.abort_signal
        r.save()
        self.observer.interrupted(r)

    def _stop(self, after_batch: int, reason: str | None = None) -> None:
        r = self.rollout
        r.status = "stopped"
        r.stopped = {
            "after_batch": after_batch,
            "reason": reason
            or f"{r.failures()} failed host(s), more than the {r.max_failures} tolerated (--max-failures)",
            "pending": r.pending(),
        }
        if self.stop_kind is not None:  # a person asked for it: an auto pass ends with it too
            r.stopped["kind"] = self.stop_kind
        r.save()
        self.observer.stopped(r, breaker=reason is None)
