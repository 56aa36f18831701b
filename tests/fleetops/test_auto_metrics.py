"""`remediate auto --prometheus FILE`: the pass's own state as gauges (fleetops.metrics.AUTO_GAUGES), counted
from a real pass's document another way than the writer does."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetops import api, auto
from fleetops.errors import UsageError
from fleetops.metrics import AUTO_STATUSES, write_auto_textfile
from fleetops.policy import parse_policy
from tests.fleetops.test_auto import CRASHLOOP, T0, Runner, ecc, report
from tests.fleetops.test_storm import POLICY


def _samples(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(path.read_text()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_a_storm_pass_writes_its_brake_budget_and_statuses(tmp_path: Path) -> None:
    scan = report(**{f"gpu-{i}": [ecc()] for i in range(6)}, **{"cpu-1": [CRASHLOOP]})
    inputs = auto.PassInputs(
        policy=parse_policy(POLICY, "policy.yml"),
        policy_source="policy.yml",
        scan_report=scan,
        group_of={h: "az-a" for h in scan["hosts"]},
        state_dir=tmp_path / "auto",
        apply=True,
    )
    result = auto.run_pass(inputs, Runner(fail=["gpu-1"]), lambda text, style: None, clock=lambda: T0)
    doc = result.document()
    path = tmp_path / "auto.prom"
    write_auto_textfile(doc, path, T0 + 5)
    got = _samples(path)
    statuses = [d["status"] for d in doc["decisions"]]
    for status in AUTO_STATUSES:
        assert got[("fleetops_auto_hosts", (("status", status),))] == statuses.count(status), status
    assert got[("fleetops_auto_brake", (("rule", "gpu-fatal"),))] == 1
    # quarantine's budget is 2 an hour: two quarantined (gpu-1 failed), four held back
    assert got[("fleetops_auto_budget_blocked", (("action", "quarantine"),))] == 4
    assert got[("fleetops_auto_rung_failed", (("action", "quarantine"),))] == 1
    assert got[("fleetops_auto_rung_failed", (("action", "stop-start"),))] == 0
    assert got[("fleetops_auto_pass_exit_code", ())] == int(result.exit_code) == 3
    assert got[("fleetops_auto_pass_timestamp_seconds", ())] == T0 + 5
    assert got[("fleetops_auto_paused", ())] == 0 and got[("fleetops_auto_pass_apply", ())] == 1
    assert not any(name == "fleetops_auto_human_needed" for name, _ in got)


def test_an_unwritable_metrics_file_is_refused_before_the_pass(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"cannot write .*no such directory"):
        api.auto(
            api.AutoRequest(inventory=[tmp_path / "none.yml"], prometheus=tmp_path / "missing" / "a.prom")
        )
