"""crashloop_unit on real captures from a lab host running a crash-looping ecs.service."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from ansible_collections.fleetops.node.plugins.module_utils import crashloop

from tests.paths import FIXTURES

FIXTURES = FIXTURES / "systemd"
SHOW = (FIXTURES / "show-crashloop-ecs.txt").read_text()
SHOW_LATER = (FIXTURES / "show-crashloop-ecs-later.txt").read_text()
JOURNAL = (FIXTURES / "journal-restarts-ecs.jsonl").read_text()
LIST_UNITS = (FIXTURES / "list-units-crashloop-ecs.txt").read_text()


def test_parse_units_keeps_only_the_looping_service() -> None:
    units, services = crashloop.parse_units(SHOW)
    assert services > 50  # every loaded service of a Debian 12 host came back in one call
    assert list(units) == ["ecs.service"]
    ecs = units["ecs.service"]
    assert ecs["n_restarts"] == 8
    assert ecs["sub_state"] == "auto-restart"
    assert ecs["result"] == "exit-code"
    assert ecs["exec_main_status"] == 1
    assert ecs["restart"] == "always"
    assert ecs["unit_file_state"] == "enabled"
    assert ecs["vendor_unit"] is True
    assert ecs["fragment_path"] == "/lib/systemd/system/ecs.service"


def test_journal_counts_scheduled_restarts_per_unit() -> None:
    assert crashloop.parse_journal_restarts(JOURNAL) == {"ecs.service": 8}
    assert crashloop.parse_journal_restarts("") == {}


def test_malformed_inputs_are_detector_errors() -> None:
    with pytest.raises(crashloop.CrashloopError, match="Failed to parse systemctl show output: line 1"):
        crashloop.parse_units("garbage without equals\n")
    with pytest.raises(
        crashloop.CrashloopError, match="Failed to parse journalctl output: line 2 is not JSON"
    ):
        crashloop.parse_journal_restarts('{"UNIT": "a.service"}\n{not json\n')


def _facts(text: str, at: float) -> dict[str, object]:
    units, services = crashloop.parse_units(text)
    return {"systemd": True, "reason": None, "services": services, "units": units, "sampled_at": at}


def test_two_samples_give_a_rate_from_nrestarts() -> None:
    grown = crashloop.add_growth(_facts(SHOW, 0.0), _facts(SHOW_LATER, 1.0), 1.0)
    ecs = grown["units"]["ecs.service"]  # type: ignore[index]
    assert grown["rate_basis"] == "samples"
    assert ecs["restarts_in_window"] == 2
    assert ecs["restarts_per_min"] == 120.0
    (finding,) = crashloop.evaluate(grown)
    assert finding["severity"] == "critical"
    assert finding["data"]["unit"] == "ecs.service"
    assert "restarting 120/min" in finding["summary"]
    assert "enabled by the image" in finding["summary"]


def test_nrestarts_reset_counts_from_zero() -> None:
    first = {"systemd": True, "units": {"a.service": {"n_restarts": 50, "sub_state": "auto-restart"}}}
    second = {"systemd": True, "units": {"a.service": {"n_restarts": 3, "sub_state": "auto-restart"}}}
    grown = crashloop.add_growth(first, second, 60.0)
    assert grown["units"]["a.service"]["restarts_in_window"] == 3


@pytest.mark.parametrize(
    ("rate", "severity"),
    [(0.0, None), (0.49, None), (0.5, "warning"), (4.99, "warning"), (5.0, "critical"), (60.0, "critical")],
)
def test_rate_thresholds(rate: float, severity: str | None) -> None:
    units, _ = crashloop.parse_units(SHOW)
    units["ecs.service"]["restarts_per_min"] = rate
    units["ecs.service"]["restarts_in_window"] = 1
    findings = crashloop.evaluate({"units": units, "rate_basis": "journal", "window_seconds": 600})
    assert [f["severity"] for f in findings] == ([severity] if severity else [])


def test_without_a_rate_a_unit_between_crashes_is_a_warning() -> None:
    units, _ = crashloop.parse_units(SHOW)
    (finding,) = crashloop.evaluate({"units": units, "rate_basis": None})
    assert finding["severity"] == "warning"
    assert "between crashes (auto-restart)" in finding["summary"]


def test_attribution_names_the_looping_unit_with_the_evidence() -> None:
    memcg = {
        "zombies": None,
        "growth": {"seconds": 10, "total_per_min": 66.0, "live_per_min": 0.0, "zombies_per_min": None},
    }
    loops = {
        "units": {
            "ecs.service": {"restarts_per_min": 60.0, "unit_file_state": "enabled", "vendor_unit": True}
        }
    }
    rate, basis, culprits = crashloop.attribute_culprits(memcg, loops, 10.0)
    assert (rate, basis) == (66.0, "host-wide total")
    assert culprits == [
        {
            "unit": "ecs.service",
            "restarts_per_min": 60.0,
            "memcgs_per_restart": 1.1,
            "unit_file_state": "enabled",
            "vendor_unit": True,
        }
    ]
    # below the growth threshold, or with no loop, nobody is blamed
    assert crashloop.attribute_culprits(memcg, loops, 100.0)[2] == []
    assert crashloop.attribute_culprits(memcg, {"units": {}}, 10.0)[2] == []
    # live cgroups growing too is not zombie growth
    busy = {"growth": {"total_per_min": 66.0, "live_per_min": 60.0, "zombies_per_min": None}}
    assert crashloop.attribute_culprits(busy, loops, 10.0)[2] == []


def test_host_without_systemd_reports_no_finding_and_no_error(tmp_path: Path) -> None:
    def never(argv: list[str]) -> tuple[int, str, str]:
        raise AssertionError("systemctl must not run on a host without systemd")

    facts = crashloop.collect(never, systemd_dir=str(tmp_path / "absent"))
    assert facts["systemd"] is False
    assert crashloop.evaluate(facts) == []


def _runner(calls: list[list[str]], journal_rc: int = 0) -> Callable[[list[str]], tuple[int, str, str]]:
    def run(argv: list[str]) -> tuple[int, str, str]:
        calls.append(argv)
        if argv[:2] == ["systemctl", "list-units"]:
            return 0, LIST_UNITS, ""
        if argv[0] == "journalctl":
            return (0, JOURNAL, "") if journal_rc == 0 else (journal_rc, "", "No journal files were found.")
        return 0, SHOW, ""

    return run


def test_collect_lists_units_once_and_shows_only_candidates(tmp_path: Path) -> None:
    calls: list[list[str]] = []
    facts = crashloop.collect(_runner(calls), systemd_dir=str(tmp_path))
    assert [c[:2] for c in calls] == [
        ["systemctl", "list-units"],
        ["journalctl", "--no-pager"],
        ["systemctl", "show"],
    ]
    assert calls[2][-1:] == ["ecs.service"]  # only the candidate, not every unit
    assert facts["services"] == len(crashloop.parse_list_units(LIST_UNITS)) > 50
    assert facts["rate_basis"] == "journal"
    assert facts["units"]["ecs.service"]["restarts_in_window"] == 8


def test_without_a_journal_every_service_is_shown_in_one_call(tmp_path: Path) -> None:
    calls: list[list[str]] = []
    facts = crashloop.collect(_runner(calls, journal_rc=1), systemd_dir=str(tmp_path))
    assert calls[2][-1] == "*"
    assert facts["rate_basis"] is None
    assert "No journal files" in facts["journal_error"]
    assert list(facts["units"]) == ["ecs.service"]


def test_list_units_parser() -> None:
    units = crashloop.parse_list_units(LIST_UNITS)
    assert units["ecs.service"][1:] in (
        ("activating", "auto-restart"),
        ("active", "running"),
        ("failed", "failed"),
    )
    assert units["ssh.service"] == ("loaded", "active", "running")
    with pytest.raises(crashloop.CrashloopError, match="list-units output: line 1"):
        crashloop.parse_list_units("broken line\n")


def test_a_unit_new_in_the_second_sample_has_no_rate() -> None:
    first = {"systemd": True, "units": {}}
    second = {"systemd": True, "units": {"a.service": {"n_restarts": 40, "sub_state": "auto-restart"}}}
    grown = crashloop.add_growth(first, second, 10.0)
    assert grown["units"]["a.service"]["restarts_per_min"] is None
