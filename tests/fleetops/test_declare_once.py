"""A remediation is declared once (``fleetops.remediations.catalog``); everything else derives from it
or is checked against it here: the CLI, the policy's actions and schema, the ladder order, the host-timeout
table, the playbooks' documented knobs, the AWX surveys and the docs site's option tables."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from fleetops.remediations import REMEDIATIONS, ladder_order
from fleetops.remediations.docs import options_markdown

REPO = Path(__file__).resolve().parents[2]

# One new declaration, registered before anything reads the registry, in a fresh interpreter; then
# what the CLI, the policy and an auto pass make of it. Nothing else is edited.
THROWAWAY = r"""
import contextlib, io, json
from fleetops import values
from fleetops.remediations import Param, Remediation, register

register(Remediation(
    name="throwaway-rung",
    playbook="fleetops.node.throwaway",
    actions=("fleetops.node.throwaway",),
    help="a throwaway rung, declared by a test",
    ladder=45,  # between reclaim (40) and quarantine (50)
    parameters=(
        Param("widget_timeout", "seconds the widget may take (default: {default})", default=30,
              parse=values.whole_seconds(1, 100), metavar="S", extravars=("fleetops_widget_timeout",), waits=True),
        Param("finding", "the check", metavar="CHECK", extravars=("fleetops_widget_check",), from_finding="check"),
    ),
))

from fleetops.cli.app import build_parser
from fleetops.policy import parse_policy
from fleetops.policy.schema import json_schema
from fleetops.auto import batches, check_policy_actions
from fleetops.remediations import REMEDIATIONS, ladder_order
from fleetops.errors import UsageError


def help_of(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        build_parser().parse_args(argv)
    return out.getvalue()


parsed = vars(build_parser().parse_args(["remediate", "throwaway-rung", "--widget-timeout", "7"]))
policy = parse_policy(json.dumps({"schema": "fleetops.policy/v1", "budgets": {"throwaway-rung": {"max": 1}}, "rules": [
    {"name": "r", "match": [{"check": "gpu_health"}],
     "ladder": [{"action": "throwaway-rung", "clear_after": "1h", "params": {"widget_timeout": 5}}]}]}), "p.yml")
check_policy_actions(policy, "p.yml")
try:
    REMEDIATIONS["throwaway-rung"].check_host_timeout(30, {"fleetops_widget_timeout": 30})
    timeout_error = None
except UsageError as err:
    timeout_error = str(err)
schema = json_schema()
print(json.dumps({
    "remediate_help": help_of(["remediate", "--help"]),
    "rung_help": help_of(["remediate", "throwaway-rung", "--help"]),
    "widget_timeout": parsed.get("widget_timeout"),
    "ladder_order": list(ladder_order()),
    "schema_actions": schema["$defs"]["Rung"]["properties"]["action"]["enum"],
    "schema_budgets": schema["properties"]["budgets"]["propertyNames"]["enum"],
    "extravars": REMEDIATIONS["throwaway-rung"].extravars(REMEDIATIONS["throwaway-rung"].resolve({})),
    "timeout_error": timeout_error,
}))
"""


def _throwaway() -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", THROWAWAY], capture_output=True, text=True, timeout=120, check=False, cwd=REPO
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def test_a_throwaway_declaration_reaches_the_cli_the_policy_schema_and_the_ladder_order() -> None:
    seen = _throwaway()
    assert "throwaway-rung" in seen["remediate_help"]
    assert "a throwaway rung, declared by a test" in seen["remediate_help"]
    assert "--widget-timeout S" in seen["rung_help"] and "(default: 30)" in seen["rung_help"]
    assert seen["widget_timeout"] == 7  # parsed by the declared parser
    order = seen["ladder_order"]
    assert order.index("reclaim") < order.index("throwaway-rung") < order.index("quarantine")
    assert [a for a in order if a != "throwaway-rung"] == list(ladder_order())  # the others keep theirs
    assert "throwaway-rung" in seen["schema_actions"] and "throwaway-rung" in seen["schema_budgets"]
    assert seen["extravars"] == {"fleetops_widget_timeout": 30}
    assert seen["timeout_error"] is not None and "--widget-timeout 30" in seen["timeout_error"]
    # and nothing of it leaks into this process's registry
    assert "throwaway-rung" not in REMEDIATIONS


def test_the_committed_policy_schema_lists_the_declared_actions_in_the_ladder_order() -> None:
    schema = json.loads((REPO / "schemas" / "policy.schema.json").read_text())
    assert schema["$defs"]["Rung"]["properties"]["action"]["enum"] == [*ladder_order(), "human"]


def _playbook(name: str) -> Path:
    return REPO / "playbooks" / (name.removeprefix("fleetops.node.") + ".yml")


def _documented(playbook: Path) -> set[str]:
    return set(re.findall(r"^#\s+(fleetops_[a-z_]+)\s", playbook.read_text(), re.M))


def test_every_declared_extra_var_is_a_knob_its_playbook_documents() -> None:
    for r in REMEDIATIONS.values():
        declared = {v for p in r.parameters for v in p.extravars}
        missing = declared - _documented(_playbook(r.playbook))
        assert not missing, f"{r.name}: {sorted(missing)} not documented in the header of {r.playbook}"


# what every remediation job template asks, whatever the remediation: where and how fast it runs
ROLLOUT_QUESTIONS = {"fleetops_targets", "fleetops_serial", "fleetops_not_after", "fleetops_host_timeout"}


def test_awx_remediation_surveys_ask_only_declared_parameters_typed_as_declared() -> None:
    by_playbook = {f"playbooks/{_playbook(r.playbook).name}": r for r in REMEDIATIONS.values()}
    templates = yaml.safe_load((REPO / "awx" / "job_templates.yml").read_text())["fleetops_awx_job_templates"]
    checked = 0
    for jt in templates:
        r = by_playbook.get(jt["playbook"])
        if r is None:
            continue  # the scan and the auto pass are not remediations
        params = {v: p for p in r.parameters for v in p.extravars}
        for q in jt["survey_spec"]["spec"]:
            var = q["variable"]
            if var in ROLLOUT_QUESTIONS:
                continue
            assert var in params, f"{jt['name']}: {var} is not a parameter remediate {r.name} declares"
            p = params[var]
            if p.kind == "flag":
                assert q["type"] == "multiplechoice" and q["choices"] == ["false", "true"], (jt["name"], var)
            assert bool(q.get("required")) == p.required, f"{jt['name']}: {var} required is not as declared"
            checked += 1
    assert checked >= 8  # the surveys do ask remediation parameters


def test_the_sites_option_tables_are_the_declarations() -> None:
    """The site's remediation reference is generated at each build (docs/_ext/fleetops_docs.py), and no
    checked-in page holds a copy of the tables that could go stale (as the README's once did)."""
    sys.path.insert(0, str(REPO / "docs" / "_ext"))
    import fleetops_docs

    page = fleetops_docs.remediations_markdown()
    assert options_markdown() in page
    for r in REMEDIATIONS.values():
        assert f"## `fleetops remediate {r.name}`" in page
        for p in r.parameters:
            assert f"| `{p.option}`" in page
    pages = [REPO / "README.md", *(REPO / "docs").glob("**/*.md")]
    copies = [
        p for p in pages if "reference" not in p.parts and "| option | takes | default |" in p.read_text()
    ]
    assert not copies, f"hand-kept copies of the generated option tables: {copies}"


def test_every_declared_option_is_in_its_commands_help() -> None:
    import contextlib
    import io

    from fleetops.cli.app import build_parser

    for r in REMEDIATIONS.values():
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            build_parser().parse_args(["remediate", r.name, "--help"])
        for p in r.parameters:
            assert p.option in out.getvalue(), (r.name, p.option)
