"""Scan throughput at fleet scale: `fleetops scan` against the playbook an SRE writes by hand.

For each fleet size (lab hosts: systemd-nspawn guests with sshd, design §7) this times
``fleetops scan`` (one fleetops.node.node_health call per host) and ``bench/baseline_scan.yml``
(the same checks the usual way: facts on, one command/shell task per check, set_fact arithmetic)
on the same fleet, with the same ansible.cfg (pipelining, ControlPersist) and the same forks. It
prints hosts/minute for both, their ratio, time per host, and controller CPU seconds per host:
the rusage of the whole process tree on this machine, ssh ControlPersist masters included (this
process is their subreaper, stops them after each run and reaps them). Every run starts cold: a
fresh ssh control-path directory, so no run reuses another's connections.

``--ablation N`` also measures, at N hosts, what each speed setting buys: each row turns one off.

Targets (issue 9): the scan >= 5x the baseline's hosts/minute at 50 hosts, and the scan's time
per host not growing with the fleet. Needs root (the lab); run it under the dev lock:

    flock /run/fleetops-dev.lock python bench/scan_fleet.py [--sizes 10,25,50] [--ablation 50]
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from fleetops.ansible.runner import ansible_env  # noqa: E402
from fleetops.scan import DEFAULT_TRANSPORT, DIRECT_TRANSPORTS, MAX_FORKS, TRANSPORTS, ScanOptions  # noqa: E402
from fleetops_lab import Lab, LabError  # noqa: E402

BIN = Path(sys.executable).parent
FLEETOPS = BIN / "fleetops"
ANSIBLE_PLAYBOOK = BIN / "ansible-playbook"
BASELINE = REPO / "bench" / "baseline_scan.yml"
SCAN_PLAYBOOK = REPO / "playbooks" / "scan.yml"
DEFAULT_SIZES = (10, 25, 50)
TARGET_RATIO = 5.0
TARGET_SIZE = 50
FLAT_TOLERANCE = 1.15  # time per host at the largest size may be at most 15% above the smallest's
PR_SET_CHILD_SUBREAPER = 36


class BenchError(Exception):
    pass


@dataclass
class Timing:
    wall_s: float
    cpu_s: float  # controller CPU (user + sys) of the run's whole process tree
    rc: int
    main_cpu_s: float = 0.0  # of that, ansible-playbook's main process (single-threaded)


@dataclass
class Row:
    hosts: int
    forks: int
    scan: Timing
    baseline: Timing

    @property
    def scan_hpm(self) -> float:
        return self.hosts / self.scan.wall_s * 60

    @property
    def baseline_hpm(self) -> float:
        return self.hosts / self.baseline.wall_s * 60

    @property
    def ratio(self) -> float:
        return self.scan_hpm / self.baseline_hpm


# --------------------------------------------------------------------------- timing


def _set_subreaper(on: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _orphans() -> list[int]:
    """Processes reparented to this one (ssh ControlPersist masters that outlived their run)."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == me:
            found.append(int(entry))
    return found


def _stop_orphans() -> None:
    """Stop and reap what a run left behind, so its CPU time lands in RUSAGE_CHILDREN."""
    deadline = time.monotonic() + 10
    while True:
        left = _orphans()
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM if time.monotonic() < deadline - 5 else signal.SIGKILL)
        for pid in left:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        if time.monotonic() > deadline:
            raise BenchError(f"processes left by a run survive SIGKILL: {left[:5]}")
        time.sleep(0.05)


@contextlib.contextmanager
def down_if_booted(lab: Lab) -> Iterator[None]:
    """A benchmark's lab: taken down at the end when no host of it ran at the start (one found up is left as it
    was, for the next run)."""
    booted = not any(h.running for h in lab.status(probe_ssh=False))
    try:
        yield
    finally:
        if booted:
            with contextlib.suppress(LabError):
                lab.down(progress=print)


@contextlib.contextmanager
def _subreaper() -> Iterator[None]:
    # Only around measured runs: the lab's supervisors, started while booting, must stay init's.
    _set_subreaper(True)
    try:
        yield
    finally:
        try:
            _stop_orphans()
        finally:
            _set_subreaper(False)


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _proc_cpu(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _MainCpu(threading.Thread):
    """Follows the CPU time of a run's ansible-playbook main process: the single-threaded part
    (strategy, results, callbacks) that caps how many hosts one run can take per second."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root, self.cpu_s = root, 0.0
        self.done = threading.Event()

    def _find(self) -> int | None:
        for entry in [str(self.root), *os.listdir("/proc")]:
            with contextlib.suppress(OSError, ValueError, IndexError):
                if (
                    not entry.isdigit()
                    or b"ansible-playbook" not in Path(f"/proc/{entry}/cmdline").read_bytes()
                ):
                    continue
                stat = Path(f"/proc/{entry}/stat").read_text()
                if int(entry) == self.root or int(stat[stat.rindex(")") + 2 :].split()[1]) == self.root:
                    return int(entry)
        return None

    def run(self) -> None:
        pid = None
        while not self.done.is_set():
            pid = pid or self._find()
            if pid is not None:
                try:
                    self.cpu_s = _proc_cpu(pid)
                except OSError:
                    return  # it exited: keep the last reading
            self.done.wait(0.05 if pid else 0.1)


def timed(argv: Sequence[str], env: Mapping[str, str], control_dir: Path | None = None) -> tuple[Timing, str]:
    """Run argv once, cold (a fresh ssh control-path directory unless ``control_dir``): timing, output."""
    with contextlib.ExitStack() as stack:
        if control_dir is None:
            control_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fleetops-cp-")))
        full_env = {**os.environ, **env, "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control_dir)}
        with _subreaper():
            cpu0, t0 = _cpu(), time.monotonic()
            proc = subprocess.Popen(
                list(argv),
                env=full_env,
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            main = _MainCpu(proc.pid)
            main.start()
            output, _ = proc.communicate()
            wall = time.monotonic() - t0
            main.done.set()
            main.join()
            _stop_orphans()
            cpu = _cpu() - cpu0
    return Timing(wall_s=wall, cpu_s=cpu, rc=proc.returncode, main_cpu_s=main.cpu_s), output


# --------------------------------------------------------------------------- the two runs


_STATE: list[str] = []


def _bench_state_dir() -> str:
    """The state home every command of this benchmark process gets (unless ``FLEETOPS_STATE_DIR`` is set): a
    scan of an inventory writes the fleet record there by default, and a benchmark must not write the
    machine's (a 7,550-host record left in /var/lib/fleetops/auto made every later scan there load it).
    Created once, removed when the process exits."""
    if not _STATE:
        path = tempfile.mkdtemp(prefix="fleetops-bench-state-")
        atexit.register(shutil.rmtree, path, True)
        _STATE.append(path)
    return _STATE[0]


def _ansible_env() -> dict[str, str]:
    state = os.environ.get("FLEETOPS_STATE_DIR") or _bench_state_dir()
    return {**ansible_env(), "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "FLEETOPS_STATE_DIR": state}


# the transports a benchmark compares by default: the default one (auto) and ansible-playbook's (ssh is auto's
# alias: the same run again)
BENCH_TRANSPORTS = (DEFAULT_TRANSPORT, *(t for t in TRANSPORTS if t not in DIRECT_TRANSPORTS))


def transport_args(transport: str) -> list[str]:
    """``--transport T``, or nothing for the default one: what a user types."""
    return [] if transport == DEFAULT_TRANSPORT else ["--transport", transport]


def scan_argv(inventory: Path, report: Path, forks: int | None = None, sample_s: float = 0) -> list[str]:
    argv = [str(FLEETOPS), "scan", "-i", str(inventory), "--format", "json", "-q", "-o", str(report)]
    argv += ["--forks", str(forks)] if forks else []
    return argv + (["--sample-seconds", str(sample_s)] if sample_s else [])


def run_scan(inventory: Path, hosts: int, forks: int | None = None, sample_s: float = 0, **kw: Any) -> Timing:
    with tempfile.TemporaryDirectory(prefix="fleetops-bench-") as tmp:
        report = Path(tmp) / "scan.json"
        timing, output = timed(scan_argv(inventory, report, forks, sample_s), _ansible_env(), **kw)
        if timing.rc not in (0, 1, 3) or not report.exists():
            raise BenchError(f"fleetops scan exited {timing.rc}: {output.strip()[-2000:]}")
        data = json.loads(report.read_text())
    # answered: ok, or partial (a check could not look fully, e.g. zombies in an nspawn guest's namespace)
    answered = data["summary"]["ok"] + data["summary"].get("partial", 0)
    if answered != hosts or data["summary"]["errors"]:
        bad = {h: (e["status"], e.get("msg"), e.get("errors")) for h, e in data["hosts"].items()
               if e["status"] not in ("ok", "partial") or e.get("errors")}  # fmt: skip
        raise BenchError(f"the scan did not get every host: {data['summary']}: {json.dumps(bad)[:3000]}")
    return timing


def run_playbook(inventory: Path, playbook: Path, forks: int, env: Mapping[str, str] | None = None) -> Timing:
    """ansible-playbook as people run it (default stdout callback), with the scan's extra vars."""
    with tempfile.TemporaryDirectory(prefix="fleetops-bench-") as tmp:
        extravars = Path(tmp) / "vars.json"
        extravars.write_text(json.dumps(ScanOptions().playbook_vars()))
        argv = [str(ANSIBLE_PLAYBOOK), "-i", str(inventory), str(playbook), "--forks", str(forks)]
        timing, output = timed([*argv, "-e", f"@{extravars}"], {**_ansible_env(), **(env or {})})
    if timing.rc != 0:
        why = [ln for ln in output.splitlines() if "fatal:" in ln or "UNREACHABLE" in ln or "ERROR" in ln]
        why = why or output.strip().splitlines()[-10:]
        raise BenchError(f"{playbook.name} exited {timing.rc}:\n" + "\n".join(why)[-3000:])
    return timing


def boot(lab: Lab, hosts: int) -> None:
    lab.up(hosts, progress=print)  # the lab raises fs.inotify.max_user_instances for large fleets


def measure(lab: Lab, hosts: int, repeat: int) -> Row:
    boot(lab, hosts)
    inventory = lab.inventory_path()
    forks = min(hosts, MAX_FORKS)  # what fleetops scan uses by default; the baseline gets the same
    run_scan(inventory, hosts)  # warm-up (untimed): guest page caches, and every host answers
    scans, baselines = [], []
    for _ in range(repeat):
        scans.append(run_scan(inventory, hosts))
        baselines.append(run_playbook(inventory, BASELINE, forks))
    return Row(hosts=hosts, forks=forks, scan=_median(scans), baseline=_median(baselines))


def _median(timings: Sequence[Timing]) -> Timing:
    mid = sorted(timings, key=lambda t: t.wall_s)[len(timings) // 2]
    return Timing(
        wall_s=mid.wall_s,
        cpu_s=statistics.median(t.cpu_s for t in timings),
        rc=mid.rc,
        main_cpu_s=statistics.median(t.main_cpu_s for t in timings),
    )


# --------------------------------------------------------------------------- ablation


def _variant_playbook(tmp: Path, name: str, scan_play_only: bool = False, **play: Any) -> Path:
    """playbooks/scan.yml with its first (scan) play changed, or without the plays after it."""
    plays = yaml.safe_load(SCAN_PLAYBOOK.read_text())
    plays[0].update(play)
    if scan_play_only:
        del plays[1:]
    path = tmp / f"scan-{name}.yml"
    path.write_text(yaml.safe_dump(plays, sort_keys=False))
    return path


def ablation(lab: Lab, hosts: int) -> list[tuple[str, Timing]]:
    """What each speed setting buys, at one fleet size: each row turns one off (all cold)."""
    boot(lab, hosts)
    inventory = lab.inventory_path()
    forks = min(hosts, MAX_FORKS)
    no_persist = "-o ControlMaster=no -o ServerAliveInterval=5 -o ServerAliveCountMax=3 -o BatchMode=yes"
    rows: list[tuple[str, Timing]] = []
    run_scan(inventory, hosts)  # warm-up
    with tempfile.TemporaryDirectory(prefix="fleetops-ablation-") as tmp_s:
        tmp = Path(tmp_s)
        rows.append((f"fleetops scan (forks {forks}, all on)", run_scan(inventory, hosts)))
        rows.append(("  forks 25 (ansible.cfg's forks)", run_scan(inventory, hosts, forks=25)))
        rows.append(("  forks 5 (ansible's default)", run_scan(inventory, hosts, forks=5)))
        warm = tmp / "cp"
        warm.mkdir()
        run_scan(inventory, hosts, control_dir=warm)
        rows.append(
            ("  warm: ControlPersist reused (re-scan < 60 s)", run_scan(inventory, hosts, control_dir=warm))
        )
        pb = SCAN_PLAYBOOK
        rows.append(
            (f"ansible-playbook scan.yml (no wrapper, forks {forks})", run_playbook(inventory, pb, forks))
        )
        rows.append(("  pipelining off", run_playbook(inventory, pb, forks, {"ANSIBLE_PIPELINING": "False"})))
        rows.append(
            ("  ControlPersist off", run_playbook(inventory, pb, forks, {"ANSIBLE_SSH_ARGS": no_persist}))
        )
        free = _variant_playbook(tmp, "free", strategy="ansible.builtin.free")
        rows.append(("  free strategy", run_playbook(inventory, free, forks)))
        facts = _variant_playbook(tmp, "facts", gather_facts=True)
        rows.append(("  fact gathering on", run_playbook(inventory, facts, forks)))
        if len(yaml.safe_load(SCAN_PLAYBOOK.read_text())) > 1:
            alone = _variant_playbook(tmp, "alone", scan_play_only=True)
            rows.append(
                ("  scan play alone (no report play after it)", run_playbook(inventory, alone, forks))
            )
        # Here the hosts share the controller's CPUs, so the scan is CPU-bound and forks matter
        # little; on a real fleet each host's answer takes network and remote time. Simulated:
        # every host takes >= 2 s (two samples 2 s apart: a sleep on the host, no CPU).
        for f in (None, 25, 5):
            name = f"latency-bound (--sample-seconds 2): forks {f or forks}" if f is None else f"  forks {f}"
            rows.append((name, run_scan(inventory, hosts, forks=f, sample_s=2)))
    return rows  # fmt: skip


# --------------------------------------------------------------------------- payload


def payload_sizes() -> dict[str, int]:
    """Bytes of the AnsiballZ payload each module sends per call (as ansible builds it, on localhost)."""
    sizes: dict[str, int] = {}
    inventory = REPO / "inventory" / "localhost.yml"
    for module, args in (
        ("fleetops.node.node_health", "checks=zombie_memcg"),
        ("ansible.builtin.command", "true"),
        ("ansible.builtin.setup", "gather_subset=min"),
    ):
        with tempfile.TemporaryDirectory(prefix="fleetops-payload-") as tmp:
            env = {**os.environ, **_ansible_env(), "ANSIBLE_KEEP_REMOTE_FILES": "1",
                   "ANSIBLE_PIPELINING": "False", "ANSIBLE_REMOTE_TMP": tmp}  # fmt: skip
            subprocess.run(
                [str(BIN / "ansible"), "-i", str(inventory), "localhost", "-m", module, "-a", args, "-o"],
                env=env, cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, check=True,
            )  # fmt: skip
            found = list(Path(tmp).rglob("AnsiballZ_*.py"))
            if not found:
                raise BenchError(f"no AnsiballZ payload kept for {module}")
            sizes[module.rsplit(".", 1)[-1]] = found[0].stat().st_size
    return sizes


# --------------------------------------------------------------------------- output


def print_table(rows: Sequence[Row]) -> None:
    print()
    head = ("hosts", "forks", "scan s", "scan h/min", "base s", "base h/min", "ratio",
            "scan s/host", "base s/host", "scan CPU s/host", "base CPU s/host")  # fmt: skip
    print("  ".join(f"{h:>{max(len(h), 6)}}" for h in head))
    for r in rows:
        cells = (r.hosts, r.forks, f"{r.scan.wall_s:.1f}", f"{r.scan_hpm:.0f}", f"{r.baseline.wall_s:.1f}",
                 f"{r.baseline_hpm:.0f}", f"{r.ratio:.1f}x", f"{r.scan.wall_s / r.hosts:.3f}",
                 f"{r.baseline.wall_s / r.hosts:.3f}", f"{r.scan.cpu_s / r.hosts:.3f}",
                 f"{r.baseline.cpu_s / r.hosts:.3f}")  # fmt: skip
        print("  ".join(f"{c!s:>{max(len(h), 6)}}" for c, h in zip(cells, head, strict=True)))


def verdicts(rows: Sequence[Row]) -> list[str]:
    lines = []
    at = next((r for r in rows if r.hosts == TARGET_SIZE), None)
    if at is not None:
        ok = at.ratio >= TARGET_RATIO
        lines.append(f"{'PASS' if ok else 'MISS'}: scan {at.ratio:.1f}x the baseline at {at.hosts} hosts "
                     f"(target >= {TARGET_RATIO:g}x)")  # fmt: skip
    if len(rows) > 1:
        small, large = min(rows, key=lambda r: r.hosts), max(rows, key=lambda r: r.hosts)
        per_small, per_large = small.scan.wall_s / small.hosts, large.scan.wall_s / large.hosts
        ok = per_large <= per_small * FLAT_TOLERANCE
        lines.append(f"{'PASS' if ok else 'MISS'}: scan time per host {per_small:.3f} s at {small.hosts} hosts, "
                     f"{per_large:.3f} s at {large.hosts} (target: not growing)")  # fmt: skip
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="fleet sizes (default: 10,25,50)"
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per size; the median is reported")
    parser.add_argument(
        "--ablation", type=int, metavar="N", help="also measure each speed setting at N hosts"
    )
    parser.add_argument("--no-payload", action="store_true", help="skip measuring the AnsiballZ payloads")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args(argv)  # fmt: skip
    try:
        sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    except ValueError:
        parser.error(f"--sizes: not a list of numbers: {args.sizes!r}")
    if os.geteuid() != 0:
        print("scan_fleet: needs root (the lab boots systemd-nspawn hosts)", file=sys.stderr)
        return 2
    print(f"scan_fleet: fleetops scan vs {BASELINE.relative_to(REPO)} on lab fleets of {sizes} hosts "
          f"({os.cpu_count()} CPUs on this controller, which also runs the hosts)", flush=True)  # fmt: skip
    lab = Lab()
    rows: list[Row] = []
    ablation_rows: list[tuple[str, Timing]] = []
    payload: dict[str, int] = {}
    try:
        if not args.no_payload:
            payload = payload_sizes()
            print("AnsiballZ payload per module call: "
                  + ", ".join(f"{m} {n / 1024:.0f} KiB" for m, n in payload.items())
                  + f"; per host: scan {payload['node_health'] / 1024:.0f} KiB, baseline "
                  f"{(payload['setup'] + 7 * payload['command']) / 1024:.0f} KiB (setup + 7 commands)")  # fmt: skip
        for size in sizes:
            started = time.monotonic()
            rows.append(measure(lab, size, args.repeat))
            print(f"  {size} hosts measured in {time.monotonic() - started:.0f} s", flush=True)
        if args.ablation:
            ablation_rows = ablation(lab, args.ablation)
    except BenchError as exc:
        print(f"scan_fleet: {exc}", file=sys.stderr)
        return 1
    finally:
        lab.down()
    print_table(rows)
    if ablation_rows:
        print(f"\nwhat each setting buys at {args.ablation} hosts (cold unless noted):")
        for name, t in ablation_rows:
            print(f"  {name:<52} {t.wall_s:6.1f} s  {args.ablation / t.wall_s * 60:6.0f} h/min  "
                  f"{t.cpu_s / args.ablation:.3f} CPU s/host")  # fmt: skip
    if len(rows) > 1:
        small, large = min(rows, key=lambda r: r.hosts), max(rows, key=lambda r: r.hosts)
        per_host = (large.scan.main_cpu_s - small.scan.main_cpu_s) / (large.hosts - small.hosts)
        cap = f"; one run tops out near {1 / per_host:.0f} hosts/s" if per_host > 0 else ""
        print(f"\nansible-playbook's main process (single-threaded) in the scan: {small.scan.main_cpu_s:.2f} CPU s "
              f"at {small.hosts} hosts, {large.scan.main_cpu_s:.2f} at {large.hosts}: "
              f"{per_host * 1000:.1f} ms per added host{cap}")  # fmt: skip
    print()
    for line in verdicts(rows):
        print(line)
    if args.json:
        args.json.write_text(json.dumps({
            "rows": [{**asdict(r), "scan_hpm": r.scan_hpm, "baseline_hpm": r.baseline_hpm, "ratio": r.ratio}
                     for r in rows],
            "ablation": [{"variant": n.strip(), **asdict(t)} for n, t in ablation_rows],
            "payload_bytes": payload, "verdicts": verdicts(rows),
        }, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
