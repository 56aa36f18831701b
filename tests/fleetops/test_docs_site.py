"""The docs site's generated reference covers everything it documents, and the README stays a front door.

The generators (docs/_ext/fleetops_docs.py) run in-process here; `make docs` builds the site from them with
Sphinx, where a warning or a broken reference fails the build.
"""

from __future__ import annotations

import json
import re
import sys

import yaml

from fleetops.cli.app import build_parser
from tests.paths import REPO

sys.path.insert(0, str(REPO / "docs" / "_ext"))
import fleetops_docs  # the site's generators

README = REPO / "README.md"


def test_the_cli_reference_has_every_command_and_subcommand() -> None:
    page = fleetops_docs.cli_markdown("t", "i", build_parser(), "fleetops")
    commands = [c for c, _ in fleetops_docs.subcommands(build_parser(), "fleetops")][1:]
    assert "fleetops remediate auto" in commands and "fleetops scan" in commands
    for command in commands:
        assert f"## `{command}`" in page
    assert page.count("```text") == len(commands) + 1  # the top level's help, then one per command


def test_the_policy_reference_has_every_field_of_the_schema() -> None:
    schema = json.loads(fleetops_docs.POLICY_SCHEMA.read_text())
    page = fleetops_docs.policy_markdown(schema)
    for part in [schema, *schema["$defs"].values()]:
        for field in part["properties"]:
            assert f"| `{field}` |" in page
    for name in schema["$defs"]:
        assert f"(policy-{name.lower()})=" in page  # the target its type links point at


def test_the_alert_reference_has_a_section_per_alert_and_every_rule() -> None:
    page = fleetops_docs.alerts_markdown()
    rules = fleetops_docs.alert_rules()
    for _, rule in rules:
        assert f"({rule['alert'].lower()})=\n## {rule['alert']}\n" in page
        assert rule["expr"].strip() in page
    assert page.count("**critical**") + page.count("**warning**") + page.count("**info**") == len(rules)


def test_the_playbook_reference_has_every_playbook_with_its_header() -> None:
    page = fleetops_docs.playbooks_markdown()
    for path in sorted((REPO / "playbooks").glob("*.yml")):
        yaml.safe_load(path.read_text())  # a playbook, not a task file
        assert f"## `fleetops.node.{path.stem}`" in page
        assert fleetops_docs.playbook_header(path), f"{path.name} has no header comment"


def test_the_readme_is_a_front_door() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings[:2] == ["How it fits", "Quick start"]
    assert "make demo" in text and "make test" in text  # CI runs the README's test command (.ci/run)
    for link in re.findall(r"\]\(([^)#]+)", text):
        assert (REPO / link).exists(), f"README links to {link}, which does not exist"
    assert "../" not in "".join(re.findall(r"\]\(([^)]+)\)", text))  # nothing outside the repository
