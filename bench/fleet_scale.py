"""Scan at fleet size: ``fleetops scan`` over 500, 2,500 and 7,500 simulated hosts, and 7,500 with 2% dead.

The fleet is the lab's simulated one (``fleetops-lab up N --addresses K --dead D``, fleetops_lab.aliases):
N lab hosts each answering ssh on K addresses of its own, the inventory listing the N x K addresses as
hosts, so the controller opens one ssh connection per inventory host as it would on a real fleet;
D more addresses are blackholed and time out as a gone instance does. An alias is its host: the
targets' CPU is the lab's, shared with the controller on this machine's cores (see docs/fleet-scale.md).

For each size and transport (``auto``, the default, run without ``--transport``: fleetops' own ssh commands;
``ansible``: ansible-playbook through ansible-runner, what AWX's scan template runs; ``ssh``: auto's alias)
one cold ``fleetops scan -o REPORT`` is run and measured:

- wall time, and hosts a minute;
- the controller's CPU seconds a host: the rusage of the scan's whole process tree (ssh and its
  ControlPersist masters included; this process is their subreaper, as in scan_fleet.py);
- the lab hosts' CPU milliseconds a host (the lab's cgroup, as scan_floor.py reads it);
- the controller's peak memory: the largest sum of PSS over the scan's process tree, sampled every
  second (PSS, not RSS: ansible's forked workers share their parent's pages), and the largest RSS of
  one process in it;
- what the run wrote to disk: the scan's TMPDIR (ansible-runner's private data dir and artifacts live
  there) at its largest while the run went, and what was left in it after the run;
- the report's size (``-o``), and its ``.partial`` stream's at its largest.

Each run must report every live host ``ok`` and every dead one ``unreachable``. The summary prints the
ratios the goals name (issue 26, item 3): time and peak memory at 7,500 against 2,500 (linear: at most
3.3x, the sizes' own ratio being 3.0), peak memory under 2 GiB at 7,500, and what the dead hosts cost:
the dead run's wall time less the full run's scaled to the live hosts, against the connect timeout a
dead host costs once. It prints the figures; it does not assert the goals. Needs root (the lab); boots
the lab's hosts when fewer are up and takes down a lab it booted. Run it under the dev lock:

    flock /run/fleetops-dev.lock python bench/fleet_scale.py [--lab b1] [--hosts 50]
        [--sizes 500,2500,7500] [--dead-pct 2] [--transports auto,ansible] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scan_fleet import (
    BENCH_TRANSPORTS,
    FLEETOPS,
    REPO,
    BenchError,
    _ansible_env,
    _cpu,
    _subreaper,
    down_if_booted,
    transport_args,
)
from scan_floor import TargetCpu

from fleetops.ansible.inventory import load_hosts
from fleetops.scan import CONNECT_TIMEOUT_S, TRANSPORTS
from fleetops_lab import Lab, LabError
from fleetops_lab.aliases import DEAD_PREFIX
from fleetops_lab.core import MAX_HOSTS

DEFAULT_SIZES = (500, 2500, 7500)
GOAL_LINEAR = 3.3  # 7,500 against 2,500
GOAL_PEAK_MIB = 2048
SAMPLE_S = 1.0


@dataclass
class Run:
    size: int  # inventory hosts
    dead: int  # of them, dead addresses
    transport: str
    wall_s: float
    cpu_s: float
    target_cpu_s: float | None
    peak_pss_mib: float
    peak_rss_mib: float  # the largest one process
    peak_processes: int
    disk_peak_mib: float
    disk_peak_files: int
    disk_left_files: int
    report_mib: float
    partial_peak_mib: float
    rc: int

    @property
    def live(self) -> int:
        return self.size - self.dead


# --------------------------------------------------------------------------- sampling


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            children.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, ()):
            out.append(child)
            todo.append(child)
    return out


def _memory_kib(pid: int) -> tuple[int, int]:
    """(PSS, RSS) of one process in KiB; (0, 0) when it is gone or has no memory (a zombie)."""
    pss = rss = 0
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss = int(line.split()[1])
            elif line.startswith("Rss:"):
                rss = int(line.split()[1])
    return pss, rss


def _tree_size(path: Path) -> tuple[int, int]:
    files = size = 0
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                size += os.lstat(os.path.join(dirpath, name)).st_size
                files += 1
    return files, size


class Sampler(threading.Thread):
    """Every second: the scan's process tree's PSS and largest RSS, its TMPDIR's size, the partial report's."""

    def __init__(self, tmpdir: Path, partial: Path) -> None:
        super().__init__(daemon=True)
        self.tmpdir, self.partial = tmpdir, partial
        self.done = threading.Event()
        self.pss_kib = self.rss_kib = self.processes = self.disk_bytes = self.disk_files = (
            self.partial_bytes
        ) = 0

    def sample(self) -> None:
        pids = _descendants(os.getpid())
        mems = [_memory_kib(pid) for pid in pids]
        self.pss_kib = max(self.pss_kib, sum(p for p, _ in mems))
        self.rss_kib = max(self.rss_kib, max((r for _, r in mems), default=0))
        self.processes = max(self.processes, len(pids))
        files, size = _tree_size(self.tmpdir)
        self.disk_files, self.disk_bytes = max(self.disk_files, files), max(self.disk_bytes, size)
        with contextlib.suppress(OSError):
            self.partial_bytes = max(self.partial_bytes, self.partial.stat().st_size)

    def run(self) -> None:
        while not self.done.wait(SAMPLE_S):
            self.sample()


# --------------------------------------------------------------------------- one scan


def scan(lab: Lab, transport: str, size: int, dead: int, target: TargetCpu) -> Run:
    inventory = lab.inventory_path()
    listed = [h.name for h in load_hosts([inventory])]
    if len(listed) != size:
        raise BenchError(f"{inventory} lists {len(listed)} host(s), not {size}")
    with tempfile.TemporaryDirectory(prefix="fleetops-scale-") as tmp:
        work = Path(tmp)
        (work / "tmp").mkdir()
        (work / "cp").mkdir()
        report = work / "scan.json"
        env = {
            **os.environ,
            **_ansible_env(),
            "TMPDIR": str(work / "tmp"),  # runner's private data dir and artifacts
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(work / "cp"),  # cold: no connection of an earlier run
        }
        argv = [
            str(FLEETOPS),
            "scan",
            "-i",
            str(inventory),
            *transport_args(transport),
            "-q",
            "-o",
            str(report),
        ]
        sampler = Sampler(work / "tmp", Path(f"{report}.partial"))
        with _subreaper():
            cpu0, target0, t0 = _cpu(), target.read(), time.monotonic()
            proc = subprocess.Popen(argv, env=env, cwd=REPO, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
            sampler.start()
            _, stderr = proc.communicate()
            wall = time.monotonic() - t0
            sampler.done.set()
            sampler.join()
        cpu, target1 = _cpu() - cpu0, target.read()
        left_files, _ = _tree_size(work / "tmp")
        if proc.returncode not in (0, 1, 3) or not report.exists():
            raise BenchError(
                f"fleetops scan --transport {transport} exited {proc.returncode}: {stderr[-2000:]}"
            )
        report_bytes = report.stat().st_size
        data = json.loads(report.read_text())
    hosts = data["hosts"]
    wrong = {
        h: (e["status"], (e.get("msg") or "")[:200], e.get("errors"))
        for h, e in hosts.items()
        if (
            e["status"] != "unreachable"
            if h.startswith(DEAD_PREFIX)
            else (e["status"] not in ("ok", "partial") or e.get("errors"))
        )
    }
    missing = sorted(set(listed) - set(hosts))
    if wrong or missing:
        raise BenchError(f"the scan did not get every host as expected: missing {missing[:10]}; "
                         f"{json.dumps(dict(list(wrong.items())[:10]))}")  # fmt: skip
    if (data.get("transport") or {}).get("by_ansible"):
        raise BenchError(f"--transport {transport} left hosts to ansible-playbook")
    mib = 1024 * 1024
    return Run(
        size=size, dead=dead, transport=transport, wall_s=wall, cpu_s=cpu,
        target_cpu_s=None if target0 is None or target1 is None else target1 - target0,
        peak_pss_mib=sampler.pss_kib / 1024, peak_rss_mib=sampler.rss_kib / 1024,
        peak_processes=sampler.processes, disk_peak_mib=sampler.disk_bytes / mib,
        disk_peak_files=sampler.disk_files, disk_left_files=left_files, report_mib=report_bytes / mib,
        partial_peak_mib=sampler.partial_bytes / mib, rc=proc.returncode,
    )  # fmt: skip


# --------------------------------------------------------------------------- output


def split(size: int, hosts: int, dead_pct: float) -> tuple[int, int]:
    """(K addresses a host, D dead) for ``size`` inventory hosts on ``hosts`` lab hosts."""
    dead = round(size * dead_pct / 100)
    k = (size - dead) // hosts
    return k, size - k * hosts


def _row(r: Run) -> tuple[str, ...]:
    target = "n/a" if r.target_cpu_s is None else f"{r.target_cpu_s / r.size * 1000:.0f}"
    return (f"{r.size:,}", str(r.dead), r.transport, f"{r.wall_s:.1f}", f"{r.size / r.wall_s * 60:,.0f}",
            f"{r.cpu_s / r.size:.3f}", target, f"{r.peak_pss_mib:.0f}", f"{r.peak_rss_mib:.0f}",
            str(r.peak_processes), f"{r.disk_peak_mib:.1f}", str(r.disk_peak_files), str(r.disk_left_files),
            f"{r.report_mib:.1f}", str(r.rc))  # fmt: skip


def print_table(runs: Sequence[Run]) -> None:
    head = ("hosts", "dead", "transport", "wall s", "hosts/min", "ctrl CPU s/host", "target CPU ms/host",
            "peak PSS MiB", "max RSS MiB", "procs", "tmp peak MiB", "tmp peak files", "left files",
            "report MiB", "rc")  # fmt: skip
    rows = [_row(r) for r in runs]
    width = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    print()
    print("  ".join(f"{h:>{w}}" for h, w in zip(head, width, strict=True)))
    for row in rows:
        print("  ".join(f"{c:>{w}}" for c, w in zip(row, width, strict=True)))


def summary(runs: Sequence[Run], sizes: Sequence[int]) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    big, mid = max(sizes), sorted(sizes)[-2] if len(sizes) > 1 else None
    for transport in sorted({r.transport for r in runs}):
        full = {r.size: r for r in runs if r.transport == transport and not r.dead}
        with_dead = next((r for r in runs if r.transport == transport and r.dead), None)
        line: dict[str, float | None] = {"peak_pss_mib": full[big].peak_pss_mib if big in full else None}
        if mid in full and big in full:
            line["time_ratio"] = full[big].wall_s / full[mid].wall_s
            line["memory_ratio"] = full[big].peak_pss_mib / full[mid].peak_pss_mib
            line["size_ratio"] = big / mid
        if with_dead is not None and with_dead.size in full:
            line["dead_cost_s"] = (
                with_dead.wall_s - full[with_dead.size].wall_s * with_dead.live / with_dead.size
            )
        out[transport] = line
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lab", default=None, help="the lab (default: $FLEETOPS_LAB, else the default lab)")
    parser.add_argument(
        "--hosts", type=int, default=50, help=f"lab hosts behind the fleet (1 .. {MAX_HOSTS})"
    )
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), metavar="S,..",
                        help="inventory sizes (default: %(default)s)")  # fmt: skip
    parser.add_argument("--dead-pct", type=float, default=2.0, metavar="P",
                        help="also the largest size with P%% of its hosts dead (0: not; default 2)")  # fmt: skip
    parser.add_argument("--transports", default=",".join(BENCH_TRANSPORTS), metavar="T,..",
                        help=f"the scan's transports to measure (default: {','.join(BENCH_TRANSPORTS)}; the "
                        "default one runs without --transport)")  # fmt: skip
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args(argv)
    try:
        sizes = sorted({int(s) for s in args.sizes.split(",") if s})
    except ValueError:
        parser.error("--sizes: whole numbers, comma-separated")
    transports = [t for t in args.transports.split(",") if t]
    if not transports or set(transports) - set(TRANSPORTS):
        parser.error(f"--transports: one or more of {', '.join(TRANSPORTS)}")
    if not 1 <= args.hosts <= MAX_HOSTS or not sizes or min(sizes) < args.hosts:
        parser.error(f"--hosts 1 .. {MAX_HOSTS}, and every size at least --hosts")
    if not 0 <= args.dead_pct < 50:
        parser.error("--dead-pct: 0 .. 50")
    if os.geteuid() != 0:
        print("fleet_scale: needs root (the lab boots systemd-nspawn hosts)", file=sys.stderr)
        return 2
    try:
        lab = Lab(name=args.lab)
    except LabError as exc:
        parser.error(str(exc))
    plan = [(s, *split(s, args.hosts, 0)) for s in sizes]
    if args.dead_pct:
        plan.append((sizes[-1], *split(sizes[-1], args.hosts, args.dead_pct)))
    print(f"fleet_scale: fleetops scan over {', '.join(f'{s:,}' for s in sizes)} simulated hosts on "
          f"{args.hosts} lab host(s) of lab {lab.name} ({os.cpu_count()} CPUs, shared by the controller and "
          f"the hosts); transports {', '.join(transports)}", flush=True)  # fmt: skip
    runs: list[Run] = []
    target = TargetCpu(lab.names.cgroup_parent)
    with down_if_booted(lab):
        try:
            for size, k, dead in plan:
                lab.up(args.hosts, addresses=k, dead=dead, progress=None)
                for transport in transports:
                    print(
                        f"  {size:,} hosts ({args.hosts} x {k} + {dead} dead), {transport} ...",
                        end=" ",
                        flush=True,
                    )
                    runs.append(scan(lab, transport, size, dead, target))
                    r = runs[-1]
                    print(f"{r.wall_s:.1f} s, {r.cpu_s / size:.3f} CPU s/host, peak {r.peak_pss_mib:.0f} MiB",
                          flush=True)  # fmt: skip
        except (BenchError, LabError) as exc:
            print(f"\nfleet_scale: {exc}", file=sys.stderr)
            return 1
    print_table(runs)
    result = summary(runs, sizes)
    print()
    for transport, line in result.items():
        parts = [f"{transport}:"]
        if "time_ratio" in line:
            parts.append(f"time {line['time_ratio']:.2f}x and peak memory {line['memory_ratio']:.2f}x from "
                         f"{sorted(sizes)[-2]:,} to {sizes[-1]:,} hosts ({line['size_ratio']:.1f}x the hosts; "
                         f"goal <= {GOAL_LINEAR}x);")  # fmt: skip
        if line["peak_pss_mib"] is not None:
            parts.append(f"peak {line['peak_pss_mib']:.0f} MiB at {sizes[-1]:,} (goal < {GOAL_PEAK_MIB});")
        if "dead_cost_s" in line:
            parts.append(
                f"dead hosts cost {line['dead_cost_s']:.1f} s (one connect timeout: {CONNECT_TIMEOUT_S} s)"
            )
        print(" ".join(parts))
    if args.json:
        args.json.write_text(json.dumps({
            "lab": lab.name, "hosts": args.hosts, "cpus": os.cpu_count(),
            "runs": [{**asdict(r), "cpu_s_per_host": r.cpu_s / r.size} for r in runs],
            "summary": result,
            "goal": {"linear": GOAL_LINEAR, "peak_mib": GOAL_PEAK_MIB, "connect_timeout_s": CONNECT_TIMEOUT_S},
        }, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
