"""Every finding the detector tests make (from their captured inputs) holds only the ``data`` keys
``fleetops.schemas.FINDING_DATA_KEYS`` declares for its check: the declaration ``fleetops policy check``
refuses a rule's keys against stays true to what the detectors set."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
from ansible_collections.fleetops.node.plugins.module_utils import findings

from fleetops.schemas import FINDING_DATA_KEYS

_MAKE_FINDING = findings.make_finding


def _declared_finding(check: str, severity: str, summary: str, data: Any = None) -> dict[str, Any]:
    finding: dict[str, Any] = _MAKE_FINDING(check, severity, summary, data)
    assert check in FINDING_DATA_KEYS, f"a finding of a check fleetops does not declare: {check}"
    undeclared = sorted(set(finding["data"]) - FINDING_DATA_KEYS[check])
    assert not undeclared, (
        f"{check} finding data keys not in fleetops.schemas FINDING_DATA_KEYS: {undeclared}"
    )
    return finding


@pytest.fixture(autouse=True)
def _findings_use_declared_keys(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    prefix = "ansible_collections.fleetops.node.plugins."
    for name, module in list(sys.modules.items()):
        if name.startswith(prefix) and getattr(module, "make_finding", None) is _MAKE_FINDING:
            monkeypatch.setattr(module, "make_finding", _declared_finding)
    yield
