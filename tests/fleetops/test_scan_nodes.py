"""``fleetops scan`` shows each Slurm host's node as the scheduler sees it (issue 28 item 3): read once per
scan on the controller, carried by every host's entry (report, ndjson line, table, Prometheus file), and a
scheduler that cannot be read makes the scan exit 3, its reason shown once.

Slurm here is a script printing ``scontrol show node`` text captured from the lab's real Slurm 22.05
(tests/unit/fixtures/slurm, as tests/fleetops/test_nodes.py); the hosts are local (node_health runs for
real through ansible-runner and through the ssh transport's local path). The real daemons and a real drain
are in tests/integration/test_slurm_lab.py.
"""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from fleetops import schemas
from fleetops.cli.args import SUMMARY_ABOVE
from fleetops.cli.render import host_line, node_cell, render_scan
from fleetops.exitcodes import ExitCode
from fleetops.metrics import SCHEDULER_NODE_GAUGE, build_registry
from fleetops.nodes import scan_view
from fleetops.scan import exit_code, report_document, with_nodes
from tests.fleetops.test_nodes import _host, _scontrol, _slurm_text
from tests.helpers import FLEETOPS
from tests.paths import REPO


def _fleet(tmp_path: Path, scontrol: Path) -> Path:
    """Four local hosts: three Slurm (one under another node name), one on the default backend."""
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        "all:\n  vars:\n    ansible_connection: local\n"
        "    ansible_python_interpreter: '{{ ansible_playbook_python }}'\n"
        "    fleetops_checks: [zombie_memcg]\n    fleetops_sample_seconds: 0\n"
        "  children:\n    slurm:\n      vars:\n        fleetops_quarantine_backend: slurm\n"
        f"        fleetops_scontrol: {scontrol}\n"
        "      hosts:\n        lab-01: {}\n        gpu-2: {fleetops_slurm_node: lab-02}\n        lab-03: {}\n"
        "    k8s:\n      hosts:\n        plain: {}\n"
    )
    return inv


def _scan(inv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(FLEETOPS), "scan", "-q", "-i", str(inv), *args],
        capture_output=True, text=True, cwd=REPO, stdin=subprocess.DEVNULL, timeout=180, check=False,
    )  # fmt: skip


def test_only_slurm_hosts_are_read_in_one_call_and_a_failure_is_each_hosts_unknown(tmp_path: Path) -> None:
    scontrol = _scontrol(tmp_path, _slurm_text(**{"lab-01": "drained_admin", "lab-02": "draining"}))
    hosts = [
        _host("lab-01", fleetops_quarantine_backend="slurm", fleetops_scontrol=str(scontrol)),
        _host("gpu-2", fleetops_quarantine_backend="slurm", fleetops_scontrol=str(scontrol), fleetops_slurm_node="lab-02"),
        _host("lab-09", fleetops_quarantine_backend="slurm", fleetops_scontrol=str(scontrol)),
        _host("plain"),
        _host("off", fleetops_quarantine_backend="none"),
        _host("typo", fleetops_quarantine_backend="slurmm"),  # a quarantine setting the scan is not the judge of
    ]  # fmt: skip
    view = scan_view(hosts)
    assert {h: (v["node"], v["phase"], v["ours"]) for h, v in view.items()} == {
        "lab-01": ("lab-01", "drained", False),
        "gpu-2": ("lab-02", "draining", True),
        "lab-09": ("lab-09", "missing", False),
    }
    assert (tmp_path / "scontrol-calls").read_text().splitlines() == [" show node"]  # one call for all
    assert scan_view([_host("plain"), _host("off", fleetops_quarantine_backend="none")]) == {}

    (tmp_path / "broken").mkdir()
    broken = _scontrol(tmp_path / "broken", "", rc=1)
    view = scan_view([_host("lab-01", fleetops_quarantine_backend="slurm", fleetops_scontrol=str(broken)),
                      _host("gpu-2", fleetops_quarantine_backend="slurm", fleetops_scontrol=str(broken),
                            fleetops_slurm_node="lab-02")])  # fmt: skip
    assert {h: (v["node"], v["phase"]) for h, v in view.items()} == {
        "lab-01": ("lab-01", "unknown"),
        "gpu-2": ("lab-02", "unknown"),
    }
    assert all("Unable to contact slurm controller" in v["error"] for v in view.values())


def _report(nodes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    hosts = {
        h: {"status": "ok", "findings": [], "facts": {}, "errors": [], "checks": ["zombie_memcg"]}
        for h in ("lab-01", "gpu-2", "lab-03", "plain")
    }
    return with_nodes(report_document(hosts, started=1.7e9, finished=1.7e9 + 2), nodes)


NODES = {
    "lab-01": {"backend": "slurm", "node": "lab-01", "phase": "drained", "ours": False, "reason": "disk swap"},
    "gpu-2": {"backend": "slurm", "node": "lab-02", "phase": "draining", "ours": True, "reason": "fleetops: gpu_health: ECC",
              "since": 1.7e9},
    "lab-03": {"backend": "slurm", "node": "lab-03", "phase": "in", "ours": False, "reason": ""},
}  # fmt: skip


def test_the_report_carries_each_node_validates_and_a_node_not_read_fails_the_scan() -> None:
    report = _report(NODES)
    schemas.validate_scan_report(report, "report")
    assert report["hosts"]["gpu-2"]["node"]["phase"] == "draining" and "node" not in report["hosts"]["plain"]
    assert "node_errors" not in report["summary"] and exit_code(report) == ExitCode.OK
    unread = {h: {"backend": "slurm", "node": h, "phase": "unknown", "ours": False, "reason": "",
                  "error": "slurm: scontrol show node: Unable to contact slurm controller"} for h in ("lab-01", "lab-03")}  # fmt: skip
    failed = _report(unread)
    schemas.validate_scan_report(failed, "report")
    assert failed["summary"]["node_errors"] == 2
    assert exit_code(failed) == ExitCode.FAILED
    bad = _report({"lab-01": {**NODES["lab-01"], "phase": "sleeping"}})
    with pytest.raises(schemas.DocumentError, match="phase"):
        schemas.validate_scan_report(bad, "report")


def _rendered(report: dict[str, Any], **kw: Any) -> str:
    out = io.StringIO()
    render_scan(report, Console(file=out, width=220, force_terminal=False, color_system=None), **kw)
    return out.getvalue()


def _hosts_header(text: str) -> str:
    """The header line of the --wide hosts table."""
    lines = text.splitlines()
    return lines[next(i for i, ln in enumerate(lines) if ln.strip() == "hosts (--wide)") + 2]


def test_the_table_says_whose_each_node_is_and_each_read_failure_once() -> None:
    text = _rendered(_report(NODES), wide=True)
    assert "node" in _hosts_header(text)  # a column of --wide's hosts table, only when some host has a node
    assert "slurm drained: disk swap" in text and "slurm draining by fleetops" in text and "slurm in" in text
    # without --wide: a line for each node out of service (whose, and the scheduler's reason), none for "in"
    plain = _rendered(_report(NODES))
    assert (
        "node lab-01: slurm drained: disk swap" in plain and "node gpu-2: slurm draining by fleetops" in plain
    )
    assert "slurm in" not in plain and "hosts (--wide)" not in plain
    assert (
        "scheduler: 3 node(s) read, 2 out of service: drained by someone else 1, draining by fleetops 1"
        in text
    )
    assert "node" not in _hosts_header(_rendered(_report({}), wide=True))
    unread = {h: {"backend": "slurm", "node": h, "phase": "unknown", "ours": False, "reason": "", "error": "slurm: boom"}
              for h in ("lab-01", "lab-03")}  # fmt: skip
    text = _rendered(_report(unread))
    assert text.count("slurm: boom") == 1 and "slurm: boom (2 host(s))" in text
    assert "2 scheduler node(s) not read" in text
    assert "(slurm draining by fleetops)" in host_line("gpu-2", _report(NODES)["hosts"]["gpu-2"])
    assert node_cell(None) == "-"
    # a summarised table (a large fleet) says the same in its line
    hosts = {f"n-{i:04d}": {"status": "ok", "findings": [], "facts": {}} for i in range(SUMMARY_ABOVE + 1)}
    nodes = {h: {**NODES["lab-01"], "node": h} for h in list(hosts)[:5]}
    text = _rendered(with_nodes(report_document(hosts, started=1.7e9, finished=1.7e9 + 2), nodes))
    assert "summarised" in text
    assert "scheduler: 5 node(s) read, 5 out of service: drained by someone else 5" in text


def test_the_prometheus_file_has_each_nodes_phase_and_who_took_it_out() -> None:
    from prometheus_client import generate_latest

    text = generate_latest(build_registry(_report(NODES))).decode()
    samples = {
        (s.labels["host"], s.labels["phase"], s.labels["by"])
        for family in text_string_to_metric_families(text)
        if family.name == "fleetops_" + SCHEDULER_NODE_GAUGE[0]
        for s in family.samples
    }
    assert samples == {
        ("lab-01", "drained", "other"),
        ("gpu-2", "draining", "fleetops"),
        ("lab-03", "in", ""),
    }
    assert "scheduler_node_phase" not in generate_latest(build_registry(_report({}))).decode()


@pytest.mark.parametrize("transport", ["ansible", "ssh"])
def test_a_real_scan_carries_each_slurm_hosts_node_in_report_and_ndjson(
    tmp_path: Path, transport: str
) -> None:
    scontrol = _scontrol(
        tmp_path, _slurm_text(**{"lab-01": "drained_admin", "lab-02": "draining", "lab-03": "idle"})
    )
    inv = _fleet(tmp_path, scontrol)
    proc = _scan(inv, "--format", "json", "--transport", transport)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    schemas.validate_scan_report(report, "report")
    phases = {
        h: (e["node"]["node"], e["node"]["phase"], e["node"]["ours"])
        for h, e in report["hosts"].items()
        if "node" in e
    }
    assert phases == {
        "lab-01": ("lab-01", "drained", False),
        "gpu-2": ("lab-02", "draining", True),
        "lab-03": ("lab-03", "in", False),
    }
    assert all(e["status"] == "ok" for e in report["hosts"].values())
    assert (tmp_path / "scontrol-calls").read_text().splitlines() == [" show node"]  # once per scan
    lines = [
        json.loads(line)
        for line in _scan(inv, "--format", "ndjson", "--transport", transport).stdout.splitlines()
    ]
    assert {d["host"]: d.get("node", {}).get("phase") for d in lines} == {
        "lab-01": "drained", "gpu-2": "draining", "lab-03": "in", "plain": None}  # fmt: skip


def test_a_scheduler_that_cannot_be_read_exits_3_and_says_why_with_every_host_scanned(tmp_path: Path) -> None:
    inv = _fleet(tmp_path, _scontrol(tmp_path, "", rc=1))
    proc = _scan(inv, "--transport", "ssh")
    assert proc.returncode == ExitCode.FAILED, proc.stdout + proc.stderr
    assert "4 host(s): 4 ok" in proc.stdout and "3 scheduler node(s) not read" in proc.stdout
    assert proc.stdout.count("Unable to contact slurm controller") == 1
