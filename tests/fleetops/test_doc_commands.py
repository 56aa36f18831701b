"""Every `fleetops ...` and `fleetops-lab ...` command the documentation shows exists and parses.

The places a user copies commands from: README.md, the site's pages (docs/**/*.md, and the generated
reference pages whose prose is not --help output), the example inventories (inventory/*), the playbooks' header
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
import json
import re
import shlex
import sys
from collections.abc import Iterator

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


def documents() -> Iterator[tuple[str, str]]:
    """(name, text) of each document: the checked-in ones, then the site's generated pages whose prose
    names commands (the command reference is the parsers' own --help, and the modules' pages are ansible's)."""
    paths = [REPO / "README.md"]
    paths += [p for p in sorted((REPO / "docs").rglob("*.md")) if not {"reference", "_build"} & set(p.parts)]
    paths += sorted(p for p in (REPO / "inventory").iterdir() if p.is_file())
    paths += sorted((REPO / "playbooks").glob("*.yml"))
    paths += sorted(p for p in (REPO / "awx").rglob("*") if p.is_file())
    for path in paths:
        text = path.read_text()
        yield str(path.relative_to(REPO)), _header(text) if path.parent.name == "playbooks" else text
    sys.path.insert(0, str(REPO / "docs" / "_ext"))
    import fleetops_docs

    yield (
        "docs/reference/policy.md",
        fleetops_docs.policy_markdown(json.loads(fleetops_docs.POLICY_SCHEMA.read_text())),
    )
    yield "docs/reference/alerts.md", fleetops_docs.alerts_markdown()
    yield "docs/reference/remediations.md", fleetops_docs.remediations_markdown()
    yield "docs/reference/exit-codes.md", fleetops_docs.exit_codes_markdown()


def _header(text: str) -> str:
    """A playbook's header comment (its commands; the tasks below run them, and are tested as code)."""
    return "\n".join(line for line in text.split("\n- name:")[0].splitlines() if line.startswith("#"))


def snippets(name: str, text: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of the code in a document: code spans, Markdown code blocks, quoted YAML strings."""
    markdown = name.endswith(".md")
    fenced = directive = False
    for number, line in enumerate(text.splitlines(), 1):
        if markdown and (fence := FENCE.match(line)):
            fenced, directive = not fenced, bool(fence.group(1)) and not fenced
            continue
        if fenced:
            if not directive:  # a {toctree} or other MyST directive holds no commands
                yield number, COMMENT.sub("", line)
            continue
        for m in SPAN.finditer(line):
            yield number, m.group(1)
        if not markdown:
            for m in QUOTED.finditer(line):
                yield number, m.group(2)


def commands(name: str, text: str) -> Iterator[tuple[int, str]]:
    """(line number, command line) of each fleetops / fleetops-lab command in a document."""
    for number, snippet in snippets(name, text):
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


ALL = [(name, number, command) for name, text in documents() for number, command in commands(name, text)]


def test_the_documents_show_commands() -> None:
    shown = {name.split("/")[0] for name, _, _ in ALL}
    assert {"README.md", "docs", "inventory", "playbooks", "awx"} <= shown
    assert any(name.startswith("docs/reference/") for name, _, _ in ALL)
    assert len(ALL) >= 100


@pytest.mark.parametrize("name,number,command", ALL, ids=[f"{name}:{n}" for name, n, _ in ALL])
def test_each_documented_command_parses(name: str, number: int, command: str) -> None:
    assert parse_error(command) is None, f"{name}:{number}: {command}: {parse_error(command)}"


@pytest.mark.parametrize(
    "command,wrong",
    [
        ("fleetops lab up", True),  # inventory/README.md said so once: the CLI has no lab command
        ("fleetops rollout --canary 1", True),
        ("fleetops scan --no-such-option", True),
        ("fleetops policy lint FILE", True),  # the verb is check (fleetops policy check FILE)
        ("fleetops policy check FILE", False),
        ("fleetops-lab up 3", False),
        ("fleetops remediate ACTION --help", False),
        ("fleetops scan -i fleet.yml --limit 'gpu_*'", False),
    ],
)
def test_the_check_tells_a_wrong_command_from_a_right_one(command: str, wrong: bool) -> None:
    assert (parse_error(command) is not None) == wrong, parse_error(command)


def test_commands_are_found_where_the_user_reads_them() -> None:
    page = (
        "Run `fleetops scan -i x.yml` then\n```sh\nfleetops merge a.json b.json -o f.json | jq .  # merged\n"
        "sudo fleetops-lab down --all\n```\nfleetops scans in prose are not commands.\n"
    )
    assert [c for _, c in commands("page.md", page)] == [
        "fleetops scan -i x.yml",
        "fleetops merge a.json b.json -o f.json",
        "fleetops-lab down --all",
    ]
    awx = "# the template `fleetops remediate auto` runs\nmsg: 'fleetops unpause' lifts it, the fleetops scan"
    assert [c for _, c in commands("awx/x.yml", awx)] == ["fleetops remediate auto", "fleetops unpause"]
