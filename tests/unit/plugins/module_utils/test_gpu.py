"""gpu_health on real inputs: nvidia-smi output captured on an NVIDIA H200 and Xid lines in the kernel's format.

A real GPU cannot run in CI (this machine has none), so the nvidia-smi side uses the output captured on
an H200 (driver 580.159.04): ``smi_csv.txt`` is exactly the detector's ``--query-gpu`` call (plus an
``rc=0`` line the capture added, stripped here), ``smi_q_ecc.txt`` its ``nvidia-smi -q -d ECC``. The
Xid lines are verbatim forms from public reports (Xid 62/154 from an RTX 5080 GSP halt, 63 from a row
remap, 48 with ``pid='<unknown>'``, 79 with pid and name, the pre-pid 32 form, the multi-line "fallen
off the bus" of newer drivers), wrapped as ``journalctl -k -o short-unix`` prints them.
``bench/gpu_health_probe.py`` runs the detector on a real GPU host.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.fleetops.node.plugins.module_utils import gpu, kernlog
from ansible_collections.fleetops.node.plugins.modules import node_health

from tests.localrun import run_command
from tests.paths import FIXTURES, REPO

FIXTURES = FIXTURES / "gpu"
SMI_CSV = "".join(
    line
    for line in (FIXTURES / "smi_csv.txt").read_text().splitlines(keepends=True)
    if not line.startswith("rc=")
)
SMI_Q_ECC = (FIXTURES / "smi_q_ecc.txt").read_text()
XID_LOG = (FIXTURES / "kernel-xid.txt").read_text()
SMI = "/usr/bin/nvidia-smi"


def _log(text: str) -> dict[str, Any]:
    return {
        "source": "journal",
        "error": None,
        "lines": kernlog.parse_short_unix(text),
        "read_at": 0.0,
        "read_ms": 1.0,
    }


def _smi(rc: int, out: str, err: str = "") -> Any:
    calls: list[list[str]] = []

    def run(argv: list[str]) -> tuple[int, str, str]:
        calls.append(argv)
        return rc, out, err

    run.calls = calls  # type: ignore[attr-defined]
    return run


def test_h200_capture_parses_with_na_fields() -> None:
    (h200,) = gpu.parse_smi_csv(SMI_CSV)
    assert h200 == {
        "index": 0,
        "pci_bus_id": "00000000:00:06.0",
        "uuid": "GPU-d254dc1a-7a4f-8b4b-f3a7-a20e7146e4d1",
        "name": "NVIDIA H200",
        "ecc_mode": "Enabled",
        "ecc_uncorrected_volatile": 0,
        "ecc_corrected_volatile": 0,
        "ecc_uncorrected_aggregate": 0,
        "retired_pages_pending": None,  # [N/A]: the H200 remaps rows instead of retiring pages
        "remapped_rows_correctable": 0,
        "remapped_rows_uncorrectable": 0,
        "remapped_rows_pending": False,
        "remapped_rows_failure": False,
    }


def test_csv_agrees_with_the_same_gpus_q_ecc_report() -> None:
    (h200,) = gpu.parse_smi_csv(SMI_CSV)
    assert "Current                                        : Enabled" in SMI_Q_ECC
    assert "Pending Page Blacklist                         : N/A" in SMI_Q_ECC
    assert "Remapping Failure Occurred                     : No" in SMI_Q_ECC
    assert h200["ecc_mode"] == "Enabled" and h200["retired_pages_pending"] is None
    assert h200["remapped_rows_failure"] is False


def test_healthy_h200_is_no_finding() -> None:
    run = _smi(0, SMI_CSV)
    facts = gpu.collect(run, _log(""), nvidia_smi=SMI)
    assert run.calls == [[SMI, *gpu.SMI_ARGS]]
    assert run.calls[0][1] == (
        "--query-gpu=index,pci.bus_id,uuid,name,ecc.mode.current,ecc.errors.uncorrected.volatile.total,"
        "ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.aggregate.total,retired_pages.pending,"
        "remapped_rows.correctable,remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure"
    )
    assert facts["nvidia_smi"] is True and len(facts["gpus"]) == 1
    assert gpu.evaluate(facts) == []


def test_not_supported_and_bad_counters() -> None:
    line = "1, 00000000:3B:00.0, GPU-x, NVIDIA A100-SXM4-80GB, Enabled, 2, 14, 7, [Not Supported], 3, 1, Yes, Yes\n"
    (a100,) = gpu.parse_smi_csv(line)
    assert a100["retired_pages_pending"] is None
    assert a100["pci_bus_id"] == "00000000:3b:00.0"
    facts = gpu.collect(_smi(0, line), _log(""), nvidia_smi=SMI)
    (finding,) = gpu.evaluate(facts)
    assert finding["severity"] == "critical"
    assert "row remapping FAILED" in finding["summary"]
    assert "2 uncorrectable ECC errors since the driver loaded" in finding["summary"]
    assert "a row remap is pending" in finding["summary"]
    pending = line.replace(", 2, 14, 7,", ", 0, 14, 7,").replace("Yes, Yes", "Yes, No")
    (finding,) = gpu.evaluate(gpu.collect(_smi(0, pending), _log(""), nvidia_smi=SMI))
    assert finding["severity"] == "warning"


def test_malformed_csv_is_a_detector_error() -> None:
    with pytest.raises(
        gpu.GpuError, match=r"Failed to parse nvidia-smi --query-gpu output: line 1: 3 fields, expected 13"
    ):
        gpu.parse_smi_csv("0, 00000000:00:06.0, GPU-x\n")


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python3, GPU has fallen off the bus.",
            {
                "code": 79,
                "pci": "0000:3b:00",
                "pid": 1,
                "name": "python3",
                "detail": "GPU has fallen off the bus.",
            },
        ),
        (
            "NVRM: Xid (PCI:0000:01:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) "
            "has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
            {"code": 48, "pid": None, "name": None},
        ),
        (
            "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
            {
                "code": 63,
                "pid": 1896,
                "name": None,
                "detail": "Row Remapper: New row marked for remapping, reset gpu to activate.",
            },
        ),
        (
            "NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000009 intr 00800000",
            {"code": 32, "pid": None, "detail": "Channel ID 00000009 intr 00800000"},
        ),
    ],
)
def test_xid_lines_parse(line: str, expected: dict[str, Any]) -> None:
    event = gpu.parse_xid(line)
    assert event is not None
    for key, value in expected.items():
        assert event[key] == value, key


def test_xid_154_states_the_recovery_action() -> None:
    event = gpu.parse_xid(
        "NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
    )
    assert event is not None
    assert event["recovery_action"] == {"from": "None", "to": "GPU Reset Required", "to_code": 1}
    assert gpu.xid_severity(event) == "critical"
    for action, severity in (("None", "info"), ("Drain P2P", "warning"), ("Node Reboot Required", "critical"),
                             ("Drain and Reset", "critical"), ("Something New", "warning")):  # fmt: skip
        event["recovery_action"] = {"from": "None", "to": action, "to_code": 9}
        assert gpu.xid_severity(event) == severity, action


@pytest.mark.parametrize(
    ("code", "severity"),
    [(79, "critical"), (48, "critical"), (74, "critical"), (95, "critical"), (119, "critical"), (64, "critical"),
     (63, "warning"), (94, "warning"), (92, "warning"), (13, "info"), (31, "info"), (43, "info"), (45, "info"),
     (999, "warning")],
)  # fmt: skip
def test_xid_classes(code: int, severity: str) -> None:
    assert gpu.xid_severity({"code": code, "recovery_action": None}) == severity


def test_kernel_log_of_a_failing_node() -> None:
    facts = gpu.collect(_smi(0, SMI_CSV), _log(XID_LOG), nvidia_smi=SMI)
    assert facts["xid_total"] == 9
    assert (
        facts["xid"]["79"]["count"] == 2
    )  # the Xid 79 line, and the multi-line "fallen off the bus" of b3:00.0
    assert facts["xid"]["79"]["pcis"] == ["0000:3b:00", "0000:b3:00.0"]
    assert facts["xid"]["154"]["severity"] == "critical"
    assert facts["xid"]["13"]["severity"] == "info"
    assert facts["xid"]["79"]["last"]["time"] == 1764430600.700903
    (finding,) = gpu.evaluate(facts)
    assert finding["check"] == "gpu_health" and finding["severity"] == "critical"
    assert finding["summary"].startswith("GPU health: Xid 48 x1 on 0000:01:00")
    assert (
        "Xid 154 x2 on 0000:01:00, 0000:3b:00 (recovery action: Node Reboot Required, critical)"
        in finding["summary"]
    )
    assert set(finding["data"]["xid"]) == {"13", "32", "48", "62", "63", "79", "154"}


def test_an_xid_79_line_and_the_probe_message_for_the_same_gpu_count_once() -> None:
    lines = kernlog.parse_short_unix(
        "1.0 h kernel: NVRM: Xid (PCI:0000:b3:00): 79, pid=7, name=x, GPU has fallen off the bus.\n"
        "2.0 h kernel: NVRM: The NVIDIA GPU 0000:b3:00.0\n"
        "3.0 h kernel: NVRM: fallen off the bus and is not responding to commands.\n"
    )
    assert [e["code"] for e in gpu.parse_log(lines)] == [79]


def test_new_events_between_samples() -> None:
    first = gpu.collect(_smi(0, SMI_CSV), _log(XID_LOG.split("\n", 3)[0] + "\n"), nvidia_smi=SMI)
    second = gpu.collect(_smi(0, SMI_CSV), _log(XID_LOG), nvidia_smi=SMI)
    grown = gpu.add_growth(first, second, 10.0)
    assert grown["new_xid_events"] == 9
    (finding,) = gpu.evaluate(grown)
    assert finding["summary"].endswith("; 9 new Xid event(s) in the last 10.0s")


def test_nvidia_smi_without_gpus_is_nothing_and_a_broken_driver_is_a_warning() -> None:
    none = gpu.collect(_smi(6, "No devices were found\n"), _log(""), nvidia_smi=SMI)
    assert none["gpus"] == [] and none["smi_error"] is None
    assert gpu.evaluate(none) == []
    broken = gpu.collect(
        _smi(9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
                "latest NVIDIA driver is installed and running.\n"),
        _log(""), nvidia_smi=SMI,
    )  # fmt: skip
    (finding,) = gpu.evaluate(broken)
    assert finding["severity"] == "warning"
    assert finding["summary"].startswith("GPU health: nvidia-smi failed: NVIDIA-SMI has failed")


def test_off_gpu_host_is_no_finding_no_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine: no nvidia-smi, no NVRM lines in its kernel log."""
    facts = gpu.collect(run_command)
    assert facts["nvidia_smi"] is False and facts["gpus"] == [] and facts["xid"] == {}
    result = node_health.run_checks({"checks": ["gpu_health"], "_run": run_command})
    assert result["errors"] == [] and result["findings"] == []
    assert result["facts"]["gpu"]["kernel_log"]["source"] in ("kmsg", "journal", None)


def test_probe_script_runs_on_plain_python_without_ansible() -> None:
    """bench/gpu_health_probe.py: stdlib only, for a real GPU host."""
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    proc = subprocess.run([python, str(REPO / "bench" / "gpu_health_probe.py")], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["check"] == "gpu_health"
    assert result["errors"] == [] and result["findings"] == []
    assert set(result["facts"]) >= {"nvidia_smi", "gpus", "xid", "kernel_log"}
