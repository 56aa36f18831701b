"""Issue 40, item 4 (the auto pass's exit codes, declared once) and item 9 (one vocabulary): every --help
ends with its exit codes and examples that parse; one metavar per option; -q wherever progress is printed;
--reason (--cause its alias); `fleetops brake lift RULE` (--lift-brake deprecated); a dry run never says done.

Through the real parser (``fleetops.cli.app.build_parser``) and ``main``; the auto passes run on this machine
(ansible's local connection), with a policy whose only rung for the scheduled event the scan is told of is
``human``.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import jsonschema
import pytest

from fleetops.cli.app import build_parser, main
from fleetops.cli.helptext import EXAMPLES, EXITS
from fleetops.exitcodes import MEANINGS, ExitCode
from fleetops.remediations import REMEDIATIONS
from tests.helpers import cli_parsers
from tests.paths import REPO

EVENTS = [{"Code": "system-reboot", "Description": "scheduled reboot", "EventId": "e-1"}]
# options whose one name means two things in two commands (plan's hostvar, drift's dimensions)
TWO_MEANINGS = {"--group-by"}
# the commands that print progress on stderr as they go
PROGRESS = {
    "scan",
    "drift",
    "merge",
    "remediate",
    "remediate auto",
    *(f"remediate {r}" for r in REMEDIATIONS),
}


PARSERS = dict(cli_parsers())


def _key(command: str) -> str:
    """The command's key in EXITS: every remediation is "remediate ACTION"."""
    words = command.split()
    return (
        "remediate ACTION"
        if words[:1] == ["remediate"] and words[1:] and words[1] in REMEDIATIONS
        else command
    )


def _section(help_text: str, title: str) -> list[str]:
    """The indented lines of the help's ``title:`` section (exit codes, examples), joined where wrapped."""
    lines = help_text.split(f"\n{title}:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    rows: list[str] = []
    for line in lines:
        if rows and title == "exit codes" and not re.match(r"  \d", line):
            rows[-1] += " " + line.strip()
        else:
            rows.append(line)
    return rows


def _examples(command: str) -> list[str]:
    return [line.strip() for line in _section(PARSERS[command].format_help(), "examples")]


@pytest.mark.parametrize("command", sorted(PARSERS), ids=lambda c: c or "fleetops")
def test_every_help_ends_with_its_exit_codes_and_two_or_three_examples(command: str) -> None:
    text = PARSERS[command].format_help()
    assert text.rstrip().split("\n\n")[-1].startswith("examples:"), text  # the last section
    codes = [int(row.split()[0]) for row in _section(text, "exit codes")]
    declared = list(MEANINGS) if command == "" else [code for code, _ in EXITS[_key(command)]]
    assert codes == [int(c) for c in declared], (command, codes)
    assert 2 <= len(_examples(command)) <= 3, command


def test_the_top_level_help_lists_every_exit_code() -> None:
    codes = {int(row.split()[0]) for row in _section(PARSERS[""].format_help(), "exit codes")}
    assert codes == {int(c) for c in ExitCode}
    # and each command's own codes are among them, each said at the top level
    assert {int(c) for rows in EXITS.values() for c, _ in rows} <= codes


@pytest.mark.parametrize("command", sorted(PARSERS), ids=lambda c: c or "fleetops")
def test_every_example_parses_with_the_real_parser(command: str) -> None:
    """Each example is a whole command line of this command (or, at the top level, of any), and the real
    parser takes it: an option renamed or a value refused fails here."""
    for example in _examples(command):
        argv = shlex.split(example)
        assert argv[0] == "fleetops", example
        assert " ".join(argv[1:]).startswith(command), (command, example)
        args = build_parser().parse_args(argv[1:])  # SystemExit (2) on anything it refuses
        assert callable(args.func), example


def test_every_declared_example_is_shown() -> None:
    """The declarations hold no example that no --help shows (a command removed, a key misspelled)."""
    shown = {e for c in PARSERS for e in _examples(c)}
    declared = {e for examples in EXAMPLES.values() for e in examples}
    declared |= {e for r in REMEDIATIONS.values() for e in r.examples}
    assert declared <= shown, sorted(declared - shown)
    assert set(EXITS) | {""} >= {_key(c) for c in PARSERS}


def test_one_metavar_per_option() -> None:
    """An option's value has one name wherever the option appears (-i INVENTORY, --state STATE, ...)."""
    seen: dict[str, dict[str, list[str]]] = {}
    for command, parser in PARSERS.items():
        for action in parser._actions:
            if action.nargs == 0 or not action.option_strings or (action.metavar is None and action.choices):
                continue
            name = max(action.option_strings, key=len)
            metavar = str(action.metavar or action.dest.upper())
            seen.setdefault(name, {}).setdefault(metavar, []).append(command)
    mixed = {name: uses for name, uses in seen.items() if len(uses) > 1 and name not in TWO_MEANINGS}
    assert mixed == {}, mixed
    assert set(seen["--inventory"]) == {"INVENTORY"}


@pytest.mark.parametrize("command", sorted(PROGRESS))
def test_every_command_that_prints_progress_takes_q(command: str) -> None:
    argv = command.split()
    extra = {"merge": ["a.json"], "remediate disable-unit": ["--unit", "x.service"],
             "remediate set-env": ["--unit", "x.service", "--env", "A=1"],
             "remediate quarantine": ["--finding", "gpu_health"]}.get(command, [])  # fmt: skip
    assert build_parser().parse_args([*argv, *extra, "-q"]).quiet is True
    assert build_parser().parse_args([*argv, *extra]).quiet is False
    if argv[0] == "remediate" and len(argv) > 1:  # -q before the action counts as well
        assert build_parser().parse_args(["remediate", "-q", *argv[1:], *extra]).quiet is True


def test_reason_is_the_one_name_and_cause_its_alias() -> None:
    parse = build_parser().parse_args
    assert parse(["remediate", "auto", "--reason", "OPS-1"]).reason == "OPS-1"
    assert parse(["remediate", "auto", "--cause", "alert X"]).reason == "alert X"
    for argv in (["stop", "--all"], ["pause"], ["unpause"], ["brake", "lift", "r"]):
        assert parse([*argv, "--reason", "why"]).reason == "why", argv


# ------------------------------------------------------------------------- the auto pass: human is not failure


@pytest.fixture
def human_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A policy whose one rung is `human` for the scheduled event this machine's scan is told of."""
    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("FLEETOPS_AUDIT_LOG", str(tmp_path / "audit.jsonl"))
    policy = tmp_path / "policy.yml"
    policy.write_text(
        "schema: fleetops.policy/v1\nrules:\n  - name: events\n    match: [{check: ec2_scheduled_event}]\n"
        "    ladder:\n      - {action: human, note: look at it}\n"
    )
    inv = tmp_path / "inv.yml"
    inv.write_text(
        "all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
        f"      ansible_python_interpreter: {sys.executable}\n      fleetops_imds: never\n"
        f"      ec2_scheduled_events: {json.dumps(EVENTS)}\n"
    )
    return ["remediate", "auto", "-i", str(inv), "--policy", str(policy), "--format", "json", "-q"]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        rc = main(list(argv))
    except SystemExit as exc:
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def test_a_host_waiting_for_a_person_is_not_a_failed_pass_unless_fail_on_human(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], human_pass: list[str]
) -> None:
    """Was exit 1 on every pass (an AWX job every 15 minutes red for days); now 0, the host named in the
    JSON (schema-valid) and, when the pass records the rung (--apply), in the audit log; 1 with --fail-on human."""
    rc, out, err = _run(capsys, *human_pass, "--apply")
    doc = json.loads(out)
    assert rc == 0 == doc["exit_code"], err
    assert doc["decisions"][0]["status"] == "human"
    assert doc["waiting_for_person"] == {"hosts": ["localhost"], "brakes": [], "fail_on": "never"}
    jsonschema.Draft202012Validator(
        json.loads((REPO / "schemas" / "auto-pass.schema.json").read_text())
    ).validate(doc)
    audit = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(e["event"], e["host"], e["rule"]) for e in audit] == [("human_needed", "localhost", "events")]
    # -q: no progress on stderr, only warnings: here the host that waits for a person
    assert err.splitlines() == [
        "localhost: ec2_scheduled_event (warning) rule events rung 1/1 human: needs a human: look at it"
    ], err
    rc, out, err = _run(capsys, *human_pass, "--fail-on", "human")
    doc = json.loads(out)
    assert rc == 1 == doc["exit_code"], err
    assert doc["waiting_for_person"]["fail_on"] == "human"


# ------------------------------------------------------------------------- the storm brake's command


def test_brake_lift_lifts_and_the_old_flag_says_it_is_deprecated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetops.auto.state import BRAKES_FILE, save_brakes

    monkeypatch.setenv("FLEETOPS_AUDIT_LOG", str(tmp_path / "audit.jsonl"))
    state = tmp_path / "auto"
    state.mkdir()
    brake = {"gpu-fatal": {"why": "6 of 6 hosts", "since": 1.0}}
    save_brakes(state / BRAKES_FILE, brake)
    rc, out, err = _run(capsys, "brake", "lift", "gpu-fatal", "--state-dir", str(state), "--reason", "fixed")
    assert rc == 0 and "storm brake on rule gpu-fatal lifted" in err, err
    assert "deprecated" not in err
    rc, out, err = _run(capsys, "brake", "lift", "gpu-fatal", "--state-dir", str(state))
    assert rc == 2 and out == "" and "no storm brake on rule 'gpu-fatal'" in err, err  # nothing left to lift
    save_brakes(state / BRAKES_FILE, brake)
    rc, _out, err = _run(capsys, "remediate", "auto", "--lift-brake", "gpu-fatal", "--state-dir", str(state))
    assert rc == 0 and "lifted" in err, err
    assert err.splitlines()[0] == (
        "fleetops: warning: --lift-brake is deprecated and goes in the next release: use "
        "`fleetops brake lift RULE [--reason TEXT]`"
    )
    events = [json.loads(line)["event"] for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert events.count("lift-brake") == 3  # each try audited, the one that found nothing too
