"""Shared test helpers: run the real `fleetops` console script and read its JSON report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FLEETOPS = Path(sys.executable).parent / "fleetops"


@dataclass
class CliResult:
    rc: int
    stdout: str
    stderr: str

    def json(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.stdout)
        return data


def fleetops(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> CliResult:
    """Run the installed `fleetops` CLI as a user would (a real subprocess)."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [str(FLEETOPS), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)
