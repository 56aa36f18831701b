"""From alert to fix with the real servers (issue 27 items 3, 4 and 6), on lab hosts.

Everything here is real: the lab hosts (systemd-nspawn, ssh), the host timer (fleetops.node.detector_timer),
Debian's prometheus-node-exporter on the host (its binary, copied into the host and run there as a service,
reading the timer's textfile directory), Debian's prometheus and prometheus-alertmanager on this machine
(started by the test on loopback ports nobody else uses, scraping the lab network, stopped by PID),
ansible-rulebook with the collection's rulebook and Alertmanager source, and `fleetops remediate auto`
passes that scan and act over ssh. Debian's own services of those packages are never started
(tools/debian-deps.sh installs them held back and disabled); nothing here listens on 9090, 9093 or 9100 of
this machine.

1. A burst of 1,000 alerts for the 3 hosts, posted to the rulebook at once, runs exactly 3 real passes,
   each limited to its host and audited with the alert that started it.
2. End to end: lab-01 and lab-02 get a crash-looping unit; their gauges reach Prometheus through the timer
   and node_exporter; the rule fires; Alertmanager posts to the rulebook; a pass limited to lab-01 masks
   the unit; the alert resolves. lab-02's alert is silenced in Alertmanager: it fires, and no pass ever
   starts for it. The test measures fault to fix and fix to resolved, at intervals short for the test
   (scrape and evaluation 1 s, the timer every 2 s with a 20 s journal window, Alertmanager's group_wait 1 s
   and group_interval 2 s, the pass's scan 2 s); docs/guides/alerts.md gives the production ones.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fleetops_lab import Lab
from fleetops_lab.host_faults import install_crashloop_unit
from tests.eda import BIN, alert, burst, free_port, need_rulebook, start_rulebook, stop, wait_listening
from tests.paths import REPO

pytestmark = pytest.mark.lab
HOSTS = ["lab-01", "lab-02", "lab-03"]
FIXED, SILENCED = "lab-01", "lab-02"
UNIT = "ecs.service"
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"  # Debian's prometheus-node-exporter
EXPORTER_UNIT = "fleetops-e2e-node-exporter"
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"  # the timer's default (Debian's node_exporter's)
RULES = REPO / "extensions" / "prometheus" / "fleetops.rules.yml"
ALERT = "FleetopsUnitsCrashLooping"
FAULT_TO_FIX_S = 60  # issue 27's target at the test's intervals


def _tool(path: str, package: str) -> str:
    found = shutil.which(path)
    if found is None:
        message = f"{path} is not installed (Debian package {package}; tools/debian-deps.sh --ci installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: {message}")
        pytest.skip(message)
    return found


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab()
    lab.up(len(HOSTS))
    try:
        yield lab
    finally:
        lab.down()


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    """The rulebook's environment, which its playbook and the passes inherit: the venv first on PATH, the
    repository's ansible.cfg, the passes' state and audit log in the test's directory."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    return {
        **base,
        "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "FLEETOPS_STATE_DIR": str(tmp_path / "state"),
        "FLEETOPS_AUDIT_LOG": str(tmp_path / "audit.jsonl"),
    }


def passes(env: dict[str, str]) -> list[dict[str, Any]]:
    """The audit log's pass lines (remediate auto --cause)."""
    log = Path(env["FLEETOPS_AUDIT_LOG"])
    if not log.exists():
        return []
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    return [line for line in lines if line.get("event") == "auto_pass"]


def test_a_burst_of_1000_alerts_for_3_hosts_runs_exactly_3_real_passes_each_audited_with_its_alert(
    lab: Lab, env: dict[str, str], tmp_path: Path
) -> None:
    rulebook = need_rulebook()
    port = free_port()
    log = tmp_path / "rulebook.log"
    variables = {"fleetops_eda_inventory": str(lab.inventory_path()), "fleetops_eda_port": port,
                 "fleetops_eda_sample_seconds": 0}  # fmt: skip
    names = ["FleetopsUnitsCrashLooping", "FleetopsUcxLeakRisk", "FleetopsZombieMemcgs"]
    alerts = [alert(HOSTS[i % 3], names[i % 3], i) for i in range(1000)]
    sent = {(a["labels"]["host"], a["fingerprint"]) for a in alerts}
    proc = start_rulebook(rulebook, tmp_path, variables, env, log)
    try:
        wait_listening(port, proc, log)
        started = time.monotonic()
        assert set(burst(port, alerts)) == {202}
        posted_s = time.monotonic() - started
        end = time.monotonic() + 180
        while time.monotonic() < end and len(passes(env)) < 3:
            time.sleep(0.5)
        time.sleep(10)  # any fourth pass would start within this
        done = passes(env)
    finally:
        stop(proc)
    assert len(done) == 3, (done, log.read_text()[-4000:])
    assert sorted(p["limit"] for p in done) == HOSTS
    for p in done:
        host = p["limit"]
        # a real pass, limited to its host: the scan reached it over ssh, the lab's hosts are clean
        assert p["decisions"] == {host: "clean"} and p["apply"] is True and p["exit_code"] == 0, p
        fingerprint = p["cause"].split(" fingerprint ")[1].split()[0]
        assert (host, fingerprint) in sent and f" on {host} fingerprint " in p["cause"], p["cause"]
    print(f"1,000 alerts posted in {posted_s:.2f} s; 3 passes in {time.monotonic() - started:.0f} s")


# ------------------------------------------------------------------------------------------ end to end


class Servers:
    """Prometheus, Alertmanager and the rulebook on this machine, each stopped by its PID at the end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        log = (self.tmp / f"{name}.log").open("w")
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, text=True,
                                env=env, cwd=self.tmp, start_new_session=True)  # fmt: skip
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop(proc)


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read() or b"null")


def post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=5) as r:
        return json.loads(r.read() or b"null")


def wait_ready(url: str, proc: subprocess.Popen[str], log: Path, seconds: float = 60) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if proc.poll() is not None:
            pytest.fail(f"{proc.args[0]} exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    pytest.fail(f"{url} never became ready:\n{log.read_text()[-3000:]}")


def firing(prometheus: str, host: str) -> bool:
    alerts = get(f"{prometheus}/api/v1/alerts")["data"]["alerts"]
    return any(
        a["labels"].get("alertname") == ALERT and a["labels"].get("host") == host and a["state"] == "firing"
        for a in alerts
    )


def alertmanager_state(alertmanager: str, host: str) -> set[str]:
    """The states (active, suppressed) of the host's crash-loop alerts in Alertmanager; empty: resolved."""
    query = urllib.parse.urlencode({"filter": [f'alertname="{ALERT}"', f'host="{host}"']}, doseq=True)
    return {a["status"]["state"] for a in get(f"{alertmanager}/api/v2/alerts?{query}")}


def test_crash_loop_to_masked_unit_through_prometheus_alertmanager_and_the_rulebook_and_a_silence_holds(
    lab: Lab, env: dict[str, str], tmp_path: Path
) -> None:
    rulebook = need_rulebook()
    prometheus_bin = _tool("prometheus", "prometheus")
    alertmanager_bin = _tool("prometheus-alertmanager", "prometheus-alertmanager")
    _tool(NODE_EXPORTER, "prometheus-node-exporter")
    hosts = [FIXED, SILENCED]
    timings: dict[str, float] = {}
    setup_started = time.monotonic()

    # the host timer, every 2 s, with a 20 s journal window for the restart rate (production: 60 s, 600 s)
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(lab.inventory_path()), "fleetops.node.detector_timer",
         "-l", ",".join(hosts), "-e", "fleetops_detector_interval_s=2", "-e", "fleetops_journal_window_seconds=20"],
        capture_output=True, text=True, timeout=600, check=False, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    # node_exporter on each host: Debian's binary, run there as a service on the host's lab address
    for host in hosts:
        shutil.copy2(NODE_EXPORTER, lab.host_root(host) / "usr/local/bin/prometheus-node-exporter")
        started = lab.run(host, [
            "systemd-run", f"--unit={EXPORTER_UNIT}", "/usr/local/bin/prometheus-node-exporter",
            f"--web.listen-address={lab.host_ip(host)}:9100", "--collector.disable-defaults",
            "--collector.textfile", f"--collector.textfile.directory={TEXTFILE_DIR}",
        ])  # fmt: skip
        assert started.returncode == 0, started.stderr
    timings["setup: timer and node_exporter on 2 hosts"] = time.monotonic() - setup_started

    prom_port, am_port, rb_port = free_port(), free_port(), free_port()
    prometheus, alertmanager = f"http://127.0.0.1:{prom_port}", f"http://127.0.0.1:{am_port}"
    (tmp_path / "prometheus.yml").write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],  # the collection's rules, as shipped
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
        "scrape_configs": [{"job_name": "node", "static_configs": [
            {"targets": [f"{lab.host_ip(h)}:9100" for h in hosts]}]}],
    }))  # fmt: skip
    (tmp_path / "alertmanager.yml").write_text(json.dumps({
        "route": {"receiver": "fleetops-eda", "group_by": ["alertname", "host"], "group_wait": "1s",
                  "group_interval": "2s", "repeat_interval": "1h"},
        "receivers": [{"name": "fleetops-eda", "webhook_configs": [
            {"url": f"http://127.0.0.1:{rb_port}/alerts", "send_resolved": True}]}],
    }))  # fmt: skip
    servers = Servers(tmp_path)
    try:
        am = servers.start("alertmanager", [
            alertmanager_bin, f"--config.file={tmp_path / 'alertmanager.yml'}",
            f"--storage.path={tmp_path / 'am'}", f"--web.listen-address=127.0.0.1:{am_port}",
            "--cluster.listen-address=",
        ])  # fmt: skip
        prom = servers.start("prometheus", [
            prometheus_bin, f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'prom'}", f"--web.listen-address=127.0.0.1:{prom_port}",
            "--rules.alert.resend-delay=1s",
        ])  # fmt: skip
        variables = {"fleetops_eda_inventory": str(lab.inventory_path()), "fleetops_eda_port": rb_port,
                     "fleetops_eda_sample_seconds": 2, "fleetops_eda_locked_delay": 2}  # fmt: skip
        rb_log = tmp_path / "rulebook.log"
        rb = start_rulebook(rulebook, tmp_path, variables, env, rb_log)
        servers.procs.append(rb)
        wait_ready(f"{alertmanager}/-/ready", am, tmp_path / "alertmanager.log")
        wait_ready(f"{prometheus}/-/ready", prom, tmp_path / "prometheus.log")
        wait_listening(rb_port, rb, rb_log)
        # a person silences lab-02 (maintenance) in Alertmanager
        now = datetime.now(UTC)
        post(f"{alertmanager}/api/v2/silences", {
            "matchers": [{"name": "host", "value": SILENCED, "isRegex": False, "isEqual": True}],
            "startsAt": now.isoformat(), "endsAt": (now + timedelta(hours=1)).isoformat(),
            "createdBy": "test_eda_lab", "comment": "maintenance: no automation on lab-02",
        })  # fmt: skip
        timings["setup: servers ready"] = time.monotonic() - setup_started

        fault = time.monotonic()
        for host in hosts:
            install_crashloop_unit(lab, host, restart_sec=0.5, mb=1)
        seen: dict[str, float] = {}
        end = fault + 150
        while time.monotonic() < end and not {"resolved", "audited"} <= set(seen):
            now_s = time.monotonic() - fault
            if "fired" not in seen and firing(prometheus, FIXED):
                seen["fired"] = now_s
            if "suppressed" not in seen and "suppressed" in alertmanager_state(alertmanager, SILENCED):
                seen["suppressed"] = now_s
            if "audited" not in seen and any(p["limit"] == FIXED for p in passes(env)):
                seen["audited"] = now_s
            if "fixed" not in seen:
                if lab.run(FIXED, f"systemctl is-enabled {UNIT}").stdout.strip() == "masked":
                    seen["fixed"] = now_s
            elif "silent" not in seen and not firing(prometheus, FIXED):
                seen["silent"] = now_s  # Prometheus no longer fires it
            if (
                "fixed" in seen
                and not alertmanager_state(alertmanager, FIXED)
                and not firing(prometheus, FIXED)
            ):
                seen["resolved"] = now_s  # Alertmanager has it resolved
            time.sleep(0.5)
        # lab-02 still loops: nothing ever acted on it
        loop_state = lab.run(
            SILENCED, f"systemctl is-enabled {UNIT}; systemctl show -p NRestarts {UNIT}"
        ).stdout
        still_firing = firing(prometheus, SILENCED)
        time.sleep(3)  # a resolved notification reaches the rulebook: it must start nothing
        done = passes(env)
    finally:
        servers.stop()
        for host in hosts:  # the timer and the units go with the lab (the module's fixture takes it down)
            lab.run(host, f"systemctl stop {EXPORTER_UNIT}")
    report = {k: round(v, 1) for k, v in {**timings, **seen}.items()}
    print(f"end to end (s after the fault unless setup): {json.dumps(report)}")
    assert {"fired", "audited", "fixed", "resolved"} <= set(seen), (report, rb_log.read_text()[-4000:])
    assert seen["fixed"] < FAULT_TO_FIX_S, report
    # one pass, for lab-01 only, audited with the alert; its fix rollout masked the unit
    (only,) = done
    assert only["limit"] == FIXED and only["decisions"] == {FIXED: "act"}, only
    assert (
        only["cause"].startswith(f"alertmanager fleetops-eda: {ALERT} (") and f" on {FIXED} " in only["cause"]
    )
    (action,) = only["actions"]
    assert action["action"] == "fix" and action["done"] == [FIXED] and action["exit_code"] == 0, only
    lines = [json.loads(line) for line in Path(env["FLEETOPS_AUDIT_LOG"]).read_text().splitlines()]
    changes = [line for line in lines if line.get("rollout") == action["rollout"]]
    assert changes and all(line["host"] == FIXED for line in changes)
    # the silence: lab-02's alert fired and was suppressed in Alertmanager; no pass, its unit still loops
    assert "suppressed" in seen and still_firing, report
    assert loop_state.splitlines()[0] == "enabled", loop_state
    print(
        f"fault to fix {seen['fixed']:.1f} s (alert firing at {seen['fired']:.1f} s, pass audited at "
        f"{seen['audited']:.1f} s); fix to resolved {seen['resolved'] - seen['fixed']:.1f} s"
    )
