"""Prometheus gauges of ena_resets, cpu_starvation and gpu_health, read back from the written textfile."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ansible_collections.fleetops.node.plugins.module_utils import cpustat, ena, gpu, kernlog
from prometheus_client.parser import text_string_to_metric_families

from fleetops.metrics import write_textfile
from tests.paths import FIXTURES

FIXTURES = FIXTURES


def _facts() -> dict[str, Any]:
    """Detector facts made by the detectors themselves from the captured inputs (see test_ena/test_gpu/test_cpustat)."""
    stats = ena.parse_ethtool_stats((FIXTURES / "ena" / "ethtool-S-eth0.txt").read_text())
    counters = {name: stats[name] for name in ena.COUNTERS if name in stats}
    resets, basis = ena.resets(counters, {})
    ena_facts = {"interfaces": {"eth0": {"pci": "0000:00:05.0", "counters": counters, "resets": resets,
                                         "resets_basis": basis, "log": {}}}, "reason": None}  # fmt: skip
    smi = "".join(
        line for line in (FIXTURES / "gpu" / "smi_csv.txt").read_text().splitlines(True) if "rc=" not in line
    )
    smi = smi.replace("Enabled, 0, 0, 0, [N/A], 0, 0, No, No", "Enabled, 3, 0, 3, [N/A], 0, 1, Yes, No")
    log = {"source": "journal", "error": None, "read_at": 0.0, "read_ms": 1.0,
           "lines": kernlog.parse_short_unix((FIXTURES / "gpu" / "kernel-xid.txt").read_text())}  # fmt: skip
    gpu_facts = gpu.collect(lambda argv: (0, smi, ""), log, nvidia_smi="/usr/bin/nvidia-smi")

    def sample(n: int) -> dict[str, Any]:
        return {
            "cpus": 2,
            "_stat": cpustat.parse_stat((FIXTURES / "cpu" / f"stat_{n}.txt").read_text()),
            "_softirqs": {},
            "_interrupts": {},
        }

    cpu_facts = cpustat.add_growth(sample(1), sample(2), 2.0)
    return {"ena": ena_facts, "gpu": gpu_facts, "cpu": cpu_facts}


def test_hardware_gauges(tmp_path: Path) -> None:
    report = {
        "schema": "fleetops.scan/v1",
        "hosts": {
            "gpu-1": {"status": "ok", "findings": [], "errors": [], "facts": _facts(), "duration_ms": 12.0},
            "cpu-1": {
                "status": "ok",
                "findings": [],
                "errors": [],
                "facts": {"memcg": {}},
                "duration_ms": 3.0,
            },
        },
        "summary": {"hosts": 2, "ok": 2, "unreachable": 0, "failed": 0, "findings": {}, "errors": 0},
        "duration_s": 1.5,
    }
    prom = tmp_path / "fleetops.prom"
    write_textfile(report, prom)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(prom.read_text())
        for s in family.samples
    }
    host = (("host", "gpu-1"),)
    assert samples[("fleetops_ena_resets", host)] == 2
    assert samples[("fleetops_ena_reset_failures", host)] == 0
    assert samples[("fleetops_cpu_system_max_pct", host)] == round(100.0 * 7 / 203, 1)
    xid = {sev: samples[("fleetops_gpu_xid_events", (("host", "gpu-1"), ("severity", sev)))]
           for sev in ("critical", "warning", "info")}  # fmt: skip
    assert xid == {"critical": 6, "warning": 1, "info": 2}  # 48, 62, 79 x2, 154 x2 / 63 / 13, 32
    assert samples[("fleetops_gpu_ecc_uncorrected", host)] == 3
    assert samples[("fleetops_gpu_remap_problems", host)] == 1
    # a host whose scan had none of these detectors gets none of these gauges
    assert not [key for key in samples if key[1] and ("host", "cpu-1") in key[1] and "gpu" in key[0]]
    assert ("fleetops_ena_resets", (("host", "cpu-1"),)) not in samples


def test_findings_show_in_the_scan_table() -> None:
    import io

    from rich.console import Console

    from fleetops.cli.render import render_scan

    facts = _facts()
    findings = ena.evaluate(facts["ena"]) + gpu.evaluate(facts["gpu"])
    report = {
        "schema": "fleetops.scan/v1",
        "hosts": {"gpu-1": {"status": "ok", "findings": findings, "errors": [], "facts": facts}},
        "summary": {"hosts": 1, "ok": 1, "unreachable": 0, "failed": 0,
                    "findings": {"critical": 1, "warning": 1, "info": 0}, "errors": 0},
    }  # fmt: skip
    out = io.StringIO()
    render_scan(report, Console(file=out, width=400, color_system=None))
    text = out.getvalue()
    rows = [[c.strip() for c in ln.strip("│").split("│")] for ln in text.splitlines() if ln.startswith("│")]
    assert ["gpu-1", "ena_resets", "warning"] in [r[:3] for r in rows]
    assert ["gpu-1", "gpu_health", "critical"] in [r[:3] for r in rows]
    assert "ENA NIC reset or TX timeout: eth0: 2 resets" in text
    wide = io.StringIO()
    render_scan(report, Console(file=wide, width=400, color_system=None), wide=True)
    assert "ena_resets:warning" in wide.getvalue() and "gpu_health:critical" in wide.getvalue()
    assert "GPU health: Xid 48" in text
