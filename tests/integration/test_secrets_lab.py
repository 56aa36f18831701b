"""Secrets at rest on a real lab host: `fleetops remediate set-env --env API_TOKEN=<random> --apply`
sets the value in the service's real environment, and no file fleetops wrote (state, audit log,
report) and none of its output holds it: only its digest. Every file is 0600, every directory 0700."""

from __future__ import annotations

import json
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetops.util import digest_value
from fleetops_lab import Lab
from fleetops_lab.host_faults import install_worker_service, remove_worker_service, worker_pid
from tests.helpers import fleetops

pytestmark = pytest.mark.lab
HOST, UNIT = "lab-01", "envcheck"


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab()
    lab.up(1)
    try:
        install_worker_service(lab, HOST, name=UNIT, ucx=False)
        yield lab
    finally:
        remove_worker_service(lab, HOST, name=UNIT)
        lab.down()


def test_a_set_env_secret_stays_out_of_every_file_and_output(lab: Lab, tmp_path: Path) -> None:
    value = "tok-" + secrets.token_hex(16)
    state_dir = tmp_path / "state"
    env = {"FLEETOPS_STATE_DIR": str(state_dir), "FLEETOPS_AUDIT_LOG": ""}
    common = ["remediate", "set-env", "--unit", UNIT, "--env", f"API_TOKEN={value}", "--restart",
              "-i", str(lab.inventory_path()), "--limit", HOST]  # fmt: skip
    dry = fleetops(*common, "--format", "json", env=env)
    assert dry.rc == 0, dry.stderr
    applied = fleetops(*common, "--apply", "--format", "json", env=env)
    assert applied.rc == 0, applied.stderr
    table = fleetops(*common, "--apply", env=env)  # once more, the table output (nothing to change)
    assert table.rc == 0, table.stderr
    pid = worker_pid(lab, HOST, name=UNIT)
    environ = lab.run(HOST, f"cat /proc/{pid}/environ", check=True).stdout.split("\0")
    assert f"API_TOKEN={value}" in environ  # the host got the value itself
    outcome = applied.json()["batches"][0]["results"][HOST]
    assert outcome["result"]["env_after"] == {"API_TOKEN": digest_value(value)}
    state = Path(applied.json()["state"])
    report = fleetops("report", str(state), "--format", "json", env=env)
    assert report.rc == 0, report.stderr
    files = [p for p in state_dir.rglob("*") if p.is_file()]
    assert (state_dir / "audit.jsonl") in files and state in files
    texts = [r.stdout + r.stderr for r in (dry, applied, table, report)] + [p.read_text() for p in files]
    assert digest_value(value) in "".join(texts)
    for text in texts:
        assert value not in text
    audit = [json.loads(line) for line in (state_dir / "audit.jsonl").read_text().splitlines()]
    assert audit[0]["after"]["env"] == {"API_TOKEN": digest_value(value)}
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for path in [state_dir, *(p for p in state_dir.rglob("*") if p.is_dir())]:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700, path
