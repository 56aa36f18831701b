"""anon_rss_growth: parsers on real /proc captures, and the two-sample rates."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.fleetops.node.plugins.module_utils import procs

from tests.paths import FIXTURES

FIXTURES = FIXTURES / "ucx"
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def _read(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_parse_stat_real_captures() -> None:
    comm, state, flags, start = procs.parse_stat(_read("leaker_stat.txt"))
    assert (comm, state, start) == ("python3", "S", 316917)
    assert not flags & procs.PF_KTHREAD
    comm, _state, flags, _start = procs.parse_stat(_read("kthread_stat.txt"))
    assert comm == "kthreadd" and flags & procs.PF_KTHREAD
    comm, state, _flags, start = procs.parse_stat(_read("odd_comm_stat.txt"))
    assert (comm, state, start) == ("w) (eird 1", "R", 317445)


def test_statm_anonymous_is_what_smaps_rollup_counts() -> None:
    size, resident, shared = procs.parse_statm(_read("leaker_statm.txt"))
    rollup = procs.parse_smaps_rollup(_read("leaker_smaps_rollup.txt"))
    assert (resident - shared) * PAGE_KB == rollup["Anonymous"] == 33472
    assert rollup["Rss"] == 40280 and rollup["Swap"] == 0
    assert size * PAGE_KB == 10963 * 4
    assert procs.parse_statm(_read("kthread_statm.txt")) == (0, 0, 0)


def test_malformed_inputs() -> None:
    with pytest.raises(ValueError, match="no \\(comm\\) field"):
        procs.parse_stat("42 no comm here")
    with pytest.raises(ValueError, match="fields after comm"):
        procs.parse_stat("42 (x) S 1 2")
    with pytest.raises(ValueError):
        procs.parse_statm("12")


def test_cmdline() -> None:
    cmdline = procs.parse_cmdline((FIXTURES / "leaker_cmdline.bin").read_bytes())
    assert cmdline.endswith("worker.py --state /tmp/ucxdev/w3 --leak-mb-per-min 600")
    assert procs.parse_cmdline(b"x" * 1000 + b"\0").endswith("...")


def _proc_tree(tmp_path: Path) -> Path:
    proc = tmp_path / "proc"
    for pid, stat, statm in (
        (5425, "leaker_stat.txt", "leaker_statm.txt"),
        (2, "kthread_stat.txt", "kthread_statm.txt"),
        (5933, "odd_comm_stat.txt", "leaker_statm.txt"),
    ):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "stat").write_text(_read(stat))
        (proc / str(pid) / "statm").write_text(_read(statm))
    (proc / "77").mkdir()  # exited between listdir and read: no files
    (proc / "self").mkdir()
    return proc


def test_sample_reads_stat_and_statm_of_user_processes(tmp_path: Path) -> None:
    facts = procs.sample(str(_proc_tree(tmp_path)), threshold_mb_per_min=100.0)
    assert facts["processes"] == 2 and facts["kernel_threads"] == 1 and facts["unreadable"] == 0
    assert facts["_procs"][5425] == [316917, "python3", 33472, 10070 * PAGE_KB, 10963 * PAGE_KB]
    assert facts["_procs"][5933][1] == "w) (eird 1"
    assert facts["sampled"] is False
    assert procs.evaluate(procs.public(facts)) == []  # one sample: no rates, no findings


def test_a_malformed_stat_is_a_detector_error(tmp_path: Path) -> None:
    proc = _proc_tree(tmp_path)
    (proc / "5425" / "stat").write_text("5425 (python3")
    with pytest.raises(procs.ProcsError, match=r"Failed to parse .*/5425/stat: no \(comm\) field"):
        procs.sample(str(proc))


def _sample(entries: dict[int, list[Any]], threshold: float = 100.0) -> dict[str, Any]:
    return {
        "sampled": False,
        "sample_ms": 1.0,
        "_procs": entries,
        "_threshold": threshold,
        "_proc": "/nonexistent",
    }


def _detail(pid: int, proc: str) -> dict[str, Any]:
    return {"smaps_rollup": {"rss_kb": 1, "anonymous_kb": 409600, "swap_kb": 0}, "map_count": 812,
            "cmdline": "python3 -m vllm", "unit": "vllm.service", "unit_manager": "system"}  # fmt: skip


def test_growth_rates_and_who_gets_the_expensive_read(tmp_path: Path) -> None:
    mib = 1024
    first = _sample({
        10: [100, "leaker", 100 * mib, 150 * mib, 900 * mib],
        11: [101, "steady", 500 * mib, 600 * mib, 900 * mib],
        12: [102, "slow", 10 * mib, 20 * mib, 90 * mib],
        13: [103, "reused", 10 * mib, 20 * mib, 90 * mib],
    })  # fmt: skip
    second = _sample({
        10: [100, "leaker", 170 * mib, 220 * mib, 970 * mib],  # +70 MiB in 10 s: 420 MiB/min, 440.4 MB/min
        11: [101, "steady", 500 * mib + 512, 600 * mib, 900 * mib],
        12: [102, "slow", 19 * mib, 29 * mib, 90 * mib],  # 54 MiB/min (56.6 MB/min): over half the threshold
        13: [999, "reused", 900 * mib, 900 * mib, 990 * mib],  # another process with that PID
        14: [104, "new", 900 * mib, 900 * mib, 990 * mib],
    })  # fmt: skip
    read: list[int] = []

    def detail(pid: int, proc: str) -> dict[str, Any]:
        read.append(pid)
        return _detail(pid, proc)

    facts = procs.add_growth(first, second, 10.0, read=detail, meminfo_path=str(tmp_path / "none"))
    assert read == [10, 12]  # smaps_rollup only where statm grew at >= half the threshold
    assert facts["compared"] == 3 and facts["sampled"] is True and facts["window_seconds"] == 10.0
    leaker, slow = facts["growing"]
    # MB is 10^6 bytes: 70 MiB (73,400,320 bytes) in 10 s is 440.4 MB/min, not "420 MB/min"
    assert leaker["pid"] == 10 and leaker["anon_mb_per_min"] == 440.4 and leaker["rss_mb_per_min"] == 440.4
    assert leaker["vsz_mb_per_min"] == 440.4
    assert leaker["anon_kb"] == [100 * mib, 170 * mib]
    assert slow["anon_mb_per_min"] == 56.6
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:    4300800 kB\n")  # 4,404 MB
    facts = procs.add_growth(first, second, 10.0, read=_detail, meminfo_path=str(meminfo))
    findings = procs.evaluate(facts)
    (finding,) = findings  # the slow one is under the 100 MB/min warning
    assert finding["severity"] == "warning"
    assert finding["data"]["pid"] == 10
    assert finding["data"]["minutes_to_exhaust_available"] == 10.0
    assert finding["summary"] == (
        "pid 10 (leaker) in vllm.service grows anonymous memory at 440.4 MB/min (RSS 440.4 MB/min) over 10s; "
        "now 419 MB anonymous in 812 mappings; MemAvailable gone in ~10 min at this rate"
    )
    (critical,) = procs.evaluate(facts, {"anon_growth_critical_mb_per_min": 440.4})
    assert critical["severity"] == "critical"
    assert (
        procs.evaluate(
            facts, {"anon_growth_warning_mb_per_min": 500.0, "anon_growth_critical_mb_per_min": 900.0}
        )
        == []
    )
    assert list(procs.growing_pids(facts)) == [10]
    assert list(procs.growing_pids(facts, {"anon_growth_warning_mb_per_min": 56.6})) == [10, 12]
    assert list(procs.growing_pids(facts, {"anon_growth_warning_mb_per_min": 56.7})) == [10]
    assert procs.growing_pids(None) == {}


def test_detail_of_a_real_process() -> None:
    detail = procs.read_detail(os.getpid())
    assert detail["smaps_rollup"]["anonymous_kb"] > 0
    assert detail["map_count"] > 10
    assert "pytest" in detail["cmdline"] or "python" in detail["cmdline"]


@pytest.mark.parametrize(
    ("text", "available"),
    [("MemTotal: 100 kB\nMemAvailable:  42 kB\n", 42), ("MemTotal: 100 kB\n", None)],
)
def test_meminfo(text: str, available: int | None) -> None:
    assert procs.parse_meminfo(text).get("MemAvailable") == available


def test_young_processes_and_small_deltas_are_not_rates() -> None:
    mib = 1024
    first = {
        **_sample({
            20: [9500, "warming-up", 1 * mib, 2 * mib, 9 * mib],  # started 5 s before the first sample
            21: [1000, "burst", 10 * mib, 20 * mib, 90 * mib],
            22: [1000, "leak", 10 * mib, 20 * mib, 90 * mib],
        }),
        "_uptime": 100.0,
        "_hz": 100,
    }  # fmt: skip
    second = _sample({
        20: [9500, "warming-up", 60 * mib, 70 * mib, 90 * mib],
        21: [1000, "burst", 10 * mib + 4000, 20 * mib, 90 * mib],  # 4 MB in 0.5 s: 469 MB/min, but noise
        22: [1000, "leak", 20 * mib, 30 * mib, 90 * mib],  # 10 MB in 0.5 s
    })  # fmt: skip
    facts = procs.add_growth(first, second, 0.5, read=_detail, meminfo_path="/nonexistent")
    assert facts["too_young"] == 1 and facts["compared"] == 2
    assert [e["pid"] for e in facts["growing"]] == [22]


# A real leak: touches 64 KiB chunks (bytes filled with "x", heap memory) on a clock, so that its
# anonymous memory grows at exactly argv[1] bytes per second (to within one chunk) from "ready" on.
LEAKER = """
import sys, time
rate, chunk, held = float(sys.argv[1]), 64 * 1024, []
sys.stdout.write("ready\\n")
sys.stdout.flush()
start = time.monotonic()
while True:
    while len(held) * chunk < rate * (time.monotonic() - start):
        held.append(b"x" * chunk)
    time.sleep(0.01)
"""
LEAK_MIB_PER_MIN = 90.0
WINDOW_SECONDS = 7.0  # 10.5 MiB in the window: over MIN_DELTA_KB (8 MiB), so it is a rate


def test_a_real_90_mib_per_min_leak_is_reported_as_94_mb_per_min(monkeypatch: pytest.MonkeyPatch) -> None:
    """The detector's two samples over a real child leaking 90 MiB/min: 94.4 MB/min (MB = 10^6 bytes).

    Under the default 100 MB/min warning it is no finding; with the warning at 50 MB/min (the knob
    fleetops_anon_growth_warning_mb_per_min) it is a warning that says MB/min. The child is seconds old:
    the rule that skips processes under MIN_AGE_SECONDS (tested above) is set to 0 here, nothing else.
    """
    monkeypatch.setattr(procs, "MIN_AGE_SECONDS", 0.0)
    true_mb_per_min = LEAK_MIB_PER_MIN * 1024 * 1024 / 1e6  # 94.37
    child = subprocess.Popen(
        [sys.executable, "-c", LEAKER, str(LEAK_MIB_PER_MIN * 1024 * 1024 / 60.0)], stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        time.sleep(0.5)
        first = procs.sample(threshold_mb_per_min=50.0)
        started = time.monotonic()
        time.sleep(WINDOW_SECONDS)
        second = procs.sample(threshold_mb_per_min=50.0)
        facts = procs.public(procs.add_growth(first, second, time.monotonic() - started))
        assert child.poll() is None, "the leaking child died"
    finally:
        child.kill()
        child.wait()
    (entry,) = [e for e in facts["growing"] if e["pid"] == child.pid]
    rate = entry["anon_mb_per_min"]
    print(f"leak of {LEAK_MIB_PER_MIN:g} MiB/min = {true_mb_per_min:.2f} MB/min; measured {rate} MB/min")
    assert abs(rate - true_mb_per_min) <= 0.10 * true_mb_per_min, entry
    # and it is MB, not MiB labelled MB: nearer 94.37 than 90 (measured 94.4-95.0 with 3 runs on 2 busy cores)
    assert abs(rate - true_mb_per_min) < abs(rate - LEAK_MIB_PER_MIN), entry
    assert [f for f in procs.evaluate(facts) if f["data"]["pid"] == child.pid] == []  # under 100 MB/min
    (finding,) = [
        f
        for f in procs.evaluate(facts, {"anon_growth_warning_mb_per_min": 50.0})
        if f["data"]["pid"] == child.pid
    ]
    assert finding["severity"] == "warning"
    assert f"grows anonymous memory at {procs._num(rate)} MB/min" in finding["summary"], finding["summary"]
    assert finding["data"]["thresholds"]["anon_growth_warning_mb_per_min"] == 50.0
