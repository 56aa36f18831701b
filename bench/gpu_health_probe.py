#!/usr/bin/env python3
"""Run ONLY the gpu_health detector, in-process, on this machine, and print its facts and findings as JSON.

For a real GPU host (CI has none): copy the repository (or just ``collections/`` and ``plugins/``) there and
run ``python3 bench/gpu_health_probe.py`` with any Python >= 3.9; it needs neither ansible nor anything
outside the standard library. ``--sample-seconds N`` takes two samples N seconds apart (new Xid events).
Exit code 0 whatever it finds; 2 when the detector could not run (the error is in the JSON).

It reads the kernel log as the module does (``/dev/kmsg`` needs root or ``kernel.dmesg_restrict=0``,
else ``journalctl -k``) and runs ``nvidia-smi --query-gpu=...`` once per sample when it is installed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "collections"))

from ansible_collections.fleetops.node.plugins.module_utils import gpu, kernlog  # noqa: E402
from ansible_collections.fleetops.node.plugins.module_utils.findings import DetectorError  # noqa: E402


def run_command(argv: list[str]) -> tuple[int, str, str]:
    """What AnsibleModule.run_command gives the module: (rc, stdout, stderr); a missing binary is rc 127."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    except OSError as err:
        return 127, "", f"{argv[0]}: {err.strerror or err}"
    return proc.returncode, proc.stdout, proc.stderr


def probe(sample_seconds: float) -> dict[str, Any]:
    started = time.monotonic()
    try:
        facts = gpu.collect(run_command, kernlog.read(run_command))
        if sample_seconds > 0:
            first, first_at = facts, time.monotonic()
            time.sleep(sample_seconds)
            second = gpu.collect(run_command, kernlog.read(run_command))
            facts = gpu.add_growth(first, second, time.monotonic() - first_at)
    except DetectorError as err:
        return {
            "check": gpu.CHECK,
            "facts": None,
            "findings": [],
            "errors": [{"check": gpu.CHECK, "msg": str(err)}],
        }
    return {
        "check": gpu.CHECK,
        "python": sys.version.split()[0],
        "facts": facts,
        "findings": gpu.evaluate(facts),
        "errors": [],
        "duration_ms": round((time.monotonic() - started) * 1000.0, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sample-seconds", type=float, default=0.0, help="two samples this far apart")
    args = parser.parse_args(argv)
    result = probe(args.sample_seconds)
    print(json.dumps(result, indent=2, sort_keys=True, default=str))
    return 2 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
