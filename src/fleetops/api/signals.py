"""The API's signal handling: Ctrl-C, SIGTERM and SIGHUP during a rollout (``ctrl_c``) and during a
``remediate auto`` pass (``PassSignals``). Handlers are installed only in the main thread and given back
after (``signal_handlers``)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from fleetops.errors import Signalled
from fleetops.rollout.engine import Engine, RolloutObserver

STOP_MESSAGE = "stopping after the current batch; Ctrl-C again to abort now"


@contextlib.contextmanager
def ctrl_c(engine: Engine, observer: RolloutObserver) -> Iterator[None]:
    """First Ctrl-C: finish the running batch, then stop (state saved). Second: abort the batch now.

    SIGTERM and SIGHUP abort at once, as a second Ctrl-C does (exit 143 / 129): the batch's ansible
    run is cancelled, its hosts stay ``running`` for a resume to probe, the state is saved and the
    lock and lease released."""
    aborting = False

    def terminate(signum: int, frame: object) -> None:
        nonlocal aborting
        if aborting:
            return
        aborting = True
        name = signal.Signals(signum).name
        engine.abort(f"aborted mid-batch ({name})", signum)
        observer.message(f"{name}: aborting now; the state is saved for --resume", "warning")
        raise KeyboardInterrupt

    def handler(signum: int, frame: object) -> None:
        nonlocal aborting
        if aborting:
            return  # already aborting: let the state be saved
        if engine.stop_requested.is_set():
            aborting = True
            engine.abort()
            raise KeyboardInterrupt
        engine.request_stop()
        observer.message(STOP_MESSAGE, "warning")

    with signal_handlers({signal.SIGINT: handler, signal.SIGTERM: terminate, signal.SIGHUP: terminate}):
        yield


@contextlib.contextmanager
def signal_handlers(handlers: Mapping[int, Callable[[int, Any], None]]) -> Iterator[None]:
    """Install ``handlers`` (signal -> handler) for the block and give the previous ones back after; in
    a thread other than the main one (where Python refuses handlers) install nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in handlers}
    for signum, handler in handlers.items():
        signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


class PassSignals:
    """SIGTERM and SIGHUP during a ``remediate auto`` pass (``handler``): they raise ``Signalled``
    (exit 143 / 129) instead of killing the process, so a pass stopped outside a rollout (its scan,
    between two actions) still saves what it attempted. Only the first is raised; later ones are
    ignored while the state is saved. Inside ``held()`` (the commit) a signal waits until the block is
    done, then is raised: the ladder, the ledger and the tags are written together or not at all.
    Inside a rollout, ``ctrl_c``'s handlers take over (and give these back after)."""

    def __init__(self) -> None:
        self.fired = False
        self.holding = False
        self.pending: int | None = None

    def handler(self, signum: int, frame: object) -> None:
        if self.fired:
            return
        if self.holding:
            self.pending = self.pending or signum
            return
        self.fired = True
        raise Signalled(signum)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
        if self.pending is not None and not self.fired:
            self.fired = True
            raise Signalled(self.pending)

    @contextlib.contextmanager
    def installed(self) -> Iterator[PassSignals]:
        with signal_handlers({signal.SIGTERM: self.handler, signal.SIGHUP: self.handler}):
            yield self
