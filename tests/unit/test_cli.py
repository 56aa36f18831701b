"""The CLI's usage errors: one clear line, exit 2, no traceback, nothing run."""

from __future__ import annotations

import pytest

from tests.helpers import fleetops


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["scan", "-i", "/nonexistent/inventory.yml"], "inventory not found: /nonexistent/inventory.yml"),
        (["scan", "--no-such-option"], "unrecognized arguments: --no-such-option"),
        (["scan", "--zombie-warning", "lots"], "--zombie-warning: not an integer: 'lots'"),
        (["scan", "--zombie-warning", "-5"], "--zombie-warning: must be >= 0: '-5'"),
        (["scan", "--headroom-critical", "120"], "--headroom-critical: must be between 0 and 100"),
        (["scan", "--sample-seconds", "x"], "--sample-seconds: not a number of seconds"),
        (
            ["scan", "--zombie-warning", "500", "--zombie-critical", "100"],
            "must not exceed --zombie-critical",
        ),
        (["scan", "--format", "xml"], "invalid choice: 'xml'"),
        (["no-such-command"], "invalid choice: 'no-such-command'"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args: list[str], needle: str) -> None:
    result = fleetops(*args, timeout=60)
    assert result.rc == 2, result
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert needle in lines[0]
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_help_lists_commands_and_exit_codes() -> None:
    result = fleetops("--help", timeout=60)
    assert result.rc == 0
    for word in ("scan", "lab", "Exit codes"):
        assert word in result.stdout
