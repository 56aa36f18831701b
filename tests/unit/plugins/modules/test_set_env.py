"""fleetops.node.set_env: validation, systemd quoting, the drop-in format, and refusals end to end.

That systemd reads the quoted values back exactly is proven on real systemd in
tests/integration/test_ucx_lab.py (the values reach the restarted process's environ).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.fleetops.node.plugins.modules import set_env
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers import run_module

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


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"1X": "a"}, "'1X' is not a valid variable name"),
        ({"A-B": "a"}, "'A-B' is not a valid variable name"),
        ({"": "a"}, "'' is not a valid variable name"),
        ({"A B": "a"}, "'A B' is not a valid variable name"),
        ({"A": "line\nbreak"}, "the value of A contains a newline"),
        ({"A": "cr\r"}, "the value of A contains a newline"),
        ({"A": "nel\x85"}, "the value of A contains a newline"),
        ({"A": "ls\u2028"}, "the value of A contains a newline"),
        ({"A": "c1\x9b"}, "the value of A contains the control character '\\x9b'"),
        ({"A": "nul\0"}, "the value of A contains a NUL character"),
        ({"A": "tab\t"}, "the value of A contains the control character '\\t'"),
        ({"A": "esc\x1b[0m"}, "the value of A contains the control character '\\x1b'"),
        ({"A": True}, "the value of A must be a string, got True (quote it)"),
        ({"A": None}, "the value of A must be a string, got None (quote it)"),
    ],
)
def test_invalid_input_is_refused(env: dict[str, Any], message: str) -> None:
    with pytest.raises(set_env.SetEnvError) as err:
        set_env.validate_env(env)
    assert str(err.value).startswith(message)


def test_numbers_become_strings() -> None:
    assert set_env.validate_env({"UCX_RCACHE_MAX_UNRELEASED": 1024}) == {"UCX_RCACHE_MAX_UNRELEASED": "1024"}


def test_quoting_for_systemd() -> None:
    assert (
        set_env.quote_assignment("UCX_MEM_MMAP_HOOK_MODE", "none")
        == 'Environment="UCX_MEM_MMAP_HOOK_MODE=none"\n'
    )
    # \ and " are C-escaped inside double quotes; % is a specifier; $ means nothing in Environment=
    assert set_env.quote_assignment("A", 'a\\b"c%d$e') == 'Environment="A=a\\\\b\\"c%%d$e"\n'


def test_render_and_parse_round_trip() -> None:
    text = set_env.render(TRICKY)
    assert text is not None
    assert text.startswith(set_env.HEADER + "[Service]\n")
    assert set_env.parse_drop_in(text) == TRICKY
    assert set_env.render({}) is None


@given(
    st.dictionaries(
        st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True),
        st.text(st.characters(blacklist_characters="\u2028\u2029", blacklist_categories=("Cc", "Cs"))),
        min_size=1,
        max_size=5,
    )
)
def test_any_valid_value_round_trips(env: dict[str, str]) -> None:
    assert set_env.parse_drop_in(set_env.render(set_env.validate_env(env)) or "") == env


@pytest.mark.parametrize(
    ("text", "balanced"),
    [('"a b"', True), ('"a\\"b"', True), ('"a', False), ("'a", False), ("\"a\" 'b'", True), ('"a\\', False)],
)
def test_quote_balance(text: str, balanced: bool) -> None:
    assert set_env._quotes_balanced(text) is balanced


def test_a_hand_edited_drop_in_with_broken_quotes_is_refused() -> None:
    with pytest.raises(set_env.SetEnvError, match="line 3: unbalanced quotes"):
        set_env.parse_drop_in('# x\n[Service]\nEnvironment="A=1\n')
    with pytest.raises(set_env.SetEnvError, match="line 2: expected KEY=VALUE"):
        set_env.parse_drop_in("[Service]\nnonsense\n")
    # other sections and keys are not ours to read
    assert set_env.parse_drop_in("[Unit]\nEnvironment=X=1\n[Service]\nEnvironment=A=1 B=2\nNice=5\n") == {
        "A": "1",
        "B": "2",
    }


def test_write_atomic_modes_and_no_leftovers(tmp_path: Path) -> None:
    old = os.umask(0o077)  # modes must not depend on the caller's umask
    try:
        path = tmp_path / "etc" / "vllm.service.d" / "50-fleetops-env.conf"
        set_env.write_atomic(str(path), "one\n")
        assert path.read_text() == "one\n"
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o755
        inode = path.stat().st_ino
        set_env.write_atomic(str(path), "two\n")
        assert path.read_text() == "two\n"
        assert path.stat().st_ino != inode  # replaced by a rename, never rewritten in place
        assert sorted(p.name for p in path.parent.iterdir()) == ["50-fleetops-env.conf"]
    finally:
        os.umask(old)


# ---------------------------------------------------------------------------------------------
# End to end: ansible runs the module on this machine (its PID 1 is not systemd)
# ---------------------------------------------------------------------------------------------


def run_adhoc(tmp_path: Path, args: dict[str, Any], *extra: str) -> tuple[int, dict[str, Any]]:
    return run_module(tmp_path, "fleetops.node.set_env", json.dumps(args), *extra)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"name": "vllm;reboot", "env": {"A": "1"}}, "is not a valid systemd unit name"),
        ({"name": "vllm.socket", "env": {"A": "1"}}, "only services take Environment= drop-ins"),
        ({"name": "vllm", "env": {"A": "x\ny"}}, "the value of A contains a newline"),
        ({"name": "vllm", "env": {"9A": "1"}}, "'9A' is not a valid variable name"),
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


def test_cli_needs_key_value_pairs() -> None:
    from tests.helpers import fleetops

    result = fleetops("remediate", "set-env", "--unit", "vllm", "--env", "NOEQUALS")
    assert result.rc == 2
    assert "expected KEY=VALUE, got 'NOEQUALS'" in result.stderr
    result = fleetops("remediate", "set-env", "--unit", "vllm")
    assert result.rc == 2
    assert "--env" in result.stderr
