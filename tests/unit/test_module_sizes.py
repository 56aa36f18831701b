"""tools/module_sizes.py, ``make lint``'s size check: no module of src/fleetops over 700 lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "module_sizes.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=60)


def test_no_module_of_fleetops_passes_700_lines() -> None:
    done = _run()
    assert done.returncode == 0, done.stderr


def test_a_module_over_the_limit_fails_the_check_naming_it(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "big.py").write_text("x = 1\n" * 701)
    (tmp_path / "pkg" / "ok.py").write_text("x = 1\n" * 700)
    done = _run(str(tmp_path))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"{tmp_path / 'pkg' / 'big.py'}: 701 lines, over the 700 a module of fleetops may have: split it by concern"
    ]
