"""fleetops drift: hand-built scan reports in, odd hosts out (fleet-wide, per group, between groups)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from fleetops import drift
from fleetops.cli.render import render_drift
from fleetops.errors import UsageError
from tests.helpers import fleetops

KERNEL = "6.1.0-29-cloud-amd64"


def entry(
    *,
    enabled: tuple[str, ...] = ("ssh.service", "remote-fs.target"),
    env: dict[str, dict[str, str]] | None = None,
    kernel: str = KERNEL,
    ucx: list[str] | None = None,
    zombies: int | None = 12,
) -> dict[str, Any]:
    """One ok host as node_health reports it (only the facts drift reads)."""
    facts: dict[str, Any] = {
        "host": {"kernel": kernel, "os": "Debian GNU/Linux 12 (bookworm)", "boot_id": "b-" + kernel},
        "units": {
            "systemd": True,
            "enabled": sorted(enabled),
            "unit_files": {u: {"state": "enabled", "preset": "enabled"} for u in enabled},
            "environment": env if env is not None else {"ssh.service": {}},
        },
        "memcg": {"zombies": zombies, "total": 100},
    }
    if ucx is not None:
        facts["ucx"] = {"processes": [{"pid": 1, "version": v} for v in ucx]}
    return {"status": "ok", "findings": [], "facts": facts, "errors": []}


def report(hosts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    from fleetops.scan import summarize

    return {
        "schema": "fleetops.scan/v1",
        "started_at": "2026-01-01T00:00:00Z",
        "duration_s": 1.0,
        "hosts": hosts,
        "summary": summarize(hosts),
    }


AZ = {"h1": "us-east-1a", "h2": "us-east-1b", "h3": "us-east-1a", "h4": "us-east-1b"}
HOSTVARS = {
    h: {"ec2_az": az, "ec2_image_id": "ami-0abc", "ec2_instance_type": "g5.xlarge"} for h, az in AZ.items()
}


def odd_fleet() -> dict[str, Any]:
    """h2: an extra enabled unit (ecs.service) and a different UCX env on ssh.service."""
    hosts = {h: entry() for h in AZ}
    hosts["h2"] = entry(
        enabled=("ssh.service", "remote-fs.target", "ecs.service"),
        env={"ssh.service": {"UCX_MEM_MMAP_HOOK_MODE": "bistro"}},
    )
    return report(hosts)


def test_the_odd_host_is_singled_out_fleet_wide_and_in_its_az() -> None:
    d = drift.build_drift(odd_fleet(), HOSTVARS)
    assert d["schema"] == "fleetops.drift/v1"
    by_fact = {i["fact"]: i for i in d["fleet"]}
    assert set(by_fact) == {"unit:ecs.service", "env:ssh.service:UCX_MEM_MMAP_HOOK_MODE"}
    unit = by_fact["unit:ecs.service"]
    assert unit["majority"] == "not enabled" and unit["majority_hosts"] == 3 and unit["hosts"] == 4
    assert unit["odd"] == {"h2": "enabled"} and unit["tie"] is False
    env = by_fact["env:ssh.service:UCX_MEM_MMAP_HOOK_MODE"]
    assert env["majority"] == "unset" and env["odd"] == {"h2": "bistro"}
    assert env["label"] == "ssh.service Environment UCX_MEM_MMAP_HOOK_MODE"
    # within us-east-1b (h2, h4) it is 1 against 1: the fleet's majority breaks the tie
    (in_az,) = [i for i in d["groups"]["az"]["us-east-1b"]["drift"] if i["fact"] == "unit:ecs.service"]
    assert in_az["tie"] is True and in_az["odd"] == {"h2": "enabled"}
    assert d["groups"]["az"]["us-east-1a"]["drift"] == []
    assert d["summary"]["odd_hosts"] == ["h2"]
    # ami, kernel, instance_type: one group of every host, which would only repeat the fleet-wide items
    assert {n["scope"] for n in d["odd_hosts"]["h2"]} == {"fleet", "az=us-east-1b"}
    assert d["groups"]["ami"]["ami-0abc"] == {
        "hosts": ["h1", "h2", "h3", "h4"],
        "all_hosts": True,
        "drift": [],
    }
    assert d["hosts"]["h1"] == {"status": "ok", "az": "us-east-1a", "ami": "ami-0abc", "kernel": KERNEL,
                                "instance_type": "g5.xlarge"}  # fmt: skip
    assert drift.exit_code(d) == drift.EXIT_DRIFT


def test_identical_hosts_no_drift() -> None:
    d = drift.build_drift(report({h: entry() for h in AZ}), HOSTVARS)
    assert d["fleet"] == [] and d["odd_hosts"] == {} and d["summary"]["drifting_facts"] == 0
    assert all(rows == [] for rows in d["between_groups"].values())
    assert drift.exit_code(d) == drift.EXIT_OK


def test_boot_ids_differ_everywhere_and_are_not_drift() -> None:
    hosts = {h: entry() for h in AZ}
    for i, e in enumerate(hosts.values()):
        e["facts"]["host"]["boot_id"] = f"boot-{i}"
    assert drift.build_drift(report(hosts), HOSTVARS)["summary"]["drifting_facts"] == 0


def test_zombie_levels_are_bucketed_so_noise_is_not_drift() -> None:
    hosts = {"h1": entry(zombies=1200), "h2": entry(zombies=1900), "h3": entry(zombies=1010)}
    assert drift.build_drift(report(hosts))["fleet"] == []
    hosts["h4"] = entry(zombies=54000)
    (item,) = drift.build_drift(report(hosts))["fleet"]
    assert (
        item["fact"] == "zombies"
        and item["majority"] == "1,000-9,999"
        and item["odd"] == {"h4": "10,000-99,999"}
    )
    assert [drift.zombie_bucket(n) for n in (0, 7, 10, 999)] == ["0", "1-9", "10-99", "100-999"]


def test_unknown_zombies_namespace_scope_are_not_compared() -> None:
    hosts = {"h1": entry(zombies=None), "h2": entry(zombies=None), "h3": entry(zombies=5)}
    assert drift.build_drift(report(hosts))["fleet"] == []


def test_ucx_version_and_kernel_drift_and_kernel_groups() -> None:
    hosts = {"h1": entry(ucx=["1.22.0"]), "h2": entry(ucx=["1.22.0"]), "h3": entry(ucx=["1.19.0"]),
             "h4": entry(ucx=["1.22.0"], kernel="6.12.1")}  # fmt: skip
    d = drift.build_drift(report(hosts), HOSTVARS)
    by_fact = {i["fact"]: i for i in d["fleet"]}
    assert by_fact["ucx_version"]["odd"] == {"h3": "1.19.0"}
    assert by_fact["kernel"]["odd"] == {"h4": "6.12.1"}
    assert set(d["groups"]["kernel"]) == {KERNEL, "6.12.1"}
    # grouping by kernel never reports the kernel itself inside a kernel group
    assert all(i["fact"] != "kernel" for g in d["groups"]["kernel"].values() for i in g["drift"])
    # no UCX anywhere vs. UCX on some hosts
    d2 = drift.build_drift(report({"h1": entry(ucx=[]), "h2": entry(ucx=[]), "h3": entry(ucx=["1.19.0"])}))
    assert d2["fleet"][0]["majority"] == "none"


def test_the_second_az_shows_between_groups() -> None:
    """Pinterest: one AZ differs as a whole (every host agrees within its AZ)."""
    hosts = {h: entry(enabled=("ssh.service", "ecs.service")) for h in AZ}
    for h in ("h2", "h4"):
        hosts[h] = entry(enabled=("ssh.service",))
    d = drift.build_drift(report(hosts), HOSTVARS, ["az"])
    assert d["groups"]["az"]["us-east-1a"]["drift"] == [] and d["groups"]["az"]["us-east-1b"]["drift"] == []
    assert d["between_groups"]["az"] == [
        {"fact": "unit:ecs.service", "label": "unit ecs.service",
         "groups": {"us-east-1a": "enabled", "us-east-1b": "not enabled"}}
    ]  # fmt: skip
    (fleet,) = d["fleet"]
    assert fleet["tie"] is True
    assert drift.exit_code(d) == drift.EXIT_DRIFT


def test_env_of_a_unit_only_some_hosts_have_is_compared_among_those() -> None:
    hosts = {
        "h1": entry(env={"ssh.service": {}, "worker.service": {"A": "1"}}),
        "h2": entry(env={"ssh.service": {}, "worker.service": {"A": "1"}}),
        "h3": entry(env={"ssh.service": {}}),  # no worker: its env is unknown, not "unset"
    }
    assert drift.build_drift(report(hosts))["fleet"] == []


def test_unreachable_hosts_are_not_compared_exit_3() -> None:
    r = odd_fleet()
    r["hosts"]["h5"] = {"status": "unreachable", "msg": "ssh: no route", "findings": [], "facts": {}}
    d = drift.build_drift(r, HOSTVARS)
    assert d["not_compared"] == {"h5": {"status": "unreachable", "msg": "ssh: no route"}}
    assert d["summary"]["compared"] == 4 and d["summary"]["odd_hosts"] == ["h2"]
    assert drift.exit_code(d) == drift.EXIT_HOSTS


def test_dimensions_without_values_are_skipped() -> None:
    d = drift.build_drift(odd_fleet(), {h: {"fleetops_az": az} for h, az in AZ.items()})
    assert set(d["groups"]) == {"az", "kernel"}
    assert "ec2_image_id" in d["skipped_dimensions"]["ami"]
    assert set(d["skipped_dimensions"]) == {"ami", "instance_type"}


def test_rejects_other_schemas_and_dimensions() -> None:
    with pytest.raises(UsageError, match=r"not a fleetops\.scan/v1 report"):
        drift.build_drift({"schema": "fleetops.plan/v1"})
    with pytest.raises(UsageError, match="cannot group by 'rack'"):
        drift.build_drift(odd_fleet(), group_by=["rack"])


def test_input_report_is_not_modified() -> None:
    r = odd_fleet()
    before = copy.deepcopy(r)
    drift.build_drift(r, HOSTVARS)
    assert r == before


def test_render_table_names_the_odd_host() -> None:
    console = Console(record=True, width=200, force_terminal=False)
    render_drift(drift.build_drift(odd_fleet(), HOSTVARS), console)
    text = console.export_text()
    assert "fleet-wide" in text and "unit ecs.service" in text and "not enabled (3/4)" in text
    assert "unit ecs.service enabled (others: not enabled)" in text and "  h2: " in text
    console = Console(record=True, width=200)
    render_drift(drift.build_drift(report({h: entry() for h in AZ}), HOSTVARS), console)
    assert "no drift" in console.export_text()


def test_load_unit_allowlist(tmp_path: Path) -> None:
    plain = tmp_path / "allow.yml"
    plain.write_text("- ssh.service\n- 'systemd-*'\n")
    assert drift.load_unit_allowlist(plain) == ["ssh.service", "systemd-*"]
    group_vars = tmp_path / "all.yml"
    group_vars.write_text(yaml.safe_dump({"fleetops_unit_allowlist": ["getty@*"], "other": 1}))
    assert drift.load_unit_allowlist(group_vars) == ["getty@*"]
    bad = tmp_path / "bad.yml"
    bad.write_text("just a string\n")
    with pytest.raises(UsageError, match="must be a non-empty YAML list"):
        drift.load_unit_allowlist(bad)
    with pytest.raises(UsageError, match="cannot read the unit allow-list"):
        drift.load_unit_allowlist(tmp_path / "missing.yml")


# --------------------------------------------------------------------------------------- the CLI


def _inventory(tmp_path: Path) -> Path:
    inv = tmp_path / "inv.yml"
    hosts = {
        h: {"ansible_host": "127.0.0.1", "ec2_az": az, "ec2_image_id": "ami-0abc"} for h, az in AZ.items()
    }
    inv.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    return inv


def test_cli_from_a_saved_report(tmp_path: Path) -> None:
    saved = tmp_path / "scan.json"
    saved.write_text(json.dumps(odd_fleet()))
    out = tmp_path / "drift.json"
    result = fleetops("drift", "--from", str(saved), "-i", str(_inventory(tmp_path)), "--format", "json",
                      "-o", str(out), timeout=120)  # fmt: skip
    assert result.rc == 1, result.stderr
    d = result.json()
    assert d["summary"]["odd_hosts"] == ["h2"]
    assert set(d["groups"]) == {"az", "ami", "kernel"}
    assert json.loads(out.read_text()) == d
    table = fleetops("drift", "--from", str(saved), "--group-by", "kernel", timeout=120)
    assert table.rc == 1 and "unit ecs.service enabled (others" in table.stdout, table.stderr
    limited = fleetops("drift", "--from", str(saved), "-i", str(_inventory(tmp_path)), "--limit", "h1,h3",
                       "--format", "json", timeout=120)  # fmt: skip
    assert limited.rc == 0 and set(limited.json()["hosts"]) == {"h1", "h3"}, limited.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["drift", "--group-by", "rack"], "--group-by: choose from az,ami,kernel,instance_type"),
        (["drift", "--from", "/nonexistent.json"], "/nonexistent.json: no such file"),
        (
            ["scan", "--unit-allowlist", "/nonexistent.yml"],
            "cannot read the unit allow-list /nonexistent.yml",
        ),
    ],
)
def test_cli_usage_errors(args: list[str], needle: str) -> None:
    result = fleetops(*args, timeout=60)
    assert result.rc == 2, result
    assert needle in result.stderr and "Traceback" not in result.stderr


def test_prometheus_gauges_for_units_and_host_info() -> None:
    from prometheus_client import generate_latest

    from fleetops.metrics import build_registry

    r = odd_fleet()
    r["summary"] = {"ok": 4, "unreachable": 0, "failed": 0}
    r["hosts"]["h2"]["findings"] = [
        {"check": "unexpected_unit", "severity": "warning", "summary": "ecs.service ...", "data": {}}
    ]
    text = generate_latest(build_registry(r)).decode()
    assert 'fleetops_unexpected_units{host="h2"} 1.0' in text
    assert 'fleetops_unexpected_units{host="h1"} 0.0' in text
    assert 'fleetops_enabled_units{host="h2"} 3.0' in text
    assert (
        f'fleetops_host_info{{host="h1",kernel="{KERNEL}",os="Debian GNU/Linux 12 (bookworm)"}} 1.0' in text
    )
