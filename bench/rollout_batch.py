"""A rollout's cost per batch at fleet size: what each batch costs beyond its own playbook work.

The fleet is the lab's simulated one (``fleetops-lab up N --addresses K``, fleetops_lab.aliases, as
``fleet_scale.py`` boots it): N lab hosts each answering ssh on K addresses of its own, the inventory listing
the N x K addresses (7,500 by default). The rollout acts on a few of them (``--targets``, one alias on each of
as many distinct lab hosts), one host a batch; the rest are only in the inventory, which every batch's runner,
listing and gate still read.

The action is real and harmless: ``fleetops remediate set-env --unit fleetops-bench --env FLEETOPS_BENCH=<run>
--apply`` on a oneshot unit the bench installs (``/bin/true``, never started), a new value each run, so every
batch writes a drop-in and reloads systemd, and its gate scans the host (the default transport).

Per round, interleaved:

- **the rollout** in a child process (``api.remediate``, what ``fleetops remediate`` calls; the CLI's own start
  is once per rollout, not per batch). A batch is the time from the engine's before-batch checks to its
  ``batch_finished``; inside it the bench times, by wrapping the product's functions (no timing code in the
  product), the runner (``run_playbook``: ansible-runner, ansible-playbook's start, its inventory, the play),
  the batch inventory the runner is given (``batch_inventory.write``, where it exists), the gate's scan
  (``run_scan``), the state saves, the audit lines, the before-batch checks (kill switch, lease, deadline, pause)
  and the capacity floor. Wall and controller CPU (this process's threads and the children it reaped).
- **the baseline**: the batch's own work alone, the bare ``ansible-playbook`` of the same playbook with the
  same extra vars (the runner's, recorded by the child) over the same host, from a one-host inventory.
- **the whole inventory**: the same bare ``ansible-playbook`` with the 7,500-host inventory and ``-l HOST``:
  what each batch's runner paid for the inventory before it got the batch's hosts only.

The summary prints, medians over every batch of every round: the batch's wall and CPU, the baseline's, the
overhead (batch less baseline) and the ratio (batch / baseline), and each part. It prints the figures; it does not
assert the 3 s goal (issue 41). Needs root (the lab); boots the lab's hosts when fewer are up and takes down a
lab it booted. Run it under the dev lock:

    flock /run/fleetops-dev.lock python bench/rollout_batch.py [--lab batch] [--hosts 10] [--size 7500]
        [--targets 3] [--rounds 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

PRODUCT_ENV = "FLEETOPS_BENCH_PRODUCT"  # the child's product: another checkout's src folder (--before)
if os.environ.get(PRODUCT_ENV):  # imported first: scan_fleet puts this checkout's src first on sys.path
    sys.path.insert(0, os.environ[PRODUCT_ENV])
    import fleetops  # noqa: F401
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scan_fleet import REPO, BenchError, _ansible_env, _subreaper, down_if_booted  # noqa: E402

UNIT = "fleetops-bench"
UNIT_TEXT = (
    "[Unit]\nDescription=fleetops bench (never started)\n[Service]\nType=oneshot\nExecStart=/bin/true\n"
)
VAR = "FLEETOPS_BENCH"
PARTS = ("runner", "batch_inventory", "gate_scan", "state_save", "audit", "before_batch", "capacity")
ROLLOUT_PARTS = ("listing", "preflight", "store", "gate_scan", "state_save")  # before the first batch


def _cpu_now() -> float:
    """This process's CPU (every thread) and its reaped children's."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + ru.ru_utime + ru.ru_stime


# --------------------------------------------------------------------------- the child: one rollout


class _Clock:
    """Per-batch wall and CPU of the batch window and of each wrapped part."""

    def __init__(self) -> None:
        self.batches: list[dict[str, Any]] = []
        self.current: dict[str, Any] | None = None
        self.rollout: dict[str, list[float]] = {}  # per-rollout parts: [wall, cpu]
        self.lock = threading.Lock()
        self.extravars: dict[str, Any] | None = None
        self.transports: list[dict[str, Any]] = []  # each gate scan's report["transport"]

    def open_batch(self) -> None:
        if self.current is None:
            self.current = {"t0": time.monotonic(), "c0": _cpu_now(), "parts": {}}

    def close_batch(self) -> None:
        if self.current is not None:
            cur = self.current
            cur["wall_s"] = time.monotonic() - cur.pop("t0")
            cur["cpu_s"] = _cpu_now() - cur.pop("c0")
            self.batches.append(cur)
            self.current = None

    def add(self, part: str, wall: float, cpu: float) -> None:
        with self.lock:
            where = self.current["parts"] if self.current is not None else self.rollout
            got = where.setdefault(part, [0.0, 0.0])
            got[0] += wall
            got[1] += cpu


def _wrap(
    clock: _Clock,
    owner: Any,
    name: str,
    part: str,
    before: Callable[..., None] | None = None,
    after: Callable[[Any], None] | None = None,
) -> None:
    original = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        if before is not None:
            before(*args, **kwargs)
        t0, c0 = time.monotonic(), _cpu_now()
        try:
            result = original(*args, **kwargs)
        finally:
            clock.add(part, time.monotonic() - t0, _cpu_now() - c0)
        if after is not None:
            after(result)
        return result

    setattr(owner, name, timed)


def child(inventory: Path, targets: Sequence[str], value: str, out: Path) -> int:
    from fleetops import api
    from fleetops.api import launch
    from fleetops.api.requests import RemediationRequest
    from fleetops.rollout import batch, engine, state
    from fleetops.rollout.engine import NullObserver

    clock = _Clock()

    def record_vars(opts: Any, *args: Any, **kwargs: Any) -> None:
        if clock.current is not None and clock.extravars is None:
            clock.extravars = dict(opts.extravars)

    _wrap(clock, batch, "run_playbook", "runner", before=record_vars)

    def record_transport(report: dict[str, Any]) -> None:  # the gate's scan: the direct path, every host
        clock.transports.append(report.get("transport") or {})

    _wrap(clock, batch, "run_scan", "gate_scan", after=record_transport)
    if hasattr(batch, "batch_inventory"):  # the batch's hosts, written for the runner (since issue 41)
        _wrap(clock, batch.batch_inventory, "write", "batch_inventory")
    _wrap(clock, state.Rollout, "save", "state_save")
    _wrap(clock, engine, "audit", "audit")
    _wrap(clock, engine.Engine, "_capacity_hold", "capacity")
    _wrap(clock, launch, "preflight", "preflight")
    _wrap(clock, launch, "selected", "listing")
    _wrap(clock, launch, "shared_store", "store")
    original_before = engine.Engine._before_batch

    def before_batch(self: Any, todo: Any) -> Any:
        clock.open_batch()
        t0, c0 = time.monotonic(), _cpu_now()
        try:
            return original_before(self, todo)
        finally:
            clock.add("before_batch", time.monotonic() - t0, _cpu_now() - c0)

    setattr(engine.Engine, "_before_batch", before_batch)  # noqa: B010  (a wrapper, as _wrap sets)

    class Observer(NullObserver):
        def batch_finished(self, index: int, total: int) -> None:
            clock.close_batch()

    t0, c0 = time.monotonic(), _cpu_now()
    result = api.remediate(
        RemediationRequest(
            action="set-env",
            params={"unit": UNIT, "env": {VAR: value}},
            inventory=[inventory],
            limit=",".join(targets),
            apply=True,
            max_parallel=1,
            canary=1,
            cooldown=0,
        ),
        Observer(),
        handle_signals=False,
    )
    wall, cpu = time.monotonic() - t0, _cpu_now() - c0
    doc = result.document
    summary = doc.get("summary") or {}
    out.write_text(json.dumps({
        "product": str(Path(batch.__file__).resolve().parents[2]), "exit_code": int(result.exit_code), "summary": summary, "wall_s": wall, "cpu_s": cpu,
        "batches": clock.batches, "rollout_parts": clock.rollout, "extravars": clock.extravars,
        "transports": clock.transports,
    }))  # fmt: skip
    return 0


# --------------------------------------------------------------------------- the parent


def _run(argv: Sequence[str], env: dict[str, str]) -> tuple[float, float, str, int]:
    """(wall, CPU of the whole process tree, ssh masters included, output, rc)."""
    with _subreaper():
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        proc = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, check=False,
                              stdin=subprocess.DEVNULL)  # fmt: skip
        wall = time.monotonic() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    return wall, cpu, proc.stdout + proc.stderr, proc.returncode


def _env(work: Path, cold: str) -> dict[str, str]:
    cp = work / f"cp-{cold}"
    cp.mkdir(exist_ok=True)
    return {
        **os.environ,
        **_ansible_env(),
        "FLEETOPS_STATE_DIR": str(work / "state"),
        "FLEETOPS_AUDIT_LOG": str(work / "state" / "audit.jsonl"),
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(cp),  # cold: no connection of an earlier run
    }


def rollout(
    work: Path, inventory: Path, targets: Sequence[str], value: str, src: Path | None = None
) -> dict[str, Any]:
    """One rollout in a child process; ``src``: the product from that ``src`` folder instead (``--before``)."""
    out = work / f"rollout-{value}.json"
    argv = [sys.executable, __file__, "--child", str(out), "--inventory", str(inventory),
            "--value", value, *targets]  # fmt: skip
    env = _env(work, value)
    if src is not None:  # that product, with this checkout's collection (its playbooks and plugins)
        env.update({PRODUCT_ENV: str(src.resolve()), "FLEETOPS_COLLECTION_ROOT": str(REPO)})
    wall, cpu, output, rc = _run(argv, env)
    if rc != 0 or not out.exists():
        raise BenchError(f"the rollout's child exited {rc}: {output[-3000:]}")
    data: dict[str, Any] = json.loads(out.read_text())
    if data["exit_code"] != 0 or len(data["batches"]) != len(targets):
        raise BenchError(f"the rollout did not pass every batch: {json.dumps(data)[:3000]}")
    if any(t.get("name") != "auto" or t.get("by_ansible") for t in data["transports"]):
        raise BenchError(f"a gate scan did not take the direct path for every host: {data['transports']}")
    product = (src or REPO / "src").resolve()
    if data["product"] != str(product):
        raise BenchError(f"the rollout ran the product in {data['product']}, not {product}")
    data["tree_wall_s"], data["tree_cpu_s"] = wall, cpu
    return data


def bare(
    work: Path, inventory: Path, host: str, extravars: dict[str, Any], value: str
) -> tuple[float, float]:
    """The bare ansible-playbook of the remediation over ``host``, as the runner starts it (--diff, forks 1)."""
    xv = {**extravars, "fleetops_env": {VAR: value}}
    vars_file = work / f"vars-{value}.json"
    vars_file.write_text(json.dumps(xv))
    playbook = "fleetops.node.remediate_set_env"
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), "-l", host,
            "--diff", "--forks", "1", "-e", f"@{vars_file}", playbook]  # fmt: skip
    wall, cpu, output, rc = _run(argv, _env(work, value))
    if rc != 0 or "changed=1" not in output:
        raise BenchError(f"{shlex.join(argv)} exited {rc} (or changed nothing): {output[-3000:]}")
    return wall, cpu


def one_host_inventory(work: Path, inventory: Path, host: str) -> Path:
    from fleetops.ansible.inventory import load_hosts

    found = load_hosts([inventory], host)
    path = work / f"one-{host}.yml"
    path.write_text(yaml.safe_dump({"all": {"hosts": {host: found[0].hostvars}}}))
    return path


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def summarise(rounds: list[dict[str, Any]], key: str = "rollout") -> dict[str, Any]:
    batches = [b for r in rounds for b in r[key]["batches"]]
    base = [x for r in rounds for x in r["baseline"]]
    whole = [x for r in rounds for x in r["whole"]]
    out: dict[str, Any] = {
        "batches": len(batches),
        "batch_wall_s": _median([b["wall_s"] for b in batches]),
        "batch_cpu_s": _median([b["cpu_s"] for b in batches]),
        "baseline_wall_s": _median([w for w, _ in base]),
        "baseline_cpu_s": _median([c for _, c in base]),
        "whole_inventory_wall_s": _median([w for w, _ in whole]),
        "whole_inventory_cpu_s": _median([c for _, c in whole]),
        "parts": {
            p: [
                _median([b["parts"].get(p, [0, 0])[0] for b in batches]),
                _median([b["parts"].get(p, [0, 0])[1] for b in batches]),
            ]
            for p in PARTS
        },
        "rollout_parts": {
            p: [_median([r[key]["rollout_parts"].get(p, [0, 0])[i] for r in rounds]) for i in (0, 1)]
            for p in ROLLOUT_PARTS
        },
    }
    out["overhead_wall_s"] = out["batch_wall_s"] - out["baseline_wall_s"]
    out["overhead_cpu_s"] = out["batch_cpu_s"] - out["baseline_cpu_s"]
    out["ratio_wall"] = out["batch_wall_s"] / out["baseline_wall_s"]
    out["ratio_cpu"] = out["batch_cpu_s"] / out["baseline_cpu_s"]
    return out


def print_summary(title: str, s: dict[str, Any]) -> None:
    print(f"\n{title}, per batch, medians of {s['batches']} batches:")
    print(f"  {'':36} {'wall s':>8} {'CPU s':>8}")
    print(f"  {'the batch (rollout)':36} {s['batch_wall_s']:8.2f} {s['batch_cpu_s']:8.2f}")
    for part in PARTS:
        w, c = s["parts"][part]
        print(f"    {part:34} {w:8.2f} {c:8.2f}")
    print(
        f"  {'baseline: ansible-playbook, 1 host':36} {s['baseline_wall_s']:8.2f} {s['baseline_cpu_s']:8.2f}"
    )
    print(f"  {'ansible-playbook, whole inventory':36} {s['whole_inventory_wall_s']:8.2f} "
          f"{s['whole_inventory_cpu_s']:8.2f}")  # fmt: skip
    print(f"  {'overhead (batch - baseline)':36} {s['overhead_wall_s']:8.2f} {s['overhead_cpu_s']:8.2f}")
    print(f"  {'ratio (batch / baseline)':36} {s['ratio_wall']:7.2f}x {s['ratio_cpu']:7.2f}x")
    print("  once per rollout: " + ", ".join(
        f"{p} {w:.2f} s ({c:.2f} CPU s)" for p, (w, c) in s["rollout_parts"].items()
    ))  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lab", default=None, help="the lab (default: $FLEETOPS_LAB, else the default lab)")
    parser.add_argument("--hosts", type=int, default=10, help="lab hosts behind the fleet (default 10)")
    parser.add_argument("--size", type=int, default=7500, help="inventory hosts (default 7,500)")
    parser.add_argument(
        "--targets", type=int, default=3, help="hosts the rollout acts on, a batch each (default 3)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of rollout, baseline, whole (default 3)"
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--before", type=Path, metavar="SRC",
                        help="also the rollout with the product from SRC (another checkout's src folder, e.g. "
                        "'git archive REV src'), interleaved: a change's before and after in one run")  # fmt: skip
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--inventory", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--value", help=argparse.SUPPRESS)
    parser.add_argument("names", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.inventory, args.names, args.value, args.child)
    from fleetops_lab import Lab, LabError
    from fleetops_lab.aliases import MAX_ADDRESSES

    addresses = args.size // max(args.hosts, 1)
    if (
        not 1 <= args.targets <= args.hosts
        or addresses * args.hosts != args.size
        or addresses > MAX_ADDRESSES
    ):
        parser.error(f"--size must be --hosts x K (K <= {MAX_ADDRESSES}) and --targets 1 .. --hosts")
    if os.geteuid() != 0:
        print("rollout_batch: needs root (the lab boots systemd-nspawn hosts)", file=sys.stderr)
        return 2
    lab = Lab(name=args.lab)
    print(f"rollout_batch: set-env on {args.targets} host(s), a batch each, over a {args.size:,}-host inventory "
          f"({args.hosts} lab hosts x {addresses} addresses, lab {lab.name}; {os.cpu_count()} CPUs shared)",
          flush=True)  # fmt: skip
    rounds: list[dict[str, Any]] = []
    with down_if_booted(lab):
        try:
            lab.up(args.hosts, addresses=addresses, progress=None)
            inventory = lab.inventory_path()
            targets = [f"lab-{i:02d}-a001" for i in range(1, args.targets + 1)]
            for i in range(1, args.targets + 1):
                lab.run(f"lab-{i:02d}", f"printf %s {shlex.quote(UNIT_TEXT)} > /etc/systemd/system/{UNIT}.service"
                        " && systemctl daemon-reload", check=True)  # fmt: skip
            with tempfile.TemporaryDirectory(prefix="fleetops-rollout-batch-") as tmp:
                work = Path(tmp)
                (work / "state").mkdir(mode=0o700)
                ones = {t: one_host_inventory(work, inventory, t) for t in targets}
                stamp = str(int(time.time()))
                for n in range(1, args.rounds + 1):
                    load = _load()
                    r = rollout(work, inventory, targets, f"{stamp}-r{n}")
                    before = (
                        rollout(work, inventory, targets, f"{stamp}-p{n}", args.before)
                        if args.before
                        else None
                    )
                    base = [bare(work, ones[t], t, r["extravars"], f"{stamp}-b{n}{t}") for t in targets]
                    whole = [
                        bare(work, inventory, targets[0], r["extravars"], f"{stamp}-w{n}")
                    ]  # one: 12 s each
                    rounds.append(
                        {"load": load, "rollout": r, "before": before, "baseline": base, "whole": whole}
                    )
                    walls = " ".join(f"{b['wall_s']:.2f}" for b in r["batches"])
                    if before is not None:
                        walls += (
                            " (before: " + " ".join(f"{b['wall_s']:.2f}" for b in before["batches"]) + ")"
                        )
                    print(f"  round {n} (load {load}): batches {walls} s; baseline "
                          f"{' '.join(f'{w:.2f}' for w, _ in base)} s; whole inventory "
                          f"{' '.join(f'{w:.2f}' for w, _ in whole)} s", flush=True)  # fmt: skip
        except (BenchError, LabError) as exc:
            print(f"\nrollout_batch: {exc}", file=sys.stderr)
            return 1
    s = summarise(rounds)
    print(f"\nload average {rounds[0]['load']} at the start, {_load()} at the end")
    print_summary("this checkout", s)
    result = {"after": s}
    if args.before:
        result["before"] = summarise(rounds, "before")
        print_summary(f"before ({args.before})", result["before"])
    if args.json:
        args.json.write_text(json.dumps({"lab": lab.name, "size": args.size, "hosts": args.hosts,
                                         "cpus": os.cpu_count(), "rounds": rounds, "summary": result}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
