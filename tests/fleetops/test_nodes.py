"""The schedulers' view of the fleet, read once per pass (fleetops.nodes), and what the pass does with it:
nodes cordoned or drained by anyone count against the capacity floors, a standing quarantine of ours
counts against the quarantine cap, a disruptive rung on a Slurm node still draining waits for DRAINED,
and a backend that cannot be read fails the pass.

Kubernetes is tests/kubectl_standin (no API server runs here); Slurm is a script printing `scontrol show
node` text captured from the lab's real Slurm 22.05 (tests/unit/fixtures/slurm; the real daemons are in
tests/integration/test_slurm_lab.py)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from fleetops import auto
from fleetops.ansible.inventory import InventoryHost
from fleetops.errors import UsageError
from fleetops.exitcodes import ExitCode
from fleetops.nodes import NodeReading, NodeState, read_nodes
from fleetops.policy import parse_policy
from fleetops.remediations.backends import QUARANTINE_KEY
from tests.fleetops.test_auto import CRASHLOOP, T0, Runner, ecc, report
from tests.paths import FIXTURES, KUBECTL_STANDIN, REPO

SLURM = FIXTURES / "slurm"


def _slurm_text(**nodes: str) -> str:
    """`scontrol show node` of several nodes: {node name: fixture name}, each fixture renamed."""
    blocks = []
    for name, fixture in nodes.items():
        text = (SLURM / f"{fixture}.txt").read_text()
        captured = text.split()[0].split("=", 1)[1]
        blocks.append(text.replace(captured, name).rstrip("\n") + "\n")
    return "\n".join(blocks) + "\n"


def _scontrol(tmp_path: Path, text: str, *, sleep: float = 0, rc: int = 0) -> Path:
    out = tmp_path / "show-node.txt"
    out.write_text(text)
    calls = tmp_path / "scontrol-calls"
    script = tmp_path / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$SLURM_CONF $*" >> {calls}\n'
        + (f"sleep {sleep}\n" if sleep else "")
        + (f"echo 'slurm_load_node error: Unable to contact slurm controller' >&2; exit {rc}\n" if rc else "")
        + f"cat {out}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def _host(name: str, **hostvars: Any) -> InventoryHost:
    return InventoryHost(name, "az-a", hostvars=hostvars)


def _kube(tmp_path: Path, nodes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    state = tmp_path / "kube.json"
    state.write_text(json.dumps({"nodes": nodes, "pods": [], "pdbs": []}))
    os.environ["FLEETOPS_KUBECTL_STATE"] = str(state)
    return {"kubectl": str(KUBECTL_STANDIN)}


@pytest.fixture(autouse=True)
def _kube_state_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEETOPS_KUBECTL_STATE", raising=False)


def test_kubernetes_nodes_are_read_in_one_call_cordons_counted_ours_told_apart(tmp_path: Path) -> None:
    ours = {"key": QUARANTINE_KEY, "value": "gpu_health", "effect": "NoSchedule"}
    kube = _kube(
        tmp_path,
        {
            "n-a": {"unschedulable": True, "taints": [ours]},
            "b": {"unschedulable": True, "taints": [{"key": "example.com/maint", "effect": "NoSchedule"}]},
            "c": {"taints": [ours]},  # tainted, not cordoned: still takes work it tolerates
        },
    )
    hosts = [_host("a", k8s_node_name="n-a"), _host("b"), _host("c"), _host("d")]
    reading = read_nodes(hosts, kube)
    assert reading.failures == [] and reading.skipped == []
    assert reading.states == {
        "a": NodeState("kubernetes", "n-a", "cordoned", ours=True),
        "b": NodeState("kubernetes", "b", "cordoned", ours=False),
        "c": NodeState("kubernetes", "c", "in", ours=True),
        "d": NodeState("kubernetes", "d", "missing"),
    }
    assert set(reading.out()) == {"a", "b"}
    calls = json.loads(Path(os.environ["FLEETOPS_KUBECTL_STATE"]).read_text())["calls"]
    assert calls == [["get", "nodes", "-o", "json", "--request-timeout=30s"]]  # one call for the fleet


def test_kubernetes_nodes_not_ready_are_out(tmp_path: Path) -> None:
    """A node the node controller cannot reach or finds not ready (its taint, or its Ready condition not
    True) takes no work: it counts against the floors as a cordoned one does."""
    kube = _kube(
        tmp_path,
        {
            "u": {"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]},
            "n": {"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]},
            "f": {"ready": False},
            "r": {"ready": True},
        },
    )
    reading = read_nodes([_host("u"), _host("n"), _host("f"), _host("r")], kube)
    assert {h: s.phase for h, s in reading.states.items()} == {
        "u": "notready",
        "n": "notready",
        "f": "notready",
        "r": "in",
    }
    assert set(reading.out()) == {"u", "n", "f"}
    assert reading.states["u"].why() == "kubernetes notready by someone else"


def test_slurm_nodes_are_read_in_one_call_with_the_hosts_slurm_conf(tmp_path: Path) -> None:
    scontrol = _scontrol(
        tmp_path,
        _slurm_text(
            **{"lab-01": "drained_admin", "lab-02": "draining", "lab-03": "idle", "lab-04": "down_admin"}
        ),
    )
    conf = {
        "fleetops_quarantine_backend": "slurm",
        "fleetops_scontrol": str(scontrol),
        "fleetops_slurm_conf": "/x/slurm.conf",
    }
    hosts = [_host("lab-01", **conf), _host("gpu-2", fleetops_slurm_node="lab-02", **conf), _host("lab-03", **conf),
             _host("lab-04", **conf), _host("lab-05", **conf), _host("plain", fleetops_quarantine_backend="none")]  # fmt: skip
    reading = read_nodes(hosts)
    assert reading.failures == []
    phases = {h: (s.phase, s.ours) for h, s in reading.states.items()}
    assert phases == {
        "lab-01": ("drained", False),
        "gpu-2": ("draining", True),
        "lab-03": ("in", False),
        "lab-04": ("down", False),
        "lab-05": ("missing", False),
    }
    assert reading.states["lab-01"].reason and "[" not in reading.states["lab-01"].reason  # no [user@time]
    assert (tmp_path / "scontrol-calls").read_text().splitlines() == ["/x/slurm.conf show node"]
    assert "by someone else, reason: " in reading.states["lab-01"].why()


@pytest.mark.parametrize(
    ("kind", "needle"),
    [
        ("missing", "No such file"),
        ("refuses", "Unable to contact slurm controller"),
        ("hangs", "no answer within 1 s"),
    ],
)
def test_a_backend_that_cannot_be_read_is_one_line(tmp_path: Path, kind: str, needle: str) -> None:
    if kind == "missing":
        scontrol = tmp_path / "nowhere" / "scontrol"
    else:
        scontrol = _scontrol(
            tmp_path,
            _slurm_text(n1="idle"),
            sleep=5 if kind == "hangs" else 0,
            rc=1 if kind == "refuses" else 0,
        )
    hosts = [_host("n1", fleetops_quarantine_backend="slurm", fleetops_scontrol=str(scontrol))]
    reading = read_nodes(hosts, timeout=1)
    assert reading.states == {}
    (line,) = reading.failures
    assert reading.unknown == {"n1": line}  # its hosts' groups: capacity unknown
    assert line.startswith(f"slurm: {scontrol} show node: ") and needle in line, line
    assert "\n" not in line


def test_kubernetes_is_read_only_for_a_cluster_the_pass_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a kubectl on PATH may point at no cluster at all (this machine has one): it is not called unless the
    # pass names a cluster (--kubectl, --kubeconfig or $KUBECONFIG)
    calls = tmp_path / "calls"
    fake = tmp_path / "kubectl"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {calls}\necho \'{{"items": []}}\'\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")  # a pod's in-cluster config names none either
    for kube in ({}, {"kubectl": "kubectl"}):  # the CLI's --kubectl default names no cluster either
        reading = read_nodes([_host("a")], kube)
        assert reading.states == {} and reading.failures == [] and not calls.exists(), kube
    assert reading.skipped == [
        "kubernetes: no cluster named (--kubectl, --kubeconfig or $KUBECONFIG): cordoned nodes are not counted"
    ]
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "config"))
    reading = read_nodes([_host("a")], {})
    assert reading.states == {"a": NodeState("kubernetes", "a", "missing")} and reading.skipped == []
    assert calls.read_text().splitlines() == ["get nodes -o json --request-timeout=30s"]


def test_a_kubectl_answer_that_is_not_a_node_list_fails(tmp_path: Path) -> None:
    fake = tmp_path / "kubectl"
    fake.write_text('#!/bin/sh\necho \'{"kind": "Status"}\'\n')
    fake.chmod(0o755)
    reading = read_nodes([_host("a")], {"kubectl": str(fake)})
    assert reading.failures == ["kubernetes: kubectl get nodes: 'items'"]


# ------------------------------------------------------------------------------------------ the pass

POLICY = """
schema: fleetops.policy/v1
budgets:
  reboot: {window: 1h, max: 100}
  quarantine: {window: 1h, max: 100}
floor: {min_available_pct: 50, min_available: 1, max_quarantined_pct: 25}
storm: {fleet_pct: 100, group_pct: 100}
rules:
  - name: gpu-fatal
    match: [{check: gpu_health, severity: [critical]}]
    ladder:
      - {action: quarantine, clear_after: 1m}
      - {action: reboot, clear_after: 30m}
      - {action: human}
  - name: crashloop
    match: [{check: crashloop_unit}]
    ladder:
      - {action: reboot, clear_after: 10m}
      - {action: human}
"""


def _pass(
    tmp_path: Path,
    scan: dict[str, Any],
    nodes: NodeReading | None,
    now: float = T0,
    *,
    policy: str = POLICY,
    groups: dict[str, str] | None = None,
) -> tuple[auto.PassResult, list[str], Runner]:
    runner, lines = Runner(), []
    inputs = auto.PassInputs(
        policy=parse_policy(policy, "policy.yml"),
        policy_source="policy.yml",
        scan_report=scan,
        group_of=groups if groups is not None else {h: "az-a" for h in scan["hosts"]},
        state_dir=tmp_path / "auto",
        apply=True,
        nodes=nodes,
    )
    result = auto.run_pass(inputs, runner, lambda text, style: lines.append(text), clock=lambda: now)
    return result, lines, runner


def test_nodes_out_by_someone_else_count_against_the_floor(tmp_path: Path) -> None:
    # 4 hosts; h0 cordoned by someone else: a reboot of h2 would leave 2 of 4 (the floor keeps 2), so h2
    # goes and h3 waits; without the node reading both would go
    scan = report(h0=[], h1=[], h2=[CRASHLOOP], h3=[CRASHLOOP])
    nodes = NodeReading({"h0": NodeState("kubernetes", "h0", "cordoned")})
    result, lines, runner = _pass(tmp_path, scan, nodes)
    assert [c[1] for c in runner.calls] == [["h2"]]
    assert {d.host: d.status for d in result.decisions if d.host in ("h2", "h3")} == {
        "h2": "act",
        "h3": "floor",
    }
    assert any(
        line.startswith("group az-a: 4 hosts, 1 unavailable (h0 kubernetes cordoned by someone else)")
        for line in lines
    ), lines
    assert "nodes out of scheduling: 1 (h0 kubernetes cordoned by someone else)" in lines
    assert result.document()["nodes"] == {
        "out": {"h0": NodeState("kubernetes", "h0", "cordoned").to_dict()},
        "failures": [],
    }
    assert result.exit_code == ExitCode.OK
    _alone, _, runner2 = _pass(tmp_path / "without", scan, None)
    assert [c[1] for c in runner2.calls] == [["h2", "h3"]]


def test_a_standing_quarantine_of_ours_counts_against_the_quarantine_cap(tmp_path: Path) -> None:
    # 4 hosts: the cap is 25% (1 host); h0's ladder was reset but our taint stays (nobody released it), so
    # h1's quarantine waits
    scan = report(h0=[], h1=[ecc()], h2=[], h3=[])
    nodes = NodeReading({"h0": NodeState("kubernetes", "h0", "cordoned", ours=True)})
    result, _, runner = _pass(tmp_path, scan, nodes)
    assert runner.calls == []
    (d,) = [d for d in result.decisions if d.host == "h1"]
    assert d.status == "floor" and "quarantine" in d.reason, d.reason


def test_a_disruptive_rung_waits_while_our_slurm_drain_still_runs_jobs(tmp_path: Path) -> None:
    scan = report(h0=[ecc()], h1=[], h2=[], h3=[], h4=[], h5=[], h6=[], h7=[])
    _pass(tmp_path, scan, None)  # quarantined (drained in Slurm) by the first pass
    draining = NodeReading({"h0": NodeState("slurm", "h0", "draining", ours=True)})
    result, _lines, runner = _pass(tmp_path, scan, draining, now=T0 + 120)  # past the quarantine's 1m
    assert runner.calls == []
    (d,) = [d for d in result.decisions if d.host == "h0"]
    assert d.status == "wait" and d.rung_action == "reboot", d.to_dict()
    assert (
        "waits for Slurm node h0 to drain (its jobs still run): reboot starts once it is DRAINED" in d.reason
    )
    assert result.exit_code == ExitCode.OK
    drained = NodeReading({"h0": NodeState("slurm", "h0", "drained", ours=True)})
    result, _, runner = _pass(tmp_path, scan, drained, now=T0 + 180)
    assert [(c[0], c[1]) for c in runner.calls] == [("reboot", ["h0"])]


def test_a_backend_that_could_not_be_read_holds_disruptive_rungs_in_its_groups_and_fails_the_pass(
    tmp_path: Path,
) -> None:
    line = "kubernetes: kubectl get nodes: Unauthorized"
    scan = report(h0=[], h1=[CRASHLOOP], h2=[], h3=[CRASHLOOP])
    groups = {"h0": "az-a", "h1": "az-a", "h2": "az-b", "h3": "az-b"}
    # only az-a's nodes are on that backend
    result, _, runner = _pass(
        tmp_path, scan, NodeReading(failures=[line], unknown={"h0": line}), groups=groups
    )
    status = {d.host: (d.status, d.reason) for d in result.decisions}
    assert status["h1"] == ("floor", f"floor: the capacity of group az-a is unknown ({line})")
    assert [c[1] for c in runner.calls] == [["h3"]]  # az-b's capacity is known: its reboot goes
    assert result.exit_code == ExitCode.FAILED
    assert result.node_failures == [line]
    assert any(w.startswith(f"nodes: {line}: the pass fails") for w in result.warnings)
    assert result.document()["nodes"]["failures"] == [line]


def test_the_quarantine_key_is_the_playbooks() -> None:
    for playbook, var in (("quarantine.yml", "fleetops_q_key"), ("unquarantine.yml", "fleetops_u_key")):
        assert f"    {var}: {QUARANTINE_KEY}\n" in (REPO / "playbooks" / playbook).read_text()


DRAIN_WAIT_POLICY = POLICY.replace(
    "      - {action: reboot, clear_after: 30m}", "      - {action: reboot, clear_after: 30m, drain_wait: 2h}"
)


def test_a_rungs_drain_wait_lets_it_act_on_a_node_still_draining_after_it(tmp_path: Path) -> None:
    assert DRAIN_WAIT_POLICY != POLICY
    scan = report(h0=[ecc()], h1=[], h2=[], h3=[], h4=[], h5=[], h6=[], h7=[])

    def _run(now: float, since: float) -> tuple[auto.PassResult, Runner]:
        draining = NodeReading({"h0": NodeState("slurm", "h0", "draining", ours=True, since=since)})
        result, _, runner = _pass(tmp_path, scan, draining, now, policy=DRAIN_WAIT_POLICY)
        return result, runner

    _run(T0, T0)  # the quarantine (drain) at T0
    result, runner = _run(T0 + 3600, T0)  # an hour later: within the 2h, it waits
    (d,) = [d for d in result.decisions if d.host == "h0"]
    assert d.status == "wait" and d.reason.endswith("or 2h after the drain (drain_wait)"), d.reason
    assert runner.calls == []
    result, runner = _run(T0 + 2 * 3600 + 1, T0)  # past it: the reboot goes ahead, said as a warning
    assert [(c[0], c[1]) for c in runner.calls] == [("reboot", ["h0"])]
    assert any(
        "still drains 2.0 h after fleetops drained it, past the rung's drain_wait 2h" in w
        for w in result.warnings
    )


def test_a_drain_wait_of_zero_is_refused_at_load() -> None:
    with pytest.raises(UsageError, match="drain_wait"):
        parse_policy(DRAIN_WAIT_POLICY.replace("drain_wait: 2h", "drain_wait: 0s"), "policy.yml")


def test_the_drain_time_is_read_from_our_slurm_record(tmp_path: Path) -> None:
    text = _slurm_text(n1="draining")  # Comment=fleetops:{"check":"gpu_health"}: a record without a time
    timed = text.replace(
        'Comment=fleetops:{"check":"gpu_health"}',
        'Comment=fleetops:{"check":"gpu_health","rollout":"r","time":"2026-12-03T12:00:00Z"}',
    )
    assert timed != text
    hosts = [
        _host("n1", fleetops_quarantine_backend="slurm", fleetops_scontrol=str(_scontrol(tmp_path, timed)))
    ]
    state = read_nodes(hosts).states["n1"]
    assert state.since == 1796299200.0 and state.to_dict()["since"] == 1796299200.0
    untimed = read_nodes(
        [_host("n1", fleetops_quarantine_backend="slurm", fleetops_scontrol=str(_scontrol(tmp_path, text)))]
    )
    assert untimed.states["n1"].since is None and "since" not in untimed.states["n1"].to_dict()


@pytest.mark.parametrize("action", ["quarantine", "fix", "human"])
def test_a_drain_wait_on_a_rung_that_waits_for_no_drain_is_refused(action: str) -> None:
    text = POLICY.replace(
        "      - {action: quarantine, clear_after: 1m}",
        f"      - {{action: {action}, clear_after: 1m, drain_wait: 1h}}",
    )
    with pytest.raises(UsageError, match=f"drain_wait.*not {action}"):
        parse_policy(
            text.replace(
                "  quarantine: {window: 1h, max: 100}",
                "  quarantine: {window: 1h, max: 100}\n  fix: {unlimited: true}",
            ),
            "policy.yml",
        )


STORM_POLICY = POLICY.replace(
    "storm: {fleet_pct: 100, group_pct: 100}", "storm: {fleet_pct: 10, group_pct: 30, min_hosts: 3}"
)


def test_nodes_slurm_itself_took_out_count_toward_the_storm_brake_of_a_rule_that_matched(
    tmp_path: Path,
) -> None:
    """A fault that hangs nodes outright leaves no finding to match (the host is unreachable), but Slurm marks
    them DOWN (not responding): each counts for the storm brake of every rule that matched this pass. 10 hosts:
    ECC on h0 and h1 (2, not more than 3: no storm); with h8 and h9 not responding in Slurm it is 4, a storm:
    the rule's reboot is held, its quarantine goes on. An admin's down or one of our own drains is no storm."""
    hosts = {f"h{i}": [] for i in range(10)} | {"h0": [ecc()], "h1": [ecc()]}
    scontrol = _scontrol(
        tmp_path,
        _slurm_text(h8="not_responding", h9="not_responding", h7="down_admin", h6="rebooted_drained"),
    )
    conf = {"fleetops_quarantine_backend": "slurm", "fleetops_scontrol": str(scontrol)}
    reading = read_nodes([_host(h, **conf) for h in ("h6", "h7", "h8", "h9")])
    assert {h for h, state in reading.states.items() if state.failed} == {"h8", "h9"}
    assert reading.states["h8"].to_dict()["failed"] is True and "failed" not in reading.states["h7"].to_dict()

    calm, _, _ = _pass(tmp_path / "calm", report(**hosts), NodeReading({h: reading.states[h] for h in ("h6", "h7")}),
                       policy=STORM_POLICY)  # fmt: skip
    assert calm.brakes == {}
    stormy, _, runner = _pass(tmp_path / "storm", report(**hosts), reading, policy=STORM_POLICY)
    assert set(stormy.brakes) == {"gpu-fatal"}
    why = stormy.brakes["gpu-fatal"]["why"]
    assert (
        why.startswith("it matched 4 of 10 hosts")
        and "(2 of them failed in the scheduler, no finding: h8, h9)" in why
    )
    assert [c[0] for c in runner.calls] == ["quarantine"]  # the first rung protects work: it goes on
    # with the first rung done, the next pass's reboot of h0 and h1 is held by the brake
    again, _, runner = _pass(tmp_path / "storm", report(**hosts), reading, now=T0 + 120, policy=STORM_POLICY)
    held = {d.host: d.status for d in again.decisions if d.host in ("h0", "h1")}
    assert held["h0"] == "brake" and set(held.values()) <= {"brake", "floor"}, (
        held
    )  # h1: the floor holds it first
    assert runner.calls == []
