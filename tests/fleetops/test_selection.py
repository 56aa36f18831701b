"""A selection never grows (design §5, issue 38 item 9): through the real CLI and the real ansible-inventory,
a blank limit, or one of which a part matches no host (a typo, a group without hosts, an exclusion of
nothing), is refused by every command that acts or plans, exit 2 in one line naming the parts, before
anything runs: no rollout file, no state, no audit. ``fleetops scan`` keeps ansible's behaviour for such
parts, and says so on stderr and in its report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetops.ansible.inventory import load_targets, unmatched_parts
from fleetops.cli import app as cli
from fleetops.errors import UsageError

INVENTORY = """\
all:
  vars:
    ansible_connection: local
    ansible_python_interpreter: "{{ ansible_playbook_python }}"
  children:
    gpu:
      hosts:
        gpu-01: {fleetops_az: az1}
        gpu-02: {fleetops_az: az1}
        gpu-03: {fleetops_az: az2}
    spares: {}
    racks:
      children:
        gpu:
  hosts:
    cpu-01:
"""


@pytest.fixture
def inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(tmp_path / "state"))
    path = tmp_path / "fleet.yml"
    path.write_text(INVENTORY)
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        rc = cli.main(list(argv))
    except SystemExit as exc:
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def refused(capsys: pytest.CaptureFixture[str], tmp_path: Path, *argv: str) -> str:
    """``argv`` exits 2 with one line on stderr, and left nothing behind: no state directory (no rollout
    file, lock, lease, audit or ladder)."""
    rc, out, err = run(capsys, *argv)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and out == "", (rc, out, err)
    assert not (tmp_path / "state").exists()
    assert not (tmp_path / "auto").exists()
    return lines[0]


COMMANDS = [
    ["remediate", "reboot"],
    ["remediate", "reboot", "--apply"],
    ["remediate", "unquarantine"],
    ["plan", "reboot"],
    ["remediate", "auto"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("limit", ["", "  "])
def test_a_blank_limit_is_refused_never_all_hosts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, inventory: Path, command: list[str], limit: str
) -> None:
    extra = ["--state-dir", str(tmp_path / "auto")] if command[-1] == "auto" else []
    line = refused(capsys, tmp_path, *command, "-i", str(inventory), "-l", limit, *extra)
    assert f"--limit {limit!r} is blank: an empty selection never means all hosts" in line


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_typo_among_good_names_is_refused_naming_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, inventory: Path, command: list[str]
) -> None:
    extra = ["--state-dir", str(tmp_path / "auto")] if command[-1] == "auto" else []
    line = refused(capsys, tmp_path, *command, "-i", str(inventory), "-l", "gpu-01,gpu-5", *extra)
    assert (
        "--limit 'gpu-01,gpu-5': 'gpu-5' matches no host of the inventory" in line and "nothing run" in line
    )


@pytest.mark.parametrize(
    ("limit", "named"),
    [
        ("gpu-01,spares", "'spares' matches"),  # a group without hosts
        ("gpu,!gpu-9", "'!gpu-9' matches"),  # excluding a typo excludes nothing
        ("gpu[0:1],cpu-01,&gpu,!db*", "'!db*' matches"),
        ("gpu-0*,~^db-,cpu-01,web", "'~^db-', 'web' match no host"),  # every part named
        ("gpu-01:gpu-5", "'gpu-5' matches"),  # ansible's older ':' separator
        ("gpu-01,localhost", "'localhost' matches"),  # ansible's implicit localhost is no host of it
    ],
)
def test_each_kind_of_part_that_matches_no_host_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, inventory: Path, limit: str, named: str
) -> None:
    line = refused(capsys, tmp_path, "plan", "reboot", "-i", str(inventory), "-l", limit)
    assert f"--limit {limit!r}: {named}" in line and "nothing run" in line, line


@pytest.mark.parametrize("limit", ["spares", "gpu,&nope*", "gpu-7,gpu-8"])
def test_a_limit_that_selects_no_host_at_all_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, inventory: Path, limit: str
) -> None:
    line = refused(capsys, tmp_path, "remediate", "reboot", "-i", str(inventory), "-l", limit)
    assert f"--limit {limit!r} matches no host: nothing to do" in line, line


def test_a_limit_file_is_read_as_ansible_reads_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, inventory: Path
) -> None:
    names = tmp_path / "names"
    names.write_text("gpu-01\ngpu-5\n\n")
    line = refused(capsys, tmp_path, "plan", "reboot", "-i", str(inventory), "-l", f"@{names}")
    assert "'gpu-5' matches no host" in line


def test_every_part_that_matches_is_accepted(inventory: Path) -> None:
    full = load_targets([inventory])
    assert full.unmatched == ()
    for limit, hosts in [
        ("gpu-0*,!gpu-02", {"gpu-01", "gpu-03"}),
        ("racks,&gpu[0:1]", {"gpu-01", "gpu-02"}),
        ("~^cpu-,gpu-03", {"cpu-01", "gpu-03"}),
        ("all:!gpu", {"cpu-01"}),
        ("ungrouped", {"cpu-01"}),
    ]:
        found = load_targets([inventory], limit)
        assert found.unmatched == () and {h.name for h in found.hosts} == hosts, limit


def test_unmatched_parts_are_judged_on_the_whole_inventory(inventory: Path, tmp_path: Path) -> None:
    # a part's hosts come from the listing without the limit: another part's '&' or '!' does not hide them
    found = load_targets([inventory], "gpu-01,&gpu-02")
    assert found.hosts == [] and found.unmatched == ()
    listing = {"_meta": {"hostvars": {}}, "all": {"children": ["g"]}, "g": {"hosts": ["a*b"]}}
    assert unmatched_parts(listing, "a*b") == []  # a host's exact name matches it, whatever its characters
    assert unmatched_parts(listing, "a*c") == ["a*c"]
    with pytest.raises(UsageError, match="is blank"):
        load_targets([tmp_path / "not-read.yml"], " ")  # refused before any inventory is read


def test_scan_keeps_ansibles_behaviour_and_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, inventory: Path
) -> None:
    out_file = tmp_path / "scan.json"
    rc, _out, err = run(capsys, "scan", "-i", str(inventory), "-l", "gpu-01,gpu-5,spares", "-q",
                       "--checks", "zombie_memcg", "-o", str(out_file), "--format", "json")  # fmt: skip
    assert rc in (0, 1, 3), err
    assert "warning: --limit 'gpu-01,gpu-5,spares': 'gpu-5', 'spares' matched no host" in err
    report = json.loads(out_file.read_text())
    assert list(report["hosts"]) == ["gpu-01"]
    assert report["selection"]["unmatched"] == ["gpu-5", "spares"]
    assert report["selection"]["limit"] == "gpu-01,gpu-5,spares" and report["selection"]["host_count"] == 1
    rc, _out, err = run(capsys, "scan", "-i", str(inventory), "-l", "", "-q")
    assert rc == 2 and "is blank" in err
