"""The JSON documents fleetops reads back, validated before use: a bad file is one line and exit 2.

fleetops writes these documents, which it, a tool or an operator later reads back:

=====================  ==========================================  ===================================
document               written by                                  read back by
=====================  ==========================================  ===================================
rollout state          ``Rollout.save`` (rollout/state.py)         ``remediate --resume``, ``report``
scan report            ``fleetops scan -o`` (scan.build_report),   ``drift --from``, ``merge``
                       ``fleetops merge -o`` (merge.merge)
scan partial, line 1   ``scan -o``'s ``FILE.partial`` header        ``merge`` (validate_partial_header)
scan host line         ``scan --format ndjson``, one a host as it   tools (``jq``), a killed run's
                       answers (scan.host_line)                    output kept (validate_scan_host)
drift report           ``fleetops drift -o`` (drift.build_drift)   tools, AWX, a later ``drift --from``
plan                   ``fleetops plan --format json``             tools; embedded in every state
=====================  ==========================================  ===================================

Each has a pydantic model here and a JSON Schema generated from it in ``schemas/`` at the root of
the repository (``python -m fleetops.schemas --write`` regenerates them; a test checks they are
current). The models are strict where the code relies on a field — required keys, their types (no
``"1"`` for 1, no ``true`` for 1), enumerations, finite numbers, times a clock can show — and open
(``additionalProperties``) everywhere else, so the formats can grow without breaking older readers.

Entry points, each raising :class:`DocumentError` (a :class:`~fleetops.errors.UsageError`: exit 2)
whose message is one line, ``"<file>: <field.path>: <problem>"``:

- ``load_state(path, actions=None)``, ``load_scan_report(path)``, ``load_drift_report(path)``,
  ``load_plan(path)``: read, parse and validate a file; return the parsed ``dict`` unchanged.
- ``validate_state(data, source, actions=None)`` and the other ``validate_*``: the same for a value
  already parsed (``source`` names it in the message).

The models live by concern in ``schemas/models.py`` (the base, the plan, the rollout state) and
``schemas/reports.py`` (the scan and drift reports); this module reads and validates.

Validation only: the returned value is exactly what the file holds (extra keys included), so the
code that used ``json.loads`` before keeps working on the same data.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fleetops.auto_schema import AutoPass
from fleetops.documents import DocumentError, bad_numbers, field_path, got, raise_validation, read_json
from fleetops.schemas.models import (
    MAX_EPOCH,
    STATE_SCHEMA,
    PlanDocument,
    RolloutsDocument,
    RolloutState,
    Severity,
    _Open,
)
from fleetops.schemas.reports import (
    FINDING_DATA_KEYS,
    DriftReport,
    ScanHostLine,
    ScanPartialHeader,
    ScanReport,
)

__all__ = [
    "FINDING_DATA_KEYS",
    "MAX_EPOCH",
    "MODELS",
    "STATE_SCHEMA",
    "DocumentError",
    "DriftReport",
    "PlanDocument",
    "RolloutState",
    "RolloutsDocument",
    "ScanHostLine",
    "ScanPartialHeader",
    "ScanReport",
    "Severity",
    "json_schema",
    "json_schema_text",
    "load_drift_report",
    "load_plan",
    "load_scan_report",
    "load_state",
    "main",
    "validate_drift_report",
    "validate_partial_header",
    "validate_plan",
    "validate_scan_host",
    "validate_scan_report",
    "validate_state",
]

# ------------------------------------------------------------------------- reading a document


MODELS: dict[str, type[_Open]] = {
    "rollout-state": RolloutState,
    "scan-report": ScanReport,
    "scan-host": ScanHostLine,
    "drift-report": DriftReport,
    "plan": PlanDocument,
    "rollouts": RolloutsDocument,
    "auto-pass": AutoPass,
}


def _validate(
    model: type[_Open], data: Any, source: str, check: Callable[[dict[str, Any], str], None] | None = None
) -> dict[str, Any]:
    for loc, bad in bad_numbers(data):
        raise DocumentError(source, f"{bad.text}: {bad.why}", field_path(loc))
    if not isinstance(data, dict):
        raise DocumentError(source, f"not a {model.model_config.get('title')} document: a JSON object "
                                    f"was expected, got {got(data)}")  # fmt: skip
    try:
        model.model_validate(data)
    except ValidationError as exc:
        raise_validation(exc, source)
    except RecursionError:
        raise DocumentError(source, "nested too deeply") from None
    if check is not None:
        check(data, source)
    return data


# ------------------------------------------------------------------------- public entry points


def _known_action(actions: Collection[str] | None) -> Callable[[dict[str, Any], str], None] | None:
    if actions is None:
        return None

    def check(data: dict[str, Any], source: str) -> None:
        if data["action"] not in actions:
            known = ", ".join(sorted(actions))
            raise DocumentError(source, f"unknown remediation {data['action']!r} (known: {known})", "action")

    return check


def validate_state(data: Any, source: str, actions: Collection[str] | None = None) -> dict[str, Any]:
    """``data`` if it is a rollout state (``fleetops.rollout.engine-state/v1``), else DocumentError.

    ``actions``: the remediations this fleetops knows (``REMEDIATIONS``); an ``action`` outside
    them is refused too (``--resume`` would not know what to run).
    """
    return _validate(RolloutState, data, source, _known_action(actions))


def validate_scan_report(data: Any, source: str) -> dict[str, Any]:
    """``data`` if it is a ``fleetops.scan/v1`` report, else DocumentError."""
    return _validate(ScanReport, data, source)


def validate_scan_host(data: Any, source: str) -> dict[str, Any]:
    """``data`` if it is one ``fleetops.scan.host/v1`` line of ``scan --format ndjson``, else DocumentError."""
    return _validate(ScanHostLine, data, source)


def validate_partial_header(data: Any, source: str) -> dict[str, Any]:
    """``data`` if it is the first line of a scan's ``.partial`` file, else DocumentError."""
    return _validate(ScanPartialHeader, data, source)


def validate_drift_report(data: Any, source: str) -> dict[str, Any]:
    """``data`` if it is a ``fleetops.drift/v1`` report, else DocumentError."""
    return _validate(DriftReport, data, source)


def validate_plan(data: Any, source: str) -> dict[str, Any]:
    """``data`` if it is a ``fleetops.plan/v1`` document, else DocumentError."""
    return _validate(PlanDocument, data, source)


def load_state(path: Path | str, actions: Collection[str] | None = None) -> dict[str, Any]:
    """The rollout state file at ``path``, validated (see ``validate_state``)."""
    return validate_state(read_json(path), str(path), actions)


def load_scan_report(path: Path | str) -> dict[str, Any]:
    """The ``fleetops.scan/v1`` report at ``path``, validated."""
    return validate_scan_report(read_json(path), str(path))


def load_drift_report(path: Path | str) -> dict[str, Any]:
    """The ``fleetops.drift/v1`` report at ``path``, validated."""
    return validate_drift_report(read_json(path), str(path))


def load_plan(path: Path | str) -> dict[str, Any]:
    """The ``fleetops.plan/v1`` document at ``path``, validated."""
    return validate_plan(read_json(path), str(path))


# ------------------------------------------------------------------------------- JSON Schemas


SCHEMA_DIR_NAME = "schemas"


def json_schema(name: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of document ``name`` (a key of MODELS), from its model."""
    model = MODELS[name]
    body = model.model_json_schema(by_alias=True, mode="validation")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://example.invalid/fleetops/schemas/{name}.schema.json",
        **body,
    }


def json_schema_text(name: str) -> str:
    """``json_schema(name)`` as the committed file holds it."""
    return json.dumps(json_schema(name), indent=2, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m fleetops.schemas --write DIR``: (re)write DIR/<name>.schema.json for every document."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "--write":
        sys.stderr.write("usage: python -m fleetops.schemas --write DIR\n")
        return 2
    out = Path(args[1])
    out.mkdir(parents=True, exist_ok=True)
    for name in MODELS:
        (out / f"{name}.schema.json").write_text(json_schema_text(name), encoding="utf-8")
    return 0
