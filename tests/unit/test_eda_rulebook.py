"""extensions/eda/rulebooks/fleetops_alerts.yml under the real ansible-rulebook (Java 17 and its Drools
engine), fed over HTTP as Alertmanager feeds it, with a STAND-IN `fleetops` first on PATH: a script
written by this test, not the real CLI, that records its argv and exits 4 ("locked") when told to. What
the real passes do with the alert is tests/integration/test_eda_lab.py's (real hosts, real passes, the
audit log); this test holds the rulebook to its rules:

- a burst of 1,000 alerts for 3 hosts (repeats, resolved ones, other alerts, unknown hosts) runs one pass
  per host (once_within per host and rule), each `remediate auto --apply -l HOST --cause ALERT`;
- a pass that exits 4 (another pass holds the lock) is run again (bounded), not dropped;
- a label that holds a template or shell text reaches neither: nothing runs it, the cause is plain.

ansible-rulebook is a test dependency (pyproject's test extras); Java is Debian's openjdk-17-jre-headless
(tools/debian-deps.sh --ci). Without either the test skips, except under CI=true, where it fails.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.eda import BIN, alert, burst, free_port, need_rulebook, start_rulebook, stop, wait_listening
from tests.paths import REPO

HOSTS = ["lab-01", "lab-02", "lab-03"]
SOFTWARE = ["FleetopsUnitsCrashLooping", "FleetopsUcxLeakRisk", "FleetopsZombieMemcgs"]

STANDIN = """#!{python}
# A stand-in for `fleetops` written by tests/unit/test_eda_rulebook.py (NOT the real CLI): it records its
# argv and exits 4 (locked) the first time it is called for a host named in STANDIN_LOCKED_ONCE.
import json, os, sys, time
record = os.environ["STANDIN_RECORD"]
host = sys.argv[sys.argv.index("-l") + 1] if "-l" in sys.argv else ""
seen = [json.loads(line)["argv"] for line in open(record)] if os.path.exists(record) else []
locked = host in os.environ.get("STANDIN_LOCKED_ONCE", "").split() and not any(host in a for a in seen)
with open(record, "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "at": time.time(), "rc": 4 if locked else 0}}) + "\\n")
time.sleep(0.3)
if locked:
    sys.stderr.write("another 'fleetops remediate auto' pass is running\\n")
    sys.exit(4)
print(json.dumps({{"schema": "fleetops.auto/v1", "apply": True, "decisions": [{{"host": host, "status": "clean",
                  "reason": "no finding"}}], "actions": [], "exit_code": 0}}))
"""


def calls(record: Path) -> list[dict[str, Any]]:
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines()]


def settle(record: Path, count: int, seconds: float, quiet: float = 8.0) -> list[dict[str, Any]]:
    """The calls once ``count`` were made and ``quiet`` seconds passed without another (or ``seconds``)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end and len(calls(record)) < count:
        time.sleep(0.5)
    time.sleep(quiet)
    return calls(record)


@pytest.fixture()
def standin(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "fleetops"
    script.write_text(STANDIN.format(python=sys.executable))
    script.chmod(0o755)
    record = tmp_path / "calls.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(PATH=f"{bindir}:{BIN}:{os.environ.get('PATH', '')}", STANDIN_RECORD=str(record),
               ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")  # fmt: skip
    yield record, env


def test_a_burst_of_1000_alerts_for_3_hosts_runs_one_pass_per_host_and_a_locked_pass_is_retried(
    tmp_path: Path, standin: tuple[Path, dict[str, str]]
) -> None:
    rulebook = need_rulebook()
    record, env = standin
    env["STANDIN_LOCKED_ONCE"] = "lab-02"
    inventory = tmp_path / "fleet.yml"
    inventory.write_text("all:\n  hosts:\n" + "".join(f"    {h}: {{}}\n" for h in HOSTS))
    port = free_port()
    log = tmp_path / "rulebook.log"
    variables = {"fleetops_eda_inventory": str(inventory), "fleetops_eda_port": port,
                 "fleetops_eda_locked_retries": 3, "fleetops_eda_locked_delay": 1,
                 "fleetops_eda_sample_seconds": 0}  # fmt: skip
    marker = tmp_path / "templated"
    proc = start_rulebook(rulebook, tmp_path, variables, env, log)
    try:
        wait_listening(port, proc, log)
        # lab-01's first alert carries a template and shell text in a label: it starts lab-01's pass
        hostile = alert(
            "lab-01", "FleetopsUnitsCrashLooping", 0, unit=f"{{{{ lookup('pipe', 'touch {marker}') }}}}$(id)"
        )
        assert burst(port, [hostile]) == [202]
        alerts = [
            alert(HOSTS[i % 3], SOFTWARE[i % len(SOFTWARE)], i, status="resolved" if i % 7 == 0 else "firing")
            for i in range(1, 940)
        ]
        alerts += [alert(HOSTS[i % 3], "FleetopsScanStale", i) for i in range(940, 970)]  # no rule acts on it
        alerts += [
            alert(f"gpu-{i}", "FleetopsUnitsCrashLooping", i) for i in range(970, 1000)
        ]  # unknown hosts
        assert len(alerts) == 999
        # half one alert a request, half ten: the payloads that name an unknown host (all of them: 400)
        payloads = [[a] for a in alerts[:500]] + [alerts[i : i + 10] for i in range(500, len(alerts), 10)]
        unknown = [sum(a["labels"]["host"] not in HOSTS for a in p) for p in payloads]
        started = time.monotonic()
        answers = burst(port, alerts[:500]) + burst(port, alerts[500:], per_post=10)
        posted_s = time.monotonic() - started
        assert answers == [400 if n == len(p) else 202 for n, p in zip(unknown, payloads, strict=True)]
        made = settle(record, 4, seconds=120)
    finally:
        stop(proc)
    text = log.read_text()
    assert len(made) == 4, (made, text[-4000:])
    by_host: dict[str, list[dict[str, Any]]] = {}
    for call in made:
        argv = call["argv"]
        assert argv[:3] == ["remediate", "auto", "--format"] and "--apply" in argv, argv
        by_host.setdefault(argv[argv.index("-l") + 1], []).append(call)
    assert {h: [c["rc"] for c in cs] for h, cs in by_host.items()} == {
        "lab-01": [0],
        "lab-02": [4, 0],
        "lab-03": [0],
    }
    retry = by_host["lab-02"]
    assert retry[1]["at"] - retry[0]["at"] >= 1.0  # fleetops_eda_locked_delay
    assert retry[0]["argv"] == retry[1]["argv"]  # the same pass, the same cause
    for host, host_calls in by_host.items():
        argv = host_calls[-1]["argv"]
        cause = argv[argv.index("--cause") + 1]
        assert cause.startswith("alertmanager fleetops-eda: Fleetops") and f" on {host} fingerprint " in cause
        assert (
            argv[argv.index("-i") + 1] == str(inventory) and argv[argv.index("--sample-seconds") + 1] == "0"
        )
    lab01 = by_host["lab-01"][0]["argv"]
    cause = lab01[lab01.index("--cause") + 1]
    assert (
        "fingerprint 0000000000000000" in cause and "?? lookup??pipe?, ?touch " in cause and "{" not in cause
    )
    assert not marker.exists()
    # the source's one line per payload that named an unknown host
    dropped = [
        line for line in text.splitlines() if "fleetops.node.alertmanager:" in line and "dropped" in line
    ]
    assert len(dropped) == sum(1 for n in unknown if n), dropped[:5]
    print(f"1,000 alerts posted in {posted_s:.2f} s; {len(made)} calls (3 passes, 1 retry after exit 4)")


def test_listening_beyond_loopback_without_a_token_stops_the_rulebook_in_one_line(
    tmp_path: Path, standin: tuple[Path, dict[str, str]]
) -> None:
    """fleetops_eda_listen 0.0.0.0 and no fleetops_eda_token: the source refuses to start, ansible-rulebook
    names why and exits non-zero, and nothing listens or runs."""
    rulebook = need_rulebook()
    record, env = standin
    port = free_port()
    variables = {
        "fleetops_eda_inventory": "/dev/null",
        "fleetops_eda_port": port,
        "fleetops_eda_listen": "0.0.0.0",
    }
    log = tmp_path / "rulebook.log"
    proc = start_rulebook(rulebook, tmp_path, variables, env, log)
    try:
        rc = proc.wait(timeout=120)
    finally:
        stop(proc)
    text = log.read_text()
    assert rc != 0, text[-4000:]
    refusal = f"fleetops.node.alertmanager: refusing to listen on 0.0.0.0:{port} without a token"
    assert f"ValueError: {refusal}" in text, text[-4000:]
    assert calls(record) == []
