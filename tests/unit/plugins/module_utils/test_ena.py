"""ena_resets, and the kernel-log read it shares with gpu_health (kernlog).

No ENA NIC exists on this machine (its eth0 is virtio_net), so the ENA inputs are fixtures in the
real formats: ``ethtool -S`` of the ena driver (the "NIC statistics:" header, then the counter names
of ena_ethtool.c: the reset counters of ena 2.13+, the ENI allowance counters, per-queue counters)
and kernel-log lines in the driver's own wording, as ``journalctl -o short-unix`` prints them. The
sysfs layout is rebuilt with real symlinks in a temporary directory. The "no ENA" case and the
kernel-log read run on this machine for real.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.fleetops.node.plugins.module_utils import ena, kernlog
from ansible_collections.fleetops.node.plugins.modules import node_health

from tests.localrun import run_command
from tests.paths import FIXTURES

FIXTURES = FIXTURES
ETHTOOL = (FIXTURES / "ena" / "ethtool-S-eth0.txt").read_text()
RESET_LOG = (FIXTURES / "ena" / "kernel-ena-reset.txt").read_text()
KMSG = (FIXTURES / "kernlog" / "kmsg_real.txt").read_text()


def _sysfs(tmp_path: Path, interfaces: dict[str, tuple[str, str]]) -> Path:
    """/sys/class/net as the kernel lays it out: IFACE/device -> the PCI device, device/driver -> the driver."""
    net = tmp_path / "class" / "net"
    net.mkdir(parents=True)
    for iface, (pci, driver) in interfaces.items():
        device = tmp_path / "devices" / "pci0000:00" / pci
        device.mkdir(parents=True)
        drivers = tmp_path / "bus" / "pci" / "drivers" / driver
        drivers.mkdir(parents=True, exist_ok=True)
        os.symlink(drivers, device / "driver")
        (net / iface).mkdir()
        os.symlink(device, net / iface / "device")
    (net / "lo").mkdir()  # a virtual interface: no device link
    return net


def _log(text: str) -> dict[str, Any]:
    lines = kernlog.parse_short_unix(text)
    return {"source": "journal", "error": None, "lines": lines, "read_at": 1764437800.0, "read_ms": 1.0}


def _ethtool_run(outputs: dict[str, str]) -> Any:
    calls: list[list[str]] = []

    def run(argv: list[str]) -> tuple[int, str, str]:
        calls.append(argv)
        assert argv[0] == "/usr/sbin/ethtool" and argv[1] == "-S"
        return 0, outputs[argv[2]], ""

    run.calls = calls  # type: ignore[attr-defined]
    return run


# --------------------------------------------------------------------------------------------
# parsers
# --------------------------------------------------------------------------------------------


def test_ethtool_stats_parse_every_counter() -> None:
    stats = ena.parse_ethtool_stats(ETHTOOL, "eth0")
    assert stats["total_resets"] == 2
    assert stats["reset_fail"] == 0
    assert stats["os_netdev_wd"] == 1
    assert stats["pps_allowance_exceeded"] == 14
    assert stats["queue_0_rx_bytes"] == 12731040231
    assert len(stats) == ETHTOOL.count("\n") - 1


def test_malformed_ethtool_output_is_a_detector_error() -> None:
    with pytest.raises(
        ena.EnaError, match=r"Failed to parse ethtool -S eth0 output: no 'NIC statistics:' header"
    ):
        ena.parse_ethtool_stats("Cannot get stats strings information: Operation not supported\n", "eth0")
    with pytest.raises(ena.EnaError, match=r"line 3: 'tx_timeout: lots' is not 'name: integer'"):
        ena.parse_ethtool_stats("NIC statistics:\n     total_resets: 0\n     tx_timeout: lots\n", "eth0")


def test_kernel_log_lines_are_counted_per_interface_and_kind() -> None:
    counts, events = ena.parse_log(kernlog.parse_short_unix(RESET_LOG))
    assert counts == {
        "eth0": {"missing_tx_completion": 1, "reset_triggered": 2, "tx_timeout": 2},
        "0000:00:05.0": {"reset_completed": 2},  # dev_err lines name the PCI device
    }
    assert [e["kind"] for e in events][:2] == ["missing_tx_completion", "reset_triggered"]
    assert all("fleetops0" not in e["message"] for e in events)


def test_find_interfaces_follows_the_driver_symlink(tmp_path: Path) -> None:
    net = _sysfs(tmp_path, {"eth0": ("0000:00:05.0", "ena"), "eth1": ("0000:00:06.0", "virtio-pci")})
    assert ena.find_interfaces(str(net)) == {"eth0": "0000:00:05.0"}


def test_no_ena_on_this_machine_is_empty_facts_no_finding_no_error() -> None:
    facts = ena.collect(run_command)
    assert facts == {"interfaces": {}, "reason": "no interface uses the ena driver"}
    assert ena.evaluate(facts) == []
    result = node_health.run_checks({"checks": ["ena_resets"], "_run": run_command})
    assert result["errors"] == []
    assert result["findings"] == []
    assert result["facts"]["ena"]["interfaces"] == {}


def test_reset_lines_without_an_ena_interface_are_counted_as_ignored_never_judged(tmp_path: Path) -> None:
    # A real ENA reset log (captured) on a host whose only NIC is virtio, as a VM lab host's is.
    net = _sysfs(tmp_path, {"eth0": ("0000:00:03.0", "virtio_net")})
    facts = ena.collect(run_command, _log(RESET_LOG), sys_class_net=str(net))
    assert facts["interfaces"] == {}
    assert facts["ignored_log_lines"] == 7
    assert facts["reason"] == (
        "no interface uses the ena driver; 7 ENA driver line(s) in the kernel log ignored: "
        "no ENA device here to have reset"
    )
    assert ena.evaluate(facts) == []
    # A clean log: nothing ignored, the plain reason; the log is read through the shared reader's callable.
    clean = ena.collect(run_command, lambda: _log(""), sys_class_net=str(net))
    assert clean == {"interfaces": {}, "reason": "no interface uses the ena driver", "ignored_log_lines": 0}


def test_ena_without_ethtool_is_a_clear_detector_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    net = _sysfs(tmp_path, {"ens5": ("0000:00:05.0", "ena")})
    monkeypatch.setattr(ena, "which", lambda name: None)
    with pytest.raises(ena.EnaError) as err:
        ena.collect(run_command, _log(""), sys_class_net=str(net))
    assert str(err.value) == (
        "Failed to run ethtool -S: ethtool is not installed, and ens5 use the ena driver (install the ethtool package)"
    )


# --------------------------------------------------------------------------------------------
# collect / growth / severity
# --------------------------------------------------------------------------------------------


def test_collect_reads_counters_and_log(tmp_path: Path) -> None:
    net = _sysfs(tmp_path, {"eth0": ("0000:00:05.0", "ena")})
    run = _ethtool_run({"eth0": ETHTOOL})
    facts = ena.collect(run, _log(RESET_LOG), sys_class_net=str(net), ethtool="/usr/sbin/ethtool")
    assert run.calls == [["/usr/sbin/ethtool", "-S", "eth0"]]
    eth0 = facts["interfaces"]["eth0"]
    assert eth0["pci"] == "0000:00:05.0"
    assert eth0["resets"] == 2 and eth0["resets_basis"] == "total_resets"
    assert "queue_0_tx_cnt" not in eth0["counters"]  # per-queue counters stay out of the facts
    assert eth0["counters"]["pps_allowance_exceeded"] == 14
    assert eth0["log"] == {
        "missing_tx_completion": 1,
        "reset_triggered": 2,
        "tx_timeout": 2,
        "reset_completed": 2,
    }
    assert facts["kernel_log"] == {"source": "journal", "error": None, "read_ms": 1.0}
    (finding,) = ena.evaluate(facts)
    assert finding["check"] == "ena_resets"
    assert finding["severity"] == "warning"  # 2 resets since the driver loaded, under 3
    assert finding["summary"].startswith(
        "ENA NIC reset or TX timeout: eth0: 2 resets since the driver loaded"
    )
    assert "tx_timeout 1" in finding["summary"]
    (critical,) = ena.evaluate(facts, {"ena_resets_critical": 2})
    assert critical["severity"] == "critical"


def test_quiet_ena_is_no_finding(tmp_path: Path) -> None:
    net = _sysfs(tmp_path, {"eth0": ("0000:00:05.0", "ena")})
    quiet = (
        "NIC statistics:\n"
        + "".join(f"     {name}: 0\n" for name in ena.COUNTERS)
        + "     queue_0_tx_cnt: 5\n"
    )
    facts = ena.collect(
        _ethtool_run({"eth0": quiet}), _log(""), sys_class_net=str(net), ethtool="/usr/sbin/ethtool"
    )
    assert facts["interfaces"]["eth0"]["resets"] == 0
    assert ena.evaluate(facts) == []


def test_reset_fail_is_critical(tmp_path: Path) -> None:
    net = _sysfs(tmp_path, {"eth0": ("0000:00:05.0", "ena")})
    failed = ETHTOOL.replace("reset_fail: 0", "reset_fail: 1")
    facts = ena.collect(
        _ethtool_run({"eth0": failed}), _log(""), sys_class_net=str(net), ethtool="/usr/sbin/ethtool"
    )
    (finding,) = ena.evaluate(facts)
    assert finding["severity"] == "critical"
    assert "a reset FAILED" in finding["summary"]


def test_old_driver_counts_resets_from_tx_timeout_and_keep_alive(tmp_path: Path) -> None:
    net = _sysfs(tmp_path, {"eth0": ("0000:00:05.0", "ena")})
    old = (
        "NIC statistics:\n     tx_timeout: 0\n     suspend: 0\n     resume: 0\n     wd_expired: 1\n"
        "     interface_up: 2\n     interface_down: 1\n     admin_q_pause: 0\n     queue_0_tx_cnt: 7\n"
    )
    facts = ena.collect(
        _ethtool_run({"eth0": old}), _log(""), sys_class_net=str(net), ethtool="/usr/sbin/ethtool"
    )
    eth0 = facts["interfaces"]["eth0"]
    assert (eth0["resets"], eth0["resets_basis"]) == (1, "tx_timeout+wd_expired")
    assert eth0["counters"]["interface_down"] == 1
    (finding,) = ena.evaluate(facts)
    assert finding["severity"] == "warning"


def test_two_samples_name_the_increase(tmp_path: Path) -> None:
    net = _sysfs(tmp_path, {"eth0": ("0000:00:05.0", "ena")})
    before = ena.collect(_ethtool_run({"eth0": ETHTOOL.replace("total_resets: 2", "total_resets: 1")}),
                         _log(""), sys_class_net=str(net), ethtool="/usr/sbin/ethtool")  # fmt: skip
    after = ena.collect(_ethtool_run({"eth0": ETHTOOL.replace("pps_allowance_exceeded: 14", "pps_allowance_exceeded: 90")}),
                        _log(RESET_LOG), sys_class_net=str(net), ethtool="/usr/sbin/ethtool")  # fmt: skip
    grown = ena.add_growth(before, after, 30.0)
    increase = grown["interfaces"]["eth0"]["increase"]
    assert increase["total_resets"] == 1
    assert "pps_allowance_exceeded" not in increase  # traffic shaping, not a reset
    assert increase["log:reset_completed"] == 2
    (finding,) = ena.evaluate(grown)
    assert "+1 total_resets" in finding["summary"] and "in the last 30.0s" in finding["summary"]


# --------------------------------------------------------------------------------------------
# kernlog
# --------------------------------------------------------------------------------------------


def test_kmsg_records_parse() -> None:
    """Records captured from this machine's /dev/kmsg (prio,seq,usec,flags;message)."""
    records = kernlog.parse_kmsg(KMSG)
    assert len(records) == KMSG.count("\n")
    stamp, message = records[0]
    assert stamp > 0 and message
    assert kernlog.parse_kmsg(
        "6,1,100,-;NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.\n SUBSYSTEM=pci\n"
    ) == [(0.0001, "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.")]


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK), reason="needs /dev/kmsg")
def test_read_kmsg_on_this_machine_is_cheap() -> None:
    log = kernlog.read(run_command)
    if log["source"] is None:
        pytest.skip("kernel.dmesg_restrict without CAP_SYSLOG: " + str(log["error"]))
    assert log["source"] == "kmsg"
    assert log["read_ms"] < 500
    assert all(kernlog._MATCH.search(message) for _stamp, message in log["lines"])


def test_journal_is_the_fallback_when_kmsg_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []

    def run(argv: list[str]) -> tuple[int, str, str]:
        calls.append(argv)
        return 0, RESET_LOG, ""

    monkeypatch.setattr(kernlog, "_journalctl", lambda: "/usr/bin/journalctl")
    log = kernlog.read(run, kmsg=str(tmp_path / "no-kmsg"))
    assert log["source"] == "journal"
    assert calls[0][:4] == ["/usr/bin/journalctl", "-k", "-b", "-q"]
    assert calls[0][-2:] == ["--grep", kernlog.PATTERN]
    assert len(log["lines"]) == 7  # the bridge line does not match
    assert log["lines"][0][0] == 1764434101.118203


def test_no_kernel_log_is_said_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernlog, "_journalctl", lambda: "/usr/bin/journalctl")
    log = kernlog.read(
        lambda argv: (1, "", "Failed to open journal: Permission denied"), kmsg=str(tmp_path / "x")
    )
    assert log["source"] is None
    assert "No such file or directory" in log["error"] and "Permission denied" in log["error"]
    assert log["lines"] == []


def test_one_read_per_round_is_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []
    real = kernlog.read

    def counting(run: Any = None, kmsg: str = kernlog.KMSG) -> dict[str, Any]:
        reads.append(1)
        return real(run, kmsg)

    monkeypatch.setattr(kernlog, "read", counting)
    monkeypatch.setattr(ena, "find_interfaces", lambda sys_class_net="": {"eth0": "0000:00:05.0"})
    monkeypatch.setattr(ena, "which", lambda name: "/usr/sbin/ethtool")
    run = _ethtool_run({"eth0": ETHTOOL})
    result = node_health.run_checks(
        {"checks": ["ena_resets", "gpu_health"], "_run": run, "sample_seconds": 0.05}
    )
    assert result["errors"] == []
    assert len(reads) == 2  # two rounds, each one read for both detectors
