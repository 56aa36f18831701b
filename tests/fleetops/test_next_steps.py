"""Each finding's ``next`` (fleetops.next_steps): the remediation and the dry-run command for its host,
derived from the remediations' declarations (``Fixes``, ``Param.from_finding``) and the policy's rungs;
every command parsed back by the real CLI parser; hostile host names; the findings-first table."""

from __future__ import annotations

import io
import json
import shlex
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from fleetops import api, next_steps, scan, schemas
from fleetops.ansible.runner import PlaybookRun, RunnerOptions, TaskResult
from fleetops.cli.app import build_parser, main
from fleetops.cli.remediate import remediation_request
from fleetops.cli.render import render_scan
from fleetops.cli.render_findings import GROUP_ABOVE
from fleetops.documents import DocumentError
from fleetops.policy import LadderState, default_policy_path, load_policy, parse_policy
from fleetops.remediations import REMEDIATIONS
from fleetops.rollout.guards import target_name_problem
from fleetops.scan import report_document
from tests.fleetops.test_fix_plan import _container_findings
from tests.fleetops.test_policy import (
    ZOMBIE,
    crashloop_finding,
    ec2_findings,
    ena_finding,
    gpu_nvlink_finding,
    gpu_xid_finding,
    ucx_finding,
)
from tests.unit.plugins.module_utils.test_units import FakeSystemctl, _systemd_dirs

INV = "inventory/lab.yml"
T0 = 1_800_000_000.0


def unexpected_unit_finding(tmp_path: Path) -> dict[str, Any]:
    from ansible_collections.fleetops.node.plugins.module_utils import units

    run_dir, dirs = _systemd_dirs(tmp_path)
    facts = units.collect(FakeSystemctl(), systemd_dir=run_dir, config_dirs=dirs)
    (finding,) = units.evaluate(facts, ["ssh", "systemd-*", "*.target"])
    return dict(finding)


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Findings the detectors make from captured inputs, one or more of every check a remediation declares."""
    tmp = tmp_path_factory.mktemp("findings")
    (tmp / "ena").mkdir()
    (tmp / "units").mkdir()
    return [
        ZOMBIE,
        crashloop_finding(),
        *_container_findings(),
        ucx_finding(fixable=True),
        ucx_finding(fixable=False),
        gpu_xid_finding(),
        gpu_nvlink_finding(),
        *ec2_findings("instance-retirement", "instance-reboot", "system-maintenance"),
        ena_finding(tmp / "ena"),
        unexpected_unit_finding(tmp / "units"),
    ]


def parsed(argv: list[str]) -> Any:
    """``argv`` (a next step's) as the real CLI parses it."""
    assert argv[:2] == ["fleetops", "remediate"]
    return build_parser().parse_args(argv[1:])


def expected_value(remediation: str, name: str, value: Any) -> Any:
    p = REMEDIATIONS[remediation].parameters_by_name[name]
    return [value] if p.kind == "repeat" and not isinstance(value, list) else value


# ------------------------------------------------------------------------- derived from the declarations


def test_every_declared_fix_gives_a_command_the_cli_parses_to_that_remediation(
    real: list[dict[str, Any]],
) -> None:
    """For every remediation and every finding it declares (``Remediation.fixes``), a real finding it acts
    on; its command parses to that remediation, with each option the finding gives and the host as -l."""
    steps = next_steps.NextSteps(inventory=(INV,))
    declared = 0
    for r in REMEDIATIONS.values():
        for fx in r.fixes:
            covered = [f for f in real if fx.params_for(f) is not None]
            assert covered, f"{r.name}: no real finding of {fx.check} it acts on: add one to the fixture"
            for finding in covered:
                params = steps.params(r, finding, {})
                assert params is not None, (r.name, finding["summary"])
                argv = steps.argv(r, params, "gpu-01")
                args = parsed(argv)
                assert (args.command, args.remediation, args.limit) == ("remediate", r.name, "gpu-01")
                assert [str(p) for p in args.inventory] == [INV] and not args.apply  # a dry run
                for name, value in fx.params_for(finding).items():  # type: ignore[union-attr]
                    assert getattr(args, name) == expected_value(r.name, name, value), (r.name, name)
                for name, source in r.from_finding().items():
                    if source == "check":
                        assert getattr(args, name) == finding["check"]
                request = remediation_request(args)  # what `fleetops remediate` would run
                assert request.action == r.name
                # the same extra vars reach the hosts as the declaration's parameters give
                assert r.extravars(r.resolve(request.params)) == r.extravars(r.resolve(params))
                declared += 1
    assert declared >= len([r for r in REMEDIATIONS.values() if r.fixes])


def test_each_real_finding_gets_the_default_policys_rung_and_a_command_naming_it(
    real: list[dict[str, Any]],
) -> None:
    steps, record = next_steps.load(None, None, [INV], T0)
    assert record == {"policy": "default"} and steps.ladder is None
    policy = load_policy(default_policy_path())
    seen = set()
    for finding in real:
        step = steps.finding("gpu-01", finding)
        rule = policy.rule_for(finding)
        if rule is None:
            assert step is None or "rung" not in step
            continue
        assert step is not None and step["rung"]["rule"] == rule.name, finding["summary"]
        rung = rule.ladder[0]  # no ladder recorded: the first rung
        assert (step["rung"]["rung"], step["rung"]["rungs"], step["rung"]["action"]) == (
            1,
            len(rule.ladder),
            rung.action,
        )
        if step["command"] is not None:
            args = parsed(step["argv"])
            assert shlex.split(step["command"]) == step["argv"]
            assert args.remediation == step["remediation"]
            if rung.action != "human":  # the rung's own action, with its params
                assert step["remediation"] == rung.action
                for name, value in rung.params.items():
                    assert getattr(args, name) == value
            seen.add(step["remediation"])
        else:  # only a person acts: the rung says what to do
            assert step["remediation"] is None and step["rung"]["action"] == "human"
    assert {"fix", "quarantine", "stop-start", "reboot", "disable-unit"} <= seen


def test_a_human_rung_still_offers_the_declared_remediation_and_a_ladder_climbs(
    real: list[dict[str, Any]],
) -> None:
    unexpected = next(f for f in real if f["check"] == "unexpected_unit")
    steps, _ = next_steps.load(None, None, [], T0)
    step = steps.finding("gpu-01", unexpected)
    assert step is not None and step["rung"]["action"] == "human" and step["rung"]["status"] == "human"
    assert step["command"] == "fleetops remediate disable-unit --unit ecs.service -l gpu-01"
    # fix tried 30 min ago on the zombie ladder (gets 20 min): the next rung is reclaim
    ladder = LadderState()
    ladder.record("gpu-01", "zombie-memcg", "zombie_memcg", 0, "fix", T0 - 1800)
    one = next_steps.NextSteps(steps.policy, "default", ladder, (), T0)
    climbed = one.finding("gpu-01", ZOMBIE)
    assert climbed is not None and climbed["remediation"] == "reclaim"
    # the same finding on a host without a ladder (decided apart: a host's ladders are part of the decision)
    fresh = one.finding("gpu-02", ZOMBIE)
    assert fresh is not None and fresh["remediation"] == "fix" and fresh["command"].endswith("-l gpu-02")
    again = one.finding("gpu-03", ZOMBIE)
    assert again is not None and again["argv"][-1] == "gpu-03" and again["rung"] == fresh["rung"]
    assert (climbed["rung"]["rung"], climbed["rung"]["action"], climbed["rung"]["status"]) == (
        2,
        "reclaim",
        "act",
    )
    waiting = next_steps.NextSteps(steps.policy, "default", ladder, (), T0 - 1500).finding("gpu-01", ZOMBIE)
    assert waiting is not None and waiting["rung"]["status"] == "wait" and waiting["remediation"] == "fix"
    # the last rung tried long ago and the finding persists: the ladder ran out, a person decides; the
    # declared remediation is offered, not the exhausted rung's again
    only_reboot = parse_policy(
        "schema: fleetops.policy/v1\nbudgets: {reboot: {max: 1}}\nrules:\n  - name: loops\n"
        "    match: [{check: crashloop_unit}]\n    ladder: [{action: reboot, clear_after: 1h}]\n",
        "p.yml",
    )
    ran_out = LadderState()
    ran_out.record("gpu-01", "loops", "crashloop_unit", 0, "reboot", T0 - 86400)
    out = next_steps.NextSteps(only_reboot, "p.yml", ran_out, (), T0).finding("gpu-01", crashloop_finding())
    assert out is not None and out["rung"]["status"] == "exhausted" and out["rung"]["action"] == "reboot"
    assert out["remediation"] == "fix"  # the declared one: not the exhausted rung's reboot again
    # no policy rule (an info finding): nothing to do
    assert steps.finding("gpu-01", ucx_finding(fixable=True, severity="info")) is None


def test_a_protected_unit_or_a_value_the_remediation_refuses_is_no_command(
    real: list[dict[str, Any]],
) -> None:
    steps = next_steps.NextSteps()  # no policy: the declarations alone
    loop = next(f for f in real if f["check"] == "crashloop_unit")
    docker = {**loop, "data": {**loop["data"], "unit": "docker.service"}}
    assert steps.finding("h", docker) is None  # fix leaves a protected unit to a person; so does disable-unit
    disable = REMEDIATIONS["disable-unit"]
    assert steps.params(disable, loop, {}) == {"unit": loop["data"]["unit"]}
    assert steps.params(disable, {**loop, "data": {**loop["data"], "unit": "bad unit!!"}}, {}) is None


HOSTILE = [
    "gpu$(touch${IFS}/tmp/pwned)",
    "it's",
    "a;rm${IFS}-rf${IFS}/",
    "`id`",
    "host\\name",
    "$HOME",
    "a|b",
    "ümlaut-01",
]
REFUSED = ["gpu-*", "a,b", "!spare", "-l", "two words", "x\ny", "@file", "all", ""]


@pytest.mark.parametrize("host", HOSTILE)
def test_hostile_host_names_are_quoted_and_parse_back_exactly(host: str) -> None:
    assert target_name_problem(host) is None
    step = next_steps.NextSteps(inventory=("inv dir/$x.yml",)).finding(host, crashloop_finding())
    assert step is not None and step["command"] is not None
    assert shlex.split(step["command"]) == step["argv"]
    args = parsed(shlex.split(step["command"]))
    assert args.limit == host and [str(p) for p in args.inventory] == ["inv dir/$x.yml"]


@pytest.mark.parametrize("host", REFUSED)
def test_names_fleetops_cannot_target_exactly_get_the_reason_not_a_command(host: str) -> None:
    step = next_steps.NextSteps().finding(host, crashloop_finding())
    assert step is not None and step["command"] is None and "argv" not in step
    assert step["remediation"] == "fix" and step["refused"].startswith(f"host name {host!r} ")


def test_an_option_value_that_looks_like_an_option_stays_its_value() -> None:
    r = REMEDIATIONS["quarantine"]
    argv = next_steps.NextSteps().argv(r, {"finding": "gpu_health", "reason": "-x --apply"}, "h")
    args = parsed(argv)
    assert args.reason == "-x --apply" and not args.apply and args.limit == "h"


# ------------------------------------------------------------------------------------- a real scan


def _entry(findings: list[dict[str, Any]]) -> dict[str, Any]:
    return {"findings": findings, "facts": {}, "errors": [], "checks": ["zombie_memcg"]}


class _Runner:
    """ansible-runner's stand-in: every inventory host answers with its findings."""

    def __init__(self, hosts: dict[str, list[dict[str, Any]]]) -> None:
        self.hosts = hosts
        self.calls = 0

    def __call__(self, opts: RunnerOptions, on_result: Callable[[TaskResult], None] | None = None,
                 cancel: threading.Event | None = None) -> PlaybookRun:  # fmt: skip
        self.calls += 1
        run = PlaybookRun(status="successful", rc=0)
        for host, findings in self.hosts.items():
            tr = TaskResult(host, "ok", "scan", "fleetops.node.node_health", _entry(findings))
            run.tasks[host] = [tr]
            if on_result is not None:
                on_result(tr)
        return run


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, _Runner]:
    """A stand-in for ansible-playbook's scan: the scans below name --transport ansible (the default's
    direct path would ssh to these names)."""
    hosts = {"lab-01": [ZOMBIE, crashloop_finding()], "lab-02": [ucx_finding(fixable=False)], "lab-03": []}
    inv = tmp_path / "lab.yml"
    inv.write_text("all:\n  hosts:\n" + "".join(f"    {h}:\n" for h in hosts))
    runner = _Runner(hosts)
    monkeypatch.setattr(scan, "run_playbook", runner)
    return inv, runner


def test_the_json_report_and_every_ndjson_line_carry_next(
    fleet: tuple[Path, _Runner], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inv, _ = fleet
    state = tmp_path / "state"
    assert (
        main(
            [
                "scan",
                "-i",
                str(inv),
                "--transport",
                "ansible",
                "-q",
                "--format",
                "json",
                "--state-dir",
                str(state),
            ]
        )
        == 1
    )
    report = json.loads(capsys.readouterr().out)
    schemas.validate_scan_report(report, "report")
    assert report["next_steps"] == {"policy": "default", "ladders": str(state / "ladder.json")}
    zombie, loop = report["hosts"]["lab-01"]["findings"]
    assert zombie["next"]["command"] == f"fleetops remediate fix -i {inv} -l lab-01"
    assert zombie["next"]["rung"]["rule"] == "zombie-memcg" and loop["next"]["rung"]["rule"] == "crashloop"
    (unowned,) = report["hosts"]["lab-02"]["findings"]
    assert unowned["next"]["remediation"] is None and unowned["next"]["rung"]["action"] == "human"
    assert (
        main(
            [
                "scan",
                "-i",
                str(inv),
                "--transport",
                "ansible",
                "-q",
                "--format",
                "ndjson",
                "--state-dir",
                str(state),
            ]
        )
        == 1
    )
    lines = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    for line in lines:
        schemas.validate_scan_host(line, "ndjson")
        assert line["findings"] == report["hosts"][line["host"]]["findings"]


def test_a_bad_policy_is_exit_2_before_any_host_is_contacted(
    fleet: tuple[Path, _Runner], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inv, runner = fleet
    bad = tmp_path / "p.yml"
    bad.write_text("schema: fleetops.policy/v1\nrules: []\n")
    assert main(["scan", "-i", str(inv), "--transport", "ansible", "-q", "--policy", str(bad)]) == 2
    assert runner.calls == 0 and str(bad) in capsys.readouterr().err
    with pytest.raises(DocumentError):
        api.scan(api.ScanRequest(inventory=[inv], policy=tmp_path / "absent.yml", transport="ansible"))
    assert runner.calls == 0
    assert main(["scan", "-i", str(inv), "--transport", "ansible", "-q", "--wide", "--format", "json"]) == 2
    assert "--wide applies to --format table only" in capsys.readouterr().err
    # a policy of one's own: its rung, named by its file
    own = tmp_path / "own.yml"
    own.write_text(
        "schema: fleetops.policy/v1\nbudgets: {reboot: {max: 1}}\n"
        "rules:\n  - name: loops\n    match: [{check: crashloop_unit}]\n"
        "    ladder: [{action: reboot, clear_after: 1h}]\n"
    )
    result = api.scan(
        api.ScanRequest(inventory=[inv], policy=own, state_dir=tmp_path / "s", transport="ansible")
    )
    zombie, loop = result.report["hosts"]["lab-01"]["findings"]
    assert loop["next"]["remediation"] == "reboot" and loop["next"]["rung"]["policy"] == str(own)
    assert zombie["next"]["remediation"] == "fix" and "rung" not in zombie["next"]  # declared; no rule


# ------------------------------------------------------------------------------------------ the table


def render(report: dict[str, Any], **kw: Any) -> str:
    out = io.StringIO()
    render_scan(report, Console(file=out, width=300, color_system=None, highlight=False), **kw)
    return out.getvalue()


def row_cells(text: str) -> list[list[str]]:
    """The rows of the first table in ``text``, each cell's lines joined (show_lines: ├ between rows)."""
    lines = text.splitlines()
    out: list[list[str]] = []
    cells: list[list[str]] | None = None
    started = False
    for line in lines:
        if line.startswith("┡"):
            started, cells = True, None
            continue
        if not started:
            continue
        if line.startswith(("├", "└")):
            if cells is not None:
                out.append([" ".join(p for p in c if p) for c in cells])
            cells = None
            if line.startswith("└"):
                break
            continue
        parts = [p.strip() for p in line.strip("│").split("│")]
        cells = (
            [[p] for p in parts] if cells is None else [[*c, p] for c, p in zip(cells, parts, strict=True)]
        )
    return out


def _report(hosts: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    steps = next_steps.NextSteps(load_policy(default_policy_path()), inventory=(INV,), now=T0)
    doc = report_document(
        {h: {"status": "ok", **_entry(f)} for h, f in hosts.items()}, started=T0, finished=T0 + 1
    )
    return steps.report(doc)


def test_the_table_shows_findings_first_with_the_cause_in_full_and_the_next_step() -> None:
    long = {**ZOMBIE, "summary": ZOMBIE["summary"] + "; " + "a cause that goes on " * 20 + "to its very end"}
    report = _report(
        {"lab-01": [long, crashloop_finding()], "lab-02": [ucx_finding(fixable=False)], "lab-03": []}
    )
    text = render(report)
    assert text.lstrip().startswith("findings, and what to do next")
    header = next(ln for ln in text.splitlines() if ln.startswith("┃"))
    assert [c.strip() for c in header.strip("┃").split("┃")] == ["host", "check", "severity", "cause", "next"]
    rows = {(r[0], r[1]): r for r in row_cells(text)}
    assert " ".join(rows[("lab-01", "zombie_memcg")][3].split()) == " ".join(long["summary"].split())  # whole
    assert rows[("lab-01", "zombie_memcg")][4].startswith(f"fleetops remediate fix -i {INV} -l lab-01")
    assert "rule zombie-memcg rung 1/4 fix: fix now (first rung)" in rows[("lab-01", "zombie_memcg")][4]
    assert rows[("lab-02", "ucx_mmap_hooks")][4].startswith(
        "rule ucx-mmap-hooks-unowned rung 1/1 human: needs a human"
    )
    assert "no findings 1 host(s): lab-03" in text
    for column in ("memcg total", "zombies", "ID headroom"):
        assert column not in text and column in render(report, wide=True)  # the memory-cgroup columns: --wide


def test_hosts_with_the_same_finding_share_a_row_past_a_few_and_its_command_names_them() -> None:
    gpu = gpu_xid_finding()
    few = [f"gpu-{i:02d}" for i in range(GROUP_ABOVE)]
    many = [f"lab-{i:02d}" for i in range(GROUP_ABOVE + 4)]
    report = _report({**{h: [crashloop_finding()] for h in few}, **{h: [gpu] for h in many}})
    rows = row_cells(render(report))
    grouped = [r for r in rows if r[1] == "gpu_health"]
    assert len(grouped) == 1 and grouped[0][0] == ", ".join(many) + f" ({len(many)} hosts)"
    command = grouped[0][4].split(" rule ")[0]
    args = parsed(shlex.split(command))
    assert args.remediation == "quarantine" and args.finding == "gpu_health" and args.limit == ",".join(many)
    assert [r[0] for r in rows if r[1] == "crashloop_unit"] == few  # up to GROUP_ABOVE: a row each


def test_a_summarised_scan_lists_the_next_steps_by_kind_of_finding() -> None:
    hosts = {f"n-{i:03d}": [crashloop_finding()] if i % 2 else [] for i in range(60)}
    text = render(_report(hosts))
    assert "summarised" in text and "next steps (1 of 1 kinds of finding)" in text
    ((check, severity, named, step),) = row_cells(text[text.index("next steps") :])
    assert (check, severity, named) == (
        "crashloop_unit",
        "warning",
        "n-001, n-003, n-005, n-007, n-009, n-011 and 24 more (30 hosts)",
    )
    odd = [h for h in hosts if hosts[h]]
    args = parsed(shlex.split(step.split(" (-l: ")[0]))
    assert args.remediation == "fix" and args.limit == ",".join(odd[:20])
    assert "(-l: the first 20 of 30 hosts; each host's is in --format json)" in step
