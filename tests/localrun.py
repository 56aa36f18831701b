"""What AnsibleModule.run_command gives a module, for in-process calls of target-side code in tests."""

from __future__ import annotations

import subprocess


def run_command(argv: list[str]) -> tuple[int, str, str]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError as err:
        return 127, "", f"{argv[0]}: {err.strerror or err}"
    return proc.returncode, proc.stdout, proc.stderr
