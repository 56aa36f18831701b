"""`fleetops scan` at scale on real lab hosts: the benchmark, a hung host, Ctrl-C, the transport.

The benchmark runs here at its CI size (10 hosts); `make bench` runs 10, 25 and 50.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetops.ansible.runner import RunnerOptions, run_playbook
from fleetops.scan import (
    NOT_SCANNED_MSG,
    PartialReport,
    ScanOptions,
    build_report,
    exit_code,
    read_partial,
)
from fleetops_lab import Lab
from tests.helpers import FLEETOPS, LAB_ANSWERED, REPO, CliResult, fleetops

HOSTS = 6
HUNG = "lab-03"


# --------------------------------------------------------------------------- no lab needed


def test_interrupted_report_lists_hosts_that_never_answered() -> None:
    from fleetops.ansible.runner import PlaybookRun, TaskResult

    run = PlaybookRun(status="canceled", rc=254, interrupted=True)
    ok = {"findings": [], "facts": {"memcg": {}}, "errors": [], "checks": ["zombie_memcg"]}
    run.tasks["b"] = [TaskResult("b", "ok", "t", "fleetops.node.node_health", ok)]
    report = build_report(run, started=0, finished=1, targeted=["a", "b", "c"])
    assert report["interrupted"] is True
    assert list(report["hosts"]) == ["a", "b", "c"]
    assert report["hosts"]["b"]["status"] == "ok"
    for host in ("a", "c"):
        assert report["hosts"][host] == {
            "status": "not_scanned",
            "msg": NOT_SCANNED_MSG,
            "findings": [],
            "facts": {},
        }
    assert report["summary"]["hosts"] == 3
    assert report["summary"]["not_scanned"] == 2
    assert report["summary"]["ok"] == 1
    assert exit_code(report) == 3


def test_partial_file_is_one_json_line_per_host_and_survives_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "r.json.partial"
    partial = PartialReport(path)
    partial.add("lab-01", {"status": "ok", "findings": [], "facts": {}})
    partial.add("lab-02", {"status": "unreachable", "msg": "x", "findings": [], "facts": {}})
    lines = path.read_text().splitlines()  # flushed per host: readable while the scan runs
    assert json.loads(lines[0])["schema"] == "fleetops.scan.partial/v1"
    with path.open("a") as fh:
        fh.write('{"host": "lab-03", "entr')  # what a killed scan can leave
    assert set(read_partial(path)) == {"lab-01", "lab-02"}
    partial.close(done=False)
    assert path.exists()
    partial.close(done=True)
    assert not path.exists()


def test_connect_timeout_stays_below_the_host_timeout() -> None:
    assert ScanOptions(host_timeout=120).connect_timeout() is None  # ansible.cfg's 10 s
    assert ScanOptions(host_timeout=8).connect_timeout() == 4
    assert ScanOptions(host_timeout=1).connect_timeout() == 1
    assert ScanOptions(host_timeout=0).connect_timeout() is None


# --------------------------------------------------------------------------- the benchmark


@pytest.mark.lab
def test_bench_at_ci_size_prints_its_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """bench/scan_fleet.py at 10 hosts runs both measurements and prints its table.

    The ratio is the benchmark's output, read in the CI log, not asserted here: a timed
    threshold on a shared 2-core machine fails on load, not on a regression (2.4x against
    a 2.5x bar on one CI run). `make bench` reports PASS/MISS against the 5x target at 50 hosts.
    """
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "scan_fleet.py"), "--sizes", "10", "--no-payload",
         "--json", str(out)],
        capture_output=True, text=True, timeout=240, cwd=REPO, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    with capsys.disabled():  # the table, in the CI log even under pytest -q
        print("\n" + proc.stdout.strip())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(
        r"^\s*hosts\s+forks\s+scan s\s+scan h/min\s+base s\s+base h/min\s+ratio", proc.stdout, re.M
    )
    row = json.loads(out.read_text())["rows"][0]
    assert row["hosts"] == 10
    assert row["scan"]["rc"] == 0 and row["baseline"]["rc"] == 0, row
    # The ratio printed is the one measured: both walls come from this run.
    assert row["ratio"] == pytest.approx(row["baseline"]["wall_s"] / row["scan"]["wall_s"]), row


# --------------------------------------------------------------------------- a small fleet


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab()
    lab.up(HOSTS)
    try:
        yield lab
    finally:
        lab.down()


@pytest.mark.lab
def test_pipelining_and_controlpersist_are_in_effect_through_runner(
    lab: Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    opts = RunnerOptions(
        playbook="fleetops.node.scan",
        inventory=[lab.inventory_path()],
        limit="lab-01",
        extravars={"fleetops_checks": ["zombie_memcg"]},
        verbosity=3,
        connect_timeout=7,
        keep_artifacts=True,
    )
    env = {"ANSIBLE_SSH_CONTROL_PATH_DIR": str(tmp_path / "cp")}

    def once() -> list[str]:
        with _environ(env):
            run = run_playbook(opts)
        private = Path(capsys.readouterr().err.split("runner artifacts kept in ", 1)[1].split()[0])
        try:
            stdout = "\n".join(p.read_text() for p in private.glob("artifacts/*/stdout"))
        finally:
            shutil.rmtree(private, ignore_errors=True)
        assert run.results_for("lab-01")[0].status == "ok"
        assert run.results_for("lab-01")[0].result["fleetops_path"] == "runner"  # node_health's fast path
        execs = [ln for ln in stdout.splitlines() if "SSH: EXEC ssh" in ln]
        assert execs, stdout[-2000:]
        for line in execs:
            assert "ControlMaster=auto" in line and "ControlPersist=60s" in line, line
            assert "ConnectTimeout=7" in line, (
                line
            )  # --timeout reaches ssh (nothing in ssh_args overrides it)
        # everything goes down ssh's stdin: no temp dir, no file transfer
        assert not re.search(r"\bPUT\b|sftp|scp", stdout), stdout[-2000:]
        return execs

    # a host that has not the runner yet is sent it (a second exec); then one exec a scan
    assert len(once()) in (1, 2)
    assert len(once()) == 1


def _sshd_pids(lab: Lab, name: str) -> list[int]:
    """The guest's sshd processes, as host PIDs, from the guest's cgroup (seen from this machine)."""
    for procs in Path("/sys/fs/cgroup").glob(
        f"*/{lab.names.cgroup_parent}/{name}/payload/system.slice/ssh.service/cgroup.procs"
    ):
        pids = [int(p) for p in procs.read_text().split()]
        sshd = [p for p in pids if Path(f"/proc/{p}/comm").read_text().strip() == "sshd"]
        if sshd:
            return sshd
    raise AssertionError(f"no sshd found in the cgroups of {name}")


@pytest.mark.lab
def test_hung_host_is_unreachable_after_the_host_timeout_and_the_others_arrive(
    lab: Lab, tmp_path: Path
) -> None:
    """sshd SIGSTOPped: cold, ssh's connect timeout (half the host timeout) makes it unreachable;
    through ansible-playbook behind a live ControlPersist master (a scan moments before), the task timeout
    does. The default transport's direct path shares no connection: it is always cold."""
    host_timeout = 8
    warm, cold = tmp_path / "warm", tmp_path / "cold"
    ansible = ("--transport", "ansible")  # ControlPersist masters are ansible's ssh plugin's
    first = _scan(lab, host_timeout, warm, *ansible)  # leaves ControlPersist masters to every host
    assert first.rc in (0, 1), first.stderr
    pids = _sshd_pids(lab, HUNG)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        # warm first, while the first scan's masters are fresh (a loaded CI machine once let the cold
        # scan run long enough before it that the warm one found no live master to hide the hang)
        outcomes = {
            "warm": _timed_scan(lab, host_timeout, warm, *ansible),
            "cold": _timed_scan(lab, host_timeout, cold, *ansible),
            "default": _timed_scan(lab, host_timeout, tmp_path / "default"),
        }
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    for kind, (result, elapsed) in outcomes.items():
        report = result.json()
        assert result.rc == 3, (kind, result.stderr)
        hung = report["hosts"][HUNG]
        assert hung["status"] == "unreachable", (kind, hung)
        assert re.search("timed out", hung["msg"], re.I), (kind, hung)
        others = {h: e["status"] for h, e in report["hosts"].items() if h != HUNG}
        assert others == {
            f"lab-{i:02d}": LAB_ANSWERED for i in range(1, HOSTS + 1) if f"lab-{i:02d}" != HUNG
        }, kind
        # every other host answered while the hung one was waited for, and the wait was bounded
        assert elapsed < host_timeout + 15, (kind, elapsed)
        assert f"{HUNG}: unreachable" in result.stderr, (kind, result.stderr)
    for kind in ("cold", "default"):
        assert "banner exchange" in outcomes[kind][0].json()["hosts"][HUNG]["msg"], kind
    assert outcomes["warm"][0].json()["hosts"][HUNG]["timed_out"] is True
    assert outcomes["default"][0].json()["transport"] == {"name": "auto", "by_ansible": {}}
    # the host is fine again once sshd runs
    again = _scan(lab, host_timeout, tmp_path / "again", "--limit", HUNG)
    assert again.json()["hosts"][HUNG]["status"] == LAB_ANSWERED, again.stderr


def _scan(lab: Lab, host_timeout: int, control_dir: Path, *extra: str) -> CliResult:
    return fleetops(
        "scan", "-i", str(lab.inventory_path()), "--format", "json", "--host-timeout", str(host_timeout),
        *extra, env={"ANSIBLE_SSH_CONTROL_PATH_DIR": str(control_dir)}, timeout=120,
    )  # fmt: skip


def _timed_scan(lab: Lab, host_timeout: int, control_dir: Path, *extra: str) -> tuple[CliResult, float]:
    started = time.monotonic()
    result = _scan(lab, host_timeout, control_dir, *extra)
    return result, time.monotonic() - started


@pytest.mark.lab
def test_ctrl_c_mid_scan_leaves_a_valid_partial_report(lab: Lab, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    partial = tmp_path / "report.json.partial"
    # One host's sshd is stopped and the host timeout is long: the scan cannot end before the Ctrl-C,
    # however late a loaded controller handles the runner's events (timing alone -- Ctrl-C after the
    # second answer, one host at a time -- twice saw every host done first in CI).
    pids = _sshd_pids(lab, HUNG)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        proc = subprocess.Popen(
            [str(FLEETOPS), "scan", "-i", str(lab.inventory_path()), "--format", "json", "-o", str(out),
             "--host-timeout", "240"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, stdin=subprocess.DEVNULL,
            env={**os.environ, "ANSIBLE_SSH_CONTROL_PATH_DIR": str(tmp_path / "cp")},  # cold: no master hides it
        )  # fmt: skip
        assert proc.stderr is not None
        answered: list[str] = []
        try:
            for line in proc.stderr:
                match = re.match(rf"(lab-\d+): {LAB_ANSWERED}\b", line)  # partial: see tests/helpers.py
                if match:
                    answered.append(match.group(1))
                if len(answered) >= 2:
                    break
            assert len(answered) >= 2, "no progress lines before the scan ended"
            in_progress = read_partial(partial)  # written as hosts answer, before the end
            assert set(answered) <= set(in_progress), (answered, in_progress)
            assert HUNG not in in_progress, in_progress
            proc.send_signal(signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr
    report: dict[str, Any] = json.loads(stdout)  # valid JSON on stdout
    assert report == json.loads(out.read_text())  # and the same report in -o
    assert not partial.exists()  # the final report replaced the partial file
    assert report["interrupted"] is True
    statuses = {h: e["status"] for h, e in report["hosts"].items()}
    assert set(statuses) == {f"lab-{i:02d}" for i in range(1, HOSTS + 1)}, statuses
    assert all(statuses[h] == LAB_ANSWERED for h in answered), statuses
    not_scanned = [h for h, s in statuses.items() if s == "not_scanned"]
    assert HUNG in not_scanned, statuses  # the scan really was cut short: the stopped host never answered
    assert set(statuses.values()) <= {LAB_ANSWERED, "not_scanned"}, statuses
    assert report["summary"]["hosts"] == HOSTS
    assert report["summary"]["not_scanned"] == len(not_scanned)
    # runner was told to stop: no ansible-playbook of this scan is left running
    time.sleep(1)
    assert not _processes_matching(str(lab.inventory_path()), "ansible-playbook")


def _processes_matching(*needles: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                cmd = (
                    Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                )
                if all(n in cmd for n in needles):
                    found.append(int(entry))
    return found


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
