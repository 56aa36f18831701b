"""`fleetops plan`: through the real cli.main (its error handling), with a parser built by register()."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from fleetops.cli import app as cli
from fleetops.cli.plan import SCHEMA, register

INVENTORY = """\
all:
  vars:
    ansible_connection: local
  children:
    gpu:
      hosts:
        gpu-a1: {ec2_az: us-east-1a, rack: r1}
        gpu-a2: {ec2_az: us-east-1a, rack: r1}
        gpu-a10: {ec2_az: us-east-1a, rack: r2}
        gpu-b1: {ec2_az: us-east-1b, rack: r2}
        gpu-b2: {ec2_az: us-east-1b, rack: r2}
        gpu-c1: {ec2_az: us-east-1c, rack: r3}
        spare-1: {}
"""


def build_parser() -> argparse.ArgumentParser:
    """What fleetops.cli.build_parser does for subcommands, with only `plan` registered."""
    parser = cli._Parser(prog="fleetops")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=cli._Parser)
    sub.required = True
    register(sub)
    return parser


def _registers_plan(parser: argparse.ArgumentParser) -> bool:
    return any(
        isinstance(action, argparse._SubParsersAction) and "plan" in action.choices
        for action in parser._actions
    )


@pytest.fixture(autouse=True)
def plan_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real build_parser once it registers `plan`; until then, this module's."""
    try:
        wired = _registers_plan(cli.build_parser())
    except ImportError:
        wired = False
    if not wired:
        monkeypatch.setattr(cli, "build_parser", build_parser)


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.yml"
    path.write_text(INVENTORY)
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        rc = cli.main(list(argv))
    except SystemExit as exc:  # argparse errors and --help
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def plan_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    rc, out, err = run(capsys, "plan", *argv, "--format", "json")
    assert rc == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


def test_json_contract(capsys: pytest.CaptureFixture[str], inventory: Path) -> None:
    doc = plan_json(capsys, "reboot", "-i", str(inventory), "--max-parallel", "3", "--exclude", "gpu-b2")
    assert doc["schema"] == SCHEMA == "fleetops.plan/v1"
    assert doc["action"] == "reboot"
    assert doc["batches"] == [
        ["gpu-a1"],  # the canary
        ["gpu-a2", "gpu-b1", "gpu-c1"],
        ["gpu-a10", "spare-1"],
    ]
    assert all(isinstance(h, str) for batch in doc["batches"] for h in batch)
    assert doc["excluded"] == ["gpu-b2"]
    assert doc["caps"] == {"max_parallel": "3", "max_parallel_hosts": 3, "per_group_max": 1, "canary": 1}
    assert doc["lower_bound"] == 3
    assert doc["groups"] == {
        "us-east-1a": ["gpu-a1", "gpu-a2", "gpu-a10"],
        "us-east-1b": ["gpu-b1"],
        "us-east-1c": ["gpu-c1"],
        "ungrouped": ["spare-1"],
    }
    assert doc["group_by"] == "ec2_az|fleetops_az"
    assert doc["hosts"] == 6
    assert doc["notes"] == ["1 host(s) have no group key: planned as group 'ungrouped'"]


def test_defaults_ten_percent_one_per_group_canary_one(
    capsys: pytest.CaptureFixture[str], inventory: Path
) -> None:
    doc = plan_json(capsys, "disable-unit", "-i", str(inventory))
    assert doc["caps"] == {"max_parallel": "10%", "max_parallel_hosts": 1, "per_group_max": 1, "canary": 1}
    assert len(doc["batches"]) == doc["lower_bound"] == 7


def test_caps_canary_group_by_and_limit(capsys: pytest.CaptureFixture[str], inventory: Path) -> None:
    doc = plan_json(
        capsys,
        "set-env",
        "-i",
        str(inventory),
        "--limit",
        "gpu-*:!spare-*",
        "--group-by",
        "rack",
        "--max-parallel",
        "50%",
        "--per-group-max",
        "none",
        "--canary",
        "2",
        "--exclude",
        "gpu-c*",
        "--exclude",
        "gpu-a10",
    )
    assert doc["excluded"] == ["gpu-a10", "gpu-c1"]
    assert doc["caps"]["max_parallel_hosts"] == 2  # 50% of the 4 hosts left
    assert doc["caps"]["per_group_max"] is None
    assert doc["groups"] == {"r1": ["gpu-a1", "gpu-a2"], "r2": ["gpu-b1", "gpu-b2"]}
    assert doc["batches"] == [["gpu-a1", "gpu-b1"], ["gpu-a2", "gpu-b2"]]
    assert doc["group_by"] == "rack"


def test_table_output(
    capsys: pytest.CaptureFixture[str], inventory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps at 80 columns when not on a terminal
    rc, out, err = run(
        capsys, "plan", "reboot", "-i", str(inventory), "--max-parallel", "3", "--exclude", "gpu-b2"
    )
    assert rc == 0, err
    assert "Plan for reboot: 6 host(s) in 3 batch(es) (fewest possible: 3)" in out
    assert "max parallel 3 = 3 host(s), per group 1, canary 1" in out
    assert "note: 1 host(s) have no group key: planned as group 'ungrouped'" in out
    assert "excluded (1): gpu-b2" in out
    assert "1 (canary)" in out
    assert "us-east-1a:1 us-east-1b:1 us-east-1c:1" in out
    assert err == ""


def test_everything_excluded(capsys: pytest.CaptureFixture[str], inventory: Path) -> None:
    rc, out, _ = run(capsys, "plan", "reboot", "-i", str(inventory), "--exclude", "*")
    assert rc == 0
    assert "nothing to do" in out


def test_default_inventory_is_localhost(capsys: pytest.CaptureFixture[str]) -> None:
    doc = plan_json(capsys, "reboot")
    assert doc["batches"] == [["localhost"]]
    assert doc["groups"] == {"ungrouped": ["localhost"]}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--max-parallel", "0"], "argument --max-parallel: max parallel must be at least 1 host, got 0"),
        (
            ["--max-parallel", "150%"],
            "argument --max-parallel: max parallel must be more than 0% and at most 100%",
        ),
        (["--max-parallel", "lots"], "argument --max-parallel: not a host count or a percentage"),
        (["--per-group-max", "0"], "argument --per-group-max: must be at least 1 (or 'none'): '0'"),
        (["--per-group-max", "x"], "argument --per-group-max: not an integer: 'x'"),
        (["--canary", "x"], "argument --canary: not an integer: 'x'"),
        (["--canary", "-1"], "canary must be 0 or more hosts, got -1"),
        (["--canary", "4", "--max-parallel", "3"], "canary (4) is larger than the global cap (3 host(s)"),
        (
            ["--canary", "5", "--max-parallel", "9"],
            "canary (5) cannot be met: at most 1 per group over 4 group(s)",
        ),
        (["--exclude", "gpu-z9"], "--exclude matches no targeted host: gpu-z9"),
        (["--limit", "nothing-here"], "--limit 'nothing-here' matches no host: nothing to do"),
        (["--format", "xml"], "invalid choice: 'xml'"),
        (["--group-by", "bad_az"], None),  # not an error: everything is ungrouped
    ],
)
def test_usage_errors_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], inventory: Path, args: list[str], needle: str | None
) -> None:
    rc, out, err = run(capsys, "plan", "reboot", "-i", str(inventory), *args)
    if needle is None:
        assert rc == 0, err
        return
    assert rc == 2, (out, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert needle in lines[0]
    assert out == ""


def test_missing_inventory_and_missing_action(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, out, err = run(capsys, "plan", "reboot", "-i", str(tmp_path / "nope.yml"))
    assert (rc, out) == (2, "")
    assert err.strip() == f"fleetops: error: inventory not found: {tmp_path / 'nope.yml'}"
    rc, out, err = run(capsys, "plan")
    assert (rc, out) == (2, "")
    assert "the following arguments are required: ACTION" in err
    assert len(err.strip().splitlines()) == 1


def _fleet(tmp_path: Path, per_az: dict[str, int], extra: str = "") -> Path:
    """A YAML inventory of ``n`` hosts per AZ (gpu-<az letter>-<i>), with ``extra`` hosts lines."""
    lines = ["all:", "  vars:", "    ansible_connection: local", "  hosts:"]
    for az, n in per_az.items():
        lines += [f"    gpu-{az[-1]}-{i}: {{ec2_az: {az}}}" for i in range(1, n + 1)]
    path = tmp_path / "fleet.yml"
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


def test_a_fleet_sized_plan_says_what_sets_its_length_and_summarises_its_batches(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3,000 hosts over two AZs at one host per AZ a batch: 1,500 batches. The summary comes first and
    names the per-group cap and the largest group; the longest duration is the action's host timeout
    and cooldown per batch; the table shows the first and last batches and counts the rest, and --all
    lists every batch."""
    from fleetops.remediations import REMEDIATIONS

    monkeypatch.setenv("COLUMNS", "200")
    fleet = _fleet(tmp_path, {"us-east-1a": 1600, "us-east-1b": 1400})
    rc, out, err = run(capsys, "plan", "reboot", "-i", str(fleet))
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0] == "Plan for reboot: 3,000 host(s) in 1,600 batch(es) (fewest possible: 1,600)"
    assert lines[1].startswith(
        "1 canary batch, then 1,599 batch(es) set by --per-group-max 1: the largest group, "
    )
    assert (
        "us-east-1a, has 1,599 host(s) left" in lines[1] and "--max-parallel alone would allow 10" in lines[1]
    )
    reboot = REMEDIATIONS["reboot"]
    worst = 1600 * reboot.host_timeout + 1599 * reboot.cooldown
    days, hours = divmod(round(worst) // 3600, 24)
    assert lines[2].startswith(f"duration: at most about {days}d{hours:02d}h at the action's defaults"), (
        lines[2]
    )
    assert f"1,600 batch(es) x --host-timeout {reboot.host_timeout} s + 1,599 x --cooldown" in lines[2]
    assert len(lines) < 100, len(lines)  # not a 1,600-row table
    assert "1,565 more batches" in out and "26-1590" in out
    assert "summarised: 1,600 batches (more than 50); --all lists every batch" in out
    assert " 1600 " in out  # the last batch is shown
    rc, everything, _ = run(capsys, "plan", "reboot", "-i", str(fleet), "--all")
    assert rc == 0 and "more batches" not in everything
    assert all(f" {n} " in everything for n in (26, 800, 1590))


def test_wide_batches_name_their_first_hosts_and_count_the_rest(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """3,000 hosts in 25 batches of up to 150 (5%, 50 per AZ), printed to a pipe: a row a batch, its first
    hosts named and the rest counted (each batch's hosts in full made a 1,510-line table), wide as the scan's
    table off a terminal; --all names every host."""
    fleet = _fleet(tmp_path, {"us-east-1a": 1200, "us-east-1b": 1000, "us-east-1c": 800})
    argv = ["plan", "reboot", "-i", str(fleet), "--max-parallel", "5%", "--per-group-max", "50"]
    rc, out, err = run(capsys, *argv)
    assert rc == 0, err
    assert out.splitlines()[0] == "Plan for reboot: 3,000 host(s) in 25 batch(es) (fewest possible: 25)"
    assert len(out.splitlines()) < 40, out
    rows = [line for line in out.splitlines() if line.startswith("│") and "us-east-1" in line]
    assert len(rows) == 25, out  # one line a batch
    assert rows[1].rstrip(" │").endswith("... and 144 more"), rows[1]
    assert "each batch names its first 6 hosts; --all names every host" in out
    rc, everything, _ = run(capsys, *argv, "--all")
    assert rc == 0 and "more" not in everything
    assert all(f"gpu-{z}-{n}" in everything for z, n in (("a", 1200), ("b", 1000), ("c", 800)))


def test_a_plan_set_by_max_parallel_says_so_and_markup_in_names_is_shown_as_written(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    fleet = _fleet(tmp_path, {"us-east-1a": 5, "us-east-1b": 5}, '    odd: {ec2_az: "[red]z"}\n')
    rc, out, err = run(
        capsys, "plan", "reboot", "-i", str(fleet), "--per-group-max", "none", "--max-parallel", "3"
    )
    assert rc == 0, err
    assert (
        "1 canary batch, then 4 batch(es) set by --max-parallel 3 (3 host(s) a batch) over 10 host(s)" in out
    )
    assert "[red]z (1)" in out and "[red]z:1" in out  # a group name (a tag's value) is data, not markup
