"""The requests and results of the verbs that only read the fleet: ``scan``, ``merge`` and ``drift``
(``fleetops.api.scanning``), apart from the rollouts' (``fleetops.api.requests``), so that a scan imports
none of the rollout's modules (the planner, the engine, the lease, the remediations: ~45 ms of its start)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetops.exitcodes import ExitCode
from fleetops.paths import state_home
from fleetops.scan import FAIL_ON_DEFAULT, ScanOptions

# ------------------------------------------------------------------------------------------ scan


@dataclass
class ScanRequest(ScanOptions):
    """What to scan and how (``ScanOptions``: thresholds left None are the detector's defaults,
    memcg.DEFAULT_THRESHOLDS; an empty ``inventory`` is this checkout's localhost inventory), and
    where the results also go."""

    unit_allowlist: Path | None = None  # a file of unit-name patterns (fleetops_unit_allowlist)
    output: Path | None = None  # also write the JSON report here (FILE.partial meanwhile)
    prometheus: Path | None = None  # also write node_exporter textfile metrics here
    fail_on: str = FAIL_ON_DEFAULT  # the least severe finding that exits 1 (scan.FAIL_ON; "never": none)
    # ``policy`` (None: the one fleetops ships) and ``state_dir`` (None: <state home>/auto, as remediate auto's)
    # serve both: each finding's ``next`` (fleetops.next_steps: the policy's rungs at the state directory's
    # ladders, read only) and the fleet record (fleetops.auto.seen: what the scan saw, for the limited
    # passes' brake and floors; written to the inventory's shared store, else to ``state_dir``, naming the
    # policy's rules). A scan of this machine alone (no inventory) records nothing.
    fleet_record: bool = True
    policy: Path | None = None
    state_dir: Path | None = None


@dataclass(frozen=True)
class ScanResult:
    report: dict[str, Any]  # fleetops.scan/v1
    exit_code: ExitCode
    recorded: str = ""  # where the fleet record was written ('' when it was not)
    record_warnings: tuple[str, ...] = ()  # why (some of) it was not

    @property
    def interrupted(self) -> bool:
        return bool(self.report.get("interrupted"))

    def json(self) -> str:
        return json.dumps(self.report, indent=2, sort_keys=False)


@dataclass
class MergeRequest:
    """``fleetops merge``: shard reports (``scan --shard I/N -o FILE``, or a killed shard's
    ``FILE.partial``) to join into the report of one scan of them all."""

    reports: Sequence[Path]
    output: Path | None = None  # also write the merged JSON report here (atomically)


@dataclass(frozen=True)
class MergeResult:
    report: dict[str, Any]  # fleetops.scan/v1, with "merged": its sources and notes
    exit_code: ExitCode  # the exit code the one scan would have had (scan.exit_code)
    notes: list[str]  # what the operator should know: partial shards, hosts not scanned

    def json(self) -> str:
        return json.dumps(self.report, indent=2, sort_keys=False)


def auto_state_dir(given: Path | None) -> Path:
    """Where the auto passes keep ladder.json, ledger.json and brakes.json: ``given``, else <state home>/auto."""
    return given if given is not None else state_home() / "auto"


# ------------------------------------------------------------------------------------------ drift


@dataclass
class DriftRequest:
    inventory: Sequence[Path] = ()  # with from_report: only for the AZ / AMI / instance type hostvars
    limit: str | None = None
    group_by: Sequence[str] | None = None  # dimensions; None: all (fleetops.drift.DIMENSIONS)
    from_report: Path | None = None  # a saved fleetops.scan/v1 report instead of scanning
    output: Path | None = None  # also write the JSON drift report here
    host_timeout: int = 120


@dataclass(frozen=True)
class DriftResult:
    document: dict[str, Any]  # fleetops.drift/v1
    exit_code: ExitCode

    def json(self) -> str:
        return json.dumps(self.document, indent=2)
