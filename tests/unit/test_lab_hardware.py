"""The lab's nvidia-smi stand-in (fleetops_lab.hardware) answers gpu_health's one query exactly as the real
tool did on an H200 (the captured tests/unit/fixtures/gpu/smi_csv.txt), and refuses what it cannot answer.
The stand-in runs here as it runs in a lab host (python3, its hardware file), pointed at a temporary file.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ansible_collections.fleetops.node.plugins.module_utils import gpu

from fleetops_lab import hardware
from tests.paths import FIXTURES


def _standin(tmp_path: Path, gpus: list[dict[str, object]] | None) -> Path:
    hw = tmp_path / "gpu.json"
    if gpus is not None:
        hw.write_text(json.dumps({"gpus": gpus}))
    script = tmp_path / "nvidia-smi"
    script.write_text(hardware._STANDIN.replace("/var/lib/fleetops-lab/hw/gpu.json", str(hw)))
    return script


def _run(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=30, check=False
    )


def test_a_healthy_gpu_prints_the_captured_h200_line(tmp_path: Path) -> None:
    proc = _run(_standin(tmp_path, [hardware.HEALTHY_GPU]), *gpu.SMI_ARGS)
    assert proc.returncode == 0, proc.stderr
    captured = (FIXTURES / "gpu" / "smi_csv.txt").read_text().splitlines()[0]
    assert proc.stdout.splitlines() == [captured]
    assert gpu.parse_smi_csv(proc.stdout) == gpu.parse_smi_csv(captured)


def test_injected_ecc_errors_are_critical_for_gpu_health(tmp_path: Path) -> None:
    faulty = {
        **hardware.HEALTHY_GPU,
        "ecc.errors.uncorrected.volatile.total": 3,
        "ecc.errors.uncorrected.aggregate.total": 3,
    }
    proc = _run(_standin(tmp_path, [faulty]), *gpu.SMI_ARGS)
    assert proc.returncode == 0, proc.stderr
    (parsed,) = gpu.parse_smi_csv(proc.stdout)
    assert parsed["ecc_uncorrected_volatile"] == 3
    assert gpu._gpu_problems(parsed) == [("critical", "3 uncorrectable ECC errors since the driver loaded")]


def test_no_hardware_file_is_no_gpu(tmp_path: Path) -> None:
    proc = _run(_standin(tmp_path, None), *gpu.SMI_ARGS)
    assert proc.returncode == 6 and "No devices were found" in proc.stdout  # what collect() treats as no GPU


def test_what_it_cannot_answer_is_refused(tmp_path: Path) -> None:
    script = _standin(tmp_path, [hardware.HEALTHY_GPU])
    assert _run(script, "-q").returncode == 2
    bad = _run(script, "--query-gpu=index,temperature.gpu", "--format=csv,noheader,nounits")
    assert bad.returncode == 2 and 'Field "temperature.gpu" is not a valid field to query.' in bad.stdout
