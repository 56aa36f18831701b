from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Integration tests need root and this kernel's cgroups; say so plainly when they cannot run."""
    reason = None
    if os.geteuid() != 0:
        reason = "integration tests need root (real memory cgroups, systemd-nspawn lab hosts)"
    elif not os.path.isdir("/sys/fs/cgroup/memory") and not os.path.exists(
        "/sys/fs/cgroup/cgroup.controllers"
    ):
        reason = "no memory cgroup hierarchy on this kernel"
    if reason is None and shutil.which("systemd-nspawn") is None:
        for item in items:
            if "lab" in item.keywords:
                item.add_marker(
                    pytest.mark.skip(reason="systemd-nspawn is not installed (apt: systemd-container)")
                )
        return
    if reason is not None:
        for item in items:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    """A rollout's state and audit log in the test's own directory, not the machine's."""
    return {
        "FLEETOPS_STATE_DIR": str(tmp_path / "state"),
        "FLEETOPS_AUDIT_LOG": str(tmp_path / "audit.jsonl"),
    }
