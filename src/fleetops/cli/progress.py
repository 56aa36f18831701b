"""The rollout as the operator sees it: the engine's observer, rendered with rich on stderr.

On a terminal a transient progress line (batches done / total, hosts in flight, failures) that
disappears when the rollout ends; otherwise (CI, AWX, a pipe) one plain ``progress:`` line per batch
start and end. Everything goes to the console given (stderr), so ``--format json`` stays clean.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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

from fleetops.rollout.engine import RolloutObserver
from fleetops.rollout.outcome import HostOutcome
from fleetops.rollout.state import Rollout

STYLES = {"": "", "dim": "dim", "note": "cyan", "warning": "yellow", "error": "bold red"}


class ConsoleObserver(RolloutObserver):
    """Renders the engine's events; ``live``: the transient bar (default: when the console is a terminal)."""

    def __init__(self, console: Console, live: bool | None = None) -> None:
        self.console = console
        self.live = console.is_terminal if live is None else live
        self.rollout: Rollout | None = None
        self.total = 0
        self.in_flight: list[str] = []
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
        self.console.print(f"  [{style}]{escape(host)}: {what}[/] {escape(str(detail))}")
        self.host_finished(host)

    def interrupted(self, rollout: Rollout) -> None:
        stopped = rollout.stopped or {}
        in_doubt, pending = stopped.get("in_doubt") or [], stopped.get("pending") or []
        doubt = f"; {len(in_doubt)} in doubt (probed on resume): {' '.join(in_doubt)}" if in_doubt else ""
        self.console.print(
            f"[bold yellow]interrupted[/] after {stopped.get('after_batch', 0)} batch(es), state saved: "
            f"{len(pending)} host(s) pending{doubt}\n  resume with: fleetops remediate --resume {rollout.state_path}"
        )

    def stopped(self, rollout: Rollout, breaker: bool) -> None:
        stopped = rollout.stopped or {}
        self.console.print(
            f"[bold red]{'circuit breaker' if breaker else 'stopped'}: {escape(str(stopped.get('reason')))}; "
            f"{len(stopped.get('pending') or [])} host(s) untouched[/] "
            f"(resume with: fleetops remediate --resume {rollout.state_path})"
        )

    # ------------------------------------------------------------------ progress

    def _counts(self) -> tuple[int, int, int]:
        if self.rollout is None:
            return 0, 0, 0
        s = self.rollout.summary()
        return s["done"] + s["failed"] + s["skipped"], s["failed"], s["hosts"]

    def _batches_done(self) -> int:
        return 0 if self.rollout is None else sum(1 for b in self.rollout.batches if b.get("finished"))

    def describe(self) -> str:
        """The live line's text: batches done / total, hosts in flight, failures."""
        _, failed, _ = self._counts()
        flight = " ".join(self.in_flight[:6]) + (" ..." if len(self.in_flight) > 6 else "")
        return (
            f"batches {self._batches_done()}/{self.total} · in flight {len(self.in_flight)}"
            + (f" ({flight})" if flight else "")
            + f" · failed {failed}"
        )

    def rollout_started(self, rollout: Rollout) -> None:
        self.rollout = rollout
        self.total = len(rollout.plan["batches"])
        if self.live:
            self._bar = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("hosts"),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
            self._bar.start()
            finished, _, hosts = self._counts()
            self._task = self._bar.add_task(self.describe(), total=hosts, completed=finished)

    def rollout_finished(self, rollout: Rollout) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def _update(self) -> None:
        if self._bar is not None:
            finished, _, hosts = self._counts()
            self._bar.update(self._task, description=self.describe(), completed=finished, total=hosts)

    def batch_started(self, index: int, total: int, hosts: Sequence[str]) -> None:
        mode = "apply" if self.rollout is not None and self.rollout.apply else "dry run"
        self.console.print(f"[bold]batch {index}/{total}[/] ({mode}): {' '.join(hosts)}")
        self.batch, self.in_flight = index, list(hosts)
        if self._bar is None:
            finished, failed, all_hosts = self._counts()
            self.console.print(
                f"progress: batch {index}/{self.total} started: {len(hosts)} host(s) in flight; "
                f"hosts finished {finished}/{all_hosts}, failed {failed}"
            )
        self._update()

    def host_finished(self, host: str) -> None:
        if host in self.in_flight:
            self.in_flight.remove(host)
            self._update()

    def batch_finished(self, index: int, total: int) -> None:
        self.in_flight = []
        if self._bar is None:
            finished, failed, all_hosts = self._counts()
            self.console.print(
                f"progress: batch {index}/{self.total} finished: batches done {self._batches_done()}/{self.total}, "
                f"hosts finished {finished}/{all_hosts}, failed {failed}"
            )
        self._update()
