"""Shared pytest set-up. `tests.*` and `ansible_collections.fleetops.node.*` are importable through
pytest's `pythonpath` setting (pyproject.toml): the repository root and `collections/`."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="session")
def _state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A test never writes the state home of the person running it: ``fleetops scan -i`` records the fleet
    record there by default (fleetops.auto.seen). A test (or a conftest) that sets its own keeps it."""
    if os.environ.get("FLEETOPS_STATE_DIR"):
        yield
        return
    os.environ["FLEETOPS_STATE_DIR"] = str(tmp_path_factory.mktemp("state-home"))
    try:
        yield
    finally:
        os.environ.pop("FLEETOPS_STATE_DIR", None)
