"""The JSON Schema of ``fleetops.policy/v1`` (``schemas/policy.schema.json``, from the model) and the
small CLI around it: ``python -m fleetops.policy --write DIR`` / ``--check FILE...``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from fleetops.policy.language import Policy
from fleetops.policy.lint import check_policy_file

SCHEMA_NAME = "policy"  # schemas/policy.schema.json


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of ``fleetops.policy/v1``, from the model."""
    body = Policy.model_json_schema(by_alias=True, mode="validation")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://example.invalid/fleetops/schemas/{SCHEMA_NAME}.schema.json",
        **body,
    }


def json_schema_text() -> str:
    """``json_schema()`` as ``schemas/policy.schema.json`` holds it."""
    return json.dumps(json_schema(), indent=2, sort_keys=False) + "\n"


def check_files(names: list[str]) -> int:
    """Check policy files (:func:`~fleetops.policy.lint.check_policy_file`): one line per problem on
    stderr, ``FILE: ok (N rules)`` on stdout for a good one; 0 when all are good, else 2."""
    rc = 0
    for name in names:
        policy, problems = check_policy_file(name)
        for line in problems:
            sys.stderr.write(f"{line}\n")
        if problems:
            rc = 2
        elif policy is not None:
            sys.stdout.write(f"{name}: ok ({len(policy.rules)} rules)\n")
    return rc


def main(argv: list[str] | None = None) -> int:
    """``python -m fleetops.policy --write DIR``: (re)write DIR/policy.schema.json;
    ``python -m fleetops.policy --check FILE...``: ``fleetops policy check FILE...`` (its alias)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "--write":
        out = Path(args[1])
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{SCHEMA_NAME}.schema.json").write_text(json_schema_text(), encoding="utf-8")
        return 0
    if len(args) >= 2 and args[0] == "--check":
        return check_files(args[1:])
    sys.stderr.write("usage: python -m fleetops.policy --write DIR | --check FILE...\n")
    return 2
