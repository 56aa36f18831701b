"""The Mistral incident on real lab hosts, with the real UCX.

`libucx-cu12==1.22.0` from PyPI (downloaded into /var/cache/fleetops/wheels when missing) is
unpacked into a lab host as pip would; a systemd service runs python3 + ctypes that loads it and
initialises a UCP context under the default configuration (mmap hooks on, unbounded registration
cache), and prints UCX's own view of that configuration. The scan must find it with those values,
its unit and its version; `fleetops remediate set-env` must put UCX_MEM_MMAP_HOOK_MODE=none into
its environment through a drop-in and a restart, after which the scan no longer reports it. A
process that maps and touches anonymous memory at a known rate must be measured within 20%; a
steady one must not be reported.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fleetops_lab import Lab
from fleetops_lab.host_faults import (
    UCX_UNFIXED_VERSION,
    ensure_ucx_wheel,
    install_worker_service,
    remove_worker_service,
    ucx_libdir,
    worker_pid,
    worker_ucx_config,
)
from tests.helpers import CliResult, fleetops

pytestmark = pytest.mark.lab
SICK, HEALTHY = "lab-01", "lab-02"
HOOK, RCACHE = "UCX_MEM_MMAP_HOOK_MODE", "UCX_RCACHE_MAX_UNRELEASED"
DROP_IN = "/etc/systemd/system/ucx-worker.service.d/50-fleetops-env.conf"
LEAK_MB_PER_MIN = 300.0
WORKERS = ("ucx-worker", "leaker", "steady", "envcheck", "ucx-old")


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    ensure_ucx_wheel()  # from nothing: pip downloads them into the cache the first time
    ensure_ucx_wheel(UCX_UNFIXED_VERSION)
    lab = Lab()
    lab.up(2)
    try:
        yield lab
    finally:
        for name in WORKERS:
            remove_worker_service(lab, SICK, name=name)
        lab.down()


def _scan(lab: Lab, *extra: str) -> dict[str, Any]:
    result = fleetops("scan", "-i", str(lab.inventory_path()), "--format", "json", "-q", *extra)
    assert "Traceback" not in result.stderr, result.stderr
    report: dict[str, Any] = result.json()
    assert report["hosts"][SICK]["errors"] == [], report["hosts"][SICK]["errors"]
    return report


def _findings(report: dict[str, Any], host: str, check: str) -> list[dict[str, Any]]:
    return [f for f in report["hosts"][host]["findings"] if f["check"] == check]


def _ucx_process(report: dict[str, Any], pid: int) -> dict[str, Any]:
    (entry,) = [p for p in report["hosts"][SICK]["facts"]["ucx"]["processes"] if p["pid"] == pid]
    return entry


def _set_env(lab: Lab, *args: str) -> CliResult:
    return fleetops(
        "remediate", "set-env", "--unit", "ucx-worker", "-i", str(lab.inventory_path()), "--limit", SICK,
        "--format", "json", "--show-values", *args,
    )  # fmt: skip


def _file_state(lab: Lab, path: str) -> str:
    return lab.run(SICK, f"stat -c '%a %U %n' {path} {path.rsplit('/', 1)[0]} 2>&1; cat {path} 2>&1").stdout


def test_real_ucx_service_found_then_fixed_with_set_env(lab: Lab) -> None:
    install_worker_service(lab, SICK)
    pid = worker_pid(lab, SICK)
    own_view = worker_ucx_config(lab, SICK)
    assert (own_view[HOOK], own_view[RCACHE]) == ("bistro", "inf")  # what UCX 1.22 itself uses

    report = _scan(lab)
    entry = _ucx_process(report, pid)
    assert entry["unit"] == "ucx-worker.service" and entry["unit_manager"] == "system"
    assert entry["version"] == "1.22.0"
    assert entry["version_source"] == f"pkg-config file {ucx_libdir('1.22.0')}/pkgconfig/ucx.pc"
    assert entry["libdir"] == ucx_libdir("1.22.0")
    # the detector's effective values are the ones UCX itself runs with
    assert {name: v["value"] for name, v in entry["variables"].items()} == {
        HOOK: own_view[HOOK],
        RCACHE: own_view[RCACHE],
    }
    assert entry["variables"][HOOK]["source"] == "default"
    (finding,) = [f for f in _findings(report, SICK, "ucx_mmap_hooks") if f["data"]["pid"] == pid]
    # UCX 1.22 has the upstream fix (openucx/ucx#11248): the old leaking setup is only info there
    assert finding["severity"] == "info"
    assert finding["data"]["fixed_upstream"] is True
    for part in (f"pid {pid} (python3) in ucx-worker.service", "UCX 1.22.0", "UCX_MEM_MMAP_HOOK_MODE=bistro"):
        assert part in finding["summary"], finding["summary"]
    assert report["hosts"][HEALTHY]["facts"]["ucx"]["processes"] == []

    # A dry run predicts the drop-in and the restart, and changes nothing.
    dry = _set_env(lab, "--env", f"{HOOK}=none", "--restart")
    assert dry.rc == 0, dry.stderr
    outcome = dry.json()["batches"][0]["results"][SICK]
    assert outcome["changed"] is True
    assert outcome["result"]["actions"] == [f"write {DROP_IN}", "daemon-reload", "try-restart"]
    assert 'Environment="UCX_MEM_MMAP_HOOK_MODE=none"' in outcome["result"]["diff"]["after"]
    assert outcome["result"]["diff"]["before"] == ""
    assert "No such file" in _file_state(lab, DROP_IN)
    assert worker_pid(lab, SICK) == pid

    # The drop-in alone: systemd knows, the running process does not (restart pending).
    only_file = _set_env(lab, "--env", f"{HOOK}=none", "--apply")
    assert only_file.rc == 0, only_file.stderr
    assert worker_pid(lab, SICK) == pid
    entry = _ucx_process(_scan(lab), pid)
    assert entry["restart_pending"] is True
    assert entry["variables"][HOOK] == {
        "value": "bistro",
        "source": "default",
        "environ": None,
        "unit": "none",
    }

    # With the restart (what the rollout staggers) the new process runs with hooks off.
    fixed = _set_env(lab, "--env", f"{HOOK}=none", "--restart", "--apply")
    assert fixed.rc == 0, fixed.stderr
    new_pid = worker_pid(lab, SICK)
    assert new_pid != pid
    assert worker_ucx_config(lab, SICK)[HOOK] == "none"  # UCX itself now runs without the hooks
    state = _file_state(lab, DROP_IN)
    assert f"644 root {DROP_IN}" in state and "755 root /etc/systemd/system/ucx-worker.service.d" in state
    assert 'Environment="UCX_MEM_MMAP_HOOK_MODE=none"' in state
    report = _scan(lab)
    entry = _ucx_process(report, new_pid)
    assert entry["variables"][HOOK] == {"value": "none", "source": "unit", "environ": "none", "unit": "none"}
    assert entry["hooks_on"] is False and entry["restart_pending"] is False
    assert _findings(report, SICK, "ucx_mmap_hooks") == []

    # Once more: nothing to do, no restart.
    again = _set_env(lab, "--env", f"{HOOK}=none", "--restart", "--apply")
    assert again.rc == 0, again.stderr
    assert again.json()["summary"]["changed"] == 0
    assert worker_pid(lab, SICK) == new_pid


def test_values_reach_the_process_exactly(lab: Lab) -> None:
    """systemd reads the drop-in's quoting back to exactly the value given (no specifier, escape, $)."""
    install_worker_service(lab, SICK, name="envcheck", ucx=False)
    tricky = 'it\'s "quoted" back\\slash 100% $HOME ${PATH} %n `id` ünï'
    result = fleetops(
        "remediate", "set-env", "--unit", "envcheck", "--env", f"TRICKY={tricky}", "--env", "EMPTY=",
        "--restart", "--apply", "-i", str(lab.inventory_path()), "--limit", SICK, "--format", "json",
    )  # fmt: skip
    assert result.rc == 0, result.stderr
    pid = worker_pid(lab, SICK, name="envcheck")
    environ = lab.run(SICK, f"cat /proc/{pid}/environ", check=True).stdout.split("\0")
    assert f"TRICKY={tricky}" in environ
    assert "EMPTY=" in environ


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--unit", "ucx-worker", "--env", "9BAD=1"], "'9BAD' is not a valid variable name"),
        (["--unit", "ucx-worker", "--env", "A=two\nlines"], "the value of A contains a newline"),
        (["--unit", "ucx-worker", "--env", "A=nul\x01"], "the value of A contains the control character"),
        (["--unit", "no-such-service-here", "--env", "A=1"], "no such unit on this host"),
        (["--unit", "ucx;reboot", "--env", "A=1"], "is not a valid systemd unit name"),
        (
            ["--unit", "ucx-worker", "--env", "A=1", "--drop-in", "../../evil.conf"],
            "must be a plain file name",
        ),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(lab: Lab, args: list[str], needle: str) -> None:
    snapshot = "find /etc/systemd/system -type f -printf '%p %m %s\\n' | sort | md5sum"
    before = lab.run(SICK, snapshot, check=True).stdout
    result = fleetops(
        "remediate", "set-env", *args, "--restart", "--apply", "-i", str(lab.inventory_path()), "--limit", SICK,
        "--format", "json",
    )  # fmt: skip
    if needle == "no such unit on this host":  # what only the host knows: its batch fails there
        assert result.rc == 3, result.stderr
        outcome = result.json()["batches"][0]["results"][SICK]
        assert outcome["status"] == "failed"
        assert needle in outcome["msg"]
    else:  # checked on the controller as the module checks it, before any batch: exit 2, one line
        assert result.rc == 2 and needle in result.stderr and result.stdout == "", result.stderr
    assert lab.run(SICK, snapshot, check=True).stdout == before


@pytest.mark.exclusive  # a rate measured within 20%: nothing else may compete for the CPU
def test_anon_rss_growth_measures_a_real_leak(lab: Lab) -> None:
    # The leaker also runs UCX: the UCX finding must carry the growth and still be info on 1.22.
    install_worker_service(lab, SICK, name="leaker", leak_mb_per_min=LEAK_MB_PER_MIN)
    install_worker_service(lab, SICK, name="steady", ucx=False)
    leaker, steady = worker_pid(lab, SICK, name="leaker"), worker_pid(lab, SICK, name="steady")
    time.sleep(11)  # processes younger than 10 s at the first sample are warming up, not compared
    report = _scan(lab, "--sample-seconds", "15")
    facts = report["hosts"][SICK]["facts"]["anon_rss"]
    assert facts["sampled"] is True and facts["compared"] > 5
    growing = {e["pid"]: e for e in facts["growing"]}
    assert steady not in growing
    entry = growing[leaker]
    assert abs(entry["anon_mb_per_min"] - LEAK_MB_PER_MIN) <= 0.2 * LEAK_MB_PER_MIN, entry
    assert entry["unit"] == "leaker.service"
    assert entry["smaps_rollup"]["anonymous_kb"] >= entry["anon_kb"][1] * 0.9
    assert entry["map_count"] > 100  # every 1 MiB chunk is a mapping of its own
    (finding,) = _findings(report, SICK, "anon_rss_growth")
    assert finding["data"]["pid"] == leaker
    assert finding["severity"] == "warning"
    assert f"pid {leaker} (python3) in leaker.service grows anonymous memory at" in finding["summary"]
    (hooks,) = [f for f in _findings(report, SICK, "ucx_mmap_hooks") if f["data"]["pid"] == leaker]
    assert hooks["severity"] == "info"  # 1.22: growing, but not from the hooks
    assert hooks["data"]["growth"]["anon_mb_per_min"] == entry["anon_mb_per_min"]
    print(f"leak measured at {entry['anon_mb_per_min']} MB/min (true rate {LEAK_MB_PER_MIN:g})")


def test_fix_turns_the_hooks_off_on_a_ucx_without_the_upstream_fix(lab: Lab) -> None:
    """UCX 1.19 (libucx-cu12==1.19.0) with the default setup: a warning, and what `fix` acts on."""
    for name in ("leaker", "steady"):
        remove_worker_service(lab, SICK, name=name)
    libdir = ucx_libdir(UCX_UNFIXED_VERSION)
    install_worker_service(lab, SICK, name="ucx-old", ucx_version=UCX_UNFIXED_VERSION)
    # no file names the version any more: the real ucx_info beside the library must tell it
    site = libdir.rsplit("/libucx/lib", 1)[0]
    lab.run(
        SICK, f"rm -rf {libdir}/pkgconfig {site}/libucx/VERSION {site}/libucx_cu12-*.dist-info", check=True
    )
    pid = worker_pid(lab, SICK, name="ucx-old")
    own_view = worker_ucx_config(lab, SICK, name="ucx-old")
    assert (own_view[HOOK], own_view[RCACHE]) == ("bistro", "inf")
    report = _scan(lab)
    entry = _ucx_process(report, pid)
    assert entry["version"] == "1.19.0"
    assert entry["version_source"] == f"ucx_info -v ({site}/libucx/bin/ucx_info)"
    (finding,) = _findings(report, SICK, "ucx_mmap_hooks")
    assert finding["severity"] == "warning" and finding["data"]["pid"] == pid
    assert (
        "runs UCX 1.19.0 with mmap hooks on (UCX_MEM_MMAP_HOOK_MODE=bistro, UCX default)"
        in finding["summary"]
    )
    assert "the setup that leaks anonymous memory on UCX < 1.21" in finding["summary"]

    inventory = str(lab.inventory_path())
    dry = fleetops(
        "remediate", "fix", "-i", inventory, "--sample-seconds", "2", "--ucx-fix", "rcache-bound", "--format", "json",
    )  # fmt: skip
    assert dry.rc == 0, dry.stderr
    assert dry.json()["plan"]["batches"] == [[SICK]], dry.stdout
    outcome = dry.json()["batches"][0]["results"][SICK]
    assert outcome["changed"] is True
    assert '"env_after": {"UCX_RCACHE_MAX_UNRELEASED": "1024"}' in json.dumps(outcome), outcome
    assert worker_pid(lab, SICK, name="ucx-old") == pid
    assert "No such file" in _file_state(lab, "/etc/systemd/system/ucx-old.service.d/50-fleetops-env.conf")

    fixed = fleetops(
        "remediate", "fix", "-i", inventory, "--sample-seconds", "2", "--ucx-fix", "hooks-off", "--apply",
        "--format", "json",
    )  # fmt: skip
    assert fixed.rc == 0, fixed.stderr + fixed.stdout
    rollout = fixed.json()
    assert rollout["summary"]["changed"] == 1, rollout
    outcome = rollout["batches"][0]["results"][SICK]
    assert '"env_after": {"UCX_MEM_MMAP_HOOK_MODE": "none"}' in json.dumps(outcome), outcome
    new_pid = worker_pid(lab, SICK, name="ucx-old")
    assert new_pid != pid
    assert worker_ucx_config(lab, SICK, name="ucx-old")[HOOK] == "none"
    report = _scan(lab)
    assert _ucx_process(report, new_pid)["hooks_on"] is False
    assert _findings(report, SICK, "ucx_mmap_hooks") == []
    again = fleetops(
        "remediate", "fix", "-i", inventory, "--sample-seconds", "2", "--ucx-fix", "hooks-off", "--apply",
        "--format", "json",
    )  # fmt: skip
    assert again.rc == 0, again.stderr
    assert again.json()["summary"]["changed"] == 0
