"""The gauges' one definition (module_utils/gauges.py): the host timer's text rendering and escaping, and that
the controller's --prometheus textfile and the host timer write the same names, help texts, labels and values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.fleetops.node.plugins.module_utils import gauges
from prometheus_client.parser import text_string_to_metric_families

from fleetops.metrics import write_textfile
from tests.paths import FIXTURES

NASTY_UNIT = 'we"ird\\unit\nname.service'


def _report() -> dict[str, Any]:
    report: dict[str, Any] = json.loads((FIXTURES / "documents" / "scan-3hosts.json").read_text())
    return report


def _parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _families(text: str) -> dict[str, tuple[str, str]]:
    return {f.name: (f.documentation, f.type) for f in text_string_to_metric_families(text)}


def test_label_values_are_escaped_per_the_text_format() -> None:
    finding = {
        "check": "crashloop_unit",
        "severity": "critical",
        "summary": "x",
        "data": {"unit": NASTY_UNIT},
    }
    series = [s for s in gauges.host_series("h", _entry(findings=[finding])) if s[0] == "unit_findings"]
    text = gauges.render(series)
    assert (
        'fleetops_unit_findings{host="h",check="crashloop_unit",severity="critical",'
        'unit="we\\"ird\\\\unit\\nname.service"} 1.0\n'
    ) in text
    assert text.count("\n") == 3  # HELP, TYPE, one sample: the newline in the name did not end a line
    # Prometheus' own parser reads back exactly the unit's name
    assert _parse(text) == {
        (
            "fleetops_unit_findings",
            (("check", "crashloop_unit"), ("host", "h"), ("severity", "critical"), ("unit", NASTY_UNIT)),
        ): 1.0
    }


def test_help_and_values_are_escaped_and_formatted() -> None:
    assert gauges.escape_help("a\\b\nc") == "a\\\\b\\nc"
    assert gauges.escape_label_value('"\\\n') == '\\"\\\\\\n'
    assert [gauges.format_value(v) for v in (1, 0.5, float("inf"), float("-inf"), float("nan"), 65535)] == [
        "1.0", "0.5", "+Inf", "-Inf", "NaN", "65535.0",
    ]  # fmt: skip


def test_identity_labels_follow_host_and_empty_ones_are_left_out() -> None:
    series = [("memcg_total", ("h",), 3), ("scan_timestamp_seconds", (), 1.5), ("findings", ("h", "info"), 0)]
    text = gauges.render(series, [("host", "h"), ("instance_id", "i-0abc"), ("az", "")])
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines == [
        'fleetops_memcg_total{host="h",instance_id="i-0abc"} 3.0',
        'fleetops_findings{host="h",instance_id="i-0abc",severity="info"} 0.0',
        'fleetops_scan_timestamp_seconds{host="h",instance_id="i-0abc"} 1.5',
    ]  # families in GAUGES' order, each once with its HELP and TYPE
    assert text.count("# TYPE fleetops_memcg_total gauge\n") == 1
    assert gauges.render([]) == ""


@pytest.mark.parametrize(
    ("series", "message"),
    [
        ([("no_such_gauge", ("h",), 1)], "unknown gauge"),
        ([("findings", ("h",), 1)], "takes labels"),
    ],
)
def test_a_series_that_is_not_defined_is_refused(series: list[Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        gauges.render(series)


def _entry(**overrides: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "status": "ok",
        "facts": {},
        "findings": [],
        "errors": [],
        "checks": [],
        "duration_ms": 5,
    }
    entry.update(overrides)
    return entry


@pytest.mark.parametrize("host", ["local2", "localhost", "gone"])
def test_controller_and_host_write_the_same_gauges_for_a_host(host: str, tmp_path: Path) -> None:
    """One host of a real scan report: the controller's textfile (prometheus_client) and the host timer's
    rendering of the same node_health result have the same series, values, help texts and types."""
    report = _report()
    write_textfile(report, tmp_path / "controller.prom")
    controller_text = (tmp_path / "controller.prom").read_text()
    controller = {key: v for key, v in _parse(controller_text).items() if ("host", host) in key[1]}
    host_text = gauges.render(gauges.host_series(host, report["hosts"][host]))
    assert _parse(host_text) == controller
    assert len(controller) >= (2 if report["hosts"][host]["status"] != "ok" else 40)
    families = _families(controller_text)
    for name, doc in _families(host_text).items():
        assert families[name] == doc, name


def test_the_definition_is_what_the_controller_writes(tmp_path: Path) -> None:
    write_textfile(_report(), tmp_path / "controller.prom")
    families = _families((tmp_path / "controller.prom").read_text())
    assert set(families) == {gauges.metric_name(g.name) for g in gauges.GAUGES}
    for g in gauges.GAUGES:
        assert families[gauges.metric_name(g.name)] == (g.help, "gauge")
    assert len({g.name for g in gauges.GAUGES}) == len(gauges.GAUGES)
    assert {g.scope for g in gauges.GAUGES} <= set(gauges.SCOPES)


def test_units_and_gpus_are_labels_an_alert_can_name() -> None:
    findings = [
        {"check": "crashloop_unit", "severity": "critical", "summary": "", "data": {"unit": "ecs.service"}},
        {"check": "unexpected_unit", "severity": "warning", "summary": "", "data": {"unit": "ecs.service"}},
        {"check": "gpu_health", "severity": "critical", "summary": "", "data": {
            "xid": {"79": {"severity": "critical", "count": 2, "pcis": ["0000:3b:00"]}},
            "gpus": [{"pci_bus_id": "00000000:3B:00.0", "problems": ["1 uncorrectable ECC error"]}],
        }},
    ]  # fmt: skip
    got = {(n, labels): v for n, labels, v in gauges.host_series("h", _entry(findings=findings))}
    assert got[("unit_findings", ("h", "crashloop_unit", "critical", "ecs.service"))] == 1
    assert got[("unit_findings", ("h", "unexpected_unit", "warning", "ecs.service"))] == 1
    assert got[("gpu_findings", ("h", "critical", "0000:3b:00"))] == 2
    assert got[("gpu_findings", ("h", "critical", "00000000:3B:00.0"))] == 1
