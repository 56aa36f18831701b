"""Scans and rollouts as the operator sees them, rendered with rich on stderr.

On a terminal a transient progress bar (hosts done / total, their rate and the time left; for a
rollout batches done and hosts in flight too) that disappears when the run ends; otherwise (CI, AWX,
a pipe) plain ``progress:`` lines: a rollout's at each batch start and end, a large scan's every
PLAIN_EVERY_S seconds. Everything goes to the console given (stderr), so ``--format json`` and
``ndjson`` on stdout stay clean.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from itertools import islice
from typing import IO, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from fleetops.ansible.facts import answered_statuses
from fleetops.cli.args import PLAIN_EVERY_S, SUMMARY_ABOVE
from fleetops.errors import FleetopsError
from fleetops.rollout.engine import RolloutObserver
from fleetops.rollout.outcome import HostOutcome
from fleetops.rollout.state import HOST_DONE, HOST_FAILED, HOST_SKIPPED, Rollout

STYLES = {"": "", "dim": "dim", "note": "cyan", "warning": "yellow", "error": "bold red"}
# A rollout's bar is refreshed about this many times over its hosts (and at each batch start and end):
# each refresh counts every host's state, so once a host would make a rollout quadratic.
REFRESHES = 100


def duration_text(seconds: float) -> str:
    """``45s``, ``2m05s``, ``1h02m``, ``20d23h``: a rate's time left, a run's time taken, a plan's length."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def rate_eta(done: int, total: int, elapsed: float) -> str:
    """``52.1 hosts/s, ETA 2m05s`` from hosts done of ``total`` in ``elapsed`` seconds (the mean rate
    so far); ``ETA ?`` until a host is done."""
    if done <= 0 or elapsed <= 0:
        return "ETA ?"
    rate = done / elapsed
    left = max(0, total - done)
    per = f"{rate:,.1f} hosts/s" if rate >= 0.1 else f"{60 * rate:,.1f} hosts/min"
    return f"{per}, ETA {duration_text(left / rate)}"


def _bar(console: Console, redirect: bool = True) -> Progress:
    """The transient bar both a scan and a rollout show on a terminal. A scan's (``redirect`` False)
    leaves stdout alone: ``--format ndjson`` lines go to stdout, whatever stderr is."""
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("hosts"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        redirect_stdout=redirect,
        redirect_stderr=redirect,
    )


class ScanProgress:
    """A scan's progress on stderr: ``start(hosts)`` once the targets are listed, ``host(name, entry)``
    as each answers, ``finish()`` at the end.

    Up to SUMMARY_ABOVE targets every host gets a line as it answers (as before); past it only the
    hosts without a result (unreachable, failed) do, and the counts are in the bar (a terminal) or
    in a ``progress:`` line every PLAIN_EVERY_S seconds (not a terminal), each with the rate and ETA.
    ``live``: the bar (default: when the console is a terminal); ``clock``: monotonic seconds."""

    def __init__(
        self,
        console: Console,
        line: Callable[[str, dict[str, Any]], str],
        live: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console, self.line, self.clock = console, line, clock
        self.live = console.is_terminal if live is None else live
        self.total = 0
        self.done = 0
        self.seen: set[str] = set()
        self.status: dict[str, int] = {}
        self.findings = 0
        self.started = clock()
        self.last_line = self.started
        self._bar: Progress | None = None
        self._task: Any = None

    def start(self, total: int) -> None:
        self.total, self.started = total, self.clock()
        self.last_line = self.started
        if self.live and total:
            self._bar = _bar(self.console, redirect=False)
            self._bar.start()
            self._task = self._bar.add_task(self.describe(), total=total)

    def counts(self) -> str:
        """``ok 120, unreachable 3; 14 with findings``."""
        parts = ", ".join(f"{k} {n:,}" for k, n in sorted(self.status.items(), key=lambda kv: kv[0] != "ok"))
        return f"{parts or 'ok 0'}; {self.findings:,} with findings"

    def describe(self) -> str:
        return f"scan · {rate_eta(self.done, self.total, self.clock() - self.started)} · {self.counts()}"

    def host(self, host: str, entry: dict[str, Any]) -> None:
        if host in self.seen:  # a second result for a host (a later task failed): counted once
            return
        self.seen.add(host)
        self.done += 1
        self.status[entry["status"]] = self.status.get(entry["status"], 0) + 1
        self.findings += bool(entry.get("findings"))
        if self.total <= SUMMARY_ABOVE or entry["status"] not in answered_statuses():
            self.console.print(self.line(host, entry), soft_wrap=True)
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, description=self.describe())
        elif self.total > SUMMARY_ABOVE and self.clock() - self.last_line >= PLAIN_EVERY_S:
            self.plain_line()

    def plain_line(self) -> None:
        self.last_line = self.clock()
        pct = f" ({100 * self.done // self.total}%)" if self.total else ""
        self.console.print(
            f"progress: {self.done:,}/{self.total:,} hosts{pct}, "
            f"{rate_eta(self.done, self.total, self.last_line - self.started)}; {self.counts()}",
            highlight=False,
            soft_wrap=True,  # one line whatever the width (CI, AWX, logs)
        )

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        if self.total and (self.total > SUMMARY_ABOVE or self.live):  # started: the targets were listed
            took = self.clock() - self.started
            rate = f" ({self.done / took:,.1f} hosts/s)" if took > 0 and self.done else ""
            self.console.print(
                f"scanned {self.done:,}/{self.total:,} hosts in {duration_text(took)}{rate}; {self.counts()}",
                highlight=False,
                soft_wrap=True,
            )


class NdjsonOutput:
    """``scan --format ndjson``: one ``fleetops.scan.host/v1`` object a line on ``stream``, written
    and flushed as each host answers (a run killed half way leaves whole lines for every host that
    answered); ``finish(report)`` adds the hosts that never answered (not_scanned), once each.

    A closed stream (a reader that went away: ``| head``) is remembered (``closed``) and ``on_closed``
    is called once (the scan stops: nobody reads it); ``check()`` then raises the one-line error."""

    def __init__(self, stream: IO[str], on_closed: Callable[[], None] = lambda: None) -> None:
        self.stream, self.on_closed = stream, on_closed
        self.written: set[str] = set()
        self.closed = False

    def host(self, host: str, entry: Mapping[str, Any]) -> None:
        from fleetops.scan import host_record

        if host in self.written or self.closed:
            return
        try:
            self.stream.write(json.dumps(host_record(host, entry), separators=(",", ":")) + "\n")
            self.stream.flush()
        except (BrokenPipeError, ValueError):  # ValueError: the stream was closed under us
            self.closed = True
            self._drop()
            self.on_closed()
            return
        self.written.add(host)

    def _drop(self) -> None:
        """Point the stream's descriptor at /dev/null: what is left in its buffer, flushed at exit,
        would raise the same broken pipe again (Python's documented way out)."""
        try:
            fd = self.stream.fileno()
        except (OSError, ValueError):
            return
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fd)
        finally:
            os.close(devnull)

    def finish(self, report: Mapping[str, Any]) -> None:
        for host, entry in report["hosts"].items():
            self.host(host, entry)
        self.check()

    def check(self) -> None:
        if self.closed:
            raise FleetopsError(
                f"stdout closed before the scan ended (broken pipe): stopped after {len(self.written):,} host line(s)"
            )


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
            self._bar = _bar(self.console)
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
