"""Isolation between the collection's unit tests."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@pytest.fixture(autouse=True)
def _signal_handlers_restored() -> Iterator[None]:
    """Each test leaves the process's SIGINT/SIGTERM/SIGHUP handlers as it found them.

    ansible_runner.run() called without a cancel_callback installs its own SIGINT and SIGTERM handlers
    in the calling process and never removes them; a later test of the CLI's Ctrl-C and SIGTERM
    handling (tests/fleetops/test_rollout.py) then finds a stranger's handler. Which tests share a
    process depends on the order and, under pytest-xdist, on the worker: restoring them here keeps
    every test's result independent of that."""
    saved = {s: signal.getsignal(s) for s in SIGNALS}
    yield
    for s, handler in saved.items():
        if signal.getsignal(s) is not handler and handler is not None:
            signal.signal(s, handler)
