"""`fleetops scan --shard I/N` on four controllers at once, and `fleetops merge`, against one unsharded scan.

Seven inventory hosts, each different, so that a merge that mixed hosts up would show: five real lab
hosts with their own injected faults (a GPU with uncorrectable ECC errors, units the image enabled
that are not on the fleet's allow-list, a GPU with a row remap pending, a clean host), an address where
no host answers (unreachable) and a real host whose Python does not exist (failed). By the names' hash
the four shards each hold one to two of them. The four shard scans run side by side (as four
controllers would), each writes its report, ``fleetops merge`` joins them, and the merge must equal one
unsharded scan host by host: the same hosts, statuses and (check, severity) findings, the same summary
and the same exit code.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetops.values import shard_of
from fleetops_lab import Lab
from fleetops_lab.hardware import GPU_FILE, inject_ecc, install_gpu, read_gpus
from fleetops_lab.host_faults import install_crashloop_unit, remove_crashloop_unit
from tests.helpers import FLEETOPS, REPO, fleetops

pytestmark = pytest.mark.lab

SHARDS = 4
CHECKS = "gpu_health,unexpected_unit"
ALLOWLIST = ["ssh.service", "systemd-*", "getty@*", "remote-fs.target"]
# host: the (check, severity) findings its fault must give (None: a status other than ok)
EXPECTED: dict[str, set[tuple[str, str]] | str] = {
    "lab-01": {("gpu_health", "critical")},  # uncorrectable ECC errors
    "lab-02": {("unexpected_unit", "warning")},  # ecs.service, enabled by the image
    "lab-03": {("gpu_health", "critical"), ("unexpected_unit", "warning")},  # both, another unit
    "lab-04": set(),  # clean
    "lab-05": {("gpu_health", "warning")},  # a row remap pending
    "lab-gone": "unreachable",  # an address where no host answers
    "lab-broken": "failed",  # lab-04's address, a Python interpreter that does not exist
}
UNITS = {"lab-02": "ecs", "lab-03": "datadog"}


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab()
    lab.up(5)
    try:
        inject_ecc(lab, "lab-01", uncorrected=2)
        inject_ecc(lab, "lab-03", uncorrected=1)
        for host, name in UNITS.items():
            install_crashloop_unit(lab, host, name=name, start=False)  # enabled, never started
        install_gpu(lab, "lab-05")
        gpus = read_gpus(lab, "lab-05")
        gpus[0]["remapped_rows.pending"] = "Yes"
        (lab.host_root("lab-05") / GPU_FILE).write_text(json.dumps({"gpus": gpus}))
        yield lab
    finally:
        try:
            for host, name in UNITS.items():
                remove_crashloop_unit(lab, host, name=name)
        finally:
            lab.down()


def _inventory(lab: Lab, tmp_path: Path) -> Path:
    inventory = yaml.safe_load(lab.inventory_path().read_text())
    hosts = inventory["all"]["children"]["fleetops_lab"]["hosts"]
    hosts["lab-gone"] = {"ansible_host": lab.unused_ip}
    hosts["lab-broken"] = {**hosts["lab-04"], "ansible_python_interpreter": "/nonexistent/python3"}
    inv = tmp_path / "fleet.yml"
    inv.write_text(yaml.safe_dump(inventory))
    return inv


def _scan_args(inv: Path, tmp_path: Path) -> list[str]:
    allowlist = tmp_path / "allow.yml"
    allowlist.write_text(yaml.safe_dump(ALLOWLIST))
    return ["scan", "-i", str(inv), "--checks", CHECKS, "--sample-seconds", "0", "--unit-allowlist",
            str(allowlist), "--forks", "10", "-q", "--format", "json"]  # fmt: skip


def _found(entry: dict[str, Any]) -> set[tuple[str, str]]:
    return {(f["check"], f["severity"]) for f in entry["findings"]}


def test_four_shards_merged_equal_one_unsharded_scan(lab: Lab, tmp_path: Path) -> None:
    started = time.monotonic()
    inv = _inventory(lab, tmp_path)
    args = _scan_args(inv, tmp_path)
    by_shard = {i: sorted(h for h in EXPECTED if shard_of(h, SHARDS) == i) for i in range(1, SHARDS + 1)}
    assert all(by_shard.values()), by_shard  # every shard holds hosts: none is trivially equal

    # four controllers at once, one shard each
    procs = {
        i: subprocess.Popen(
            [str(FLEETOPS), *args, "--shard", f"{i}/{SHARDS}", "-o", str(tmp_path / f"shard{i}.json")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
        )
        for i in by_shard
    }
    shard_rc = {}
    for i, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        shard_rc[i] = proc.returncode
        report = json.loads(out)
        assert report["shard"] == {"index": i, "count": SHARDS}
        assert sorted(report["hosts"]) == by_shard[i], (i, err)  # exactly its hosts, each accounted for
        assert report == json.loads((tmp_path / f"shard{i}.json").read_text())
    shards_s = time.monotonic() - started

    merged = fleetops("merge", *(str(tmp_path / f"shard{i}.json") for i in by_shard), "--format", "json",
                      "-o", str(tmp_path / "merged.json"))  # fmt: skip
    whole = fleetops(*args)
    report, one = merged.json(), whole.json()
    assert merged.rc == whole.rc == 3, (merged.stderr, whole.stderr)  # an unreachable and a failed host
    # each shard exits as a scan of its own hosts: clean, findings, or a host unreachable or failed
    assert shard_rc == {1: 0, 2: 1, 3: 3, 4: 1}, by_shard

    # the faults are what they should be, each host its own: the comparison below can tell hosts apart
    for host, expected in EXPECTED.items():
        entry = one["hosts"][host]
        if isinstance(expected, str):
            assert entry["status"] == expected, (host, entry)
        else:
            assert entry["status"] == "ok" and _found(entry) == expected, (host, entry)
    # host by host, the merge is the unsharded scan
    assert list(report["hosts"]) == list(one["hosts"]) == sorted(EXPECTED)
    for host in EXPECTED:
        got, want = report["hosts"][host], one["hosts"][host]
        assert got["status"] == want["status"], host
        assert _found(got) == _found(want), host
        assert [f["summary"] for f in got["findings"]] == [f["summary"] for f in want["findings"]], host
    assert report["summary"] == one["summary"]
    assert report["options"] == one["options"]
    assert json.loads((tmp_path / "merged.json").read_text()) == report
    print(f"\n4 shard scans side by side: {shards_s:.1f} s; whole test {time.monotonic() - started:.1f} s")
