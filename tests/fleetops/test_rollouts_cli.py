"""`fleetops rollouts` and `fleetops report ID`: the rollouts this controller keeps, through the real
cli.main, over real state files written by the rollout layer (new_rollout / save) and real lock files."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from fleetops.cli import app as cli
from fleetops.rollout.locks import HostLocks
from fleetops.rollout.state import HOST_DONE, HOST_FAILED, Rollout, new_rollout


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "state"
    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(home))
    monkeypatch.setenv("COLUMNS", "200")
    return home


def _rollout(action: str, hosts: list[str], statuses: dict[str, str], status: str) -> Rollout:
    """A rollout kept where the CLI keeps it (state_path None: $FLEETOPS_STATE_DIR/rollouts/<id>-<action>.json)."""
    r = new_rollout(
        action=action,
        apply=True,
        inventory=[Path("inv.yml")],
        extravars={},
        plan={"batches": [hosts], "hosts": len(hosts)},
        max_failures=0,
        cooldown=0,
        gate=True,
        state_path=None,
    )
    r.hosts.update(statuses)
    r.status = status
    r.save()
    time.sleep(1.01)  # ids carry the second: one a second, so "newest first" is testable
    return r


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        rc = cli.main(list(argv))
    except SystemExit as exc:
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def test_no_rollouts_says_where_it_looked(capsys: pytest.CaptureFixture[str], state: Path) -> None:
    rc, out, _ = run(capsys, "rollouts")
    assert rc == 0 and f"no rollouts kept in {state / 'rollouts'}" in out
    rc, out, _ = run(capsys, "rollouts", "--format", "json")
    assert rc == 0 and json.loads(out) == {"schema": "fleetops.rollouts/v1", "rollouts": []}


def test_rollouts_lists_each_with_its_counts_newest_first_a_cut_off_one_and_an_unreadable_file(
    capsys: pytest.CaptureFixture[str], state: Path
) -> None:
    done = _rollout("reboot", ["a", "b"], {"a": HOST_DONE, "b": HOST_DONE}, "done")
    cut = _rollout("reclaim", ["a", "b", "c"], {"a": HOST_DONE, "b": HOST_FAILED}, "running")
    live = _rollout("disable-unit", ["d"], {}, "running")
    locks = HostLocks()  # this process holds live's lock (another lock set: alive here)
    locks.acquire(["d"], live)
    bad = state / "rollouts" / "20261201T000000Z-abcdef-reboot.json"
    bad.write_text("{truncated")
    try:
        rc, out, err = run(capsys, "rollouts", "--format", "json")
    finally:
        locks.release()
    assert rc == 0, err
    doc: dict[str, Any] = json.loads(out)
    schema = json.loads((Path(__file__).parents[2] / "schemas" / "rollouts.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)  # the committed schema of fleetops.rollouts/v1
    rows = {r["id"]: r for r in doc["rollouts"]}
    assert [r["id"] for r in doc["rollouts"]] == [live.id, cut.id, done.id, "20261201T000000Z-abcdef"]
    assert rows[done.id] | {"started": 0} == {
        "id": done.id, "action": "reboot", "status": "done", "apply": True, "started": 0,
        "operator": done.operator, "hosts": 2, "done": 2, "failed": 0, "pending": 0,
        "state": str(state / "rollouts" / f"{done.id}-reboot.json"), "error": "",
    }  # fmt: skip
    assert abs(rows[done.id]["started"] - done.created) < 1e-6
    assert rows[cut.id]["status"] == "running (no process)"  # saved as running, no live process holds it
    assert (rows[cut.id]["done"], rows[cut.id]["failed"], rows[cut.id]["pending"]) == (1, 1, 1)
    assert rows[live.id]["status"] == "running"
    assert (
        rows["20261201T000000Z-abcdef"]["status"] == "unreadable" and rows["20261201T000000Z-abcdef"]["error"]
    )
    rc, out, _ = run(capsys, "rollouts")
    assert rc == 0
    assert out.index(live.id) < out.index(cut.id) < out.index(done.id)
    assert "running (no process)" in out and "unreadable:" in out


def test_report_takes_a_rollout_id_or_a_path_and_refuses_an_unknown_id(
    capsys: pytest.CaptureFixture[str], state: Path
) -> None:
    done = _rollout("reboot", ["a"], {"a": HOST_DONE}, "done")
    rc, by_id, err = run(capsys, "report", done.id, "--format", "json")
    assert rc == 0, err
    rc, by_path, _ = run(capsys, "report", done.state_path, "--format", "json")
    assert rc == 0 and by_id == by_path and json.loads(by_id)["id"] == done.id
    rc, _, err = run(capsys, "report", "20991231T235959Z-abcdef")
    assert rc == 2 and "no rollout 20991231T235959Z-abcdef in" in err
