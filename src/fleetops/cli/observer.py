"""Rollouts as the operator sees them (``ConsoleObserver``), rendered with rich on stderr: a transient
progress bar on a terminal (batches done, hosts in flight, the rate and the time left), plain ``progress:``
lines at each batch start and end otherwise. Apart from the scan's progress (``fleetops.cli.progress``),
which a scan imports without the rollout's modules."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from itertools import islice
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress

from fleetops.cli.args import SUMMARY_ABOVE
from fleetops.cli.progress import STYLES, progress_bar, rate_eta
from fleetops.rollout.engine import RolloutObserver
from fleetops.rollout.outcome import HostOutcome
from fleetops.rollout.state import HOST_DONE, HOST_FAILED, HOST_SKIPPED, Rollout

# A rollout's bar is refreshed about this many times over its hosts (and at each batch start and end):
# each refresh counts every host's state, so once a host would make a rollout quadratic.
REFRESHES = 100


class ConsoleObserver(RolloutObserver):
    """Renders the engine's events; ``live``: the transient bar (default: when the console is a terminal)."""

    def __init__(
        self, console: Console, live: bool | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.console, self.clock = console, clock
        self.live = console.is_terminal if live is None else live
        self.started = clock()
        self.finished_before = 0  # hosts a resumed rollout had finished: not part of this run's rate
        self.rollout: Rollout | None = None
        self.total = 0
        self.in_flight: dict[str, None] = {}  # in batch order; a dict: a host leaves it in O(1)
        self.batches_done = 0
        self.refresh_every = 1
        self.since_refresh = 0
        self.batch = 0
        self._bar: Progress | None = None
        self._task: Any = None

    # ------------------------------------------------------------------ lines

    def message(self, text: str, style: str = "") -> None:
        markup = STYLES.get(style, style)
        self.console.print(f"[{markup}]{escape(text)}[/]" if markup else escape(text))

    def host_recorded(self, host: str, outcome: HostOutcome) -> None:
        apply = self.rollout.apply if self.rollout is not None else False
        style = "green" if outcome.ok else "bold red"
        if outcome.status != "ok":
            what = outcome.status
        elif outcome.gate:
            what = "failed its gate"
        elif outcome.changed:
            what = "changed" if apply else "would change"
        else:
            what = "ok (no change)"
        detail = outcome.gate or outcome.msg or ", ".join((outcome.result or {}).get("actions") or [])
        # host names and module messages are data (an EC2 Name tag, a kubectl error with [...]): never markup
        tail = f" {escape(str(detail))}" if detail else ""  # no trailing blank when there is nothing to add
        self.console.print(f"  [{style}]{escape(host)}: {what}[/]{tail}")
        self.host_finished(host)

    def interrupted(self, rollout: Rollout) -> None:
        stopped = rollout.stopped or {}
        in_doubt, pending = stopped.get("in_doubt") or [], stopped.get("pending") or []
        doubt = f"; {len(in_doubt)} in doubt (probed on resume): {' '.join(in_doubt)}" if in_doubt else ""
        self.console.print(
            f"[bold yellow]interrupted[/] after {stopped.get('after_batch', 0)} batch(es)"
            f"{', state saved' if rollout.keep else ''}: "
            f"{len(pending)} host(s) pending{doubt}{_resume_hint(rollout, chr(10) + '  ')}"
        )

    def stopped(self, rollout: Rollout, breaker: bool) -> None:
        stopped = rollout.stopped or {}
        self.console.print(
            f"[bold red]{'circuit breaker' if breaker else 'stopped'}: {escape(str(stopped.get('reason')))}; "
            f"{len(stopped.get('pending') or [])} host(s) untouched[/]" + _resume_hint(rollout, " (", ")")
        )

    # ------------------------------------------------------------------ progress

    def _counts(self) -> tuple[int, int, int]:
        """Hosts finished (done, failed or skipped), failed, and all: one C-speed count of the states
        (``Rollout.summary`` also reads every result), taken per batch and per refresh, never per host."""
        if self.rollout is None:
            return 0, 0, 0
        states = Counter(self.rollout.hosts.values())
        finished = states[HOST_DONE] + states[HOST_FAILED] + states[HOST_SKIPPED]
        return finished, states[HOST_FAILED], len(self.rollout.hosts)

    def _batches_done(self) -> int:
        return self.batches_done

    def describe(self) -> str:
        """The live line's text: batches done / total, hosts in flight, failures."""
        _, failed, _ = self._counts()
        flight = " ".join(islice(self.in_flight, 6)) + (" ..." if len(self.in_flight) > 6 else "")
        return (
            f"batches {self._batches_done()}/{self.total} · in flight {len(self.in_flight)}"
            + (f" ({flight})" if flight else "")
            + f" · failed {failed} · {self.rate()}"
        )

    def rate(self) -> str:
        """This run's hosts per second and the time left at that rate (cooldowns included)."""
        finished, _, hosts = self._counts()
        return rate_eta(
            finished - self.finished_before, hosts - self.finished_before, self.clock() - self.started
        )

    def rollout_started(self, rollout: Rollout) -> None:
        self.rollout = rollout
        self.total = len(rollout.plan["batches"])
        self.started, self.finished_before = self.clock(), self._counts()[0]
        self.batches_done = sum(1 for b in rollout.batches if b.get("finished"))
        self.refresh_every = max(1, len(rollout.hosts) // REFRESHES)
        if self.live:
            self._bar = progress_bar(self.console)
            self._bar.start()
            finished, _, hosts = self._counts()
            self._task = self._bar.add_task(self.describe(), total=hosts, completed=finished)

    def rollout_finished(self, rollout: Rollout) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def _update(self) -> None:
        self.since_refresh = 0
        if self._bar is not None:
            finished, _, hosts = self._counts()
            self._bar.update(self._task, description=self.describe(), completed=finished, total=hosts)

    def batch_started(self, index: int, total: int, hosts: Sequence[str]) -> None:
        mode = "apply" if self.rollout is not None and self.rollout.apply else "dry run"
        named = " ".join(hosts[:SUMMARY_ABOVE]) + (
            f" ... and {len(hosts) - SUMMARY_ABOVE:,} more" if len(hosts) > SUMMARY_ABOVE else ""
        )
        self.console.print(
            f"[bold]batch {index}/{total}[/] ({mode}, {len(hosts):,} host(s)): {escape(named)}"
        )
        self.batch, self.in_flight = index, dict.fromkeys(hosts)
        if self._bar is None:
            finished, failed, all_hosts = self._counts()
            self.console.print(
                f"progress: batch {index}/{self.total} started: {len(hosts)} host(s) in flight; "
                f"hosts finished {finished}/{all_hosts}, failed {failed}; {self.rate()}"
            )
        self._update()

    def host_finished(self, host: str) -> None:
        """O(1) a host: the bar is refreshed (an O(hosts) count) every ``refresh_every`` hosts."""
        if host in self.in_flight:
            del self.in_flight[host]
            self.since_refresh += 1
            if self.since_refresh >= self.refresh_every:
                self._update()

    def batch_finished(self, index: int, total: int) -> None:
        self.in_flight = {}
        self.batches_done += 1
        if self._bar is None:
            finished, failed, all_hosts = self._counts()
            self.console.print(
                f"progress: batch {index}/{self.total} finished: batches done {self._batches_done()}/{self.total}, "
                f"hosts finished {finished}/{all_hosts}, failed {failed}; {self.rate()}"
            )
        self._update()


class QuietObserver(ConsoleObserver):
    """``-q``: no progress (no bar, no batch or progress lines, no line per host that went well); warnings,
    errors, a failed host, an interrupted or stopped rollout are still said."""

    def __init__(
        self, console: Console, live: bool | None = None, clock: Callable[[], float] = time.monotonic
    ):
        super().__init__(console, live=False, clock=clock)

    def message(self, text: str, style: str = "") -> None:
        if style in ("warning", "error"):
            super().message(text, style)

    def host_recorded(self, host: str, outcome: HostOutcome) -> None:
        if not outcome.ok or outcome.gate:
            super().host_recorded(host, outcome)

    def batch_started(self, index: int, total: int, hosts: Sequence[str]) -> None:
        self.batch, self.in_flight = index, dict.fromkeys(hosts)

    def batch_finished(self, index: int, total: int) -> None:
        self.in_flight = {}
        self.batches_done += 1


def _resume_hint(rollout: Rollout, before: str, after: str = "") -> str:
    """How to resume ``rollout`` (its state file); a dry run saves none: nothing to resume, run it again."""
    if not rollout.keep:
        return f"{before}a dry run saves no state: run it again{after}"
    return f"{before}resume with: fleetops remediate --resume {rollout.state_path}{after}"
