"""module_utils/slurm.py on real captures: ``scontrol show node`` of Debian 12's Slurm 22.05 on the lab
(``fleetops-lab up 3 --slurm``): idle, draining under a job, drained, down and drained by an admin,
drained by fleetops and rebooted, down and not responding (slurmd stopped: Slurm's own reason after its
SlurmdTimeout), and a node that does not exist."""

from __future__ import annotations

from typing import Any

import pytest
from ansible_collections.fleetops.node.plugins.module_utils import slurm

from tests.paths import FIXTURES

FIXTURES = FIXTURES / "slurm"


def _node(name: str) -> dict[str, Any]:
    node = slurm.parse_show_node((FIXTURES / f"{name}.txt").read_text())
    assert node is not None
    return node


# ------------------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("capture", "state", "flags", "phase"),
    [
        ("idle", "IDLE", [], "in"),
        ("draining", "ALLOCATED", ["DRAIN"], "draining"),
        ("drained", "IDLE", ["DRAIN"], "drained"),
        ("down_admin", "DOWN", [], "down"),
        ("drained_admin", "IDLE", ["DRAIN", "NOT_RESPONDING"], "drained"),
        ("rebooted_drained", "IDLE", ["DRAIN"], "drained"),
        ("not_responding", "DOWN", ["NOT_RESPONDING"], "down"),
    ],
)
def test_reads_the_state_and_its_flags(capture: str, state: str, flags: list[str], phase: str) -> None:
    node = _node(capture)
    assert (node["state"], node["flags"], slurm.phase(node)) == (state, flags, phase)


def test_reads_the_reason_without_slurms_stamp_and_the_comment_whole() -> None:
    node = _node("drained")
    assert node["NodeName"] == "lab-02"
    assert node["reason"] == "fleetops: gpu_health: 1 uncorrectable ECC error"
    assert node["comment"] == 'fleetops:{"check":"gpu_health"}'
    assert slurm.parse_record(node["comment"]) == {"check": "gpu_health"}
    admin = _node("drained_admin")
    assert (admin["reason"], admin["comment"]) == ("admin: firmware", "")
    idle = _node("idle")
    assert (idle["reason"], idle["comment"]) == ("", "")


@pytest.mark.parametrize(
    ("capture", "failed"),
    [
        ("not_responding", True),  # Slurm's own "Not responding" after SlurmdTimeout (slurmd stopped)
        ("down_admin", False),  # an admin's down: planned, another reason
        ("drained_admin", False),  # drained by an admin, even while not responding
        ("drained", False),
        ("idle", False),
    ],
)
def test_failed_is_slurm_taking_a_node_out_itself(capture: str, failed: bool) -> None:
    assert slurm.failed(_node(capture)) is failed


def test_no_node_in_scontrols_answer_is_none() -> None:
    assert slurm.parse_show_node((FIXTURES / "not_found.txt").read_text()) is None
    assert slurm.parse_show_node("") is None


def test_a_reason_holding_key_value_words_stays_the_reason() -> None:
    text = (
        (FIXTURES / "drained_admin.txt")
        .read_text()
        .replace("Reason=admin: firmware", "Reason=State=IDLE Comment=x NodeName=other")
    )
    node = slurm.parse_show_node(text)
    assert node is not None
    assert (node["NodeName"], node["state"], node["reason"], node["comment"]) == (
        "lab-01",
        "IDLE",
        "State=IDLE Comment=x NodeName=other",
        "",
    )


# ------------------------------------------------------------------------------------- names, reasons


@pytest.mark.parametrize("name", ["lab-02", "gpu017", "node_1.rack-3", "a" * 128])
def test_one_node_names_pass(name: str) -> None:
    assert slurm.node_name_problem(name) is None


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("lab 02", "' '"),
        ("a=b", "'='"),
        ("-lab-02", "starts with '-'"),
        ("lab-[01-10]", "'['"),
        ("a,b", "','"),
        ("lab-02\nx", "'\\n'"),
        ("", "is empty"),
        ("a" * 129, "longer than 128"),
    ],
)
def test_names_that_are_not_one_node_are_refused_in_one_line(name: str, why: str) -> None:
    with pytest.raises(slurm.SlurmError) as caught:
        slurm.check_node_name(name)
    assert why in str(caught.value)
    assert "\n" not in str(caught.value).replace("\\n", "")


def test_our_reason_is_one_printable_line_of_at_most_200_characters() -> None:
    assert (
        slurm.reason_text("gpu_health", "1 ECC\nerror\t on GPU 0")
        == "fleetops: gpu_health: 1 ECC error on GPU 0"
    )
    assert slurm.reason_text("gpu_health") == "fleetops: gpu_health"
    assert len(slurm.reason_text("gpu_health", "x" * 500)) == slurm.REASON_MAX
    with pytest.raises(slurm.SlurmError, match="control characters"):
        slurm.reason_text("gpu_health", "bell\x07")
    with pytest.raises(slurm.SlurmError, match="not a check name"):
        slurm.reason_text("gpu health", "x")


# ------------------------------------------------------------------------------------- what to do


def test_drains_a_node_that_takes_work_recording_it_first() -> None:
    steps, note = slurm.plan_drain(_node("idle"), "fleetops: gpu_health")
    assert (steps, note) == (["comment", "drain"], "drain: fleetops: gpu_health")


def test_a_node_we_drained_is_not_drained_again() -> None:
    for capture in ("draining", "drained", "rebooted_drained"):
        assert slurm.plan_drain(_node(capture), "fleetops: other: x")[0] == []


@pytest.mark.parametrize("capture", ["drained_admin", "down_admin"])
def test_a_node_someone_else_took_out_is_left_alone_both_ways(capture: str) -> None:
    node = _node(capture)
    steps, note = slurm.plan_drain(node, "fleetops: gpu_health")
    assert steps == [] and note.startswith("left alone:") and "admin:" in note
    steps, note = slurm.plan_resume(node)
    assert steps == [] and note.startswith("left alone:") and "admin:" in note


def test_someone_elses_comment_is_never_overwritten() -> None:
    node = {**_node("idle"), "comment": "rack 7, ticket 123"}
    with pytest.raises(slurm.SlurmError, match="someone else's"):
        slurm.plan_drain(node, "fleetops: gpu_health")


def test_resumes_only_a_node_our_record_says_we_drained() -> None:
    assert slurm.plan_resume(_node("drained"))[0] == ["resume", "uncomment"]
    assert slurm.plan_resume(_node("draining"))[0] == ["resume", "uncomment"]
    assert slurm.plan_resume(_node("idle")) == ([], "not quarantined")
    # our reason without our record (someone copied it, or the record was removed): not ours
    assert slurm.plan_resume({**_node("drained"), "comment": ""})[0] == []


def test_a_node_we_drained_that_slurm_re_reasoned_is_still_ours_one_an_admin_re_reasoned_is_not() -> None:
    rebooted = {
        **_node("drained"),
        "reason": "Node unexpectedly rebooted",
        "state": "DOWN",
        "flags": ["DRAIN"],
    }
    assert slurm.plan_resume(rebooted)[0] == ["resume", "uncomment"]
    admin = {**_node("drained"), "reason": "admin: keep out"}
    steps, note = slurm.plan_resume(admin)
    assert steps == [] and "admin: keep out" in note
    assert slurm.plan_drain(admin, "fleetops: gpu_health")[0] == []


def test_a_record_without_a_drain_is_finished_not_left_behind() -> None:
    # an interrupted quarantine wrote the record and died before the drain: the next one drains (with a
    # record of its own: test_a_drain_of_a_node_in_service_always_writes_a_fresh_record)
    recorded = {**_node("idle"), "comment": slurm.encode_record("gpu_health", "r1", "2026-12-03T00:00:00Z")}
    assert slurm.plan_drain(recorded, "fleetops: gpu_health")[0] == ["comment", "drain"]
    # someone resumed a node we drained: unquarantine removes the stale record only
    assert slurm.plan_resume(recorded)[0] == ["uncomment"]


@pytest.mark.parametrize("capture", ["idle", "draining"])
def test_a_drain_of_a_node_in_service_always_writes_a_fresh_record(capture: str) -> None:
    """An old record of ours left on a node in service (an admin's RESUME of our drain, an unquarantine cut
    off between its resume and its uncomment, a quarantine cut off before its drain) is replaced before the
    drain, never reused: its time is what the ladder's drain_wait counts from, and an old one made the wait
    "past" at once, so the next rung rebooted a node whose jobs still ran (issue 38)."""
    old = slurm.encode_record("other_check", "20261101T000000Z-abcdef", "2026-11-01T00:00:00Z")
    node = {**_node(capture), "flags": [], "reason": "", "comment": old}  # "draining" less DRAIN: jobs run
    assert slurm.phase(node) == "in"
    steps, note = slurm.plan_drain(node, "fleetops: gpu_health")
    assert (steps, note) == (["comment", "drain"], "drain: fleetops: gpu_health")
    # a node still out of service under our drain (down since, with our reason) keeps its record and time
    down = {**_node("drained"), "state": "DOWN", "flags": []}
    assert slurm.phase(down) == "down" and slurm.reason_ours(down["reason"])
    assert slurm.plan_drain(down, "fleetops: gpu_health")[0] == ["drain"]


def test_the_record_round_trips_and_foreign_comments_are_not_records() -> None:
    text = slurm.encode_record("gpu_health", "20261203T000000Z-abcdef", "2026-12-03T00:00:00Z")
    assert slurm.parse_record(text) == {
        "check": "gpu_health",
        "rollout": "20261203T000000Z-abcdef",
        "time": "2026-12-03T00:00:00Z",
    }
    for other in ("", "fleetops", "fleetops:not json", 'fleetops:{"no":"check"}', "ticket 12"):
        assert slurm.parse_record(other) is None


def test_the_jobs_a_requeue_moves_are_squeues_ids_for_one_checked_node() -> None:
    assert slurm.squeue_args("gpu-01") == [
        "--noheader", "--nodelist=gpu-01", "--states=RUNNING,CONFIGURING,SUSPENDED", "--format=%A",
    ]  # fmt: skip
    assert slurm.parse_job_ids("17\n4\n\n17\n") == ["4", "17"]
    assert slurm.parse_job_ids("") == []
    with pytest.raises(slurm.SlurmError, match="not a job id"):
        slurm.parse_job_ids("4\n5 --signal=KILL\n")
    with pytest.raises(slurm.SlurmError, match="starts with '-'"):
        slurm.squeue_args("-all")
