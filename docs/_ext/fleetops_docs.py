"""The site's generated reference pages, written into docs/reference/ (git-ignored) before Sphinx reads.

Nothing here is copied by hand; every page comes from the code's own declarations:

- ``reference/collection/``: the collection's modules and inventory plugin, by antsibull-docs from their
  DOCUMENTATION / EXAMPLES / RETURN (``antsibull-docs collection --use-current``);
- ``reference/playbooks.md``: each playbook's header comment (its knobs and how to run it);
- ``reference/cli.md`` and ``reference/lab-cli.md``: every command's ``--help``, from the argparse parsers;
- ``reference/remediations.md``: the remediations' options (fleetops.remediations.docs);
- ``reference/policy.md``: the policy's fields, from schemas/policy.schema.json (fleetops.schemas);
- ``reference/alerts.md``: one section per alert of extensions/prometheus/fleetops.rules.yml, the page
  each alert's ``runbook_url`` names (:func:`runbook_url`);
- ``reference/exit-codes.md``: fleetops.exitcodes.

``python docs/_ext/fleetops_docs.py`` writes them without Sphinx; ``make docs`` builds the site.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

DOCS = Path(__file__).resolve().parents[1]
REPO = DOCS.parent
OUT = DOCS / "reference"
RULES = REPO / "extensions" / "prometheus" / "fleetops.rules.yml"
POLICY_SCHEMA = REPO / "schemas" / "policy.schema.json"
ALERTS_PAGE = "reference/alerts.html"  # the alert reference, relative to the site's root
HELP_COLUMNS = "100"


def runbook_url(alert: str) -> str:
    """An alert's runbook: its section of the alert reference, a path relative to the site's root."""
    return f"{ALERTS_PAGE}#{alert.lower()}"


# ---- the CLI, from its parsers


def subcommands(parser: argparse.ArgumentParser, prog: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(command line, parser) of a parser and every subcommand under it, depth first, in declared order."""
    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from subcommands(child, f"{prog} {name}")


def _help(parser: argparse.ArgumentParser) -> str:
    with contextlib.ExitStack() as stack:
        old = os.environ.get("COLUMNS")
        os.environ["COLUMNS"] = HELP_COLUMNS
        stack.callback(lambda: os.environ.__setitem__("COLUMNS", old) if old else os.environ.pop("COLUMNS"))
        return parser.format_help()


def cli_markdown(title: str, intro: str, parser: argparse.ArgumentParser, prog: str) -> str:
    out = [f"# {title}", "", intro, ""]
    for command, child in subcommands(parser, prog):
        if command != prog:
            out += [f"## `{command}`", ""]
        out += ["```text", _help(child).rstrip(), "```", ""]
    return "\n".join(out)


# ---- the policy, from its JSON Schema


def _type(spec: dict[str, Any]) -> str:
    if "$ref" in spec:
        name = spec["$ref"].rsplit("/", 1)[1]
        return f"[{name}](#policy-{name.lower()})"
    if "anyOf" in spec:
        return " or ".join(_type(s) for s in spec["anyOf"])
    if "enum" in spec:
        return " \\| ".join(f"`{v}`" for v in spec["enum"])
    if "const" in spec:
        return f"`{spec['const']}`"
    kind = spec.get("type", "any")
    if kind == "array":
        return f"list of {_type(spec.get('items', {}))}"
    if kind == "object" and isinstance(spec.get("additionalProperties"), dict):
        return f"mapping to {_type(spec['additionalProperties'])}"
    bounds = [
        f"{sign} {spec[key]}"
        for key, sign in (
            ("minimum", ">="),
            ("exclusiveMinimum", ">"),
            ("maximum", "<="),
            ("exclusiveMaximum", "<"),
        )
        if key in spec
    ]
    if "pattern" in spec:
        bounds.append(f"matching `{spec['pattern']}`")
    if "minItems" in spec:
        bounds.append(f"at least {spec['minItems']}")
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|").replace("``", "`")


def _fields(schema: dict[str, Any]) -> list[str]:
    required = set(schema.get("required", ()))
    rows = ["| field | type | default | description |", "| --- | --- | --- | --- |"]
    for name, spec in schema.get("properties", {}).items():
        default = "required" if name in required else f"`{json.dumps(spec.get('default'))}`"
        rows.append(f"| `{name}` | {_type(spec)} | {default} | {_cell(spec.get('description', ''))} |")
    return rows


def policy_markdown(schema: dict[str, Any]) -> str:
    out = [
        "# Policy reference",
        "",
        f"The fields of a `{schema['title']}` file, generated from `schemas/policy.schema.json` (itself generated",
        "from the pydantic models of `src/fleetops/schemas.py` and `src/fleetops/policy*`; "
        "`python -m fleetops.schemas --write`). `python -m fleetops.policy --check FILE` validates a file against it.",
        "The guide: [The ladder left running](../guides/ladder.md).",
        "",
        "(policy-top)=",
        "## The file",
        "",
        _cell(schema.get("description", "")),
        "",
        *_fields(schema),
        "",
    ]
    for name, spec in schema.get("$defs", {}).items():
        out += [f"(policy-{name.lower()})=", f"## {name}", "", _cell(spec.get("description", "")), ""]
        out += [*_fields(spec), ""]
    return "\n".join(out)


# ---- the alerts, from the Prometheus rules


def alert_rules(path: Path = RULES) -> list[tuple[str, dict[str, Any]]]:
    """(group name, rule) of every alerting rule, in the file's order."""
    return [
        (group["name"], rule)
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]


def _rule_comments(path: Path = RULES) -> dict[tuple[str, str], str]:
    """The comment above each rule's expr (its threshold and its argued for:), by (alert, severity)."""
    comments: dict[tuple[str, str], str] = {}
    for block in path.read_text().split("- alert: ")[1:]:
        name = block.split("\n", 1)[0].strip()
        severity = re.search(r"severity: (\w+)", block)
        lines = [m.group(1) for m in re.finditer(r"^\s+# ?(.*)$", block.split("expr:", 1)[0], re.M)]
        comments[name, severity.group(1) if severity else ""] = " ".join(lines)
    return comments


def alerts_markdown() -> str:
    comments = _rule_comments()
    by_name: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for group, rule in alert_rules():
        by_name.setdefault(rule["alert"], []).append((group, rule))
    out = [
        "# Alert reference",
        "",
        "Every alert of `extensions/prometheus/fleetops.rules.yml`, generated from the file. Each alert's",
        "`runbook_url` is its section here, a path relative to this site's root "
        f"(`{ALERTS_PAGE}#<alert in lower case>`): serve the site and prefix it with the site's address in",
        "your Alertmanager templates. The guide: [Alerts and the event path](../guides/alerts.md).",
        "",
        "| alert | severities | for | group |",
        "| --- | --- | --- | --- |",
    ]
    for name, rules in by_name.items():
        severities = ", ".join(r["labels"]["severity"] for _, r in rules)
        durations = ", ".join(r["for"] for _, r in rules)
        out.append(f"| [{name}](#{name.lower()}) | {severities} | {durations} | `{rules[0][0]}` |")
    out.append("")
    for name, rules in by_name.items():
        out += [f"({name.lower()})=", f"## {name}", ""]
        for group, rule in rules:
            labels, ann = rule["labels"], rule["annotations"]
            # a templated check ({{ $labels.check }}): the series' own, one alert per check
            check = "each check's own" if "$labels.check" in labels["check"] else f"check `{labels['check']}`"
            out += [
                f"**{labels['severity']}** (group `{group}`, {check}, for `{rule['for']}`): "
                f"{_cell(ann['summary'])}",
                "",
                _cell(ann["description"]),
                "",
                "```text",
                rule["expr"].strip(),
                "```",
                "",
            ]
            if note := comments.get((name, labels["severity"])):
                out += [f"Why this threshold and `for:`: {_cell(note)}", ""]
    return "\n".join(out)


# ---- playbooks, exit codes, remediation options


def playbook_header(path: Path) -> str:
    """A playbook's header: the comment lines above its first play."""
    lines = []
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            lines.append(line[2:] if line.startswith("# ") else line[1:])
        elif line.strip() not in ("", "---"):
            break
    return "\n".join(lines).strip()


def playbooks_markdown() -> str:
    out = [
        "# Playbooks",
        "",
        "The collection's playbooks (`ansible-playbook fleetops.node.NAME`, or an AWX job template), each with",
        "its header comment: what it does and the extra vars it takes. Generated from `playbooks/*.yml`.",
        "",
    ]
    for path in sorted((REPO / "playbooks").glob("*.yml")):
        out += [f"## `fleetops.node.{path.stem}`", "", "```text", playbook_header(path), "```", ""]
    return "\n".join(out)


def exit_codes_markdown() -> str:
    """The one table of exit codes: what each says happened, which commands use it, what to do (from
    fleetops.exitcodes.MEANINGS and fleetops.cli.helptext.EXITS, which every --help is made from too)."""
    from fleetops.cli.helptext import commands_using
    from fleetops.exitcodes import MEANINGS

    out = [
        "# Exit codes",
        "",
        "Every fleetops command exits with one of these; each command's `--help` ends with the ones it uses and "
        "what each means for it ([command reference](cli.md)). Generated from `src/fleetops/exitcodes.py` and "
        "`src/fleetops/cli/helptext.py`, as the `--help` texts are. In AWX the same codes fail or pass the job; "
        "`playbooks/remediate_auto.yml` names each in its failure message.",
        "",
        "| code | name | what happened | commands | what to do |",
        "| --- | --- | --- | --- | --- |",
    ]
    for code, meaning in MEANINGS.items():
        commands = ", ".join(f"`{c}`" for c in commands_using(code))
        out.append(
            f"| {int(code)} | `{code.name}` | {_cell(meaning.happened)} | {commands} | {_cell(meaning.todo)} |"
        )
    return "\n".join(out) + "\n"


def remediations_markdown() -> str:
    from fleetops.remediations.docs import options_markdown

    return "\n".join(
        [
            "# Remediation options",
            "",
            "Each `fleetops remediate ACTION`: its playbook, its place in the policy's ladder, its options, their",
            "defaults and the extra vars they become. Generated from the declarations "
            "(`src/fleetops/remediations/declare.py`). The guide: [Fixing one thing safely](../guides/fixing.md).",
            "",
            options_markdown(),
        ]
    )


# ---- the collection, by antsibull-docs

# The Ansible docsite's targets antsibull-docs's pages refer to, and where they are on docs.ansible.com:
# written as a local intersphinx inventory, so the build needs no network and a target the pages start
# to name that is not here fails it (an undefined label is a warning, and warnings fail).
ANSIBLE_DOCS = "https://docs.ansible.com/projects/ansible/latest/"
ANSIBLE_TARGETS = {
    ("std:label", "common_return_values"): "reference_appendices/common_return_values.html",
    ("std:label", "ansible_configuration_settings"): "reference_appendices/config.html",
    ("std:label", "action_plugins"): "plugins/action.html",
    ("std:label", "ansible_collections.ansible.builtin.wait_for_connection_module"): (
        "collections/ansible/builtin/wait_for_connection_module.html"
    ),
    **{
        (
            "std:envvar",
            f"ANSIBLE_CACHE_PLUGIN{suffix}",
        ): f"reference_appendices/config.html#envvar-ANSIBLE_CACHE_PLUGIN{suffix}"
        for suffix in ("", "_CONNECTION", "_PREFIX", "_TIMEOUT")
    },
}


def ansible_inventory(path: Path) -> Path:
    """An intersphinx inventory (objects.inv, version 2) of ANSIBLE_TARGETS."""
    import zlib

    lines = "".join(f"{name} {role} -1 {uri} -\n" for (role, name), uri in sorted(ANSIBLE_TARGETS.items()))
    header = "# Sphinx inventory version 2\n# Project: Ansible\n# Version: latest\n"
    header += "# The remainder of this file is compressed using zlib.\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header.encode() + zlib.compress(lines.encode()))
    return path


def collection_pages(dest: Path) -> None:
    """antsibull-docs's pages for the collection in this checkout (collections/ links it as fleetops.node)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(mode=0o700, parents=True)  # antsibull-docs wants a directory only its owner writes
    bindir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
        "ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections"),
    }
    subprocess.run(
        [
            str(Path(bindir) / "antsibull-docs"),
            "collection",
            "--use-current",
            "--dest-dir",
            str(dest),
            "--output-format",
            "ansible-docsite",
            "fleetops.node",
        ],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:  # unchanged pages keep their mtime: incremental builds
        path.write_text(text)


def generate(out: Path = OUT) -> None:
    from fleetops.cli.app import build_parser
    from fleetops_lab.cli import build_parser as lab_parser

    out.mkdir(parents=True, exist_ok=True)
    ansible_inventory(out / "ansible.inv")
    collection_pages(out / "collection")
    _write(
        out / "cli.md",
        cli_markdown(
            "`fleetops` command reference",
            "Every command's `--help`, generated from the CLI's argparse parsers (`fleetops.cli.app.build_parser`).",
            build_parser(),
            "fleetops",
        ),
    )
    _write(
        out / "lab-cli.md",
        cli_markdown(
            "`fleetops-lab` command reference",
            "The development lab's commands (`lab/`, a development package: never on a controller), "
            "generated from `fleetops_lab.cli.build_parser`.",
            lab_parser(),
            "fleetops-lab",
        ),
    )
    _write(out / "policy.md", policy_markdown(json.loads(POLICY_SCHEMA.read_text())))
    _write(out / "alerts.md", alerts_markdown())
    _write(out / "playbooks.md", playbooks_markdown())
    _write(out / "exit-codes.md", exit_codes_markdown())
    _write(out / "remediations.md", remediations_markdown())


def setup(app: Any) -> dict[str, Any]:
    app.connect("config-inited", lambda app, config: generate())
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    generate()
