"""fleetops.node.set_env: validation, systemd quoting, the drop-in format, what it decides and does
with a drop-in directory, secrets, and refusals end to end.

``EnvDropIn`` runs in-process against a temporary unit directory; its ``systemctl`` is a stand-in that
replays ``systemctl show`` output captured on a lab host (tests/unit/fixtures/systemd_identity): this
machine has no systemd. That systemd reads the quoted values back exactly, that a secret stays out of
what ansible prints and logs, and that a ``systemctl edit`` override survives, is proven on real
systemd in tests/integration/test_ucx_lab.py and tests/integration/test_protected_units_lab.py.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testing import patch_module_args
from ansible_collections.fleetops.node.plugins.module_utils import systemd
from ansible_collections.fleetops.node.plugins.modules import set_env
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers import run_module
from tests.paths import FIXTURES

TRICKY = {
    "SPACES": "x y  z",
    "DQUOTE": 'q"uote',
    "BACKSLASH": "back\\slash",
    "DOLLAR": "dollar$HOME ${PATH}",
    "PERCENT": "per%cent %n %%",
    "SINGLE": "it's 'single'",
    "EMPTY": "",
    "EDGES": " lead and trail ",
    "SHELL": "$(rm -rf /); `id` | tee",
    "UNICODE": "ünïcødé ✓",
    "ESCAPED_QUOTE": '\\"',
}
SECRET = "s3cr3t-value"
# what the captured unit's drop-in set (show-env-running.txt)
CAPTURED_ENV = {"UCX_MEM_MMAP_HOOK_MODE": "none", "TRICKY": "a b\\c"}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"1X": "a"}, "'1X' is not a valid variable name"),
        ({"A-B": "a"}, "'A-B' is not a valid variable name"),
        ({"": "a"}, "'' is not a valid variable name"),
        ({"A B": "a"}, "'A B' is not a valid variable name"),
        ({"UCX_X\n": "a"}, "'UCX_X\\n' is not a valid variable name"),
        ({"A": "line\nbreak"}, "the value of A contains a newline"),
        ({"A": "cr\r"}, "the value of A contains a newline"),
        ({"A": "nel\x85"}, "the value of A contains a newline"),
        ({"A": "ls\u2028"}, "the value of A contains a newline"),
        ({"A": "c1\x9b"}, "the value of A contains the control character '\\x9b'"),
        ({"A": "nul\0"}, "the value of A contains a NUL character"),
        ({"A": "tab\t"}, "the value of A contains the control character '\\t'"),
        ({"A": "esc\x1b[0m"}, "the value of A contains the control character '\\x1b'"),
        ({"A": True}, "the value of A must be a string, got bool (quote it)"),
        ({"A": None}, "the value of A must be a string, got NoneType (quote it)"),
    ],
)
def test_invalid_input_is_refused(env: dict[str, Any], message: str) -> None:
    with pytest.raises(systemd.DropInError) as err:
        systemd.validate_env(env)
    assert str(err.value).startswith(message)


def test_numbers_become_strings() -> None:
    assert systemd.validate_env({"UCX_RCACHE_MAX_UNRELEASED": 1024}) == {"UCX_RCACHE_MAX_UNRELEASED": "1024"}


def test_quoting_for_systemd() -> None:
    assert (
        systemd.quote_assignment("UCX_MEM_MMAP_HOOK_MODE", "none")
        == 'Environment="UCX_MEM_MMAP_HOOK_MODE=none"\n'
    )
    # \ and " are C-escaped inside double quotes; % is a specifier; $ means nothing in Environment=
    assert systemd.quote_assignment("A", 'a\\b"c%d$e') == 'Environment="A=a\\\\b\\"c%%d$e"\n'


def test_render_and_parse_round_trip() -> None:
    text = systemd.render_env_drop_in(TRICKY, set_env.HEADER)
    assert text is not None
    assert text.startswith(set_env.HEADER + "[Service]\n")
    assert systemd.parse_drop_in(text) == (TRICKY, [])
    assert systemd.render_env_drop_in({}, set_env.HEADER) is None


@given(
    st.dictionaries(
        st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True),
        st.text(st.characters(blacklist_characters="\u2028\u2029", blacklist_categories=("Cc", "Cs"))),
        min_size=1,
        max_size=5,
    )
)
def test_any_valid_value_round_trips(env: dict[str, str]) -> None:
    text = systemd.render_env_drop_in(systemd.validate_env(env), set_env.HEADER) or ""
    assert systemd.parse_drop_in(text) == (env, [])


@pytest.mark.parametrize(
    ("text", "balanced"),
    [('"a b"', True), ('"a\\"b"', True), ('"a', False), ("'a", False), ("\"a\" 'b'", True), ('"a\\', False)],
)
def test_quote_balance(text: str, balanced: bool) -> None:
    assert systemd._quotes_balanced(text) is balanced


def test_a_hand_edited_drop_in_with_broken_quotes_is_refused() -> None:
    with pytest.raises(systemd.DropInError, match="line 3: unbalanced quotes"):
        systemd.parse_drop_in('# x\n[Service]\nEnvironment="A=1\n')
    with pytest.raises(systemd.DropInError, match="line 2: expected KEY=VALUE"):
        systemd.parse_drop_in("[Service]\nnonsense\n")
    # other sections and keys are not ours to read, but they are named
    assert systemd.parse_drop_in("[Unit]\nEnvironment=X=1\n[Service]\nEnvironment=A=1 B=2\nNice=5\n") == (
        {"A": "1", "B": "2"},
        ["line 1: [Unit]", "line 2: Environment=", "line 5: Nice="],
    )


def ansible_module(tmp_path: Path) -> AnsibleModule:
    """A real AnsibleModule, in-process: its tmpdir and atomic_move are what write_file uses."""
    module_tmp = tmp_path / "module-tmp"
    module_tmp.mkdir(exist_ok=True)
    with patch_module_args({"_ansible_tmpdir": str(module_tmp), "_ansible_no_log": True}):
        return AnsibleModule(argument_spec={})


def test_write_file_modes_and_no_leftovers(tmp_path: Path) -> None:
    module = ansible_module(tmp_path)
    old = os.umask(0o077)  # modes must not depend on the caller's umask
    try:
        path = tmp_path / "etc" / "vllm.service.d" / "50-fleetops-env.conf"
        set_env.write_file(module, str(path), "one\n")
        assert path.read_text() == "one\n"
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o755
        inode = path.stat().st_ino
        path.chmod(0o600)  # atomic_move keeps the old file's mode: write_file sets it again
        set_env.write_file(module, str(path), "two\n")
        assert path.read_text() == "two\n"
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
        assert path.stat().st_ino != inode  # replaced by a rename, never rewritten in place
        assert sorted(p.name for p in path.parent.iterdir()) == ["50-fleetops-env.conf"]
        assert list((tmp_path / "module-tmp").iterdir()) == []
    finally:
        os.umask(old)


def test_write_file_never_follows_a_link_planted_at_the_temporary_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = ansible_module(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    path = tmp_path / "unit.d" / "50-fleetops-env.conf"
    path.parent.mkdir()
    planted = tmp_path / "module-tmp" / ".50-fleetops-env.conf.planted.tmp"
    planted.symlink_to(victim)
    names = iter(["planted", "planted", "free"])
    monkeypatch.setattr(tempfile, "_get_candidate_names", lambda: names)
    set_env.write_file(module, str(path), "new\n")
    assert victim.read_text() == "keep\n"
    assert path.read_text() == "new\n"
    assert stat.S_IMODE(path.lstat().st_mode) == 0o644
    assert [p.name for p in (tmp_path / "module-tmp").iterdir()] == [planted.name]


def test_write_file_gives_up_when_every_temporary_name_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = ansible_module(tmp_path)
    (tmp_path / "module-tmp" / ".x.conf.same.tmp").write_text("")

    def same() -> Iterator[str]:
        while True:
            yield "same"

    monkeypatch.setattr(tempfile, "_get_candidate_names", same)
    with pytest.raises(OSError):
        set_env.write_file(module, str(tmp_path / "x.conf"), "new\n")
    assert not (tmp_path / "x.conf").exists()


# ---------------------------------------------------------------------------------------------
# EnvDropIn in-process: decide, then act, on a temporary unit directory
# ---------------------------------------------------------------------------------------------


class FakeSystemctl:
    """Replays captured ``systemctl show`` output; records every command (a stand-in: no systemd here)."""

    def __init__(self, show: str = "show-env-running.txt") -> None:
        self.show = (FIXTURES / "systemd_identity" / show).read_text()
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> tuple[int, str, str]:
        self.calls.append(argv)
        return 0, self.show if argv[1] == "show" else "", ""

    def verbs(self) -> list[str]:
        return [argv[1] for argv in self.calls]


def params(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = dict(
        name="vllm-decode", env=dict(CAPTURED_ENV), exclusive=False, state="present", restart=False,
        drop_in="50-fleetops-env.conf", show_values=False,
    )  # fmt: skip
    base.update(overrides)
    return base


def drop_in(tmp_path: Path, run: FakeSystemctl, **overrides: Any) -> set_env.EnvDropIn:
    proc = tmp_path / "proc"
    (proc / "76").mkdir(parents=True, exist_ok=True)
    if not (proc / "76" / "environ").exists():
        (proc / "76" / "environ").write_bytes(b"PATH=/usr/bin\0UCX_MEM_MMAP_HOOK_MODE=none\0TRICKY=a b\\c\0")
    module = ansible_module(tmp_path)
    return set_env.EnvDropIn(
        run,
        lambda path, text: set_env.write_file(module, path, text),
        params(**overrides),
        unit_dir=str(tmp_path / "units"),
        proc=str(proc),
    )


def test_decide_digests_values_and_names_what_changes(tmp_path: Path) -> None:
    run = FakeSystemctl()
    env = dict(CAPTURED_ENV, TOKEN=SECRET, ONE="1")
    planner = drop_in(tmp_path, run, env=env)
    result = planner.decide()
    path = str(tmp_path / "units" / "vllm-decode.service.d" / "50-fleetops-env.conf")
    assert result["unit"] == "vllm-decode.service" and result["names"] == ["vllm-decode.service"]
    assert result["path"] == path
    assert result["actions"] == [f"write {path}", "daemon-reload"]
    assert result["changed_vars"] == ["ONE", "TOKEN", "TRICKY", "UCX_MEM_MMAP_HOOK_MODE"]
    assert result["removed_vars"] == []
    assert result["env_after"] == {k: systemd.digest_value(v) for k, v in env.items()}
    assert result["values_shown"] is False
    diff = planner.diff()
    text = json.dumps([result, diff])
    for value in (SECRET, "a b", "none"):
        assert value not in text
    assert f'Environment="TOKEN={systemd.digest_value(SECRET)}"' in diff["after"]
    assert run.verbs() == ["show"]  # deciding reads only
    assert not os.path.exists(path)


def test_show_values_shows_them(tmp_path: Path) -> None:
    result = drop_in(tmp_path, FakeSystemctl(), env={"A": "1"}, show_values=True).decide()
    assert result["env_after"] == {"A": "1"} and result["values_shown"] is True


def test_act_writes_reloads_checks_and_is_idempotent(tmp_path: Path) -> None:
    run = FakeSystemctl()
    planner = drop_in(tmp_path, run)
    assert planner.decide()["changed"] is True
    planner.act()
    path = tmp_path / "units" / "vllm-decode.service.d" / "50-fleetops-env.conf"
    assert path.read_text() == set_env.HEADER + '[Service]\nEnvironment="UCX_MEM_MMAP_HOOK_MODE=none"\n' + (
        'Environment="TRICKY=a b\\\\c"\n'
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert run.verbs() == ["show", "daemon-reload", "show"]
    again = drop_in(tmp_path, FakeSystemctl()).decide()
    assert again["changed"] is False and again["actions"] == [] and again["changed_vars"] == []


def test_a_later_drop_in_that_wins_is_an_error_without_the_value(tmp_path: Path) -> None:
    planner = drop_in(tmp_path, FakeSystemctl(), env={"UCX_MEM_MMAP_HOOK_MODE": "reloc"})
    planner.decide()
    with pytest.raises(set_env.SetEnvError) as err:
        planner.act()  # systemd (the capture) still sees none
    message = str(err.value)
    assert message.startswith(
        "Failed to set the environment of vllm-decode.service: systemd sees, after the reload"
    )
    assert f"UCX_MEM_MMAP_HOOK_MODE={systemd.digest_value('none')}" in message
    assert "reloc" not in message and "=none" not in message


def test_restart_when_the_process_lacks_the_values(tmp_path: Path) -> None:
    env = {"UCX_MEM_MMAP_HOOK_MODE": "none"}
    first = drop_in(tmp_path, FakeSystemctl(), env=env)
    first.decide()
    first.act()
    # the file is right and the process has the value: nothing to do
    assert drop_in(tmp_path, FakeSystemctl(), env=env, restart=True).decide()["actions"] == []
    (tmp_path / "proc" / "76" / "environ").write_bytes(b"PATH=/usr/bin\0")
    assert drop_in(tmp_path, FakeSystemctl(), env=env, restart=True).decide()["actions"] == ["try-restart"]


def test_exclusive_and_absent(tmp_path: Path) -> None:
    first = drop_in(tmp_path, FakeSystemctl())
    first.decide()
    first.act()
    exclusive = drop_in(
        tmp_path, FakeSystemctl(), env={"UCX_MEM_MMAP_HOOK_MODE": "none"}, exclusive=True
    ).decide()
    assert exclusive["removed_vars"] == ["TRICKY"] and exclusive["changed_vars"] == []
    absent = drop_in(tmp_path, FakeSystemctl(), env=None, state="absent")
    result = absent.decide()
    assert result["actions"][0].startswith("remove ") and result["removed_vars"] == [
        "TRICKY",
        "UCX_MEM_MMAP_HOOK_MODE",
    ]


OVERRIDE = "[Service]\nExecStart=\nExecStart=/usr/bin/vllm serve\nLimitNOFILE=1048576\nEnvironment=A=1\n"


def test_a_systemctl_edit_override_is_not_rewritten(tmp_path: Path) -> None:
    unit_dir = tmp_path / "units" / "vllm-decode.service.d"
    unit_dir.mkdir(parents=True)
    (unit_dir / "override.conf").write_text(OVERRIDE)
    run = FakeSystemctl()
    for overrides in ({}, {"state": "absent", "env": None}, {"exclusive": True}):
        with pytest.raises(set_env.SetEnvError) as err:
            drop_in(tmp_path, run, drop_in="override.conf", **overrides).decide()
        assert str(err.value) == (
            f"Failed to set the environment of vllm-decode.service: {unit_dir}/override.conf was not written by "
            "fleetops and holds more than Environment= lines (line 2: ExecStart=, line 3: ExecStart=, line 4: "
            "LimitNOFILE=); it is left as it is: choose another drop_in"
        )
    assert (unit_dir / "override.conf").read_text() == OVERRIDE
    assert set(run.verbs()) == {"show"}


def test_a_foreign_drop_in_of_only_environment_lines_is_taken_over(tmp_path: Path) -> None:
    unit_dir = tmp_path / "units" / "vllm-decode.service.d"
    unit_dir.mkdir(parents=True)
    (unit_dir / "override.conf").write_text('# mine\n[Service]\nEnvironment="TRICKY=a b\\\\c"\n\n')
    planner = drop_in(
        tmp_path, FakeSystemctl(), drop_in="override.conf", env={"UCX_MEM_MMAP_HOOK_MODE": "none"}
    )
    result = planner.decide()
    assert result["changed_vars"] == ["UCX_MEM_MMAP_HOOK_MODE"] and result["env_before"] == {
        "TRICKY": systemd.digest_value("a b\\c")
    }
    planner.act()
    assert (unit_dir / "override.conf").read_text().startswith(set_env.HEADER)


def test_our_own_drop_in_with_extra_lines_is_rewritten(tmp_path: Path) -> None:
    unit_dir = tmp_path / "units" / "vllm-decode.service.d"
    unit_dir.mkdir(parents=True)
    (unit_dir / "50-fleetops-env.conf").write_text(set_env.HEADER + "[Service]\nNice=5\nEnvironment=A=1\n")
    assert drop_in(tmp_path, FakeSystemctl()).decide()["changed"] is True


def test_links_are_refused(tmp_path: Path) -> None:
    unit_dir = tmp_path / "units" / "vllm-decode.service.d"
    unit_dir.mkdir(parents=True)
    (tmp_path / "elsewhere.conf").write_text("")
    (unit_dir / "50-fleetops-env.conf").symlink_to(tmp_path / "elsewhere.conf")
    with pytest.raises(
        set_env.SetEnvError, match="is a symbolic link; fleetops does not write through or over links"
    ):
        drop_in(tmp_path, FakeSystemctl()).decide()


@pytest.mark.parametrize("planted", ["drop-in", "directory"])
def test_a_link_planted_after_deciding_is_refused_before_writing(tmp_path: Path, planted: str) -> None:
    unit_dir = tmp_path / "units" / "vllm-decode.service.d"
    run = FakeSystemctl()
    planner = drop_in(tmp_path, run)
    planner.decide()
    victim_dir = tmp_path / "elsewhere"
    victim_dir.mkdir()
    victim = victim_dir / "50-fleetops-env.conf"
    victim.write_text("keep\n")
    if planted == "drop-in":
        unit_dir.mkdir(parents=True)
        (unit_dir / "50-fleetops-env.conf").symlink_to(victim)
        link = unit_dir / "50-fleetops-env.conf"
    else:
        unit_dir.parent.mkdir(parents=True)
        unit_dir.symlink_to(victim_dir)
        link = unit_dir
    with pytest.raises(set_env.SetEnvError) as err:
        planner.act()
    assert str(err.value) == (
        f"Failed to set the environment of vllm-decode.service: {link} is a symbolic link; fleetops does not "
        "write through or over links"
    )
    assert victim.read_text() == "keep\n" and link.is_symlink()
    assert run.verbs() == ["show"]


def test_a_failed_move_is_a_failure_to_write(tmp_path: Path) -> None:
    unit_dir = tmp_path / "units" / "vllm-decode.service.d"
    run = FakeSystemctl()
    planner = drop_in(tmp_path, run)
    planner.decide()
    (unit_dir / "50-fleetops-env.conf").mkdir(parents=True)  # rename(2) cannot replace a directory
    with pytest.raises(set_env.SetEnvError) as err:
        planner.act()
    path = unit_dir / "50-fleetops-env.conf"
    # atomic_move's own message, with the OSError it chained
    assert re.fullmatch(
        re.escape(f"Failed to write drop-in {path}: Could not replace '{path}' with '{tmp_path}/module-tmp/")
        + r"\.50-fleetops-env\.conf\.\w+\.tmp'\. \(\[Errno 21\] Is a directory: .*\)",
        str(err.value),
    )
    assert run.verbs() == ["show"]
    assert list((tmp_path / "module-tmp").iterdir()) == []


@pytest.mark.parametrize(
    ("overrides", "show", "message"),
    [
        ({"name": "no-such-h3"}, "show-env-missing.txt", "no-such-h3.service: no such unit on this host"),
        (
            {"name": "vllm.socket"},
            "show-env-running.txt",
            "vllm.socket: only services take Environment= drop-ins",
        ),
        ({"name": "-x"}, "show-env-running.txt", "a unit: '-x' starts with '-'"),
        ({"drop_in": "x.conf\n"}, "show-env-running.txt", "drop_in 'x.conf\\n' must be a plain file name"),
    ],
)
def test_refusals_run_nothing(tmp_path: Path, overrides: dict[str, Any], show: str, message: str) -> None:
    run = FakeSystemctl(show)
    with pytest.raises(set_env.SetEnvError) as err:
        drop_in(tmp_path, run, **overrides).decide()
    assert message in str(err.value)
    assert set(run.verbs()) <= {"show"}
    assert not (tmp_path / "units").exists()


# ---------------------------------------------------------------------------------------------
# End to end: ansible runs the module on this machine (its PID 1 is not systemd)
# ---------------------------------------------------------------------------------------------


def run_adhoc(tmp_path: Path, args: dict[str, Any], *extra: str) -> tuple[int, dict[str, Any]]:
    return run_module(tmp_path, "fleetops.node.set_env", json.dumps(args), *extra)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"name": "vllm;reboot", "env": {"A": "1"}}, "is not a valid systemd unit name"),
        ({"name": "--now", "env": {"A": "1"}}, "starts with '-'"),
        ({"name": "vllm.socket", "env": {"A": "1"}}, "only services take Environment= drop-ins"),
        ({"name": "vllm", "env": {"A": "x\ny"}}, "the value of A contains a newline"),
        ({"name": "vllm", "env": {"9A": "1"}}, "'9A' is not a valid variable name"),
        ({"name": "vllm", "env": {"UCX_X\n": "1"}}, "'UCX_X\\n' is not a valid variable name"),
        (
            {"name": "vllm", "env": {"A": "1"}, "drop_in": "../evil.conf"},
            "must be a plain file name ending in .conf",
        ),
        ({"name": "vllm"}, "state is present but all of the following are missing: env"),
        ({"name": "vllm", "env": {}}, "env is empty"),
    ],
)
def test_refusals_end_to_end(tmp_path: Path, args: dict[str, Any], message: str) -> None:
    rc, result = run_adhoc(tmp_path, args)
    assert rc != 0
    assert message in result["msg"]
    assert "changed" not in result or result["changed"] is False


@pytest.mark.skipif(
    os.path.isdir("/run/systemd/system"),
    reason="needs a host without systemd: this machine runs systemd as PID 1",
)
def test_a_host_without_systemd_is_a_clear_error(tmp_path: Path) -> None:
    rc, result = run_adhoc(tmp_path, {"name": "vllm", "env": {"UCX_MEM_MMAP_HOOK_MODE": "none"}}, "--check")
    assert rc != 0
    assert result["msg"] == "Failed to set the environment of vllm.service: this host is not running systemd"


@pytest.mark.parametrize("value", [SECRET, SECRET + "\n", "1"])
def test_values_stay_out_of_what_ansible_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("ANSIBLE_INJECT_INVOCATION", "1")
    rc, result = run_adhoc(tmp_path, {"name": "vllm1", "env": {"TOKEN": value}}, "-vvv", "--diff")
    assert rc != 0  # refused (newline) or no systemd here: either way the result must not carry the value
    module_args = result["invocation"]["module_args"]
    assert module_args["env"] == {"TOKEN": systemd.digest_value(value)}
    if value == "1":  # ansible's own no_log masking would have garbled every "1" in the result
        assert module_args["name"] == "vllm1"
        assert "********" not in json.dumps(result)
    else:
        assert SECRET not in json.dumps(result)


def test_cli_needs_key_value_pairs() -> None:
    from tests.helpers import fleetops

    result = fleetops("remediate", "set-env", "--unit", "vllm", "--env", "NOEQUALS")
    assert result.rc == 2
    assert "expected KEY=VALUE, got 'NOEQUALS'" in result.stderr
    result = fleetops("remediate", "set-env", "--unit", "vllm")
    assert result.rc == 2
    assert "--env" in result.stderr
