"""Every per-host cost in the controller is O(1) (issue 26 item 4): a guard that fails when one becomes
quadratic, by counting operations rather than timing them.

Each case runs the controller's own code over synthetic fleets of N, 2N and 4N hosts (N = 100, or 60
for the heavier) and counts what it
does: every Python and C function call (``sys.setprofile``) plus every comparison made with a host name
(names are ``Name``, a str that counts ``==`` and ``<``: what ``x in some_list``, ``list.remove`` and a
sort cost, which no call count shows; a name read back from JSON is a plain str again). Counts are exact
and repeatable, so the test does not depend on the machine's load. What a case does once (imports, a
table's frame, a temporary directory) is the same at every size; the *increments* cancel it: going
from 2N to 4N hosts costs twice what going from N to 2N cost when the work is linear (about 2.2x for
n log n), four times when it is quadratic. A case fails when the whole, or any one of fleetops's
functions, the C functions they call or the name comparisons alone, grows faster than MAX_GROWTH (an
O(n) step in a per-host loop is a small part of the whole at these sizes, but not of its own count).

Covered: a scan's whole controller side through ansible-playbook (runner events handled, report, partial
file, Prometheus file, ndjson lines, progress, the summarised table), the same on the default transport (the
direct path: each host's ssh command resolved from ansible's configuration, its options validated, its answer
read), inventory listing, planning, merge, drift, a rollout
(engine, state saves, progress, ``fleetops report``'s table) in a fixed number of batches, and two
``remediate auto`` passes (decide, floors, budgets, brake, commit, its JSON document) with the state
directory as the record. Not covered: what happens in other processes (ansible-playbook,
ansible-inventory) and a pass's shared store (DynamoDB through moto: its requests).
"""

from __future__ import annotations

import io
import json
import sys
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

SIZES = (100, 200, 400)
# the heavier cases (thousands of operations a host, counted one by one) at half the sizes: under a minute
SMALLER = (60, 120, 240)  # all past SUMMARY_ABOVE (50): the table summarised at every size
MAX_GROWTH = 3.0  # (ops(4N) - ops(2N)) / (ops(2N) - ops(N)): 2 linear, ~2.2 n log n, 4 quadratic
AZS = ("us-east-1a", "us-east-1b", "us-east-1c")
CHECKS = ("zombie_memcg", "crashloop_unit", "unexpected_unit")


class Name(str):
    """A host name that counts the comparisons made with it (until JSON or a format string copies it)."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        Name.compared += 1
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        Name.compared += 1
        return str.__ne__(self, other)

    def __lt__(self, other: str) -> bool:
        Name.compared += 1
        return str.__lt__(self, other)

    def __gt__(self, other: str) -> bool:
        Name.compared += 1
        return str.__gt__(self, other)

    __hash__ = str.__hash__

    def __str__(self) -> str:
        return self  # str(name) (the runner's, say) keeps counting: it would otherwise copy a plain str


def _listed(hosts: list[Any]) -> Any:
    """What ``launch.selected`` returns for a fleet the test made: its hosts, no group names, none unmatched."""
    from fleetops.ansible.inventory import InventoryTargets

    return InventoryTargets(
        hosts=list(hosts), groups=frozenset(), present=frozenset(h.name for h in hosts), every=list(hosts)
    )


def names(n: int) -> list[str]:
    return [Name(f"node-{i:05d}") for i in range(n)]


OURS = ("/src/fleetops/", "/ansible_collections/fleetops/")  # fleetops's code: the CLI's and the collection's


def operations(run: Callable[[], object]) -> Counter[str]:
    """What ``run`` does: calls by function (``c:`` for C functions, under the name of the code that called
    them; ``fleetops:`` when that code is fleetops's own), and ``compared host names``."""
    calls: Counter[str] = Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event not in ("call", "c_call"):
            return
        code = frame.f_code
        whose = "fleetops" if any(p in code.co_filename for p in OURS) else "other"
        if event == "call":
            calls[f"{whose}:{code.co_filename.rsplit('/', 1)[-1]}:{code.co_qualname}"] += 1
        else:
            calls[f"{whose}:c:{getattr(arg, '__qualname__', arg)}"] += 1

    Name.compared = 0
    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    calls["compared host names"] = Name.compared
    return calls


def entry(i: int) -> dict[str, Any]:
    """A host's scan entry: facts every command reads, a finding on every third host."""
    findings = [
        {"check": CHECKS[i % 3], "severity": ("warning", "critical")[i % 2], "summary": "x", "data": {}}
    ] * (i % 3 == 0)
    return {
        "status": "unreachable" if i % 37 == 0 else ("partial" if i % 5 == 0 else "ok"),
        "msg": "ssh: connect timed out" if i % 37 == 0 else None,
        "findings": findings if i % 37 else [],
        "facts": {
            "host": {"kernel": f"6.8.0-{40 + i % 2}", "os": "Ubuntu 24.04"},
            "memcg": {"zombies": 10 * (i % 5), "total": 100, "live": 50, "cgroup_version": 2},
            "units": {"systemd": True, "enabled": ["ssh.service", "cron.service"], "unit_files": {}},
        }
        if i % 37
        else {},
        "errors": [],
        "checks": list(CHECKS),
        # as node_health answers: each check's coverage (every 5th host's crashloop_unit could not look)
        "coverage": {
            c: {"level": "none", "reason": "systemd is not PID 1 on this host: no service to read"}
            if c == "crashloop_unit" and i % 5 == 0
            else {"level": "full", "reason": None}
            for c in CHECKS
        },
    }


# ------------------------------------------------------------------------------------------ cases


def scan_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[int], Callable[[], object]]:
    """``api.scan --transport ansible`` with ansible-runner's events played in (two a host: the module's result
    and the stats), the inventory listing stood in for, -o and --prometheus written; the CLI's ndjson stream,
    progress and summarised table on each host and on the result."""
    import ansible_runner

    from fleetops import api
    from fleetops.ansible import runner
    from fleetops.ansible.inventory import InventoryHost
    from fleetops.api import scanning
    from fleetops.cli.progress import NdjsonOutput, ScanProgress
    from fleetops.cli.render import host_line, render_scan

    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all: {}\n")
    fleet: dict[str, list[InventoryHost]] = {}

    def fake_run(**kw: Any) -> Any:
        hosts = fleet["hosts"]
        for i, h in enumerate(hosts):
            kind = "runner_on_unreachable" if i % 37 == 0 else "runner_on_ok"
            e = entry(i)
            res = (
                {"msg": e["msg"], "unreachable": True}
                if i % 37 == 0
                else {k: e[k] for k in ("findings", "facts", "errors", "checks", "coverage")}
            )
            data = {
                "host": h.name,
                "task": "Run all detectors",
                "task_action": "fleetops.node.node_health",
                "res": res,
            }
            kw["event_handler"]({"event": kind, "event_data": data})
        stats = {"ok": {h.name: 1 for h in hosts}, "dark": {}, "failures": {}}
        kw["event_handler"]({"event": "playbook_on_stats", "event_data": stats})
        return SimpleNamespace(status="successful", rc=0, stdout=None)

    monkeypatch.setattr(ansible_runner, "run", fake_run)
    monkeypatch.setattr(runner, "_stop_leftovers", lambda marker: None)  # reads /proc: other processes' count
    monkeypatch.setattr(
        scanning, "_selected", lambda inventories, limit, group_by, strict=True: _listed(fleet["hosts"])
    )

    def make(n: int) -> Callable[[], object]:
        fleet["hosts"] = [InventoryHost(name=h, group=AZS[i % 3]) for i, h in enumerate(names(n))]

        def run() -> object:
            console = Console(file=io.StringIO(), width=200)
            progress, stream = ScanProgress(console, host_line), NdjsonOutput(io.StringIO())
            groups: dict[str, str | None] = {}

            def on_host(host: str, e: dict[str, Any]) -> None:
                stream.host(host, e)
                progress.host(host, e)

            def on_targets(hosts: Sequence[Any]) -> None:
                groups.update((h.name, h.group) for h in hosts)
                progress.start(len(hosts))

            request = api.ScanRequest(
                inventory=[inventory], output=tmp_path / "r.json", prometheus=tmp_path / "r.prom",
                transport="ansible",
            )  # fmt: skip
            result = api.scan(request, on_host=on_host, cancel=threading.Event(), on_targets=on_targets)
            progress.finish()
            stream.finish(result.report)
            render_scan(result.report, console, groups=groups)
            return result

        return run

    return make


def scan_ssh_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[int], Callable[[], object]]:
    """``api.scan`` on its default transport (auto): each host's ssh command resolved from ansible's configuration
    and its variables, its options validated, its answer turned into the report; the ssh processes stood in
    for (every host answers the runner's reply) and the thread pool run inline (profiling sees one
    thread)."""
    from fleetops import api
    from fleetops.ansible import direct
    from fleetops.ansible.inventory import InventoryHost
    from fleetops.api import scanning

    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all: {}\n")
    fleet: dict[str, list[InventoryHost]] = {}
    result = {k: v for k, v in entry(1).items() if k in ("findings", "facts", "errors", "checks", "coverage")}
    reply = json.dumps({"fleetops_runner": "ok", "result": {**result, "duration_ms": 1.0}}).encode()

    class Inline:
        def __init__(self, max_workers: int) -> None:
            del max_workers

        def __enter__(self) -> Inline:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
            return [fn(item) for item in items]

    monkeypatch.setattr(direct._Calls, "run", lambda self, argv, data, timeout: (0, reply, b""))
    monkeypatch.setattr(direct, "ThreadPoolExecutor", Inline)
    monkeypatch.setattr(
        scanning, "_selected", lambda inventories, limit, group_by, strict=True: _listed(fleet["hosts"])
    )

    def make(n: int) -> Callable[[], object]:
        def hostvars(i: int) -> dict[str, Any]:
            return {"ansible_host": f"10.0.{i // 200}.{i % 200 + 1}", "ansible_user": "root",
                    "ansible_ssh_private_key_file": "/keys/fleet", "fleetops_az": AZS[i % 3]}  # fmt: skip

        fleet["hosts"] = [InventoryHost(h, AZS[i % 3], hostvars=hostvars(i)) for i, h in enumerate(names(n))]

        def run() -> object:
            request = api.ScanRequest(inventory=[inventory], output=tmp_path / "r.json")  # the default: auto
            return api.scan(request, cancel=threading.Event())

        return run

    return make


def inventory_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[int], Callable[[], object]]:
    """``ansible-inventory --list`` output (EC2-like: a group a host's AZ, host vars) turned into targets."""
    from fleetops.ansible.inventory import hosts_from_list

    def make(n: int) -> Callable[[], object]:
        hosts = names(n)
        data = {
            "_meta": {
                "hostvars": {
                    h: {"ec2_az": AZS[i % 3], "ansible_host": f"10.0.{i // 250}.{i % 250}"}
                    for i, h in enumerate(hosts)
                }
            },
            "all": {"children": ["ungrouped", *AZS]},
            **{az: {"hosts": hosts[k::3]} for k, az in enumerate(AZS)},
        }
        return lambda: hosts_from_list(data)

    return make


def plan_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[int], Callable[[], object]]:
    """The planner: 10% batches, a canary, at most one host a batch per AZ would be O(n) batches:
    here per-group caps off so the batch count is fixed (10% of the hosts a batch)."""
    from fleetops.ansible.inventory import InventoryHost
    from fleetops.planner import plan

    def make(n: int) -> Callable[[], object]:
        hosts = [InventoryHost(name=h, group=AZS[i % 3]) for i, h in enumerate(names(n))]
        return lambda: plan(hosts, max_parallel="10%", per_group_max=None, canary=1, exclude=[hosts[5].name])

    return make


def merge_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[int], Callable[[], object]]:
    """``fleetops merge`` of 4 shard reports (read, validated, checked for overlap, joined)."""
    from fleetops.merge import merge
    from fleetops.scan import report_document
    from fleetops.values import Shard

    def make(n: int) -> Callable[[], object]:
        hosts = {h: entry(i) for i, h in enumerate(names(n))}
        paths = []
        for index in range(1, 5):
            shard = Shard(index, 4)
            part = {h: e for h, e in hosts.items() if shard.holds(h)}
            doc = report_document(
                part, started=1.8e9, finished=1.8e9 + 60, shard=shard, options={"checks": None}
            )
            path = tmp_path / f"n{n}-shard{index}.json"
            path.write_text(json.dumps(doc))
            paths.append(path)
        return lambda: merge(paths)

    return make


def drift_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[int], Callable[[], object]]:
    """``fleetops drift`` of a scan report grouped by AZ and kernel, and its table."""
    from fleetops.cli.render import render_drift
    from fleetops.drift import build_drift
    from fleetops.scan import report_document

    def make(n: int) -> Callable[[], object]:
        hosts = {h: entry(i) for i, h in enumerate(names(n))}
        report = report_document(hosts, started=1.8e9, finished=1.8e9 + 60)
        hostvars = {h: {"fleetops_az": AZS[i % 3]} for i, h in enumerate(hosts)}

        def run() -> object:
            drift = build_drift(report, hostvars)
            render_drift(drift, Console(file=io.StringIO(), width=200))
            return drift

        return run

    return make


def rollout_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[int], Callable[[], object]]:
    """A rollout in 10 batches (the engine with a runner whose every host succeeds, a gate scan, the
    state saved, the audit log, the progress bar), then ``fleetops report``'s table of its state. In a
    fixed number of batches: the state is saved whole after each batch, O(hosts) a batch (see the
    lead's note: batches of a fixed size make that quadratic)."""
    from fleetops.api import _ctrl_c
    from fleetops.cli.observer import ConsoleObserver
    from fleetops.cli.report import render_rollout
    from fleetops.rollout.engine import Engine
    from tests.fleetops.test_rollout import FakeRunner, _rollout, fake_scanner

    monkeypatch.setenv("FLEETOPS_AUDIT_LOG", str(tmp_path / "audit.jsonl"))

    def make(n: int) -> Callable[[], object]:
        hosts = names(n)
        batches = [hosts[k : k + n // 10] for k in range(0, n, n // 10)]
        rollout = _rollout(tmp_path / f"r{n}", batches)
        (tmp_path / f"r{n}").mkdir(exist_ok=True)

        def run() -> object:
            # a terminal: the live bar, refreshed as hosts finish (it counted every host's state per host)
            observer = ConsoleObserver(Console(file=io.StringIO(), width=200, force_terminal=True))
            engine = Engine(
                rollout=rollout, actions=("x",), runner=FakeRunner(), scanner=fake_scanner, observer=observer
            )
            with _ctrl_c(engine, engine.observer):
                done = engine.run()
            render_rollout(done, Console(file=io.StringIO(), width=200))
            return done

        return run

    return make


def auto_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[int], Callable[[], object]]:
    """``remediate auto``'s pass (decide, floors, budgets, the brake, commit; the state directory as the
    record) with the default policy over a fleet in three AZs: an ECC fault (quarantine), a crash-looping
    unit (reboot) or zombie memcgs (reclaim) on every third host, every 37th unreachable; each action a
    stand-in that succeeds. Two passes two hours apart, the second climbing the ladders the first left (its
    own state directory for each size)."""
    from fleetops import auto
    from fleetops.exitcodes import ExitCode
    from fleetops.policy import default_policy_path, load_policy

    policy = load_policy(default_policy_path())
    gpu = {"gpus": [{"index": 0, "ecc_uncorrected_volatile": 2}], "xid": []}
    faults = (
        {"check": "gpu_health", "severity": "critical", "summary": "ECC", "data": gpu},
        {
            "check": "crashloop_unit",
            "severity": "critical",
            "summary": "loop",
            "data": {"unit": "ecs.service"},
        },
        {"check": "zombie_memcg", "severity": "warning", "summary": "zombies", "data": {}},
    )

    def host(i: int) -> dict[str, Any]:
        if i % 37 == 0:
            return {"status": "unreachable", "msg": "ssh: connect timed out"}
        return {"status": "ok", "findings": [faults[(i // 3) % 3]] if i % 3 == 0 else []}

    def act(action: str, hosts: Sequence[str], params: Any) -> auto.ActionRun:
        done = frozenset(hosts)
        return auto.ActionRun(action, tuple(hosts), params, attempted=done, done=done, exit_code=ExitCode.OK)

    def make(n: int) -> Callable[[], object]:
        hosts = names(n)
        group_of = {h: AZS[i % 3] for i, h in enumerate(hosts)}
        scan = {"hosts": {h: host(i) for i, h in enumerate(hosts)}}
        state = tmp_path / f"auto{n}"

        def run() -> object:
            inputs = auto.PassInputs(
                policy=policy,
                policy_source="default",
                scan_report=scan,
                group_of=group_of,
                state_dir=state,
                apply=True,
                fleet=group_of,
            )
            results = []
            for hour in (0, 2):  # the second pass reads the first's ladders and ledger and climbs them
                clock = 1_800_000_000.0 + hour * 3600
                results.append(
                    auto.run_pass(inputs, act, lambda text, style: None, clock=lambda at=clock: at)
                )
                results[-1].document()
            return results

        return run

    return make


CASES: dict[str, Callable[[Path, pytest.MonkeyPatch], Callable[[int], Callable[[], object]]]] = {
    "auto": auto_case,
    "scan": scan_case,
    "scan-ssh": scan_ssh_case,
    "inventory": inventory_case,
    "plan": plan_case,
    "merge": merge_case,
    "drift": drift_case,
    "rollout": rollout_case,
}


def growth(counts: Sequence[Counter[str]], key: str | None = None) -> float:
    """(ops(4N) - ops(2N)) / (ops(2N) - ops(N)), of everything or of one ``key``."""
    small, mid, large = (sum(c.values()) if key is None else c[key] for c in counts)
    return (large - mid) / max(1, mid - small)


def steepest(counts: Sequence[Counter[str]], sizes: Sequence[int] = SIZES) -> dict[str, float]:
    """fleetops's functions (and the C functions they call) and the host-name comparisons whose counts
    grow faster than MAX_GROWTH, each alone: an O(n) step inside a per-host loop is a small part of the
    whole at these sizes. Only counts done at least once a host (fewer are noise: a cache filled, a list
    grown); other libraries' own (rich's width cache) are left to the whole."""
    _, mid, large = counts
    keys = [k for k in large if k.startswith(("fleetops:", "compared")) and large[k] - mid[k] >= sizes[2]]
    return {k: round(g, 2) for k in keys if (g := growth(counts, k)) > MAX_GROWTH}


@pytest.mark.parametrize("case", sorted(CASES))
def test_controller_work_grows_linearly_with_the_fleet(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make = CASES[case](tmp_path, monkeypatch)
    make(10)()  # imports and first-use caches, outside what is counted
    sizes = SMALLER if case in ("scan", "scan-ssh", "rollout") else SIZES
    counts = [operations(make(n)) for n in sizes]
    total = growth(counts)
    steep = steepest(counts, sizes)
    assert total <= MAX_GROWTH and not steep, (
        f"{case}: work grew {total:.2f}x from {sizes[1]} to {sizes[2]} hosts against {sizes[0]} to {sizes[1]} "
        f"(linear: 2); quadratic? growing fastest: {steep}"
    )
    assert sum(counts[2].values()) > sum(counts[1].values()) > sum(counts[0].values()), (
        f"{case}: nothing grew"
    )


def test_the_guard_sees_a_quadratic() -> None:
    """The measure itself: a linear scan of a list per host (``in`` on a list) is caught, a set is not."""

    def make(n: int, use_set: bool) -> Callable[[], object]:
        hosts = names(n)

        def run() -> object:
            seen: Any = set() if use_set else []
            for h in hosts:
                if h not in seen:
                    seen.add(h) if use_set else seen.append(h)
            return seen

        return run

    quadratic = [operations(make(n, use_set=False)) for n in SIZES]
    linear = [operations(make(n, use_set=True)) for n in SIZES]
    assert growth(quadratic) > 3.5 and growth(linear) < 2.2
    assert set(steepest(quadratic)) == {"compared host names"} and steepest(linear) == {}


def test_the_guard_sees_a_quadratic_step_in_the_scan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An O(n) step inside the scan's per-host path (the ndjson stream remembering its hosts in a list,
    not a set) is caught, though it is a small part of the scan's work at these sizes."""
    from fleetops.cli import progress

    class Written(list[str]):
        add = list.append

    real = progress.NdjsonOutput.__init__

    def init(self: Any, *a: Any, **kw: Any) -> None:
        real(self, *a, **kw)
        self.written = Written()

    monkeypatch.setattr(progress.NdjsonOutput, "__init__", init)
    make = scan_case(tmp_path, monkeypatch)
    make(10)()
    counts = [operations(make(n)) for n in SMALLER]
    assert growth(counts) <= MAX_GROWTH  # the whole hides it...
    assert "compared host names" in steepest(counts, SMALLER)  # ...each count alone does not
