"""fleetops.node.node_health: the detector registry in-process, and the module end to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.fleetops.node.plugins.module_utils import memcg
from ansible_collections.fleetops.node.plugins.modules import node_health

from tests.helpers import ansible_doc, run_module

ANSIBLE = Path(sys.executable).with_name("ansible")
PY39 = Path.home() / ".pyenv/versions/3.9.18/bin/python3"
MEMCG_KEYS = {
    "cgroup_version",
    "scope",
    "total",
    "live",
    "zombies",
    "id_used",
    "id_headroom",
    "id_headroom_pct",
    "id_headroom_basis",
    "basis",
    "scope_reason",
    "hierarchy",
    "reason",
}


def _run(argv: list[str]) -> tuple[int, str, str]:
    """What AnsibleModule.run_command does, for in-process runs of run_checks()."""
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def params(**overrides: Any) -> dict[str, Any]:
    """The module's defaults (its argument_spec, the one place they are defined), plus ``overrides``."""
    base: dict[str, Any] = dict(node_health.DEFAULTS, _run=_run)
    base.update(overrides)
    return base


# ---------------------------------------------------------------------------------------------
# In-process
# ---------------------------------------------------------------------------------------------


def test_registry_matches_documented_choices() -> None:
    import yaml

    doc = yaml.safe_load(node_health.DOCUMENTATION)
    assert doc["options"]["checks"]["choices"] == list(node_health.DETECTORS)
    assert doc["attributes"]["check_mode"]["support"] == "full"
    assert doc["attributes"]["diff_mode"]["support"] == "none"
    assert doc["attributes"]["platform"]["platforms"] == "posix"
    assert yaml.safe_load(node_health.RETURN)
    assert yaml.safe_load(node_health.EXAMPLES)


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({}, None),
        ({"zombie_warning": 20000}, None),
        (
            {"zombie_warning": 20001},
            "zombie_warning (20001) must not be greater than zombie_critical (20000)",
        ),
        ({"zombie_warning": -1}, "zombie_warning must not be negative, got -1"),
        ({"sample_seconds": -0.5}, "sample_seconds must not be negative, got -0.5"),
        ({"headroom_critical_pct": 100.5}, "headroom_critical_pct must be at most 100, got 100.5"),
        (
            {"anon_growth_warning_mb_per_min": -1.0},
            "anon_growth_warning_mb_per_min must not be negative, got -1.0",
        ),
        (
            {"anon_growth_warning_mb_per_min": 500.0, "anon_growth_critical_mb_per_min": 400.0},
            "anon_growth_warning_mb_per_min (500.0) must not be greater than anon_growth_critical_mb_per_min (400.0)",
        ),
    ],
)
def test_validate(overrides: dict[str, Any], problem: str | None) -> None:
    assert node_health._validate(params(**overrides)) == problem


def test_run_checks_on_this_host() -> None:
    result = node_health.run_checks(params())
    assert set(result) == {"facts", "findings", "errors", "checks", "coverage", "duration_ms"}
    assert list(result["coverage"]) == result["checks"]
    assert result["checks"] == [
        "zombie_memcg",
        "crashloop_unit",
        "crashloop_container",
        "anon_rss_growth",
        "ucx_mmap_hooks",
        "ec2_scheduled_event",
        "unexpected_unit",
        "ena_resets",
        "cpu_starvation",
        "gpu_health",
    ]
    assert result["errors"] == []
    assert set(result["facts"]["memcg"]) == MEMCG_KEYS
    # private per-process samples never leave the module
    assert not [k for facts in result["facts"].values() for k in facts if k.startswith("_")]
    assert result["facts"]["anon_rss"]["sampled"] is False
    assert result["facts"]["ucx"]["processes_scanned"] > 0
    assert result["duration_ms"] > 0


def test_a_failing_detector_becomes_an_error_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(_params: dict[str, Any]) -> dict[str, Any]:
        return memcg.parse_proc_cgroups("#subsys_name\thierarchy\tnum_cgroups\tenabled\nmemory\t4\tx\t1\n")

    monkeypatch.setitem(
        node_health.DETECTORS, "zombie_memcg", node_health.DETECTORS["zombie_memcg"]._replace(sample=broken)
    )
    result = node_health.run_checks(params(checks=["zombie_memcg", "zombie_memcg"]))
    assert result["checks"] == ["zombie_memcg"]
    assert list(result["facts"]) == ["host"]  # what the host is: always there, no detector
    assert result["findings"] == []
    assert result["errors"] == [
        {
            "check": "zombie_memcg",
            "msg": "Failed to parse /proc/cgroups: line 2: num_cgroups 'x' is not an integer",
        }
    ]


def test_sampling_reports_growth(monkeypatch: pytest.MonkeyPatch) -> None:
    totals = iter([5000, 5100])

    def fake(_params: dict[str, Any]) -> dict[str, Any]:
        total = next(totals)
        free, pct = memcg.id_headroom(40)
        return {
            "cgroup_version": 1, "scope": "host", "total": total, "live": 40, "zombies": total - 40,
            "id_used": 40, "id_headroom": free, "id_headroom_pct": pct,
            "id_headroom_basis": memcg.ID_BASIS_LIVE_NO_SWAP, "basis": memcg.BASIS_V1, "scope_reason": "test",
            "hierarchy": "/sys/fs/cgroup/memory", "reason": None,
        }  # fmt: skip

    monkeypatch.setitem(
        node_health.DETECTORS, "zombie_memcg", node_health.DETECTORS["zombie_memcg"]._replace(sample=fake)
    )
    result = node_health.run_checks(params(sample_seconds=0.2))
    growth = result["facts"]["memcg"]["growth"]
    assert 0.2 <= growth["seconds"] < 1.0
    assert growth["zombies_per_min"] == pytest.approx(100 * 60 / growth["seconds"], rel=0.01)
    (finding,) = [f for f in result["findings"] if f["check"] == "zombie_memcg"]
    assert finding["severity"] == "warning"
    assert "zombies +" in finding["summary"]
    assert result["duration_ms"] >= 200


# ---------------------------------------------------------------------------------------------
# End to end: ansible runs the module on this machine
# ---------------------------------------------------------------------------------------------


def run_adhoc(
    tmp_path: Path, args: str, *extra: str, python: str | None = None
) -> tuple[int, dict[str, Any]]:
    """``ansible localhost -m fleetops.node.node_health``; the result as the tree callback saved it."""
    return run_module(tmp_path, "fleetops.node.node_health", args, *extra, python=python)


def test_module_end_to_end(tmp_path: Path) -> None:
    rc, result = run_adhoc(tmp_path, "checks=zombie_memcg sample_seconds=0.3")
    assert rc == 0, result
    assert result["changed"] is False
    assert result["checks"] == ["zombie_memcg"]
    assert result["errors"] == []
    assert isinstance(result["findings"], list)
    assert result["duration_ms"] >= 300
    facts = result["facts"]["memcg"]
    assert set(facts) == MEMCG_KEYS | {"growth"}
    assert set(facts["growth"]) == {"seconds", "total_per_min", "live_per_min", "zombies_per_min"}
    if facts["cgroup_version"] == 1 and facts["scope"] == "host":
        assert facts["hierarchy"] == "/sys/fs/cgroup/memory"
        assert facts["zombies"] == max(0, facts["total"] - facts["live"])
    if facts["cgroup_version"] is not None:
        assert facts["id_used"] in (facts["total"], min(facts["live"] or 0, facts["total"]))
        assert facts["id_headroom"] == max(0, 65535 - facts["id_used"])
        assert facts["id_headroom_basis"].startswith(("live memcgs: ", "every memcg, dying included: "))
    for finding in result["findings"]:
        assert set(finding) == {"check", "severity", "summary", "data"}


def test_module_check_mode(tmp_path: Path) -> None:
    rc, result = run_adhoc(tmp_path, "", "--check")
    assert rc == 0, result
    assert result["changed"] is False
    assert "memcg" in result["facts"]


def test_module_rejects_bad_thresholds(tmp_path: Path) -> None:
    rc, result = run_adhoc(tmp_path, "zombie_warning=5000 zombie_critical=100")
    assert rc != 0
    assert result["msg"] == (
        "Failed to validate node_health options: zombie_warning (5000) must not be greater than zombie_critical (100)"
    )


def test_module_rejects_unknown_check(tmp_path: Path) -> None:
    rc, result = run_adhoc(tmp_path, "checks=nope")
    assert rc != 0
    assert "value of checks must be one or more of: zombie_memcg" in result["msg"]


@pytest.mark.skipif(not PY39.exists(), reason="needs Python 3.9 (pyenv 3.9.18) to prove the target floor")
def test_module_runs_on_python_3_9(tmp_path: Path) -> None:
    rc, result = run_adhoc(tmp_path, "", python=str(PY39))
    assert rc == 0, result
    assert result["errors"] == []
    assert set(result["facts"]["memcg"]) == MEMCG_KEYS


def test_ansible_doc_renders_every_option_with_the_argument_specs_default() -> None:
    """The docs repeat each default as text; they must say what the argument_spec (the one definition) says."""
    doc = ansible_doc("fleetops.node.node_health")
    assert set(doc["options"]) == set(node_health.ARGUMENT_SPEC)
    for name, spec in node_health.ARGUMENT_SPEC.items():
        option = doc["options"][name]
        assert option["type"] == spec["type"], name
        assert option.get("default") == spec.get("default"), name
        assert option.get("choices") == spec.get("choices"), name


def test_a_failed_second_sample_keeps_the_first(monkeypatch: pytest.MonkeyPatch) -> None:
    real = node_health.DETECTORS["zombie_memcg"]
    calls = iter(["ok", "broken"])

    def flaky(_params: dict[str, Any]) -> dict[str, Any]:
        if next(calls) == "broken":
            raise memcg.MemcgError("read", "/proc/cgroups", "Permission denied")
        return dict(real.sample(_params))

    monkeypatch.setitem(node_health.DETECTORS, "zombie_memcg", real._replace(sample=flaky))
    result = node_health.run_checks(params(sample_seconds=0.05))
    assert set(result["facts"]["memcg"]) == MEMCG_KEYS  # the first sample, without growth
    assert result["errors"] == [
        {"check": "zombie_memcg", "msg": "Failed to read /proc/cgroups: Permission denied"}
    ]


def test_ucx_findings_know_what_anon_rss_growth_saw(monkeypatch: pytest.MonkeyPatch) -> None:
    """A UCX < 1.21 process with the leaking setup is critical when the same scan sees it grow."""
    entry = {
        "pid": 4242, "comm": "python3", "unit": "vllm.service", "unit_manager": "system", "fixable_unit": True,
        "version": "1.19.0", "restart_pending": False,
        "variables": {
            "UCX_MEM_MMAP_HOOK_MODE": {"value": "bistro", "source": "default", "environ": None, "unit": None},
            "UCX_RCACHE_MAX_UNRELEASED": {"value": "inf", "source": "default", "environ": None, "unit": None},
        },
    }  # fmt: skip
    anon = iter([
        {4242: [7, "python3", 1024, 2048, 4096], 1: [1, "init", 10, 10, 10]},
        {4242: [7, "python3", 1024 + 80 * 1024, 2048 + 80 * 1024, 4096], 1: [1, "init", 10, 10, 10]},
    ])  # fmt: skip

    def anon_sample(params: dict[str, Any]) -> dict[str, Any]:
        return {
            "sampled": False,
            "_procs": next(anon),
            "_threshold": params["anon_growth_warning_mb_per_min"],
        }

    no_detail = {"smaps_rollup": None, "map_count": None, "cmdline": None, "unit": None, "unit_manager": None}
    from ansible_collections.fleetops.node.plugins.module_utils import procs

    monkeypatch.setattr(procs, "read_detail", lambda pid, proc: dict(no_detail))
    monkeypatch.setitem(
        node_health.DETECTORS,
        "anon_rss_growth",
        node_health.DETECTORS["anon_rss_growth"]._replace(
            sample=anon_sample,
            add_growth=lambda first, second, seconds: procs.add_growth(
                first, second, seconds, read=procs.read_detail
            ),
        ),
    )
    monkeypatch.setitem(
        node_health.DETECTORS,
        "ucx_mmap_hooks",
        node_health.DETECTORS["ucx_mmap_hooks"]._replace(sample=lambda params: {"processes": [dict(entry)]}),
    )
    one = node_health.run_checks(params(checks=["anon_rss_growth", "ucx_mmap_hooks"]))
    assert [f["severity"] for f in one["findings"]] == ["warning"]  # one sample: growth unknown
    anon = iter([
        {4242: [7, "python3", 1024, 2048, 4096]},
        {4242: [7, "python3", 1024 + 80 * 1024, 2048 + 80 * 1024, 4096]},
    ])  # fmt: skip
    two = node_health.run_checks(params(checks=["anon_rss_growth", "ucx_mmap_hooks"], sample_seconds=0.2))
    growth, hooks = two["findings"]
    assert growth["check"] == "anon_rss_growth" and growth["data"]["pid"] == 4242
    assert hooks["check"] == "ucx_mmap_hooks" and hooks["severity"] == "critical"
    assert hooks["data"]["growth"]["anon_mb_per_min"] == growth["data"]["anon_mb_per_min"]
