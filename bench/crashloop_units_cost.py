"""Cost of the crashloop_unit detector on a real systemd host with 300 services against 30.

The detector reads every service in ONE ``systemctl show`` call (design §3), so its cost should
grow far slower than the unit count (target ratio far below 10). The baseline measured in the same
run is the way it is usually written: one ``systemctl show`` per unit. Both run on a lab host
(systemd-nspawn, systemd 252); the detector's time is the module's own ``duration_ms``.
Needs root (the lab).

    python bench/crashloop_units_cost.py [--small 30] [--large 300] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from fleetops_lab import Lab  # noqa: E402

HOST = "lab-01"
PREFIX = "fleetops-bench-"


def _ensure_units(lab: Lab, count: int) -> None:
    """Exactly ``count`` loaded bench services (oneshot, RemainAfterExit) on the host."""
    script = f"""
set -e
systemctl stop '{PREFIX}*.service' 2>/dev/null || true
rm -f /etc/systemd/system/{PREFIX}*.service
for i in $(seq -f '%04g' 1 {count}); do
  printf '[Service]\\nType=oneshot\\nRemainAfterExit=yes\\nExecStart=/bin/true\\n' > /etc/systemd/system/{PREFIX}$i.service
done
systemctl daemon-reload
systemctl start $(for i in $(seq -f '%04g' 1 {count}); do echo {PREFIX}$i.service; done)
systemctl list-units --type=service --all --no-legend '{PREFIX}*' | wc -l
"""
    out = lab.run(HOST, script, check=True, timeout=300).stdout.strip().splitlines()[-1]
    if int(out) != count:
        raise SystemExit(f"expected {count} bench units loaded, found {out}")


def _services(lab: Lab) -> int:
    out = lab.run(HOST, "systemctl list-units --type=service --all --no-legend | wc -l", check=True).stdout
    return int(out.strip())


def _detector_ms(lab: Lab, repeat: int) -> float:
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
           "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json"}  # fmt: skip
    times = []
    for _ in range(repeat):
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "ansible"), "-i", str(lab.inventory_path()), HOST,
             "-m", "fleetops.node.node_health", "-a", "checks=crashloop_unit", "-o"],
            capture_output=True, text=True, env=env, check=True, cwd=REPO,
        )  # fmt: skip
        line = proc.stdout.strip().splitlines()[-1]
        times.append(float(json.loads(line.split("=>", 1)[1])["duration_ms"]))
    return statistics.median(times)


def _per_unit_ms(lab: Lab, repeat: int) -> float:
    """The usual way: list the units, then one systemctl show per unit (timed on the host)."""
    script = """
start=$(date +%s%N)
for u in $(systemctl list-units --type=service --all --no-legend --plain | awk '{print $1}'); do
  systemctl show -p Id,ActiveState,SubState,Result,NRestarts,UnitFileState "$u" >/dev/null
done
echo $(( ($(date +%s%N) - start) / 1000 ))
"""
    times = [
        int(lab.run(HOST, script, check=True, timeout=300).stdout.strip()) / 1000.0 for _ in range(repeat)
    ]
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=30)
    parser.add_argument("--large", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("crashloop_units_cost: skipped: needs root (it boots a lab host)")
        return 0
    lab = Lab()
    lab.up(1)
    try:
        rows = []
        for extra in (args.small, args.large):
            _ensure_units(lab, extra)
            rows.append(
                (_services(lab), _detector_ms(lab, args.repeat), _per_unit_ms(lab, max(1, args.repeat // 2)))
            )
        lab.run(HOST, f"rm -f /etc/systemd/system/{PREFIX}*.service; systemctl daemon-reload", check=False)
    finally:
        lab.down()
    (n_small, det_small, per_small), (n_large, det_large, per_large) = rows
    print(f"{'services':>9} {'detector (1 call) ms':>22} {'per-unit baseline ms':>22}")
    for n, det, per in rows:
        print(f"{n:>9} {det:>22.1f} {per:>22.1f}")
    det_ratio = det_large / det_small
    print(f"services ratio {n_large / n_small:.1f}x; detector cost ratio {det_ratio:.2f} (target far below 10); "
          f"per-unit baseline ratio {per_large / per_small:.2f}; at {n_large} services the detector is "
          f"{per_large / det_large:.0f}x cheaper than the per-unit way")  # fmt: skip
    return 0 if det_ratio < 5 else 1


if __name__ == "__main__":
    sys.exit(main())
