"""`fleetops --help` imports nothing heavy, and works without the collection; a command then fails in one line.

Not timed (bench/cli_help.py times it): what a help loads is checked by the modules it leaves in
``sys.modules``, in a fresh interpreter.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fleetops.ansible import collection
from fleetops.cli import app
from fleetops.errors import FleetopsError
from tests.helpers import FLEETOPS, REPO, cli_parsers

# what made every command wait ~1 s before it parsed its first option
HEAVY = ("boto3", "botocore", "paramiko", "pydantic", "ansible", "ansible_runner", "ansible_collections")


COMMANDS = [command.split() for command, _ in cli_parsers()]  # [], every COMMAND, remediate ACTION

# every --help in one fresh interpreter, as the console script runs it; then what it imported
LOADED = """
import contextlib, io, json, sys
from fleetops.cli import main
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            main([*argv, "--help"])
        except SystemExit as exc:
            assert exc.code == 0 and out.getvalue().startswith("usage: fleetops"), (argv, exc.code)
print(json.dumps(sorted(sys.modules)))
"""


def test_the_commands_are_all_there() -> None:
    names = {" ".join(c) for c in COMMANDS}
    assert {
        "scan",
        "plan",
        "remediate",
        "report",
        "stop",
        "drift",
        "remediate reboot",
        "remediate auto",
    } <= names


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_a_command_alone_is_built_as_in_the_whole_parser() -> None:
    """``fleetops COMMAND ...`` builds only COMMAND's parser (app.COMMANDS names the module that registers
    it): the table is what the modules register, in --help's order, and each command built alone is the
    same parser (its help, every option) as in the whole one; anything else builds all."""
    whole = _commands(app.build_parser())
    assert list(whole) == [name for _, names in app.COMMANDS for name in names]
    for name, parser in whole.items():
        alone = _commands(app.build_parser([name, "-q"]))
        assert [names for _, names in app.COMMANDS if name in names] == [tuple(alone)]
        assert alone[name].format_help() == parser.format_help()
        assert [a.option_strings for a in alone[name]._actions] == [a.option_strings for a in parser._actions]
    for argv in ([], ["--help"], ["--version"], ["scna"], ["-q", "scan"]):
        assert list(_commands(app.build_parser(argv))) == list(whole), argv


def test_help_of_every_command_imports_nothing_heavy() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", LOADED, json.dumps(COMMANDS)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout)
    assert "fleetops.cli.remediate" in loaded and "fleetops.rollout.lease" in loaded  # it did run them
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY)
    assert heavy == [], heavy
    assert "fleetops.api" not in loaded


# what a scan over ssh must not load: the listing and the ssh commands need ansible's inventory, config and
# ssh plugin, never ansible's CLIs (ansible-inventory's, in a process of its own or in this one), the
# runner (no host left to ansible-playbook here), boto3 (no EC2 source), pydantic (no policy) or paramiko
SCAN_UNUSED = ("boto3", "botocore", "paramiko", "pydantic", "ansible_runner", "ansible.cli")

SCANNED = """
import json, subprocess, sys
started, at_first_ssh = [], []
real = subprocess.Popen.__init__
def spy(self, args, *a, **k):
    started.append(str(args[0] if isinstance(args, (list, tuple)) else args))
    if started[-1].rsplit("/", 1)[-1] == "ssh" and not at_first_ssh:
        at_first_ssh.extend(sorted(sys.modules))
    real(self, args, *a, **k)
subprocess.Popen.__init__ = spy
from fleetops.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules), "started": started, "first": at_first_ssh}))
"""

# what a scan must not have loaded when its first ssh starts (the operator waits for that): the policy
# (pydantic) and the store are read once the hosts are being scanned, for a finding or the record; the other
# commands' parsers are not built (fleetops.cli.app.COMMANDS), nor packaging's requirement parser imported;
# the rollout verbs and what they bring (the planner, the engine, the lease, the remediations) stay unloaded
OTHER_COMMANDS = tuple(module for module, _ in app.COMMANDS if module is not None)
BEFORE_FIRST_SSH_UNUSED = (
    *SCAN_UNUSED,
    "fleetops.policy",
    "fleetops.store",
    "fleetops.auto",
    *OTHER_COMMANDS,
    "packaging.requirements",
    "fleetops.api.verbs",
    "fleetops.api.launch",
    "fleetops.api.requests",
    "fleetops.cli.observer",
    "fleetops.planner",
    "fleetops.remediations",
    "fleetops.rollout.engine",
    "fleetops.rollout.lease",
    "fleetops.rollout.state",
)


@pytest.mark.parametrize("record", [False, True], ids=["no-record", "record"])
def test_a_scan_over_ssh_imports_only_what_it_uses(tmp_path: Path, record: bool) -> None:
    """`fleetops scan` (its default transport, auto: the direct path over ssh) lists its inventory in process
    (no ansible-inventory) and loads none of SCAN_UNUSED; its hosts refuse the connection (port 1), so every
    one is scanned by the direct path, unreachable. Writing the fleet record (the default) reads the policy,
    which is pydantic, and nothing else of them."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  vars: {ansible_host: 127.0.0.1, ansible_port: 1, ansible_user: nobody}\n"
        "  hosts: {h1: {}, h2: {}}\n"
    )
    argv = ["scan", "-i", str(inventory), "-q", "--format", "json"]
    argv += ["--state-dir", str(tmp_path / "state")] if record else ["--no-record"]
    proc = subprocess.run(
        [sys.executable, "-c", SCANNED, *argv], capture_output=True, text=True, timeout=180, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    report = json.loads(proc.stdout[: proc.stdout.rindex("\n{")])
    assert report["transport"] == {"name": "auto", "by_ansible": {}}, report["transport"]
    assert sorted(report["hosts"]) == ["h1", "h2"]
    assert not any(Path(p).name == "ansible-inventory" for p in found["started"]), found["started"]
    loaded = [m for m in found["modules"] if m.startswith(SCAN_UNUSED)]
    assert [m for m in loaded if not (record and m.split(".")[0] in ("pydantic", "pydantic_core"))] == [], (
        loaded
    )
    assert (tmp_path / "state" / "seen.json").exists() == record
    assert "ansible.inventory.manager" in found["modules"]  # listed in this process
    assert found["first"], found["started"]
    assert [m for m in found["first"] if m.startswith(BEFORE_FIRST_SSH_UNUSED)] == []


def test_collection_constants_read_from_source_are_the_imported_ones() -> None:
    """``collection.constant`` (no import, what --help shows) agrees with the imported module, for
    every constant it finds in the files the controller reads that way."""
    for name in ("memcg", "ucx", "lease"):
        module = importlib.import_module(f"{collection.PACKAGE}.plugins.module_utils.{name}")
        constants = collection._constants(name)
        assert constants, name
        for key, value in constants.items():
            assert getattr(module, key) == value, (name, key)
    assert collection.constant("ucx", "FIXES") == {
        "rcache-bound": {"UCX_RCACHE_MAX_UNRELEASED": "1024"},
        "hooks-off": {"UCX_MEM_MMAP_HOOK_MODE": "none"},
    }
    with pytest.raises(FleetopsError, match="not a constant"):
        collection.constant("lease", "encode")


# ------------------------------------------------------------------------------ without the collection


@pytest.fixture(scope="module")
def no_collection(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An environment where ansible would find no fleetops.node: no checkout (FLEETOPS_COLLECTION_ROOT
    names an empty folder), no collections path, an empty home."""
    home = tmp_path_factory.mktemp("home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_COLLECTIONS_PATH")}
    pythonpath = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in pythonpath if not (Path(p) / "ansible_collections").exists()
    )
    env.update(HOME=str(home), FLEETOPS_COLLECTION_ROOT=str(home), COLUMNS="100")
    return env


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(FLEETOPS), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "fleetops")
def test_help_works_without_the_collection(no_collection: dict[str, str], command: list[str]) -> None:
    proc = _run(no_collection, *command, "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: fleetops"), proc.stdout
    assert proc.stderr == ""


def test_help_without_the_collection_leaves_its_defaults_out(no_collection: dict[str, str]) -> None:
    scan = _run(no_collection, "scan", "--help").stdout
    assert "default: the module's)" in " ".join(scan.split())  # not "the module's, 1000)"
    fix = " ".join(_run(no_collection, "remediate", "fix", "--help").stdout.split())
    assert "default: the module's (docs/guides/fixing.md: the UCX fix)" in fix


@pytest.mark.parametrize(
    "args",
    [
        ["scan"],
        ["scan", "-q", "--format", "json"],
        ["plan", "reboot"],
        ["remediate", "reboot", "--apply"],
        ["remediate", "reclaim", "--lease-ttl", "60"],  # an option's type needs the collection
        ["remediate", "reboot", "--break-lock", "20261129T170102Z-3fa9c1"],
        ["remediate", "auto"],
        ["drift"],
    ],
    ids=" ".join,
)
def test_a_command_without_the_collection_says_so_in_one_line(
    no_collection: dict[str, str], args: list[str]
) -> None:
    proc = _run(no_collection, *args)
    assert proc.returncode == 2, proc
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    # read from its source (a constant, a default) or imported (drift's first need of it): the same guidance
    assert re.match(r"fleetops: error: Failed to (read|load) ansible_collections\.fleetops\.node\.", lines[0])
    assert "the fleetops.node collection is not installed where ansible finds collections" in lines[0]
    assert "ANSIBLE_COLLECTIONS_PATH" in lines[0]
    assert proc.stdout == ""


def test_every_name_fleetops_api_lists_resolves_from_where_it_says() -> None:
    """The facade names its verbs three times (the TYPE_CHECKING imports for mypy, ``_LAZY`` for the runtime,
    ``__all__``): every listed and every lazy name resolves, each lazy one to its module's own object."""
    import fleetops.api as api

    for name in api.__all__:
        assert getattr(api, name) is not None, name
    for name, module in api._LAZY.items():
        assert getattr(api, name) is getattr(importlib.import_module(module), name), name
    assert set(api._LAZY) <= set(dir(api))
