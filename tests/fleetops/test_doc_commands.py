"""Every `fleetops ...` and `fleetops-lab ...` command the documentation shows exists and parses.

The places a user copies commands from: README.md, the site's pages (docs/**/*.md; the generated reference
is built from the parsers themselves), the example inventories (inventory/*), the playbooks' header
comments and AWX as code (awx/**). A command is one in a code span (`...`), a Markdown code block, or a
quoted YAML string that starts with the command. Each is parsed in-process by the parser of the command
it names (fleetops.cli.app.build_parser, fleetops_lab.cli.build_parser): an unknown subcommand or an
option its subcommand does not take fails with argparse's own message. Placeholders (ACTION, FILE, ...)
and shell syntax around the command (pipes, redirections, comments, `$(...)`) are left out.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetops.cli.app import build_parser
from fleetops_lab.cli import build_parser as lab_parser
from tests.paths import REPO

PARSERS = {"fleetops": build_parser, "fleetops-lab": lab_parser}
# A command starts a snippet, or follows a prompt, sudo, a pipe, a list or a $( (a path before it is fine).
COMMAND = re.compile(
    r"(?:^|\$\(|[|;&]\s*|^\$\s+|\bsudo\s+|\btimeout\s+\S+\s+)\s*(?:[\w./-]*/)?(fleetops(?:-lab)?)[ \t]+(?=[a-z-])"
)
SPAN = re.compile(r"`([^`\n]+)`")
QUOTED = re.compile(r"""(["'])((?:fleetops|fleetops-lab) [^"'\n]*)\1""")
FENCE = re.compile(r"^\s*```(\{?)")
COMMENT = re.compile(r"(?:^|\s)#.*$")
# Where a command ends: a pipe, a list, a redirection, a comment, a $( ) or a sentence.
END = re.compile(r"\s(?:\||&&|;|>|2>|#)|[)`;]|\.\s|\.$|,\s")
SUBSTITUTION = re.compile(r"\$\(([^()]*)\)")
# A word the reader replaces: FILE, I/N, [--all], off|on, <host>, ...
PLACEHOLDER = re.compile(r"[|\[\]<>]|\.\.|(?<![A-Za-z])[A-Z][A-Z0-9_]*(?![a-z])")
INCOMPLETE = ("the following arguments are required", "expected one argument")


def documents() -> Iterator[Path]:
    yield REPO / "README.md"
    for path in sorted((REPO / "docs").rglob("*.md")):
        if not {"reference", "_build"} & set(path.relative_to(REPO / "docs").parts):
            yield path
    yield from sorted(p for p in (REPO / "inventory").iterdir() if p.is_file())
    yield from sorted((REPO / "playbooks").glob("*.yml"))
    yield from sorted(p for p in (REPO / "awx").rglob("*") if p.is_file())


def _header(text: str) -> str:
    """A playbook's header comment (its commands; the tasks below run them, and are tested as code)."""
    return "\n".join(line for line in text.split("\n- name:")[0].splitlines() if line.startswith("#"))


def snippets(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of the code in a file: code spans, Markdown code blocks, quoted YAML strings."""
    text = path.read_text()
    if path.parent.name == "playbooks":
        text = _header(text)
    fenced = directive = False
    for number, line in enumerate(text.splitlines(), 1):
        if path.suffix == ".md" and (fence := FENCE.match(line)):
            fenced, directive = not fenced, bool(fence.group(1)) and not fenced
            continue
        if fenced:
            if not directive:  # a {toctree} or other MyST directive holds no commands
                yield number, COMMENT.sub("", line)
            continue
        for m in SPAN.finditer(line):
            yield number, m.group(1)
        if path.suffix != ".md":
            for m in QUOTED.finditer(line):
                yield number, m.group(2)


def commands(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, command line) of each fleetops / fleetops-lab command in a file."""
    for number, snippet in snippets(path):
        inner = [m.group(1) for m in SUBSTITUTION.finditer(snippet)]
        for text in [SUBSTITUTION.sub("value", snippet), *inner]:
            for m in COMMAND.finditer(text):
                rest = text[m.start(1) :]
                end = END.search(rest, len(m.group(1)))
                yield number, rest[: end.start() if end else len(rest)].strip()


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def _subcommand(parser: argparse.ArgumentParser, word: str) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(word)
    return None


def _has_subcommands(parser: argparse.ArgumentParser) -> bool:
    return any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


def structure_error(program: str, args: list[str]) -> str | None:
    """The command names commands that exist, and gives each only options it takes (placeholders aside)."""
    parser = PARSERS[program]()
    options, actions = _options(parser), list(parser._actions)
    path = [program]
    for word in args:
        if word.startswith("-") and word != "-":
            name = word.split("=", 1)[0]
            if name not in options and not PLACEHOLDER.search(name):
                return f"{' '.join(path)}: no option {name}"
        elif _has_subcommands(parser) and not PLACEHOLDER.search(word):
            child = _subcommand(parser, word)
            if child is None:
                if not _takes_value(actions, args, word):  # not `--lab b1 up`'s b1: no such command
                    return f"{' '.join(path)}: no command {word!r}"
                continue
            parser, path = child, [*path, word]
            options |= _options(parser)
            actions += parser._actions
    return None


def _takes_value(actions: list[argparse.Action], args: list[str], word: str) -> bool:
    """The word is the value of the option just before it (`fleetops-lab --lab b1 up`)."""
    i = args.index(word)
    if i == 0 or not args[i - 1].startswith("-") or "=" in args[i - 1]:
        return False
    for action in actions:
        if args[i - 1] in action.option_strings:
            return action.nargs != 0
    return False


def parse_error(command: str) -> str | None:
    """None when the command's parser accepts it, else why not: argparse's own message."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.replace('"', "").replace("'", "").split()
    program, args = words[0], [w for w in words[1:] if w != "\\"]
    if problem := structure_error(program, args):
        return problem
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            PARSERS[program]().parse_args(args)
    except SystemExit as exit_:
        message = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else ""
        if exit_.code in (0, None) or any(PLACEHOLDER.search(w) for w in args):
            return None  # --help; or a template: its structure is what can be checked
        if any(reason in message for reason in INCOMPLETE):
            return None  # the command named (`fleetops merge`, `fleetops stop -i`), not run
        return message
    return None


ALL = [(path, number, command) for path in documents() for number, command in commands(path)]


def test_the_documents_show_commands() -> None:
    shown = {path.relative_to(REPO).parts[0] for path, _, _ in ALL}
    assert {"README.md", "docs", "inventory", "playbooks", "awx"} <= shown
    assert len(ALL) >= 100


@pytest.mark.parametrize("path,number,command", ALL, ids=[f"{p.relative_to(REPO)}:{n}" for p, n, _ in ALL])
def test_each_documented_command_parses(path: Path, number: int, command: str) -> None:
    assert parse_error(command) is None, (
        f"{path.relative_to(REPO)}:{number}: {command}: {parse_error(command)}"
    )


@pytest.mark.parametrize(
    "command,wrong",
    [
        ("fleetops lab up", True),  # inventory/README.md said so once: the CLI has no lab command
        ("fleetops rollout --canary 1", True),
        ("fleetops scan --no-such-option", True),
        ("fleetops-lab up 3", False),
        ("fleetops remediate ACTION --help", False),
        ("fleetops scan -i fleet.yml --limit 'gpu_*'", False),
    ],
)
def test_the_check_tells_a_wrong_command_from_a_right_one(command: str, wrong: bool) -> None:
    assert (parse_error(command) is not None) == wrong, parse_error(command)


def test_commands_are_found_where_the_user_reads_them(tmp_path: Path) -> None:
    doc = tmp_path / "page.md"
    doc.write_text(
        "Run `fleetops scan -i x.yml` then\n```sh\nfleetops merge a.json b.json -o f.json | jq .  # merged\n"
        "sudo fleetops-lab down --all\n```\nfleetops scans in prose are not commands.\n"
    )
    assert [c for _, c in commands(doc)] == [
        "fleetops scan -i x.yml",
        "fleetops merge a.json b.json -o f.json",
        "fleetops-lab down --all",
    ]
