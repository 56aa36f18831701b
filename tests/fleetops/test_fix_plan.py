"""What `fleetops remediate fix` does per host, from a scan report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.fleetops.node.plugins.module_utils import containers

from fleetops.fix import fix_plan_from_report
from tests.paths import FIXTURES


def _host(*findings: dict[str, Any], status: str = "ok") -> dict[str, Any]:
    return {"status": status, "findings": list(findings), "facts": {}}


LOOP = {
    "check": "crashloop_unit",
    "severity": "critical",
    "summary": "ecs.service is crash looping",
    "data": {"unit": "ecs.service", "restarts_per_min": 30.0},
}
SLOW = {**LOOP, "severity": "info", "data": {"unit": "flaky.service"}}
ZOMBIES = {
    "check": "zombie_memcg",
    "severity": "warning",
    "summary": "piling up",
    "data": {"culprits": [{"unit": "ecs.service"}, {"unit": "other.service"}]},
}


def test_fix_plan_turns_off_loops_and_culprits_then_reclaims() -> None:
    report = {
        "hosts": {
            "sick": _host(LOOP, ZOMBIES),
            "zombies-only": _host(
                {**ZOMBIES, "data": {"zombies": 1500, "thresholds": {"zombie_warning": 1000}}}
            ),
            "ids-running-out": _host({**ZOMBIES, "data": {"id_headroom_pct": 10.0, "zombies": None}}),
            "growth-only": _host(
                {**ZOMBIES, "data": {"zombies": None, "growth_per_min": 60.0, "culprits": []}}
            ),
            "healthy": _host(),
            "info-only": _host(SLOW),
            "gone": {"status": "unreachable", "msg": "No route to host", "findings": [], "facts": {}},
        }
    }
    plan, notes = fix_plan_from_report(report)
    assert plan == {
        "sick": {"disable_units": ["ecs.service", "other.service"], "reclaim": True},
        "zombies-only": {"disable_units": [], "reclaim": True},
        "ids-running-out": {"disable_units": [], "reclaim": True},
    }
    assert notes == [
        "gone: unreachable in the scan, left alone (No route to host)",
        "growth-only: memory cgroups growing with no culprit named: left for a human to look at",
    ]


def test_nothing_to_fix() -> None:
    plan, notes = fix_plan_from_report({"hosts": {"a": _host()}})
    assert plan == {}
    assert notes == ["no host has a crash-looping unit or zombie memory cgroups to fix"]


# ------------------------------------------------------------------------------------------------
# crashloop_container findings: turn off the unit that re-creates the container (fixtures/docker)
# ------------------------------------------------------------------------------------------------

DOCKER = FIXTURES / "docker"
PROC = DOCKER / "proc"  # ecs-init in ecs.service, `docker start -a flappy` in flappy.service, a `logs -f`
T1 = containers.parse_timestamp("2026-11-29T15:00:05Z") or 0.0


def _sample(name: str, now: float, proc: Path, edit: Any = None) -> dict[str, Any]:
    items = json.loads((DOCKER / name).read_text())
    if edit:
        edit(items)
    parsed = containers.parse_inspect(json.dumps(items), now)
    owned = containers.attach_owners(parsed, containers.find_owners(parsed, str(proc)))
    return {"docker": True, "reason": None, "containers": owned, "sampled_at": now}


def _container_findings(
    proc: Path = PROC, second_proc: Path | None = None, edit: Any = None
) -> list[dict[str, Any]]:
    first = _sample("ecs-agent-1.json", T1, proc, edit)
    second = _sample("ecs-agent-2.json", T1 + 10, second_proc or proc, edit)
    findings: list[dict[str, Any]] = containers.evaluate(containers.add_growth(first, second, 10.0))
    return findings


def _proc_without(tmp_path: Path, *pids: str) -> Path:
    tree = tmp_path / "proc"
    shutil.copytree(PROC, tree)
    for pid in pids:
        shutil.rmtree(tree / pid)
    return tree


def test_container_owners_from_the_process_tree() -> None:
    found = {f["data"]["name"]: f for f in _container_findings()}
    assert sorted(found) == ["ecs-agent", "flappy"]  # steady is steady
    ecs = found["ecs-agent"]["data"]
    assert ecs["restart_count"] == 0 and ecs["recreated"] == 1  # ecs-init re-creates it
    assert ecs["owner_unit"] == "ecs.service" and ecs["owner_protected"] is False
    # the operator's `docker logs -f ecs-agent` (in ssh.service) follows the container; it does not own it
    assert ecs["owner_basis"] == (
        "pid 62 amazon-ecs-init (creates ecs-agent) in ecs.service (system manager)"
    )
    flappy = found["flappy"]["data"]
    assert flappy["owner_unit"] == "flappy.service"
    assert flappy["owner_basis"] == (
        "pid 65 `/bin/sh /usr/bin/docker start -a flappy` in flappy.service (system manager)"
    )
    assert "owned by ecs.service (pid 62 amazon-ecs-init" in found["ecs-agent"]["summary"]


def test_fix_plan_disables_the_unit_that_re_creates_the_container() -> None:
    report = {"hosts": {"sick": _host(*_container_findings()), "healthy": _host()}}
    plan, notes = fix_plan_from_report(report)
    assert plan == {
        "sick": {
            "disable_units": ["ecs.service", "flappy.service"],
            "reclaim": True,
            "containers": {"ecs.service": ["ecs-agent"], "flappy.service": ["flappy"]},
        }
    }
    assert notes == []


def test_fix_plan_merges_a_container_owner_with_the_same_unit_crash_looping() -> None:
    report = {"hosts": {"sick": _host(LOOP, *_container_findings())}}
    plan, _notes = fix_plan_from_report(report)
    assert plan["sick"]["disable_units"] == ["ecs.service", "flappy.service"]
    assert plan["sick"]["containers"] == {"ecs.service": ["ecs-agent"], "flappy.service": ["flappy"]}


def test_an_owner_seen_only_in_the_first_sample_still_counts(tmp_path: Path) -> None:
    # ecs-init exited between the samples (the agent crashed, the unit is between restarts)
    later = _proc_without(tmp_path, "62")
    found = {f["data"]["name"]: f["data"] for f in _container_findings(PROC, later)}
    assert found["ecs-agent"]["owner_unit"] == "ecs.service"


def test_unattributed_containers_are_left_alone_with_a_note(tmp_path: Path) -> None:
    proc = _proc_without(tmp_path, "62", "65")  # no ecs-init, no client: only the `logs -f` follower
    findings = _container_findings(proc)
    assert all(f["data"]["owner_unit"] is None for f in findings)
    plan, notes = fix_plan_from_report({"hosts": {"sick": _host(*findings)}})
    assert plan == {}
    assert notes == [
        "sick: container ecs-agent (amazon/amazon-ecs-agent:latest) crash loops but could not be attributed to a "
        "unit (no owner label, client process or known creator found): left alone",
        "sick: container flappy (example/flappy:1) crash loops but could not be attributed to a unit (no owner "
        "label, client process or known creator found; docker itself restarts it (restart policy always)): "
        "left alone",
        "no host has a crash-looping unit or zombie memory cgroups to fix",
    ]


def test_a_protected_owner_is_never_planned(tmp_path: Path) -> None:
    def label(items: list[dict[str, Any]]) -> None:
        for item in items:
            if item["Name"] == "/flappy":
                item["Config"]["Labels"] = {"PODMAN_SYSTEMD_UNIT": "containerd.service"}

    findings = _container_findings(_proc_without(tmp_path, "65"), edit=label)
    flappy = next(f["data"] for f in findings if f["data"]["name"] == "flappy")
    assert flappy["owner_unit"] == "containerd.service" and flappy["owner_protected"] is True
    assert flappy["owner_basis"] == "label PODMAN_SYSTEMD_UNIT=containerd.service"
    plan, notes = fix_plan_from_report({"hosts": {"sick": _host(*findings)}})
    assert plan == {
        "sick": {
            "disable_units": ["ecs.service"],
            "reclaim": True,
            "containers": {"ecs.service": ["ecs-agent"]},
        }
    }
    assert notes == [
        "sick: container flappy crash loops and is owned by containerd.service, a protected unit: left for a human"
    ]


def test_client_command_lines_that_own_a_container() -> None:
    known = {
        "web": {"id": "0123456789ab", "full_id": "0123456789ab" + "c" * 52},
        "nginx": {"id": "ffffffffffff"},
    }
    refs = containers.referenced_containers
    assert refs(["run", "--rm", "--name", "web", "nginx"], known) == ["web"]  # the image is not a container
    assert refs(["-H", "unix:///run/docker.sock", "container", "run", "--name=web", "nginx"], known) == [
        "web"
    ]
    assert refs(["start", "-a", "web"], known) == ["web"]
    assert refs(["start", "-a", "0123456789abcc"], known) == ["web"]
    assert refs(["logs", "-f", "web"], known) == []
    assert refs(["wait", "web"], known) == []
    assert refs(["run", "nginx"], known) == []


def _fix_task(module: str) -> dict[str, Any]:
    import yaml

    from tests.paths import REPO

    play = yaml.safe_load((REPO / "playbooks" / "remediate_fix.yml").read_text())[0]

    def tasks(items: list[dict[str, Any]]) -> Any:  # the changes sit inside the lease block
        for task in items:
            yield task
            for key in ("block", "rescue", "always"):
                yield from tasks(task.get(key) or [])

    return next(t[module] for t in tasks(play["tasks"]) if module in t)


def test_fix_reclaims_only_at_the_warning_level_as_remediate_reclaim() -> None:
    """The playbook leaves ``min_zombies`` to reclaim_memcg, whose default is the warning level, as
    `remediate reclaim` does: a host the plan names but that is under the level when the fix runs
    (its loops just turned off) keeps its page cache. Run for real on this machine, in check mode
    (nothing dropped): its zombies (about 10 here) are under the level, so no reclaim; the old
    ``min_zombies: 1`` reclaimed at any count from 1."""
    from fleetops.ansible import facts
    from fleetops.ansible.runner import RunnerOptions, run_playbook
    from tests.paths import REPO

    # unset (no --min-zombies), the knob is omitted and the module's default, the warning level, applies
    assert (
        _fix_task("fleetops.node.reclaim_memcg")["min_zombies"]
        == "{{ fleetops_min_zombies | default(omit) }}"
    )
    run = run_playbook(
        RunnerOptions(
            playbook="fleetops.node.remediate_fix",
            inventory=[REPO / "inventory" / "localhost.yml"],
            extravars={"fleetops_fix_plan": {"localhost": {"disable_units": [], "reclaim": True}}},
            check=True,
        )
    )
    result = next(tr for tr in run.results_for("localhost") if tr.action == "fleetops.node.reclaim_memcg")
    assert result.status == "ok", result.result
    pending, warning = result.result["pending"], facts.zombie_warning_default()
    assert result.result["reclaimed"] is (pending >= warning), (pending, warning)


def test_fix_shows_the_ucx_values_it_sets() -> None:
    """The UCX fix values are not secrets: the set_env results keep them as set (lab tests read them)."""
    assert _fix_task("fleetops.node.set_env")["show_values"] is True


@pytest.mark.parametrize("extravars", [{}, {"fleetops_fix_plan": {}}, {"fleetops_fix_plan": []}])
def test_a_fix_plan_that_names_no_host_fails_at_once_and_changes_nothing(extravars: dict[str, Any]) -> None:
    """Empty never means all: the fix playbook run by hand or from AWX without a plan (or with an
    empty one) fails on its plan check, before any task that changes a host. Real ansible-playbook on
    this machine, in check mode."""
    from fleetops.ansible.runner import RunnerOptions, run_playbook
    from tests.paths import REPO

    run = run_playbook(
        RunnerOptions(
            playbook="fleetops.node.remediate_fix",
            inventory=[REPO / "inventory" / "localhost.yml"],
            extravars=extravars,
            check=True,
        )
    )
    results = run.results_for("localhost")
    failed = [tr for tr in results if tr.status == "failed"]
    assert [tr.action for tr in failed] == ["ansible.builtin.assert"], [
        (tr.action, tr.status) for tr in results
    ]
    assert "names no host" in str(failed[0].result.get("msg")), failed[0].result
    changing = {"fleetops.node.disable_unit", "fleetops.node.set_env", "fleetops.node.reclaim_memcg"}
    assert not [tr for tr in results if tr.action in changing], [(tr.action, tr.status) for tr in results]


def test_fix_never_plans_a_protected_unit_and_says_so() -> None:
    """A crash-looping protected unit (systemd-logind by its dbus alias, sshd, one the operator named
    with --protected) is left alone with a note; the unprotected culprit on the same host is fixed."""
    looping = [
        {**LOOP, "data": {"unit": "dbus-org.freedesktop.login1.service", "restarts_per_min": 9.0}},
        {**LOOP, "data": {"unit": "ssh.service", "restarts_per_min": 9.0}},
        {**LOOP, "data": {"unit": "vendor-agent.service", "restarts_per_min": 9.0}},
        LOOP,
    ]
    plan, notes = fix_plan_from_report({"hosts": {"sick": _host(*looping)}}, protected=("vendor-agent",))
    assert plan == {"sick": {"disable_units": ["ecs.service"], "reclaim": True}}
    assert notes == [
        "sick: dbus-org.freedesktop.login1.service crash loops but is protected (dbus-org.freedesktop.*): "
        "left for a human",
        "sick: ssh.service crash loops but is protected (ssh.service): left for a human",
        "sick: vendor-agent.service crash loops but is protected (vendor-agent.service): left for a human",
    ]
    only_protected, notes = fix_plan_from_report({"hosts": {"sick": _host(looping[1])}})
    assert only_protected == {}  # nothing to do there: the host is not touched at all
