"""The collection's Prometheus rules and Alertmanager example (extensions/prometheus/), with the real tools.

promtool (Debian package prometheus) checks the rules and runs their unit tests (extensions/prometheus/tests:
fixture series, expected alerts); amtool (prometheus-alertmanager) checks the example route. Without them
the tests that need them skip, except under CI=true, where tools/debian-deps.sh --ci installs both and a
missing tool fails. The rest holds the rules to what fleetops.metrics really writes (metric names, label
names, the `check` and `severity` values), to their own conventions (severity, an argued `for:`, a runbook
link to the alert's own section of the docs site's generated alert reference) and to the alerts guide's table.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from functools import cache
from typing import Any

import pytest
import yaml
from ansible_collections.fleetops.node.plugins.module_utils import cpustat, crashloop, ena, findings, memcg
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fleetops.metrics import build_auto_registry, build_registry
from tests.fleetops.test_metrics_hw import _facts as hardware_facts
from tests.paths import FIXTURES, REPO

sys.path.insert(0, str(REPO / "docs" / "_ext"))
import fleetops_docs  # the site's generators: docs/_ext/fleetops_docs.py

PROM = REPO / "extensions" / "prometheus"
RULES = PROM / "fleetops.rules.yml"
ALERTMANAGER = PROM / "alertmanager.example.yml"
UNIT_TESTS = sorted((PROM / "tests").glob("*.yml"))
GUIDE = REPO / "docs" / "guides" / "alerts.md"
SCRAPE_LABELS = {"instance", "job"}  # added by Prometheus when it scrapes node_exporter
# up == 0 and absent(): their $value says nothing, so their descriptions leave it out
CONSTANT_VALUE = {"FleetopsHostNotScanned", "FleetopsScanMetricsAbsent"}

# A metric name outside a recording rule's name (host:fleetops_...:deriv1h), with its optional {matchers}.
SELECTOR = re.compile(r"(?<![\w:])(fleetops_\w+)(?![\w:])\s*(\{[^}]*\})?")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def _tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (Debian package {package}; tools/debian-deps.sh --ci installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: {message}")
        pytest.skip(message)
    return path


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, cwd=PROM)


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _alerts() -> list[dict[str, Any]]:
    return [rule for rule in _rules() if "alert" in rule]


@cache
def _written() -> dict[str, dict[str, set[str]]]:
    """metric family -> label -> values, from what fleetops.metrics writes for a real report (scan-3hosts.json,
    one host given the ena, gpu and cpu facts the detectors make from captured inputs)."""
    report = json.loads((FIXTURES / "documents" / "scan-3hosts.json").read_text())
    report["hosts"]["local2"]["facts"].update(hardware_facts())
    text = generate_latest(build_registry(report)).decode()
    text += generate_latest(build_auto_registry(_auto_document(), 1_800_000_000.0)).decode()
    text += generate_latest(build_auto_registry(_stranded_document(), 1_800_000_000.0)).decode()
    families: dict[str, dict[str, set[str]]] = {}
    for family in text_string_to_metric_families(text):
        labels = families.setdefault(family.name, defaultdict(set))
        for sample in family.samples:
            for key, value in sample.labels.items():
                labels[key].add(value)
    return families


AUTO_POLICY = """
schema: fleetops.policy/v1
budgets:
  quarantine: {window: 1h, max: 1}
  reboot: {window: 1h, max: 5}
rules:
  - name: gpu-fatal
    match: [{check: gpu_health, severity: [critical]}]
    ladder:
      - {action: quarantine, clear_after: 10m}
      - {action: human}
  - name: crashloop
    match: [{check: crashloop_unit}]
    floor: {min_available_pct: 90}
    ladder:
      - {action: reboot, clear_after: 10m}
      - {action: human}
"""


@cache
def _auto_document() -> dict[str, Any]:
    """A real remediate auto pass's document (fleetops.auto/v1): a quarantine budget spent, a storm brake,
    reboots held by a capacity floor, and (a second pass) ladders at their human rung."""
    import tempfile
    from pathlib import Path

    from fleetops import auto
    from fleetops.policy import parse_policy
    from tests.fleetops.test_auto import CRASHLOOP, T0, Runner, ecc, report

    scan = report(**{f"gpu-{i}": [ecc()] for i in range(5)}, **{"cpu-1": [CRASHLOOP], "cpu-2": [CRASHLOOP]})
    with tempfile.TemporaryDirectory() as tmp:
        inputs = auto.PassInputs(
            policy=parse_policy(AUTO_POLICY, "policy.yml"),
            policy_source="policy.yml",
            scan_report=scan,
            group_of={h: "az-a" for h in scan["hosts"]},
            state_dir=Path(tmp),
            apply=True,
        )
        auto.run_pass(inputs, Runner(fail=["cpu-2"]), lambda text, style: None, clock=lambda: T0)
        doc = auto.run_pass(inputs, Runner(), lambda text, style: None, clock=lambda: T0 + 3600).document()
    return doc


@cache
def _stranded_document() -> dict[str, Any]:
    """A real pass's document (with a shared store) that reports a stop-start a dead pass left unfinished
    for too long (fleetops.journal.STRANDED_AFTER_S) as stranded."""
    import tempfile
    from pathlib import Path

    from fleetops import journal
    from tests.fleetops.test_auto import T0, Clock, ecc, report
    from tests.fleetops.test_journal import a_pass
    from tests.fleetops.test_store import left_by_a_dead_pass, memory

    shared = memory(Clock(T0))
    left_by_a_dead_pass(shared, T0)
    with tempfile.TemporaryDirectory() as tmp:
        a_pass(Path(tmp), shared, T0 + 600, report(**{"lab-02": [ecc()]}))
        result, _lines = a_pass(
            Path(tmp), shared, T0 + journal.STRANDED_AFTER_S + 600, report(**{"lab-02": []})
        )
    assert result.stranded
    return result.document()


def _selectors(expr: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    return [(m.group(1), MATCHER.findall(m.group(2) or "")) for m in SELECTOR.finditer(expr)]


# ---- the real tools


def test_promtool_check_rules() -> None:
    promtool = _tool("promtool", "prometheus")
    result = _run(promtool, "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout, result.stdout


def test_promtool_test_rules() -> None:
    promtool = _tool("promtool", "prometheus")
    assert UNIT_TESTS, "no promtool unit tests in extensions/prometheus/tests"
    result = _run(promtool, "test", "rules", *map(str, UNIT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(UNIT_TESTS), result.stdout


def test_amtool_checks_the_example_route_and_routes_by_severity() -> None:
    amtool = _tool("amtool", "prometheus-alertmanager")
    result = _run(amtool, "check-config", str(ALERTMANAGER))
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr
    # the alerts a rung can act on go to the event-driven rulebook too (fleetops-eda, then the people's route)
    for labels, receivers in (
        (
            ["alertname=FleetopsGpuXid", "severity=critical", "host=h1"],
            "fleetops-eda,fleetops-slack-critical",
        ),
        (["alertname=FleetopsGpuXid", "severity=warning", "host=h1"], "fleetops-eda,fleetops-slack"),
        (["alertname=FleetopsScanStale", "severity=warning", "instance=ctl:9100"], "fleetops-slack"),
        (["alertname=FleetopsDetectorErrors", "severity=warning", "host=h1"], "fleetops-slack"),
        (["alertname=FleetopsGpuXid", "severity=info", "host=h1"], "fleetops-eda,null"),
        (["alertname=NodeDown", "severity=critical"], "null"),
    ):
        result = _run(amtool, "config", "routes", "test", f"--config.file={ALERTMANAGER}", *labels)
        assert result.returncode == 0 and result.stdout.split() == [receivers], (labels, result.stdout)


def test_the_example_sends_the_rulebook_exactly_the_alerts_its_rules_act_on() -> None:
    """The fleetops-eda route's alertnames are the rulebooks' (extensions/eda/rulebooks/), and each is an
    alert of the rules."""
    route = yaml.safe_load(ALERTMANAGER.read_text())["route"]["routes"][0]
    assert route["receiver"] == "fleetops-eda" and route["continue"] is True
    (matcher,) = route["matchers"]
    routed = set(re.fullmatch(r'alertname =~ "Fleetops\((.*)\)"', matcher).group(1).split("|"))  # type: ignore[union-attr]
    names = {rule["alert"] for rule in _alerts()}
    for book in sorted((REPO / "extensions" / "eda" / "rulebooks").glob("*.yml")):
        acted = set(re.findall(r'"(Fleetops\w+)"', book.read_text()))
        assert {f"Fleetops{n}" for n in routed} == acted, book.name
        assert acted <= names, acted - names


# ---- the rules read what fleetops.metrics writes


def test_every_metric_label_and_value_the_rules_read_is_written() -> None:
    written = _written()
    problems = []
    used: set[str] = set()
    for rule in _rules():
        name = rule.get("alert") or rule["record"]
        for metric, matchers in _selectors(rule["expr"]):
            used.add(metric)
            if metric not in written:
                problems.append(f"{name}: {metric} is not written by fleetops.metrics")
                continue
            for label, op, value in matchers:
                if label not in written[metric]:
                    problems.append(f"{name}: {metric} has no label {label!r}")
                elif label in ("check", "severity"):
                    wanted = value.split("|") if op in ("=~", "!~") else [value]
                    unknown = [v for v in wanted if v not in written[metric][label]]
                    if unknown:
                        problems.append(f"{name}: {metric}{{{label}}} is never {unknown}")
        labels_here = {label for metric, _ in _selectors(rule["expr"]) for label in written.get(metric, {})}
        for clause in GROUPING.findall(rule["expr"]):
            for label in filter(None, (part.strip() for part in clause.split(","))):
                if label not in labels_here | SCRAPE_LABELS:
                    problems.append(f"{name}: by/without ({label}): no metric it reads has that label")
    assert used, "no fleetops_* metric found in the rules"
    assert not problems, "\n".join(problems)


def test_the_unit_tests_feed_only_series_fleetops_writes() -> None:
    written = _written()
    problems = []
    for path in UNIT_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for series in test["input_series"]:
                ((metric, matchers),) = _selectors(series["series"])
                for label, _, _ in matchers:
                    if label not in set(written.get(metric, {})) | SCRAPE_LABELS:
                        problems.append(f"{path.name}: {series['series']}: {metric} has no label {label!r}")
                if metric not in written:
                    problems.append(f"{path.name}: {metric} is not written by fleetops.metrics")
    assert not problems, "\n".join(problems)


# ---- each alert's conventions and its unit tests


def _anchors() -> set[str]:
    """The targets of the generated alert reference page (MyST's `(target)=` lines)."""
    return set(re.findall(r"^\((\w+)\)=$", fleetops_docs.alerts_markdown(), re.M))


def test_each_alert_has_a_severity_an_argued_for_and_a_runbook_in_the_site() -> None:
    anchors = _anchors()
    blocks = RULES.read_text().split("- alert: ")[1:]
    alerts = _alerts()
    assert len(blocks) == len(alerts)
    for block, alert in zip(blocks, alerts, strict=True):
        name = alert["alert"]
        assert block.startswith(name + "\n")
        assert alert["labels"]["severity"] in ("critical", "warning", "info"), name
        assert alert["labels"]["check"], name
        assert "for" in alert, f"{name}: no for:"
        argued = re.search(r"#.*\bfor: (\w+)", block)
        assert argued and argued.group(1) == alert["for"], f"{name}: no comment arguing for: {alert['for']}"
        ann = alert["annotations"]
        assert set(ann) == {"summary", "description", "runbook_url"}, name
        assert ("$value" in ann["description"]) != (name in CONSTANT_VALUE), name
        if "absent(" not in alert["expr"]:
            subject = "$labels.host" if "host" not in _grouped_away(alert) else "$labels.instance"
            assert subject in ann["description"], name
        assert ann["runbook_url"] == fleetops_docs.runbook_url(name), name
        page, anchor = ann["runbook_url"].split("#")
        assert page == fleetops_docs.ALERTS_PAGE and not page.startswith(("/", "http")), name
        assert anchor in anchors, f"{name}: {ann['runbook_url']}: the alert reference has no such target"


# The rules that compare a gauge with a detector's threshold (the others count findings: > 0), and the
# detector's default (or the declared level) they must equal.
HEADROOM_IDS = (
    memcg.DEFAULT_THRESHOLDS["headroom_critical_pct"] * memcg.MEM_CGROUP_ID_MAX / 100
)  # free*100 < pct*MAX
THRESHOLDS = {
    ("FleetopsZombieMemcgs", "warning"): memcg.DEFAULT_THRESHOLDS["zombie_warning"],
    ("FleetopsZombieMemcgs", "critical"): memcg.DEFAULT_THRESHOLDS["zombie_critical"],
    ("FleetopsZombieMemcgGrowth", "warning"): crashloop.DEFAULT_THRESHOLDS["zombie_growth_warning_per_min"],
    ("FleetopsMemcgIdHeadroomLow", "critical"): HEADROOM_IDS,
    ("FleetopsEnaResets", "critical"): ena.DEFAULT_THRESHOLDS["ena_resets_critical"],
    ("FleetopsCpuStarvation", "warning"): cpustat.DEFAULT_THRESHOLDS["cpu_system_warning_pct"],
    ("FleetopsCpuStarvation", "critical"): cpustat.DEFAULT_THRESHOLDS["cpu_system_critical_pct"],
    # under full coverage (findings.COVERAGE: 1 full, 0.5 partial, 0 none): a check that could not look fully
    ("FleetopsScanPartial", "info"): dict(findings.COVERAGE)["full"],
}


def test_the_thresholds_are_the_detectors_defaults() -> None:
    compared = {}
    for alert in _alerts():
        m = re.search(r"(>=|<|>) (\d+(?:\.\d+)?)$", alert["expr"])
        if m and float(m.group(2)) and "time()" not in alert["expr"]:
            compared[alert["alert"], alert["labels"]["severity"]] = float(m.group(2))
    assert compared == {key: float(value) for key, value in THRESHOLDS.items()}


def _grouped_away(alert: dict[str, Any]) -> set[str]:
    """Labels an alert's series do not have: no host on the scan-wide gauges."""
    written = _written()
    metrics = [metric for metric, _ in _selectors(alert["expr"])]
    return {"host"} if metrics and all("host" not in written[m] for m in metrics) else set()


def test_every_alert_fires_and_is_held_back_in_the_unit_tests() -> None:
    fired: set[tuple[str, str]] = set()
    held: set[tuple[str, str]] = set()
    for path in UNIT_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            subjects = set()
            for series in test["input_series"]:
                labels = dict((k, v) for k, _, v in _selectors(series["series"])[0][1])
                subjects.add(labels.get("host") or labels.get("instance") or "")
            for case in test.get("alert_rule_test", []):
                expected = [a["exp_labels"]["severity"] for a in case.get("exp_alerts") or []]
                for severity in ("critical", "warning", "info"):
                    pair = (case["alertname"], severity)
                    fired |= {pair} if severity in expected else set()
                    if expected.count(severity) < len(subjects):
                        held.add(pair)  # some series of this test does not fire it at this time
    pairs = {(a["alert"], a["labels"]["severity"]) for a in _alerts()}
    assert pairs - fired == set(), "never seen firing"
    assert pairs - held == set(), "never seen held back"


def test_the_guides_table_lists_every_alert_with_its_severities_and_for() -> None:
    text = GUIDE.read_text()
    section = text.split("\n## The alerts\n", 1)[1].split("\n## ", 1)[0]
    rows = {
        m.group(1): (m.group(2).split(", "), m.group(3).split(", "))
        for m in re.finditer(r"^\| `(Fleetops\w+)` \| ([^|]+?) \| ([^|]+?) \|", section, re.M)
    }
    rules: dict[str, tuple[list[str], list[str]]] = {}
    for alert in _alerts():
        severities, durations = rules.setdefault(alert["alert"], ([], []))
        severities.append(alert["labels"]["severity"])
        durations.append(alert["for"])
    assert rows == rules
