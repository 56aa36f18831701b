"""The scan against the physical ssh floor: `fleetops scan` vs one bare ssh round trip per host.

The floor is what no scan over ssh can beat: for every host, one fresh ssh connection that starts
the host's Python and exits (``ssh HOST "python3 -c 'import os'"``), all hosts at once (as many at
once as the scan's forks: every host up to 100), no connection reuse (``ControlMaster=no``,
``ControlPath=none``), with the ssh command line the scan itself uses for that host
(``fleetops.ansible.direct``: ansible's configuration and the host's variables, the options ansible's
ssh plugin adds, connection sharing off). Any host failing fails the benchmark.

The scan is ``fleetops scan --format json --transport T`` on the same hosts, for each transport asked
(``auto``, the default, run without ``--transport``: fleetops' own ssh commands, ansible-playbook for the
hosts they cannot serve; ``ansible``: ansible-playbook; ``ssh``: auto's alias), cold each run (a fresh ssh
control-path directory), as ``bench/scan_fleet.py`` runs it; it must exit 0 or 1 (findings) and report
every host scanned, none left to ansible-playbook by the direct path.

They are interleaved (floor, each scan, floor, each scan, ... ``--runs`` times, after one untimed warm-up
of each) and the medians reported: wall time, the ratio scan/floor, the controller's CPU seconds per
host (the rusage of the whole process tree on this machine: ssh children and ControlPersist masters
included; this process is their subreaper, see scan_fleet.py) and the lab hosts' CPU per host (the
``usage_usec`` of the lab's cgroup parent in the unified hierarchy: sshd, Python, the module, and
whatever else the guests did meanwhile).

Goal (issue 26): the scan <= 2.0x the floor at 50 hosts and <= 0.08 controller CPU s/host. This
prints the figures; it does not assert the goal. Needs root (the lab); boots the lab's hosts when
fewer are up, and takes down only a lab it booted from nothing. Run it under the dev lock:

    flock /run/fleetops-dev.lock python bench/scan_floor.py [--lab b1] [--hosts 50] [--runs 3]
        [--transports auto,ansible] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scan_fleet import (
    BENCH_TRANSPORTS,
    BenchError,
    _ansible_env,
    _cpu,
    _subreaper,
    down_if_booted,
    scan_argv,
    timed,
    transport_args,
)

from fleetops.ansible import direct
from fleetops.ansible.inventory import InventoryHost, load_hosts
from fleetops.errors import UsageError
from fleetops.scan import MAX_FORKS, TRANSPORTS
from fleetops_lab import Lab, LabError
from fleetops_lab.core import host_name

GOAL_RATIO = 2.0
GOAL_CPU_S_PER_HOST = 0.08
GOAL_HOSTS = 50
REMOTE_COMMAND = "python3 -c 'import os'"  # one string: ssh joins its argv with spaces
FLOOR_TIMEOUT_S = 120


@dataclass
class Sample:
    kind: str  # "floor" or "scan"
    wall_s: float
    cpu_s: float  # controller CPU (user + sys) of the run's whole process tree
    target_cpu_s: float | None  # the lab hosts' CPU over the run (None: no cgroup to read)


# --------------------------------------------------------------------------- the floor's ssh argv


def floor_argv(resolver: direct.Resolver, host: InventoryHost) -> list[str]:
    """The ssh command line the scan itself uses for ``host`` (``fleetops.ansible.direct``: ansible's
    configuration and the host's variables, the ssh plugin's options, connection sharing off), running the
    floor's command instead of the runner."""
    argv = list(resolver.target(host, FLOOR_TIMEOUT_S).argv)
    if argv[0] != "ssh" and "ssh" not in Path(argv[0]).name:
        raise BenchError(f"{host.name} is not reached over ssh: the floor is an ssh round trip")
    return [*argv[:-1], REMOTE_COMMAND]


# --------------------------------------------------------------------------- the two runs


class TargetCpu:
    """The lab hosts' CPU time: ``usage_usec`` of the lab's cgroup parent (cgroup v2, or the unified
    hierarchy of a hybrid machine)."""

    def __init__(self, cgroup_parent: str) -> None:
        candidates = [Path("/sys/fs/cgroup/unified", cgroup_parent, "cpu.stat"),
                      Path("/sys/fs/cgroup", cgroup_parent, "cpu.stat")]  # fmt: skip
        self.path = next((p for p in candidates if p.exists()), None)

    def read(self) -> float | None:
        if self.path is None:
            return None
        for line in self.path.read_text().splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
        return None


def _measured(kind: str, target: TargetCpu, run: Callable[[], tuple[float, float]]) -> Sample:
    before = target.read()
    wall, cpu = run()
    after = target.read()
    spent = after - before if before is not None and after is not None else None
    return Sample(kind=kind, wall_s=wall, cpu_s=cpu, target_cpu_s=spent)


def run_floor(argvs: Sequence[Sequence[str]], parallel: int) -> tuple[float, float]:
    """Every host's floor command, ``parallel`` at once: (wall s, controller CPU s of the ssh processes)."""

    def one(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=FLOOR_TIMEOUT_S, check=False)  # fmt: skip

    with _subreaper(), ThreadPoolExecutor(max_workers=parallel) as pool:
        cpu0, t0 = _cpu(), time.monotonic()
        done = list(pool.map(one, argvs))
        wall, cpu = time.monotonic() - t0, _cpu() - cpu0
    failed = [f"{p.args[-2]}: exit {p.returncode}: {p.stderr.strip()[-300:]}" for p in done if p.returncode]
    if failed:
        why = "\n  ".join(failed[:10])
        raise BenchError(f"the floor failed on {len(failed)} of {len(done)} host(s):\n  {why}")
    return wall, cpu


def run_scan(inventory: Path, hosts: Sequence[str], limit: str | None, transport: str) -> tuple[float, float]:
    """``fleetops scan --transport T`` once, cold: (wall s, controller CPU s); every host must be scanned."""
    with tempfile.TemporaryDirectory(prefix="fleetops-bench-") as tmp:
        report = Path(tmp) / "scan.json"
        argv = scan_argv(inventory, report) + (["-l", limit] if limit else []) + transport_args(transport)
        timing, output = timed(argv, _ansible_env())
        if timing.rc not in (0, 1) or not report.exists():
            raise BenchError(f"fleetops scan exited {timing.rc}: {output.strip()[-2000:]}")
        data = json.loads(report.read_text())
    got: Mapping[str, Any] = data["hosts"]
    bad = {h: (e["status"], e.get("msg"), e.get("errors")) for h, e in got.items()
           if e["status"] not in ("ok", "partial") or e.get("errors")}  # fmt: skip
    missing = sorted(set(hosts) - set(got))
    by_ansible = (data.get("transport") or {}).get("by_ansible")
    if by_ansible:
        raise BenchError(f"--transport {transport} left hosts to ansible-playbook: {by_ansible}")
    if bad or missing:
        raise BenchError(f"the scan did not get every host: missing {missing}; {json.dumps(bad)[:3000]}")
    return timing.wall_s, timing.cpu_s


# --------------------------------------------------------------------------- the lab


def ensure_lab(lab: Lab, wanted: Sequence[str]) -> None:
    """Boot the lab's hosts when fewer than ``wanted`` are up."""
    running = {h.name for h in lab.status(probe_ssh=False) if h.running}
    if set(wanted) <= running and lab.inventory_path().exists():
        print(f"lab {lab.name}: {len(running)} host(s) already up", flush=True)
        return
    if len(running) >= len(wanted):
        raise BenchError(f"lab {lab.name} runs {len(running)} host(s) but not all of {wanted[0]} .. "
                         f"{wanted[-1]}: fix it first (fleetops-lab --lab {lab.name} status)")  # fmt: skip
    lab.up(len(wanted), progress=print)  # the lab raises fs.inotify.max_user_instances for large fleets


# --------------------------------------------------------------------------- output


def _per_host(seconds: float | None, hosts: int, scale: float = 1.0, digits: int = 3) -> str:
    return "n/a" if seconds is None else f"{seconds / hosts * scale:.{digits}f}"


def median(samples: Sequence[Sample], kind: str) -> Sample:
    mine = [s for s in samples if s.kind == kind]
    targets = [s.target_cpu_s for s in mine if s.target_cpu_s is not None]
    return Sample(
        kind=kind,
        wall_s=statistics.median(s.wall_s for s in mine),
        cpu_s=statistics.median(s.cpu_s for s in mine),
        target_cpu_s=statistics.median(targets) if len(targets) == len(mine) else None,
    )


def print_table(samples: Sequence[Sample], medians: Sequence[Sample], hosts: int) -> None:
    runs: dict[str, int] = {}
    rows: list[tuple[str, Sample]] = []
    for s in samples:
        runs[s.kind] = runs.get(s.kind, 0) + 1
        rows.append((f"{s.kind} {runs[s.kind]}", s))
    rows += [(f"median {m.kind}", m) for m in medians]
    head = ("run", "wall s", "ctrl CPU s", "ctrl CPU s/host", "target CPU ms/host")
    width = [max(len(label) for label, _ in rows), *(max(len(h), 8) for h in head[1:])]
    print()
    print("  ".join(f"{h:>{w}}" for h, w in zip(head, width, strict=True)))
    for label, s in rows:
        cells = (label, f"{s.wall_s:.2f}", f"{s.cpu_s:.2f}", _per_host(s.cpu_s, hosts),
                 _per_host(s.target_cpu_s, hosts, 1000, 1))  # fmt: skip
        print("  ".join(f"{c:>{w}}" for c, w in zip(cells, width, strict=True)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lab", default=None, help="the lab (default: $FLEETOPS_LAB, else the default lab)")
    parser.add_argument("--hosts", type=int, default=GOAL_HOSTS, help=f"lab hosts (default: {GOAL_HOSTS})")
    parser.add_argument("--runs", type=int, default=3, help="floor/scan pairs; the medians are reported")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--transports", default=",".join(BENCH_TRANSPORTS), metavar="T,..",
                        help="the scan's transports to measure, each after the floor in every run "
                        f"(default: {','.join(BENCH_TRANSPORTS)}; the default one runs without --transport)")  # fmt: skip
    args = parser.parse_args(argv)
    transports = [t for t in args.transports.split(",") if t]
    if not transports or set(transports) - set(TRANSPORTS):
        parser.error(f"--transports: one or more of {', '.join(TRANSPORTS)}")
    if args.runs < 1:
        parser.error("--runs: at least 1")
    if os.geteuid() != 0:
        print("scan_floor: needs root (the lab boots systemd-nspawn hosts)", file=sys.stderr)
        return 2
    try:
        lab = Lab(name=args.lab)
    except LabError as exc:
        parser.error(str(exc))
    wanted = [host_name(i) for i in range(1, args.hosts + 1)]
    forks = min(args.hosts, MAX_FORKS)  # what fleetops scan uses by default; the floor gets the same
    print(f"scan_floor: fleetops scan vs the ssh floor on {args.hosts} host(s) of lab {lab.name}, "
          f"{forks} at once, {args.runs} run(s) each, interleaved ({os.cpu_count()} CPUs on this "
          "controller, which also runs the hosts)", flush=True)  # fmt: skip
    samples: list[Sample] = []
    try:
        with down_if_booted(lab):
            ensure_lab(lab, wanted)
            inventory = lab.inventory_path()
            listed = {h.name: h for h in load_hosts([inventory])}
            missing = [h for h in wanted if h not in listed]
            if missing:
                raise BenchError(f"{inventory} lacks {missing}")
            limit = None if set(listed) == set(wanted) else ",".join(wanted)
            resolver = direct.Resolver({}, connect_timeout=None)
            argvs = [floor_argv(resolver, listed[h]) for h in wanted]
            print("floor, per host: " + shlex.join(argvs[0]), flush=True)
            target = TargetCpu(lab.names.cgroup_parent)
            if target.path is None:
                print(f"  (no cpu.stat for the cgroup {lab.names.cgroup_parent}: no target CPU)", flush=True)
            run_floor(
                argvs, forks
            )  # warm-up (untimed): guest page caches, every host answers, runners staged
            for transport in transports:
                run_scan(inventory, wanted, limit, transport)
            for i in range(args.runs):
                samples.append(_measured("floor", target, lambda: run_floor(argvs, forks)))
                line = f"  run {i + 1}: floor {samples[-1].wall_s:.2f} s"
                for transport in transports:
                    samples.append(_measured(f"scan {transport}", target, partial(run_scan, inventory, wanted, limit,
                                                                                  transport)))  # fmt: skip
                    line += f", scan {transport} {samples[-1].wall_s:.2f} s"
                print(line, flush=True)
    except (BenchError, LabError, UsageError) as exc:  # the lab's status read first included
        print(f"scan_floor: {exc}", file=sys.stderr)
        return 1
    floor = median(samples, "floor")
    scans = [median(samples, f"scan {t}") for t in transports]
    print_table(samples, (floor, *scans), args.hosts)
    print()
    for scan in scans:
        print(f"{scan.kind}: ratio {scan.wall_s / floor.wall_s:.2f}x the floor (goal <= {GOAL_RATIO:.1f}x), "
              f"controller {scan.cpu_s / args.hosts:.3f} CPU s/host (goal <= {GOAL_CPU_S_PER_HOST:g})")  # fmt: skip
    if args.json:
        medians = [floor, *scans]
        args.json.write_text(json.dumps({
            "lab": lab.name, "hosts": args.hosts, "forks": forks, "runs": args.runs,
            "samples": [asdict(s) for s in samples],
            "median": {m.kind: asdict(m) for m in medians},
            "ratio": {s.kind: s.wall_s / floor.wall_s for s in scans},
            "controller_cpu_s_per_host": {m.kind: m.cpu_s / args.hosts for m in medians},
            "target_cpu_ms_per_host": {
                m.kind: None if m.target_cpu_s is None else m.target_cpu_s / args.hosts * 1000 for m in medians
            },
            "goal": {"ratio": GOAL_RATIO, "controller_cpu_s_per_host": GOAL_CPU_S_PER_HOST, "hosts": GOAL_HOSTS},
        }, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
