"""A standalone rollout's capacity floor sees the live fleet (issue 25 item 5): before each batch that has a
floor (``--max-unhealthy``; reboot's 10% by default), a group's size is the whole inventory's, and its nodes
out of scheduling by anyone (cordoned, drained, down: read once a batch, ``fleetops.nodes.read_nodes``) count
as unhealthy; a group whose scheduler cannot be read waits.

The engine runs with tests/fleetops/test_rollout.py's scripted runner; the fleet reader with the `scontrol`
stand-in of tests/fleetops/test_nodes.py (``scontrol show node`` text captured from the lab's real Slurm
22.05). A real Slurm drain counting against a reboot's floor is in tests/integration/test_slurm_lab.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetops.ansible.inventory import InventoryHost, InventoryTargets
from fleetops.api.launch import fleet_capacity
from fleetops.rollout.engine import FleetCapacity, NullObserver
from tests.fleetops.test_nodes import _scontrol, _slurm_text
from tests.fleetops.test_rollout import _guarded, state_home  # noqa: F401  (a fixture, used below)

GROUP_OF = {"a1": "az1", "a2": "az1", "b1": "az2"}
pytestmark = pytest.mark.usefixtures("state_home")  # the rollouts' state and audit log in tmp_path


def test_a_node_out_by_someone_else_holds_its_groups_next_batch(tmp_path: Path) -> None:
    reads: list[int] = []

    def fleet() -> FleetCapacity:
        reads.append(1)
        return FleetCapacity(
            {"az1": 4, "az2": 2}, {"a9": "az1"}
        )  # a9: not in the rollout, drained by an admin

    engine, runner = _guarded(tmp_path, [["a1"], ["b1"], ["a2"]], max_unhealthy="0", group_of=GROUP_OF)
    engine.fleet = fleet
    told: list[str] = []
    engine.observer = Told(told)
    rollout = engine.run()
    # told once, before the first batch: each group's capacity as the floor sees it
    assert [t for t in told if t.startswith("capacity: ")] == [
        "capacity: group az1: 4 hosts in the inventory, 1 unhealthy now (a9); --max-unhealthy 0 allows 0: "
        "its batches wait",
        "capacity: group az2: 2 hosts in the inventory, 0 unhealthy now; --max-unhealthy 0 allows 0: 0 more may "
        "be lost",
    ]
    assert runner.batches == [["b1"]]  # az2 goes; az1 waits for its lost capacity
    assert rollout.stopped is not None
    assert rollout.stopped["reason"].startswith(
        "group az1: 1 of its 4 hosts are unhealthy (a9), more than the 0"
    )
    assert len(reads) >= 2  # read before each batch, not once per rollout

    alone, runner = _guarded(
        tmp_path / "alone", [["a1"], ["b1"], ["a2"]], max_unhealthy="0", group_of=GROUP_OF
    )
    alone.run()
    assert runner.batches == [["a1"], ["b1"], ["a2"]]  # without the fleet's view nothing is held


class Told(NullObserver):
    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def message(self, text: str, style: str = "") -> None:
        self.lines.append(text)


def test_a_groups_size_is_the_whole_inventorys(tmp_path: Path) -> None:
    # 10% of the rollout's 2 az1 hosts tolerates none; 10% of az1's 20 in the inventory tolerates 2
    engine, runner = _guarded(tmp_path, [["a1"], ["a2"]], max_unhealthy="10%", group_of=GROUP_OF)
    engine.fleet = lambda: FleetCapacity({"az1": 20, "az2": 5}, {"a9": "az1"})
    engine.run()
    assert runner.batches == [["a1"], ["a2"]]
    engine, runner = _guarded(tmp_path / "more", [["a1"], ["a2"]], max_unhealthy="10%", group_of=GROUP_OF)
    engine.fleet = lambda: FleetCapacity({"az1": 20}, {"a7": "az1", "a8": "az1", "a9": "az1"})
    rollout = engine.run()
    assert runner.batches == [] and rollout.stopped is not None
    assert "3 of its 20 hosts are unhealthy (a7 a8 a9), more than the 2" in rollout.stopped["reason"]


def test_a_group_whose_scheduler_cannot_be_read_waits(tmp_path: Path) -> None:
    engine, runner = _guarded(tmp_path, [["a1"], ["b1"]], max_unhealthy="1", group_of=GROUP_OF)
    engine.fleet = lambda: FleetCapacity(
        {"az1": 3, "az2": 1}, {}, {"az1": "slurm: scontrol show node: timed out"}
    )
    rollout = engine.run()
    assert runner.batches == [["b1"]]
    assert rollout.stopped is not None
    assert rollout.stopped["reason"] == (
        "group az1: its capacity is unknown (slurm: scontrol show node: timed out); its next batch waits"
    )


def _host(name: str, group: str, **hostvars: object) -> InventoryHost:
    return InventoryHost(name, group, hostvars=dict(hostvars))


def test_the_fleet_is_read_from_the_whole_inventory_through_each_hosts_scheduler(tmp_path: Path) -> None:
    scontrol = _scontrol(
        tmp_path, _slurm_text(**{"s1": "drained_admin", "s2": "idle", "s3": "not_responding"})
    )
    slurm = {"fleetops_quarantine_backend": "slurm", "fleetops_scontrol": str(scontrol)}
    every = [
        _host("s1", "az1", **slurm), _host("s2", "az1", **slurm), _host("s3", "az2", **slurm),
        _host("k1", "az1"),  # kubernetes, no cluster named: not read (as remediate auto)
        _host("odd", "az3", fleetops_quarantine_backend="slurmm"),
    ]  # fmt: skip
    listing = InventoryTargets(every[:1], frozenset({"all"}), frozenset(h.name for h in every), every)
    seen = fleet_capacity(listing, {})()
    assert seen.sizes == {"az1": 3, "az2": 1, "az3": 1}
    assert seen.out == {"s1": "az1", "s3": "az2"}
    assert (
        list(seen.unknown) == ["az3"]
        and "fleetops_quarantine_backend 'slurmm' is not a quarantine backend" in seen.unknown["az3"]
    )
    assert (tmp_path / "scontrol-calls").read_text().splitlines() == [" show node"]  # one call for the fleet

    broken = fleet_capacity(
        InventoryTargets([], frozenset(), frozenset(), [_host("s1", "az1", fleetops_quarantine_backend="slurm",
                                                               fleetops_scontrol=str(tmp_path / "none"))]),
        {},
    )()  # fmt: skip
    assert broken.out == {} and "No such file" in broken.unknown["az1"]


def test_a_remediation_holds_a_group_an_admins_drain_already_took_capacity_from(tmp_path: Path) -> None:
    """Through `remediate` (the real launch, engine and ansible-playbook on local hosts): s3, outside the
    rollout, is drained by an admin; --max-unhealthy 0 holds s1 and s2 of its group, and nothing runs."""
    from fleetops import api
    from tests.fleetops.test_quarantine import STANDIN, _inventory

    scontrol = _scontrol(tmp_path, _slurm_text(**{"s1": "idle", "s2": "idle", "s3": "drained_admin"}))
    slurm = {"fleetops_quarantine_backend": "slurm", "fleetops_scontrol": str(scontrol), "fleetops_az": "az1"}
    inv = _inventory(tmp_path, {"s1": slurm, "s2": slurm, "s3": slurm})
    request = api.RemediationRequest(
        action="quarantine", inventory=[inv], apply=True, gate=False, limit="s1,s2", max_parallel=1,
        per_group_max=100, canary=0, max_unhealthy="0", params={"finding": "gpu_health", "kubectl": str(STANDIN)},
    )  # fmt: skip
    result = api.remediate(request, None, handle_signals=False)
    assert result.rollout is not None and result.rollout.stopped is not None
    assert result.rollout.stopped["reason"].startswith("group az1: 1 of its 3 hosts are unhealthy (s3)")
    assert sorted(result.rollout.stopped["pending"]) == ["s1", "s2"]
    calls = (tmp_path / "scontrol-calls").read_text().splitlines()
    assert calls and all(c.endswith(" show node") for c in calls), calls  # read the fleet; drained nothing


def test_with_a_shared_store_hosts_an_auto_pass_is_acting_on_count_too(tmp_path: Path) -> None:
    """An auto pass on another controller reserved a reboot of h2 (its batch runs now) and left a stop-start
    of h3 half done (in doubt, never finished): a rollout's floor counts both out; a reboot settled done
    (h4) or a dead pass's in-doubt reboot (h5, nothing half done about it) does not."""
    from ansible_collections.fleetops.node.plugins.module_utils import store as mu

    from fleetops import store

    shared = store.Store(mu.MemoryStore(clock=lambda: 1.8e9), clock=lambda: 1.8e9)
    dead = store.StoredState(shared)
    dead.load()  # auto-b: died mid-batch
    dead.reserve(
        "auto-b", "stop-start", [("h3", "az1", "r", 2, "c")], "ctl-b", 1.8e9, {"h3": ("i-3", "us-east-1")}
    )
    dead.reserve("auto-b", "reboot", [("h5", "az1", "r", 1, "c")], "ctl-b", 1.8e9)
    later = store.StoredState(shared)
    later.load()
    later.recover(
        "auto-a"
    )  # auto-a, the next pass, finds auto-b dead: h3's stop-start and h5's reboot in doubt
    done = later.reserve("auto-a", "reboot", [("h4", "az1", "r", 1, "c")], "ctl-a", 1.8e9)
    later.settle(done, ["h4"], "reboot", 1.8e9)
    later.reserve("auto-a", "reboot", [("h2", "az1", "r", 1, "c")], "ctl-a", 1.8e9)  # its batch runs now
    assert later.busy(["reboot"]) == {"h2": "reboot in a batch of auto-a"}

    every = [_host(h, "az1") for h in ("h1", "h2", "h3", "h4", "h5")]
    listing = InventoryTargets(every[:1], frozenset({"all"}), frozenset(h.name for h in every), every)
    seen = fleet_capacity(listing, {}, shared)()
    assert seen.out == {"h2": "az1", "h3": "az1"} and seen.unknown == {}
    # the rollout's own hosts are never busy to it (the pass reserved them before its rollout's batches)
    assert fleet_capacity(listing, {}, shared, own={"h2"})().out == {"h3": "az1"}

    def outage(operation: str) -> None:
        raise mu.StoreError(f"{operation}: ThrottlingException (after 5 tries)")

    failing = store.Store(mu.MemoryStore(fail=outage), clock=lambda: 1.8e9)
    seen = fleet_capacity(listing, {}, failing)()
    assert list(seen.unknown) == ["az1"] and "shared store" in seen.unknown["az1"]


def test_a_cluster_this_controller_cannot_reach_is_not_read_and_holds_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the reboot playbook's kubectl hooks are skipped without a kubectl or a kubeconfig on the controller
    (the rollout then touches no node), its floor reads no Kubernetes node; a kubectl that is there but
    fails makes the group's capacity unknown."""
    calls = tmp_path / "calls"
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(f'#!/bin/sh\necho "$*" >> {calls}\necho "error: the server is gone" >&2; exit 1\n')
    kubectl.chmod(0o755)
    config = tmp_path / "kubeconfig"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    listing = InventoryTargets([], frozenset(), frozenset({"k1"}), [_host("k1", "az1")])
    for extravars, env in (
        ({"fleetops_kubectl": str(tmp_path / "no-kubectl")}, str(config)),  # no kubectl
        ({"fleetops_kubectl": str(kubectl)}, str(tmp_path / "missing")),  # no kubeconfig
        ({"fleetops_kubectl": str(kubectl), "fleetops_kubeconfig": str(tmp_path / "missing")}, str(config)),
    ):
        config.write_text("apiVersion: v1\nkind: Config\n")
        monkeypatch.setenv("KUBECONFIG", env)
        seen = fleet_capacity(listing, extravars)()
        assert (seen.out, seen.unknown) == ({}, {}), extravars
    assert not calls.exists()
    monkeypatch.setenv("KUBECONFIG", str(config))
    seen = fleet_capacity(listing, {"fleetops_kubectl": str(kubectl)})()
    assert "the server is gone" in seen.unknown["az1"] and calls.exists()
