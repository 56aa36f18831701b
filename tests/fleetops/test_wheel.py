"""The product wheel holds the product only: no lab, demo or fault injector (they live in lab/)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from tests.paths import REPO

FORBIDDEN = ("fleetops_lab", "fleetops/lab", "demo", "faults", "ec2sim", "supervisor", "rootfs")


def _build(tmp_path: Path) -> Path:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    wheels = list(tmp_path.glob("fleetops-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_product_wheel_has_no_lab_code(tmp_path: Path) -> None:
    wheel = _build(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    modules = [n for n in names if n.endswith(".py")]
    # the wheel is the controller package, and all of it
    assert "fleetops/cli/__init__.py" in modules
    assert "fleetops/rollout/engine.py" in modules
    offending = [n for n in names if any(word in n for word in FORBIDDEN)]
    assert offending == [], offending
    # every module of the package is in it: nothing of the product was dropped with the lab (the wheel
    # also carries the collection, ansible_collections/fleetops/node: test_execution_environment checks it)
    src = sorted(str(p.relative_to(REPO / "src")) for p in (REPO / "src" / "fleetops").rglob("*.py"))
    assert sorted(n for n in modules if n.startswith("fleetops/")) == src
    # the default remediation policy ships with the package: `remediate auto` without --policy works
    # from a wheel (an AWX execution environment), not only from a checkout
    assert "fleetops/policies/default.yml" in names
    with zipfile.ZipFile(wheel) as zf:
        shipped = zf.read("fleetops/policies/default.yml")
    assert shipped == (REPO / "policies" / "default.yml").read_bytes()
