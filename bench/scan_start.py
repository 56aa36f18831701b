"""How long ``fleetops scan`` takes to start its first ssh (what an operator waits for on every command, and a
rollout on every batch's gate), against baselines measured in the same run: the interpreter's own start-up
(``python -c pass``) and the CLI's import (``python -c "import fleetops.cli.app"``).

The scan is the default one (transport auto, the fleet record written to a temporary state home) of HOSTS
hosts that refuse the connection (127.0.0.1, port 1: no lab needed), so that its start, not its hosts, is
timed. The first ssh is seen through ``ssh`` on ``PATH``: a script that notes the time (``date``: the
system clock, as this process reads it) and execs the real ssh. ``--base SRC`` times another tree's
``src`` (``PYTHONPATH``: the same interpreter, ansible and collection) in the same rounds, alternated with
this one's: the before and after of a change.

Each figure is the median of RUNS runs after one warm-up (the page cache warm, as for a user's second
command). Target: the first ssh within TARGET_S of the command. Run: python bench/scan_start.py [--base SRC]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scan_fleet import _ansible_env

BIN = Path(sys.executable).parent
PYTHON = sys.executable
RUNS = 7
HOSTS = 50
TARGET_S = 0.3


def _fake_ssh(folder: Path, stamps: Path) -> None:
    """``ssh`` that notes when it was first started, then runs the real one."""
    real = shutil.which("ssh") or "/usr/bin/ssh"
    script = folder / "ssh"
    script.write_text(f'#!/bin/sh\n[ -e {stamps} ] || date +%s.%N > {stamps}\nexec {real} "$@"\n')
    script.chmod(0o755)


def first_ssh_s(argv: list[str], env: dict[str, str], stamps: Path) -> tuple[float, float]:
    """(seconds from the start to the first ssh, CPU seconds of the whole command)."""
    stamps.unlink(missing_ok=True)
    before = os.times()
    start = time.time()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    after = os.times()
    if (
        proc.returncode == 2 or not stamps.exists()
    ):  # 2: a usage error; 3: the hosts are unreachable, as meant
        raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}, no ssh started\n{proc.stderr[-2000:]}")
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return float(stamps.read_text()) - start, cpu


def wall_s(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, capture_output=True, check=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, help="another tree's src folder, timed in the same rounds")
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--hosts", type=int, default=HOSTS)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fleetops-bench-start-"))
    try:
        inventory = work / "hosts.yml"
        names = "".join(f"    h{n:04d}: {{}}\n" for n in range(args.hosts))
        inventory.write_text(
            "all:\n  vars: {ansible_host: 127.0.0.1, ansible_port: 1, ansible_user: nobody}\n"
            f"  hosts:\n{names}"
        )
        (work / "bin").mkdir()
        stamps = work / "first-ssh"
        _fake_ssh(work / "bin", stamps)
        env = {**_ansible_env(), "PATH": f"{work / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
        argv = [str(BIN / "fleetops"), "scan", "-i", str(inventory), "-q", "--format", "json"]
        trees = {"this tree": {**env}}
        if args.base is not None:
            trees["--base"] = {**env, "PYTHONPATH": str(args.base.resolve())}
        figures: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
        starts: list[float] = []
        imports: list[float] = []
        for i in range(args.runs + 1):
            start_up = wall_s([PYTHON, "-c", "pass"], env)
            cli = wall_s([PYTHON, "-c", "import fleetops.cli.app"], env)
            taken = {name: first_ssh_s(argv, tree_env, stamps) for name, tree_env in trees.items()}
            if i:  # the first round warms the page cache and the kept copies
                starts.append(start_up)
                imports.append(cli)
                for name, figure in taken.items():
                    figures[name].append(figure)
        start_up, cli = statistics.median(starts), statistics.median(imports)
        print(
            f"fleetops scan of {args.hosts} hosts (refusing ssh), median of {args.runs} runs after one warm-up"
        )
        print(f"{'':32} {'first ssh s':>12} {'x start-up':>11} {'x CLI import':>13} {'command CPU s':>14}")
        print(f"{'python -c pass':32} {start_up:>12.3f} {1:>10.1f}x")
        print(f"{'python -c import fleetops.cli.app':32} {cli:>12.3f} {cli / start_up:>10.1f}x {1:>12.1f}x")
        verdicts = []
        for name, runs in figures.items():
            first = statistics.median(f[0] for f in runs)
            cpu = statistics.median(f[1] for f in runs)
            print(f"{'fleetops scan (' + name + ')':32} {first:>12.3f} {first / start_up:>10.1f}x "
                  f"{first / cli:>12.1f}x {cpu:>14.2f}")  # fmt: skip
            verdicts.append(first <= TARGET_S)
        print(
            f"target: the first ssh within {TARGET_S:g} s: {'met' if verdicts[0] else 'NOT met'} (this tree)"
        )
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
