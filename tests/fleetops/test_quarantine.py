"""``fleetops remediate quarantine`` / ``unquarantine`` through the real rollout engine and real
ansible-playbook (local connection), with kubectl replaced by the stand-in tests/kubectl_standin/kubectl:
no Kubernetes API server can run on these machines. The stand-in keeps nodes, pods and
PodDisruptionBudgets in a JSON file ($FLEETOPS_KUBECTL_STATE) and enforces what these playbooks rely on:
cordon state, taints unique by key and effect, annotations, and drains whose evictions respect PDBs.
Only the unquarantine's scan is replaced (by a report given here): a real scan of this controller finds
whatever this machine has; tests/integration/test_quarantine_lab.py scans real lab hosts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetops import api
from fleetops.errors import UsageError
from tests.paths import KUBECTL_STANDIN

STANDIN = KUBECTL_STANDIN
KEY = "fleetops.io/quarantine"
MUTATING = ("cordon", "uncordon", "taint", "annotate", "drain")


class Messages:
    """An observer that keeps the operator's messages."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None

    def message(self, text: str, style: str = "") -> None:
        self.lines.append(text)


@pytest.fixture
def kube(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(tmp_path / "home"))
    monkeypatch.setenv("FLEETOPS_AUDIT_LOG", str(tmp_path / "audit.jsonl"))
    path = tmp_path / "kube.json"
    monkeypatch.setenv("FLEETOPS_KUBECTL_STATE", str(path))
    return path


def _cluster(path: Path, nodes: dict[str, Any], pods: list[Any] = (), pdbs: list[Any] = ()) -> None:  # type: ignore[assignment]
    full = {n: {"unschedulable": False, "taints": [], "annotations": {}, **v} for n, v in nodes.items()}
    path.write_text(json.dumps({"nodes": full, "pods": list(pods), "pdbs": list(pdbs)}))


def _read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _inventory(tmp_path: Path, hosts: dict[str, dict[str, Any]]) -> Path:
    data = {
        "all": {
            "hosts": {
                h: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, **v}
                for h, v in hosts.items()
            }
        }
    }
    path = tmp_path / "inv.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def _run(
    inv: Path, action: str, apply: bool, observer: Any = None, one_at_a_time: bool = False, **params: Any
) -> api.RolloutResult:
    request = api.RemediationRequest(
        action=action,
        inventory=[inv],
        apply=apply,
        gate=False,  # the batch gate scans this controller; the unquarantine's own scan is what is tested
        max_parallel=1 if one_at_a_time else "100%",
        per_group_max=100,  # one batch: the hosts are ungrouped
        canary=0,
        params={"kubectl": str(STANDIN), **params},
    )
    return api.remediate(request, observer, handle_signals=False)


def _mutations(path: Path) -> list[list[str]]:
    return [c for c in _read(path)["calls"] if any(v in c[: c.index("--")] for v in MUTATING if "--" in c)]


def test_quarantine_dry_run_changes_nothing_then_apply_cordons_taints_and_annotates(
    tmp_path: Path, kube: Path
) -> None:
    foreign = {"key": "gpu", "value": "a100", "effect": "NoSchedule"}
    _cluster(kube, {"node-a": {"taints": [foreign]}, "nb": {"unschedulable": True}})
    inv = _inventory(tmp_path, {"node-a": {}, "node-b": {"k8s_node_name": "nb"}})
    before = _read(kube)["nodes"]

    dry = _run(inv, "quarantine", False, finding="crashloop_unit", reason="units crash loop")
    assert dry.rollout is not None
    assert {h: o.changed for h, o in dry.rollout.results.items()} == {"node-a": True, "node-b": True}
    assert _read(kube)["nodes"] == before and _mutations(kube) == []
    notes = [n for o in dry.rollout.results.values() for n in o.notes]
    assert any(
        "would annotate, taint fleetops.io/quarantine=crashloop_unit:NoSchedule, cordon" in n for n in notes
    )

    done = _run(inv, "quarantine", True, finding="crashloop_unit", reason="units crash loop")
    assert done.rollout is not None and int(done.exit_code) == 0, done.document
    nodes = _read(kube)["nodes"]
    ours = {"key": KEY, "value": "crashloop_unit", "effect": "NoSchedule"}
    assert nodes["node-a"]["taints"] == [foreign, ours] and nodes["node-a"]["unschedulable"] is True
    assert nodes["nb"]["taints"] == [ours] and nodes["nb"]["unschedulable"] is True
    rec_a = json.loads(nodes["node-a"]["annotations"][KEY])
    rec_b = json.loads(nodes["nb"]["annotations"][KEY])
    assert rec_a["check"] == "crashloop_unit" and rec_a["reason"] == "units crash loop"
    assert rec_a["rollout"] == done.rollout.id and rec_a["time"].endswith("Z")
    assert rec_a["cordoned_by_us"] is True and rec_b["cordoned_by_us"] is False  # nb was cordoned before
    for call in _mutations(kube):
        dash = call.index("--")
        assert call[dash + 1] in ("node-a", "nb") and "--request-timeout=60s" in call[:dash], call
    assert not any(c[c.index("--") - 1] == "cordon" and c[-1] == "nb" for c in _mutations(kube))

    # quarantined again (another rollout): nothing changes, the first record (who cordoned) is kept
    calls = len(_read(kube)["calls"])
    again = _run(inv, "quarantine", True, finding="crashloop_unit")
    assert again.rollout is not None and not any(o.changed for o in again.rollout.results.values())
    assert _read(kube)["nodes"] == nodes
    assert all(c[c.index("--") - 1 if "--" in c else 0] in ("json",) for c in _read(kube)["calls"][calls:])


def test_unquarantine_takes_off_only_our_taint_and_cordon_and_refuses_a_host_still_failing_its_check(
    tmp_path: Path, kube: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fleetops.scan

    def record(by_us: bool) -> str:
        return json.dumps({"check": "crashloop_unit", "reason": "", "time": "2026-12-01T00:00:00Z",
                           "rollout": "r1", "cordoned_by_us": by_us})  # fmt: skip

    ours = {"key": KEY, "value": "crashloop_unit", "effect": "NoSchedule"}
    other = {"key": "fleetops.io/other", "value": "x", "effect": "NoSchedule"}
    _cluster(
        kube,
        {
            "node-a": {
                "unschedulable": True,
                "taints": [other, ours],
                "annotations": {KEY: record(True), "k": "v"},
            },
            "node-b": {"unschedulable": True, "taints": [ours], "annotations": {KEY: record(False)}},
            "node-c": {"unschedulable": True, "taints": [ours], "annotations": {KEY: record(True)}},
            "node-d": {"unschedulable": True, "taints": [ours], "annotations": {KEY: record(True)}},
        },
    )
    inv = _inventory(tmp_path, {"node-a": {}, "node-b": {}, "node-c": {}, "node-d": {}})
    crit = {
        "check": "crashloop_unit",
        "severity": "critical",
        "summary": "a.service restarted 40 times",
        "data": {},
    }
    other_warning = {"check": "zombie_memcg", "severity": "warning", "summary": "zombies", "data": {}}
    # node-a: another check's warning (not what it was quarantined for); node-d: not scanned
    report = {"hosts": {"node-a": {"status": "ok", "findings": [{"check": "x", "severity": "info"}, other_warning]},
                        "node-b": {"status": "ok", "findings": []},
                        "node-c": {"status": "ok", "findings": [crit]},
                        "node-d": {"status": "unreachable", "findings": []}}}  # fmt: skip
    scans: list[Any] = []

    def scan(opts: Any) -> dict[str, Any]:
        scans.append(opts.limit)
        return report

    monkeypatch.setattr(fleetops.scan, "run_scan", scan)
    before = _read(kube)["nodes"]
    dry = _run(inv, "unquarantine", False, sample_seconds=0.5)
    assert dry.rollout is not None and dry.rollout.results["node-a"].changed  # would change
    assert _read(kube)["nodes"] == before and _mutations(kube) == []
    said = Messages()
    done = _run(inv, "unquarantine", True, said, sample_seconds=0.5)
    assert scans == [None, None] and done.rollout is not None and int(done.exit_code) == 3, done.document
    results = done.rollout.results
    assert {h: o.status for h, o in results.items()} == {
        "node-a": "ok", "node-b": "ok", "node-c": "failed", "node-d": "failed"
    }  # fmt: skip
    assert (
        results["node-c"].msg == "refused: its scan still finds crashloop_unit: node node-c left quarantined"
    )
    assert results["node-d"].msg == "refused: no scan result for node-d: node node-d left quarantined"
    assert any("node-d: its scan did not complete (unreachable)" in m for m in said.lines), said.lines
    nodes = _read(kube)["nodes"]
    assert nodes["node-a"] == {"unschedulable": False, "taints": [other], "annotations": {"k": "v"}}
    assert nodes["node-b"] == {"unschedulable": True, "taints": [], "annotations": {}}  # not our cordon
    assert nodes["node-c"]["taints"] == [ours] and nodes["node-c"]["unschedulable"] is True
    assert KEY in nodes["node-c"]["annotations"] and nodes["node-d"]["taints"] == [ours]
    assert not any({"node-c", "node-d"} & set(c) for c in _mutations(kube))


def test_evict_drains_and_a_pdb_blocked_eviction_fails_the_host_after_the_timeout(
    tmp_path: Path, kube: Path
) -> None:
    pods = [
        {"name": "web-1", "namespace": "d", "node": "node-a", "labels": {"app": "web"}},
        {"name": "web-2", "namespace": "d", "node": "node-b", "labels": {"app": "web"}},
        {"name": "db-1", "namespace": "d", "node": "node-b", "labels": {"app": "db"}},
        {"name": "log-1", "namespace": "kube-system", "node": "node-b", "daemonset": True},
    ]
    pdbs = [
        {"name": "web", "namespace": "d", "selector": {"app": "web"}, "minAvailable": 1},
        {"name": "db", "namespace": "d", "selector": {"app": "db"}, "maxUnavailable": 0},
    ]
    _cluster(kube, {"node-a": {}, "node-b": {}}, pods, pdbs)
    inv = _inventory(tmp_path, {"node-a": {}, "node-b": {}})
    # one host at a time, node-a first: two drains at once race for the last pod a PDB allows to go
    done = _run(
        inv, "quarantine", True, one_at_a_time=True, finding="ucx_mmap_hooks", evict=True, drain_timeout=2
    )
    assert done.rollout is not None
    results = done.rollout.results
    assert results["node-a"].status == "ok" and results["node-a"].changed, results["node-a"]
    assert results["node-b"].status == "failed", results
    assert "kubectl drain node-b failed (the node stays cordoned and tainted)" in str(results["node-b"].msg)
    assert "violate a PodDisruptionBudget" in str(results["node-b"].msg)
    left = {p["name"] for p in _read(kube)["pods"]}
    # web-1 went (web kept one: web-2); web-2 (the last web) and db-1 (maxUnavailable 0) stay, and the
    # DaemonSet's pod is ignored
    assert left == {"web-2", "db-1", "log-1"}
    nodes = _read(kube)["nodes"]
    for name in ("node-a", "node-b"):
        assert nodes[name]["unschedulable"] is True and nodes[name]["taints"][0]["key"] == KEY
    drains = [c for c in _read(kube)["calls"] if "drain" in c]
    assert all("--timeout=2s" in c[: c.index("--")] and "--disable-eviction" not in c for c in drains)


def test_names_and_findings_are_checked_before_anything_runs(tmp_path: Path, kube: Path) -> None:
    _cluster(kube, {})
    inv = _inventory(tmp_path, {"n1": {"k8s_node_name": "--all"}, "n2": {}})
    with pytest.raises(UsageError, match=r"Kubernetes node name '--all' \(of host 'n1'\)"):
        _run(inv, "quarantine", True, finding="crashloop_unit")
    inv = _inventory(tmp_path, {"n2": {}})
    with pytest.raises(UsageError, match="--finding 'a b' is not a check name"):
        _run(inv, "quarantine", True, finding="a b")
    assert _read(kube).get("calls") is None  # kubectl never ran


def _standin(kube: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(STANDIN), *argv], capture_output=True, text=True, check=False, timeout=30)


def test_the_stand_in_enforces_taints_cordon_double_dash_and_no_eviction_bypass(kube: Path) -> None:
    _cluster(kube, {"n1": {}})
    assert _standin(kube, "taint", "nodes", "--", "n1", "k=v:NoSchedule").returncode == 0
    dup = _standin(kube, "taint", "nodes", "--", "n1", "k=w:NoSchedule")
    assert dup.returncode == 1 and "already has k taint(s) with same effect(s)" in dup.stderr
    assert _standin(kube, "taint", "nodes", "--", "n1", "k=w:NoExecute").returncode == 0
    assert _standin(kube, "taint", "nodes", "--overwrite", "--", "n1", "k=w:NoSchedule").returncode == 0
    assert _read(kube)["nodes"]["n1"]["taints"] == [
        {"key": "k", "value": "w", "effect": "NoExecute"},
        {"key": "k", "value": "w", "effect": "NoSchedule"},
    ]
    assert _standin(kube, "taint", "nodes", "--", "n1", "k-").returncode == 0
    assert _read(kube)["nodes"]["n1"]["taints"] == []
    gone = _standin(kube, "cordon", "--", "--all")  # after --, a name
    assert gone.returncode == 1 and 'nodes "--all" not found' in gone.stderr
    assert _standin(kube, "cordon", "--", "n1").stdout.strip() == "node/n1 cordoned"
    assert _standin(kube, "cordon", "--", "n1").stdout.strip() == "node/n1 already cordoned"
    assert _standin(kube, "drain", "--disable-eviction", "--", "n1").returncode == 1
    assert _standin(kube, "annotate", "node", "--", "n1", "a=1").returncode == 0
    assert _standin(kube, "annotate", "node", "--", "n1", "a=2").returncode == 1  # no --overwrite


def test_the_cli_requires_a_finding(capsys: pytest.CaptureFixture[str]) -> None:
    from fleetops.cli.app import main

    with pytest.raises(SystemExit) as exc:
        main(["remediate", "quarantine", "-i", "x.yml"])
    assert exc.value.code == 2 and "--finding" in capsys.readouterr().err
