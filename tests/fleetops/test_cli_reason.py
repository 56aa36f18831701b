"""Every ``--reason`` (and ``--cause``) of the CLI is one checked line: the text is written to the audit log, the
shared store, the pause and stop files and EC2 tags, where a newline could forge an audit line. Walks the real
parser (``fleetops.cli.app.build_parser``): a subcommand that takes a reason takes it through
``cli.args.add_reason_arg`` (``values.cause``), and refuses a bad one with exit 2 and one line before anything
is touched (no state written, no api called). A remediation's ``--reason`` (quarantine's: the node's annotation,
the Slurm drain reason) is a declared parameter (``Param.parse``: ``values.quarantine_reason``), the same
one-line check (``values.one_line``) with the remediation's own limit, and may be empty."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetops import api
from fleetops.cli import args as cli_args
from fleetops.cli.app import build_parser, main
from fleetops.exitcodes import ExitCode
from fleetops.remediations import REMEDIATIONS
from fleetops.values import CAUSE_MAX, one_line
from tests.helpers import cli_parsers

REASON_OPTIONS = ("--reason", "--cause")
# the commands that take a reason today (a new one is walked too: this only proves the walk finds them)
KNOWN = {"pause", "unpause", "stop", "store", "brake lift", "remediate auto", "remediate quarantine"}
BAD = [
    pytest.param('incident 42\n{"event": "unpause", "operator": "root"}', id="newline-forged-audit-line"),
    pytest.param("incident\r42", id="carriage-return"),
    pytest.param("incident \x1b[31m42", id="escape-sequence"),
    pytest.param("incident\t42", id="tab"),
    pytest.param("x" * (CAUSE_MAX + 1), id="over-long"),
    pytest.param("incident\u202842", id="unicode-line-separator"),
]


def _reason_action(parser: argparse.ArgumentParser) -> argparse.Action | None:
    return next((a for a in parser._actions if set(a.option_strings) & set(REASON_OPTIONS)), None)


TAKING = {cmd: p for cmd, p in cli_parsers() if _reason_action(p) is not None}


def _argv(command: str, parser: argparse.ArgumentParser) -> list[str]:
    """The command with its required positionals (the first choice, else a name): a line that parses."""
    argv = command.split()
    for action in parser._actions:
        if action.option_strings or isinstance(action, argparse._SubParsersAction):
            continue
        if action.nargs in ("?", "*"):
            continue
        argv.append(str(next(iter(action.choices))) if action.choices else "gpu-rule")
    for action in parser._actions:  # required options (quarantine's --finding)
        if action.option_strings and action.required:
            argv += [action.option_strings[0], "gpu_xid"]
    return argv + (["--all"] if command == "stop" else [])


def _remediation(command: str) -> str | None:
    """``quarantine`` for "remediate quarantine": a remediation whose parameters declare the reason."""
    name = command.removeprefix("remediate ")
    return name if command.startswith("remediate ") and name in REMEDIATIONS else None


def test_the_walk_finds_every_command_that_takes_a_reason() -> None:
    assert set(TAKING) >= KNOWN, sorted(TAKING)


@pytest.mark.parametrize("command", sorted(TAKING))
def test_every_reason_is_declared_once(command: str) -> None:
    action = _reason_action(TAKING[command])
    assert action is not None
    remediation = _remediation(command)
    if remediation is not None:  # a declared parameter: the same check, the remediation's limit
        param = REMEDIATIONS[remediation].parameters_by_name["reason"]
        assert param.parse is not None and "one line, up to" in param.help
        with pytest.raises(ValueError, match="one line of printable characters"):
            param.parse("Xid 79\nforged")
        assert param.parse("") == "" and action.default == ""  # may be empty: no reason
        return
    assert action.type is cli_args.cause, f"{command}: --reason not taken through cli.args.add_reason_arg"
    assert action.dest == "reason" and action.default is None and action.metavar == "TEXT"
    assert f"one line, up to {CAUSE_MAX} characters" in (action.help or "")
    # and a good one is kept as given (surrounding blanks dropped); none given is None, never checked
    parse = build_parser().parse_args
    argv = _argv(command, TAKING[command])
    assert parse([*argv, "--reason", " ticket OPS-1234 — Störung "]).reason == "ticket OPS-1234 — Störung"
    assert parse(argv).reason is None


@pytest.fixture
def untouched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, list[str]]]:
    """An empty state directory, and every api entry point a reason reaches recording that it was called."""
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(state))
    called: list[str] = []
    for name in ("store", "stop", "lift_brake", "auto", "remediate", "resume"):
        monkeypatch.setattr(api, name, lambda *a, _n=name, **k: called.append(_n))
    yield state, called


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("command", sorted(TAKING))
def test_a_bad_reason_is_refused_before_anything_is_touched(
    command: str, bad: str, untouched: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    state, called = untouched
    action = _reason_action(TAKING[command])
    assert action is not None
    for option in action.option_strings:  # --reason, and remediate auto's --cause
        for given in ([option, bad], [f"{option}={bad}"]):
            with pytest.raises(SystemExit) as exc:
                main([*_argv(command, TAKING[command]), *given])
            assert exc.value.code == ExitCode.USAGE, (command, given)
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and "--reason" in err and "Traceback" not in err, err
            assert ("one line of printable characters" in err) or ("at most" in err), err
    assert called == [] and list(state.iterdir()) == []


@pytest.mark.parametrize("command", sorted(c for c in TAKING if _remediation(c) is None))
def test_a_blank_reason_is_refused_where_the_reason_is_optional_text(
    command: str, untouched: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    """``--reason ''`` says nothing: refused (leave the option out for none), as remediate auto always did."""
    state, called = untouched
    with pytest.raises(SystemExit) as exc:
        main([*_argv(command, TAKING[command]), "--reason", "  "])
    assert exc.value.code == ExitCode.USAGE and "must not be empty" in capsys.readouterr().err
    assert called == [] and list(state.iterdir()) == []


def test_one_line_is_the_one_check() -> None:
    assert one_line(" why ") == "why" and one_line("", empty=True) == ""
    for bad in ("a\nb", "a\x00b", "a\x7fb", "x" * 11):
        with pytest.raises(ValueError):
            one_line(bad, 10)


def test_the_side_effect_check_sees_a_pause(
    untouched: tuple[Path, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the same command with a good reason writes the pause (so an empty directory above means
    nothing ran, not that nothing could be seen)."""
    state, _ = untouched
    monkeypatch.undo()  # the real api
    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(state))
    assert main(["pause", "--reason", "incident 42"]) == ExitCode.OK
    assert (state / "pause.json").exists() and "incident 42" in (state / "audit.jsonl").read_text()
    assert main(["unpause", "--reason", "incident 42 closed"]) == ExitCode.OK


@pytest.mark.parametrize(
    "summary",
    [
        pytest.param('GPU 0: Xid 79\n{"event": "unquarantine"}\x1b[2J', id="newline-and-escape"),
        pytest.param("unit a.service\u2028restarts\t\t12 times", id="line-separator-and-tabs"),
        pytest.param("x" * 1000, id="over-long"),
    ],
)
def test_a_pass_makes_the_hosts_summary_one_line_in_the_quarantine_reason(summary: str) -> None:
    """An auto pass's quarantine reason is built from the finding's summary, which is the host's text: it is
    made one printable line within the annotation's limit (a host cannot forge an audit line or a drain reason
    of several lines), and the remediation's own check accepts it."""
    from fleetops.auto.actions import REASON_MAX, action_params
    from fleetops.policy import Decision

    decision = Decision(
        host="h1", group="g", status="act", reason="", rule="xid", check="gpu_health", severity="critical",
        summary=summary, rung=0, rungs=2, rung_action="quarantine", action="quarantine", params={},
        waiting_rules=(), reset=False, still_quarantined=False, blind=False,
    )  # fmt: skip
    params = action_params(decision, {})
    reason = params["reason"]
    assert reason.startswith("fleetops remediate auto: rule xid rung 1: ") and len(reason) <= REASON_MAX
    assert reason.isprintable() and "  " not in reason, reason
    assert one_line(reason, REASON_MAX) == reason
    extravars = REMEDIATIONS["quarantine"].extravars(params)
    assert (
        extravars["fleetops_quarantine_reason"] == reason
        and extravars["fleetops_quarantine_check"] == "gpu_health"
    )
