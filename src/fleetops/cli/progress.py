"""Scans as the operator sees them, rendered with rich on stderr (rollouts: ``fleetops.cli.observer``).

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
from collections.abc import Callable, Mapping
from typing import IO, Any

from rich.console import Console
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

STYLES = {"": "", "dim": "dim", "note": "cyan", "warning": "yellow", "error": "bold red"}


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


def progress_bar(console: Console, redirect: bool = True) -> Progress:
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
            self._bar = progress_bar(self.console, redirect=False)
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
