"""fleetops.policy: the policy file, the pure decision of ``remediate auto``, and its state files.

Findings come from real inputs wherever they exist: the scan report ``fleetops scan`` wrote
(``documents/scan-3hosts.json``: zombie_memcg warnings) and the collection's own detectors run on
the captured inputs of their unit tests (an H200's nvidia-smi output and Xid lines, an ENA
interface's ethtool counters and reset log, the systemctl output of a crash-looping ecs.service,
IMDS's scheduled-events document). The UCX finding is built by hand in the shape ucx.evaluate
returns (its real inputs need a fake /proc; tests/unit/plugins/module_utils/test_ucx.py covers it).
Time is a fake clock (plain numbers): the decision takes ``now`` as an argument.
"""

from __future__ import annotations

import copy
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from ansible_collections.fleetops.node.plugins.module_utils import crashloop, ec2events, ena, gpu, kernlog
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetops import policy as P
from fleetops.documents import DocumentError
from fleetops.remediations import REMEDIATIONS
from fleetops.schemas import validate_scan_report
from tests.paths import FIXTURES, REPO

DEFAULT = REPO / "policies" / "default.yml"
SCHEMA_FILE = REPO / "schemas" / "policy.schema.json"
T0 = 1_790_000_000.0  # a fake clock's start (2026-09-21)
MIN = 60.0
HOUR = 3600.0


# ------------------------------------------------------------------------------ real findings


def _kernlog(text: str) -> dict[str, Any]:
    return {"source": "journal", "error": None, "lines": kernlog.parse_short_unix(text), "read_at": 0.0,
            "read_ms": 1.0}  # fmt: skip


def _smi(out: str) -> Any:
    return lambda argv: (0, out, "")


SMI_CSV = "".join(
    line
    for line in (FIXTURES / "gpu" / "smi_csv.txt").read_text().splitlines(keepends=True)
    if not line.startswith("rc=")
)
A100_BAD = (
    "1, 00000000:3B:00.0, GPU-x, NVIDIA A100-SXM4-80GB, Enabled, 2, 14, 7, [Not Supported], 3, 1, Yes, Yes\n"
)


def gpu_xid_finding() -> dict[str, Any]:
    """The H200 capture with the kernel log of a failing node: Xid 79, 48, 154, ... (critical)."""
    facts = gpu.collect(_smi(SMI_CSV), _kernlog((FIXTURES / "gpu" / "kernel-xid.txt").read_text()),
                        nvidia_smi="/usr/bin/nvidia-smi")  # fmt: skip
    (finding,) = gpu.evaluate(facts)
    return dict(finding)


def gpu_smi_finding(line: str) -> dict[str, Any]:
    (finding,) = gpu.evaluate(gpu.collect(_smi(line), _kernlog(""), nvidia_smi="/usr/bin/nvidia-smi"))
    return dict(finding)


def gpu_nvlink_finding() -> dict[str, Any]:
    line = "NVRM: Xid (PCI:0000:3b:00): 74, pid=1, name=python3, NVLink: fatal error detected on link 3"
    text = f"1764430600.700903 gpu-host kernel: {line}\n"
    (finding,) = gpu.evaluate(gpu.collect(_smi(SMI_CSV), _kernlog(text), nvidia_smi="/usr/bin/nvidia-smi"))
    return dict(finding)


def ec2_findings(*codes: str) -> list[dict[str, Any]]:
    events = [{"Code": code, "EventId": f"instance-event-{i}", "NotBefore": "3 Feb 2027 00:00:00 GMT",
               "State": "active", "Description": "scheduled"} for i, code in enumerate(codes)]  # fmt: skip
    return [dict(f) for f in ec2events.evaluate({"events": ec2events.parse_imds_events(json.dumps(events))})]


def ena_finding(tmp_path: Path) -> dict[str, Any]:
    """eth0 of an instance whose ENA reset twice (the captured ethtool -S and reset log)."""
    net = tmp_path / "class" / "net"
    net.mkdir(parents=True)
    device = tmp_path / "devices" / "pci0000:00" / "0000:00:05.0"
    device.mkdir(parents=True)
    driver = tmp_path / "bus" / "pci" / "drivers" / "ena"
    driver.mkdir(parents=True)
    os.symlink(driver, device / "driver")
    (net / "eth0").mkdir()
    os.symlink(device, net / "eth0" / "device")
    out = (FIXTURES / "ena" / "ethtool-S-eth0.txt").read_text()
    facts = ena.collect(lambda argv: (0, out, ""), _kernlog((FIXTURES / "ena" / "kernel-ena-reset.txt").read_text()),
                        sys_class_net=str(net), ethtool="/usr/sbin/ethtool")  # fmt: skip
    (finding,) = ena.evaluate(facts)
    return dict(finding)


def crashloop_finding() -> dict[str, Any]:
    """ecs.service crash looping on a lab host (systemctl show capture), between crashes."""
    units, _ = crashloop.parse_units((FIXTURES / "systemd" / "show-crashloop-ecs.txt").read_text())
    (finding,) = crashloop.evaluate({"units": units, "rate_basis": None})
    return dict(finding)


def ucx_finding(fixable: bool, severity: str = "warning") -> dict[str, Any]:
    return {
        "check": "ucx_mmap_hooks",
        "severity": severity,
        "summary": "pid 105 (python3) in ucx-worker.service runs UCX 1.18.0 with mmap hooks on ...",
        "data": {"pid": 105, "comm": "python3", "unit": "ucx-worker.service" if fixable else None,
                 "unit_manager": "system" if fixable else None, "fixable_unit": fixable,
                 "fixed_upstream": severity == "info", "policy": "leaks"},
    }  # fmt: skip


EC2_RETIREMENT = ec2_findings("instance-retirement")
BASE_REPORT = json.loads((FIXTURES / "documents" / "scan-3hosts.json").read_text())
ZOMBIE = BASE_REPORT["hosts"]["localhost"]["findings"][0]


def report(hosts: dict[str, list[dict[str, Any]] | str]) -> dict[str, Any]:
    """A scan report of the real one's shape: each host its findings, or a status ("unreachable")."""
    doc = copy.deepcopy(BASE_REPORT)
    template = doc["hosts"]["localhost"]
    gone = doc["hosts"]["gone"]
    doc["hosts"] = {}
    for host, findings in hosts.items():
        if isinstance(findings, str):
            doc["hosts"][host] = dict(gone, status=findings)
        else:
            doc["hosts"][host] = dict(copy.deepcopy(template), findings=copy.deepcopy(findings))
    doc["summary"]["hosts"] = len(hosts)
    validate_scan_report(doc, "test report")  # every report built here is a valid fleetops.scan/v1
    return doc


@pytest.fixture(scope="module")
def default() -> P.Policy:
    return P.load_policy(DEFAULT)


def policy(text: str) -> P.Policy:
    return P.parse_policy(text, "test.yml")


def az(host: str) -> str | None:
    return {"a": "us-east-1a", "b": "us-east-1b"}.get(host.split("-")[0])


def one(decisions: list[P.Decision], host: str) -> P.Decision:
    (d,) = [d for d in decisions if d.host == host]
    return d


# ------------------------------------------------------------------------------ the files


def test_default_policy_loads_and_encodes_the_incidents(default: P.Policy) -> None:
    names = [r.name for r in default.rules]
    assert names[:2] == ["gpu-fatal", "gpu-reset-required"]  # hardware first
    ladders = {r.name: [rung.action for rung in r.ladder] for r in default.rules}
    assert ladders["gpu-fatal"] == ["quarantine", "stop-start", "replace", "human"]
    assert ladders["zombie-memcg"][:3] == ["fix", "reclaim", "reboot"]  # Pinterest
    assert ladders["ucx-mmap-hooks"][:2] == ["fix", "reboot"]  # Mistral
    assert ladders["ec2-hardware-event"][:2] == ["stop-start", "replace"]
    assert ladders["ena-resets"][:3] == ["reboot", "stop-start", "replace"]
    assert ladders["crashloop"] == ["fix", "human"]
    assert names.index("zombie-memcg") < names.index("ena-resets")  # the cause before its symptom
    assert default.budgets["replace"].group_limit(50) == (1, "1/h")


def test_every_default_rule_has_a_comment_saying_why() -> None:
    lines = DEFAULT.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("  - name: "):
            assert lines[i - 1].lstrip().startswith("#"), f"rule at line {i + 1} has no comment above it"


def test_the_actions_that_exist_are_the_engines_remediation_names() -> None:
    # quarantine, stop-start and replace are being added to REMEDIATIONS by the ladder's other parts
    assert {"fix", "disable-unit", "set-env", "reclaim", "reboot"} <= set(REMEDIATIONS)
    assert set(P.ACTIONS) - set(REMEDIATIONS) <= {"quarantine", "stop-start", "replace", "human"}


def test_committed_json_schema_is_the_generated_one() -> None:
    assert SCHEMA_FILE.read_text() == P.json_schema_text(), (
        "schemas/policy.schema.json is stale: python -m fleetops.policy --write schemas"
    )


def test_json_schema_accepts_the_default_policy_and_rejects_a_typo() -> None:
    schema = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    doc = yaml.safe_load(DEFAULT.read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)
    doc["rules"][0]["ladder"][0]["clear_afer"] = "1m"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema).validate(doc)
    bad = yaml.safe_load(DEFAULT.read_text())
    bad["rules"][0]["ladder"][0]["clear_after"] = "15 min"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema).validate(bad)


def test_check_command_validates_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("schema: fleetops.policy/v1\nrules: []\n")
    out = subprocess.run([sys.executable, "-m", "fleetops.policy", "--check", str(DEFAULT), str(bad)],
                         capture_output=True, text=True, check=False, timeout=60)  # fmt: skip
    assert out.returncode == 2
    assert out.stdout == f"{DEFAULT}: ok (15 rules)\n"
    assert out.stderr.count("\n") == 1 and out.stderr.startswith(f"{bad}: rules: ")


MINIMAL = """\
schema: fleetops.policy/v1
budgets:
  fix: {unlimited: true}
  reboot: {unlimited: true}
rules:
  - name: r
    match: [{check: ena_resets}]
    ladder:
      - {action: reboot, clear_after: 15m}
"""


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "test.yml: empty file: no fleetops.policy/v1 document"),
        ("rules: [\n", "test.yml: not valid YAML: "),
        ("- a\n- b\n", "test.yml: not a fleetops.policy/v1 document: a mapping was expected, got a list"),
        ("schema: fleetops.scan/v1\nrules: []\n", "test.yml: schema: not a fleetops.policy/v1 document"),
        (MINIMAL.replace("clear_after", "clear_afer"), "test.yml: rules[0].ladder[0].clear_afer: Extra inputs"),
        (MINIMAL.replace("ena_resets", "ena_reset"), "test.yml: rules[0].match[0].check: unknown check 'ena_reset'"),
        (MINIMAL.replace("reboot", "reimage"), "test.yml: rules[0].ladder[0].action: Input should be 'fix'"),
        (MINIMAL.replace("15m", "15 min"), "test.yml: rules[0].ladder[0].clear_after: not a duration: '15 min'"),
        (MINIMAL.replace("15m", "15"), "test.yml: rules[0].ladder[0].clear_after: Input should be a valid string"),
        (MINIMAL.replace(", clear_after: 15m", ""), "test.yml: rules[0].ladder[0].clear_after: required: the time"),
        (MINIMAL.replace("{action: reboot, clear_after: 15m}", "{action: human}\n      - {action: reboot, clear_after: 1m}"),
         "test.yml: rules[0].ladder[0].action: 'human' ends a ladder"),
        (MINIMAL.replace("ladder:\n      - {action: reboot, clear_after: 15m}", "ladder: []"),
         "test.yml: rules[0].ladder: List should have at least 1 item"),
        (MINIMAL + "  - name: r\n    match: [{check: gpu_health}]\n    ladder: [{action: human}]\n",
         "test.yml: rules[1].name: rule 'r' is defined twice"),
        (MINIMAL.replace("  - name: r\n", "  - name: r\n    name: s\n"), "test.yml: not valid YAML: found a duplicate key 'name'"),
        (MINIMAL.replace("reboot: {unlimited: true}", "reboot: {window: 1h}"), "test.yml: budgets.reboot: no limit: give max, per_group"),
        (MINIMAL.replace("reboot: {unlimited: true}", "reboot: {per_group_pct: 0}"), "test.yml: budgets.reboot.per_group_pct: Input should be greater than 0"),
        (MINIMAL.replace("reboot: {unlimited: true}", "reboot: {per_group: 1, window: 8d}"), "test.yml: budgets.reboot.window: must be more than 0 and at most 7d"),
        (MINIMAL.replace("budgets:\n", "budgets:\n  human: {per_group: 1}\n"), "test.yml: budgets.human: 'human' runs nothing"),
        (MINIMAL.replace("budgets:\n", "budgets:\n  reimage: {per_group: 1}\n"), "test.yml: budgets.reimage: unknown action 'reimage' (known: fix, disable-unit, "),
        (MINIMAL.replace("{check: ena_resets}", "{check: ena_resets, data: {x: {}}}"), "test.yml: rules[0].match[0].data.x: an empty condition"),
        (MINIMAL.replace("{check: ena_resets}", "{check: ena_resets, data: {x: {matches: a}}}"),
         "test.yml: rules[0].match[0].data.x.matches: Extra inputs are not permitted"),
        (MINIMAL.replace("{check: ena_resets}", "{check: ena_resets, severity: [fatal]}"),
         "test.yml: rules[0].match[0].severity[0]: Input should be 'critical', 'warning' or 'info'"),
        (MINIMAL.replace("name: r", "name: 'Bad Name\u2028'"), "test.yml: rules[0].name: String should match pattern"),
        ("schema: fleetops.policy/v1\nrules:\n  - name: r\n    match: [{check: ena_resets}]\n    ladder:\n      - {action: human, params: {a: 1}}\n",
         "test.yml: rules[0].ladder[0].params: 'human' runs nothing"),
        (MINIMAL.replace("  reboot: {unlimited: true}\n", ""),
         "test.yml: rules[0].ladder[0].action: rule r: reboot has no budget: give budgets.reboot a limit"),
        (MINIMAL.replace("reboot: {unlimited: true}", "reboot: {unlimited: true, max: 3}"),
         "test.yml: budgets.reboot.unlimited: an unlimited budget has no max"),
        (MINIMAL.replace("clear_after: 15m", "clear_after: 0s"), "test.yml: rules[0].ladder[0].clear_after: must be more than 0"),
        (MINIMAL.replace("clear_after: 15m}", "clear_after: 15m, params: {kube_drain: 'false'}}"),
         "test.yml: rules[0].ladder[0].params.kube_drain: remediate reboot --kube-drain: must be true or false, got 'false'"),
        (MINIMAL.replace("clear_after: 15m}", "clear_after: 15m, params: {reboot_timeout: 10m}}"),
         "test.yml: rules[0].ladder[0].params.reboot_timeout: remediate reboot --reboot-timeout: not an integer: '10m'"),
        (MINIMAL.replace("clear_after: 15m}", "clear_after: 15m, params: {reboot_timeout: '600'}}"),
         "test.yml: rules[0].ladder[0].params.reboot_timeout: remediate reboot --reboot-timeout: must be a number, got the string '600'"),
        (MINIMAL.replace("clear_after: 15m}", "clear_after: 15m, params: {drain_timeout: 0}}"),
         "test.yml: rules[0].ladder[0].params.drain_timeout: remediate reboot --drain-timeout: must be between 1 and 86400: '0'"),
        (MINIMAL.replace("{action: reboot, clear_after: 15m}", "{action: fix, clear_after: 15m, params: {method: fast}}"),
         "test.yml: rules[0].ladder[0].params.method: remediate fix --method: must be one of drop_caches, memory_reclaim, both, got 'fast'"),
        (MINIMAL.replace("{action: reboot, clear_after: 15m}", "{action: fix, clear_after: 15m, params: {protected: sshd}}"),
         "test.yml: rules[0].ladder[0].params.protected: remediate fix --protected: must be a list, got 'sshd'"),
        (b"schema: fleetops.policy/v1\n\xff\n", "test.yml: not UTF-8 text"),
    ],
)  # fmt: skip
def test_a_bad_policy_is_one_line(text: str | bytes, problem: str) -> None:
    with pytest.raises(DocumentError) as err:
        P.parse_policy(text, "test.yml")
    message = str(err.value)
    assert message.startswith(problem), message
    assert "\n" not in message and "\u2028" not in message and message.isprintable()
    assert err.value.exit_code == 2


def test_load_policy_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(DocumentError, match=r"^.*/none\.yml: no such file$"):
        P.load_policy(tmp_path / "none.yml")
    with pytest.raises(DocumentError, match=r": is a directory, not a file$"):
        P.load_policy(tmp_path)
    path = tmp_path / "p.yml"
    path.write_text(MINIMAL + "description: 2026-01-02\n")  # a date stays text: no timestamp type
    assert P.load_policy(path).description == "2026-01-02"


def test_durations() -> None:
    assert [P.duration_seconds(t) for t in ("0s", "90s", "15m", "2h", "7d", "1h30m")] == [
        0, 90, 900, 7200, 604800, 5400,
    ]  # fmt: skip
    for bad in ("", "15", "15 m", "1.5h", "-1m", "1w"):
        with pytest.raises(ValueError, match="not a duration"):
            P.duration_seconds(bad)
    assert [P.fmt_duration(s) for s in (45, 240, 5400, 9000, 3 * 86400)] == [
        "45 s",
        "4 min",
        "1.5 h",
        "2.5 h",
        "3 d",
    ]


# ------------------------------------------------------------------------------ matching real findings


def test_default_policy_takes_each_real_finding_to_its_rule(default: P.Policy, tmp_path: Path) -> None:
    retirement, system_reboot = ec2_findings("instance-retirement", "system-reboot")
    (instance_reboot,) = ec2_findings("instance-reboot")
    pending = A100_BAD.replace(", 2, 14, 7,", ", 0, 14, 7,").replace("Yes, Yes", "Yes, No")
    cases = {
        "zombie-memcg": ZOMBIE,
        "gpu-fatal": gpu_xid_finding(),  # Xid 79 and 48 in the kernel log
        "gpu-reset-required": gpu_nvlink_finding(),  # Xid 74 alone
        "gpu-remap-pending": gpu_smi_finding(pending),
        "ec2-hardware-event": retirement,
        "ec2-instance-reboot": instance_reboot,
        "ena-resets": ena_finding(tmp_path),
        "crashloop": crashloop_finding(),
        "ucx-mmap-hooks": ucx_finding(fixable=True),
        "ucx-mmap-hooks-unowned": ucx_finding(fixable=False),
    }
    for name, finding in cases.items():
        rule = default.rule_for(finding)
        assert rule is not None and rule.name == name, (name, finding["check"], finding["severity"])
    assert (
        system_reboot["severity"] == "warning"
        and default.rule_for(system_reboot).name == "ec2-hardware-event"
    )  # type: ignore[union-attr]
    bad = gpu_smi_finding(A100_BAD)  # remap failure + uncorrectable ECC on an A100, no Xid
    assert bad["severity"] == "critical" and default.rule_for(bad).name == "gpu-fatal"  # type: ignore[union-attr]
    assert default.rule_for(ucx_finding(fixable=True, severity="info")) is None  # fixed upstream: no fault


def test_data_conditions() -> None:
    pol = policy("""\
schema: fleetops.policy/v1
rules:
  - name: all-ops
    match:
      - check: gpu_health
        data:
          xid: {has_any: [79]}
          xid.79.count: {gte: 2, lt: 10}
          xid.*.severity: {in: [critical]}
          gpus.*.name: {glob: "NVIDIA H*"}
          smi_error: {exists: false}
          new_xid_events: null
    ladder: [{action: human}]
""")
    finding = gpu_xid_finding()
    finding["data"]["gpus"] = [{"name": "NVIDIA H200"}]
    assert P.matches(pol.rules[0].match[0], finding) is False  # smi_error: null is a value
    del finding["data"]["smi_error"]
    assert P.matches(pol.rules[0].match[0], finding) is True
    for change in (
        lambda d: d["xid"]["79"].update(count=1),  # gte 2
        lambda d: d["xid"]["79"].update(count=10),  # lt 10
        lambda d: d["gpus"][0].update(name="Tesla V100"),  # glob
        lambda d: d.update(new_xid_events=0),  # eq null: 0 is not null
        lambda d: d.update(xid={"13": d["xid"]["13"]}),  # has_any 79
    ):
        changed = copy.deepcopy(finding)
        change(changed["data"])
        assert P.matches(pol.rules[0].match[0], changed) is False
    strict = policy(
        MINIMAL.replace("{check: ena_resets}", "{check: ucx_mmap_hooks, data: {pid: true, fixable_unit: 1}}")
    )
    assert (
        P.matches(strict.rules[0].match[0], ucx_finding(fixable=True)) is False
    )  # true is not 1, 1 is not true


# ------------------------------------------------------------------------------ deciding, pass by pass


def run_pass(
    pol: P.Policy, rep: dict[str, Any], ladder: P.LadderState, ledger: P.BudgetLedger, now: float, **kw: Any
) -> list[P.Decision]:
    before = (json.dumps(ladder.to_json()), json.dumps(ledger.to_json()))
    decisions = P.decide(pol, rep, ladder, ledger, now, az, **kw)
    assert (json.dumps(ladder.to_json()), json.dumps(ledger.to_json())) == before  # decide is pure
    P.commit(decisions, ladder, ledger, now)
    return decisions


def test_a_failed_detector_keeps_its_ladder_instead_of_reading_as_clean(
    default: P.Policy, tmp_path: Path
) -> None:
    """A scan whose ena_resets detector failed on the host cannot say the NIC is fine: the ladder in
    progress is kept (not reset, its rung's time still counting) and the decision says so; a rule
    whose detector ran is still reset."""
    ladder, ledger = P.LadderState(), P.BudgetLedger()
    sick = report({"a-1": [ena_finding(tmp_path)]})
    assert one(run_pass(default, sick, ladder, ledger, T0), "a-1").action == "reboot"
    blind = report({"a-1": []})
    blind["hosts"]["a-1"]["errors"] = [{"check": "ena_resets", "msg": "cannot read ethtool: timed out"}]
    d = one(run_pass(default, blind, ladder, ledger, T0 + 10 * MIN), "a-1")
    assert (d.status, d.reset, d.blind) == ("clean", (), ("ena-resets",))
    assert d.reason == "clean; ladder kept: its detector failed on the host: ena-resets (ena_resets)"
    assert d.to_dict()["blind"] == ("ena-resets",)
    rec = ladder.get("a-1", "ena-resets")
    assert rec is not None and rec.rung == 0  # kept: the next pass with a working detector climbs from here
    other = report({"a-1": []})
    other["hosts"]["a-1"]["errors"] = [{"check": "cpu_starvation", "msg": "no /proc/pressure"}]
    d = one(run_pass(default, other, ladder, ledger, T0 + 20 * MIN), "a-1")
    assert (d.status, d.reset, d.blind) == ("clean", ("ena-resets",), ())
    assert "blind" not in d.to_dict()  # documents of passes without one are as before


def test_the_ladder_climbs_only_after_the_clear_time_and_resets_on_a_clean_scan(
    default: P.Policy, tmp_path: Path
) -> None:
    ladder, ledger = P.LadderState(), P.BudgetLedger()
    sick = report({"a-1": [ena_finding(tmp_path)]})
    d = one(run_pass(default, sick, ladder, ledger, T0), "a-1")
    assert (d.status, d.rule, d.rung, d.action) == ("act", "ena-resets", 0, "reboot")
    assert d.line() == "a-1: ena_resets (warning) rule ena-resets rung 1/4 reboot: reboot now (first rung)"
    d = one(run_pass(default, sick, ladder, ledger, T0 + 4 * MIN), "a-1")
    assert (d.status, d.action) == ("wait", None)
    assert d.reason == "waiting: rung reboot tried 4 min ago, gets 60 min"
    d = one(run_pass(default, sick, ladder, ledger, T0 + 59 * MIN), "a-1")
    assert d.status == "wait"
    d = one(run_pass(default, sick, ladder, ledger, T0 + 60 * MIN), "a-1")
    assert (d.status, d.rung, d.action) == ("act", 1, "stop-start")
    assert d.reason == "stop-start now (climbing: rung reboot tried 60 min ago did not clear it)"
    d = one(run_pass(default, sick, ladder, ledger, T0 + 150 * MIN), "a-1")
    assert (d.rung, d.action) == (2, "replace")
    rec = ladder.get("a-1", "ena-resets")
    assert rec is not None and (rec.rung, rec.first_tried, rec.last_tried, rec.tries) == (
        2,
        T0,
        T0 + 150 * MIN,
        3,
    )
    d = one(run_pass(default, sick, ladder, ledger, T0 + 280 * MIN), "a-1")
    assert (d.status, d.rung, d.action) == ("human", 3, "human")
    assert d.reason.startswith("needs a human: the NIC resets on new hardware")
    d = one(run_pass(default, sick, ladder, ledger, T0 + 400 * MIN), "a-1")
    assert (d.status, d.action) == ("human", None)
    assert d.reason.startswith("needs a human (since 2 h): the NIC")
    assert [e.action for e in ledger.entries] == ["reboot", "stop-start", "replace"]  # a note takes no budget

    d = one(run_pass(default, report({"a-1": []}), ladder, ledger, T0 + 401 * MIN), "a-1")
    assert (d.status, d.reason, d.reset) == (
        "clean",
        "clean; ena-resets reset (was at human)",
        ("ena-resets",),
    )
    assert ladder.hosts == {}
    d = one(run_pass(default, sick, ladder, ledger, T0 + 402 * MIN), "a-1")
    assert (d.status, d.rung, d.action) == ("act", 0, "reboot")  # a recurrence starts at the bottom


def test_a_host_not_scanned_keeps_its_ladder(default: P.Policy) -> None:
    ladder, ledger = P.LadderState(), P.BudgetLedger()
    run_pass(default, report({"a-1": [gpu_xid_finding()]}), ladder, ledger, T0)
    d = one(run_pass(default, report({"a-1": "unreachable"}), ladder, ledger, T0 + HOUR), "a-1")
    assert d.status == "not_scanned" and d.reason.startswith("not scanned (unreachable): ")
    assert d.reason.endswith("ladders left as they are") and d.action is None
    d = one(run_pass(default, report({"a-1": [gpu_xid_finding()]}), ladder, ledger, T0 + HOUR), "a-1")
    assert (d.rule, d.rung, d.action) == ("gpu-fatal", 1, "stop-start")


def test_one_rule_per_host_in_policy_order_the_others_wait(default: P.Policy) -> None:
    ladder, ledger = P.LadderState(), P.BudgetLedger()
    rep = report({"a-1": [crashloop_finding(), ZOMBIE, ucx_finding(fixable=True)]})
    d = one(run_pass(default, rep, ladder, ledger, T0), "a-1")
    assert (d.rule, d.action, d.waiting_rules) == ("zombie-memcg", "fix", ("ucx-mmap-hooks", "crashloop"))
    assert d.line().endswith("(then: ucx-mmap-hooks, crashloop)")
    # the fix turned ecs.service off: the crash loop is gone, the zombies are still there
    d = one(run_pass(default, report({"a-1": [ZOMBIE]}), ladder, ledger, T0 + 20 * MIN), "a-1")
    assert (d.rule, d.action, d.waiting_rules) == ("zombie-memcg", "reclaim", ())
    assert ladder.rules("a-1") == ["zombie-memcg"]


def test_unmatched_and_info_findings(default: P.Policy) -> None:
    loose = policy(MINIMAL)
    rep = report({"a-1": [ZOMBIE], "a-2": [ucx_finding(fixable=True, severity="info")], "a-3": []})
    decisions = P.decide(loose, rep, P.LadderState(), P.BudgetLedger(), T0, az)
    assert [(d.host, d.status, d.reason) for d in decisions] == [
        ("a-1", "no_rule", "no rule matches: zombie_memcg (warning)"),
        ("a-2", "clean", "clean"),
        ("a-3", "clean", "clean"),
    ]
    assert decisions[0].line() == "a-1: no rule matches: zombie_memcg (warning)"


def test_a_policy_change_keeps_the_rung_by_its_action_or_starts_over() -> None:
    ladder = P.LadderState()
    ladder.record("a-1", "r", "ena_resets", 0, "reboot", T0)
    moved = policy(
        MINIMAL.replace(
            "      - {action: reboot", "      - {action: fix, clear_after: 1m}\n      - {action: reboot"
        )
    )
    d = one(P.decide(moved, report({"a-1": [{"check": "ena_resets", "severity": "warning", "summary": "x", "data": {}}]}),
                     ladder, P.BudgetLedger(), T0 + MIN, az), "a-1")  # fmt: skip
    assert (d.status, d.rung, d.rung_action) == ("wait", 1, "reboot")
    gone = policy(MINIMAL.replace("reboot", "stop-start"))
    d = one(P.decide(gone, report({"a-1": [{"check": "ena_resets", "severity": "warning", "summary": "x", "data": {}}]}),
                     ladder, P.BudgetLedger(), T0 + MIN, az), "a-1")  # fmt: skip
    assert (d.status, d.rung, d.action) == ("act", 0, "stop-start")
    assert "the policy changed: reboot is no longer on this ladder, starting over" in d.reason


# ------------------------------------------------------------------------------ budgets


REPLACE_NOW = """\
schema: fleetops.policy/v1
budgets:
  replace: {per_group: 1}
  reboot: {window: 30m, max: 3, per_group: 5, per_group_pct: 10}
rules:
  - name: hw
    match: [{check: ec2_scheduled_event}]
    ladder:
      - {action: replace, clear_after: 2h}
  - name: nic
    match: [{check: ena_resets}]
    ladder:
      - {action: reboot, clear_after: 1h}
"""


def test_a_budget_of_one_per_hour_blocks_a_second_replace_and_says_so() -> None:
    pol = policy(REPLACE_NOW)
    ladder, ledger = P.LadderState(), P.BudgetLedger()
    (event,) = ec2_findings("instance-retirement")
    rep = report({"a-1": [event], "a-2": [event], "b-1": [event]})
    decisions = run_pass(pol, rep, ladder, ledger, T0)
    assert [(d.host, d.status, d.action) for d in decisions] == [
        ("a-1", "act", "replace"), ("a-2", "budget", None), ("b-1", "act", "replace"),
    ]  # fmt: skip
    assert one(decisions, "a-2").reason == "budget: replace 1/h in group us-east-1a used"
    assert one(decisions, "a-2").line() == (
        "a-2: ec2_scheduled_event (critical) rule hw rung 1/1 replace: budget: replace 1/h in group us-east-1a used"
    )
    assert ladder.get("a-2", "hw") is None  # nothing was tried: the rung waits for its budget
    d = one(run_pass(pol, rep, ladder, ledger, T0 + 59 * MIN), "a-2")
    assert (d.status, d.reason) == ("budget", "budget: replace 1/h in group us-east-1a used")
    d = one(run_pass(pol, rep, ladder, ledger, T0 + 60 * MIN + 1), "a-2")
    assert (d.status, d.action) == ("act", "replace")


def test_percent_budgets_per_group_and_the_smaller_limit_wins() -> None:
    pol = policy(REPLACE_NOW)
    budget = pol.budgets["reboot"]
    assert budget.group_limit(20) == (2, "10% (2 of 20 hosts) per 30m")
    assert budget.group_limit(5) == (1, "10% (1 of 5 hosts) per 30m")  # rounded down, at least 1
    assert budget.group_limit(100) == (5, "5 per 30m")  # the count is smaller
    nic = {"check": "ena_resets", "severity": "warning", "summary": "eth0 reset", "data": {}}
    hosts = {f"a-{i}": [nic] for i in range(1, 4)} | {"b-1": [nic]}
    sizes = {"us-east-1a": 20, "us-east-1b": 40}
    ladder, ledger = P.LadderState(), P.BudgetLedger()
    decisions = run_pass(pol, report(hosts), ladder, ledger, T0, group_sizes=sizes)
    assert [(d.host, d.status) for d in decisions] == [
        ("a-1", "act"), ("a-2", "act"), ("a-3", "budget"), ("b-1", "act"),
    ]  # fmt: skip
    assert (
        one(decisions, "a-3").reason == "budget: reboot 10% (2 of 20 hosts) per 30m in group us-east-1a used"
    )
    more = {f"b-{i}": [nic] for i in range(2, 5)}
    decisions = run_pass(pol, report(more), ladder, ledger, T0 + MIN, group_sizes=sizes)
    assert [(d.host, d.status) for d in decisions] == [
        ("b-2", "budget"),
        ("b-3", "budget"),
        ("b-4", "budget"),
    ]
    assert one(decisions, "b-2").reason == "budget: reboot 3 per 30m across the fleet used"
    decisions = run_pass(pol, report(more), ladder, ledger, T0 + 31 * MIN, group_sizes=sizes)
    assert [(d.host, d.status) for d in decisions] == [("b-2", "act"), ("b-3", "act"), ("b-4", "act")]


def test_group_sizes_default_to_the_reports_hosts_and_no_group_is_one_group() -> None:
    pol = policy(
        REPLACE_NOW.replace("{window: 30m, max: 3, per_group: 5, per_group_pct: 10}", "{per_group_pct: 50}")
    )
    nic = {"check": "ena_resets", "severity": "warning", "summary": "eth0 reset", "data": {}}
    hosts = {f"a-{i}": [nic] for i in range(1, 5)} | {"x-1": [nic], "x-2": [nic]}
    decisions = P.decide(pol, report(hosts), P.LadderState(), P.BudgetLedger(), T0, az)
    assert [(d.host, d.group, d.status) for d in decisions] == [
        ("a-1", "us-east-1a", "act"), ("a-2", "us-east-1a", "act"), ("a-3", "us-east-1a", "budget"),
        ("a-4", "us-east-1a", "budget"), ("x-1", "-", "act"), ("x-2", "-", "budget"),
    ]  # fmt: skip


def test_spending_counts_the_ledger_against_the_budgets() -> None:
    ledger = P.BudgetLedger()
    budget = P.Budget(per_group=1, max=2)

    def blocked(group: str, now: float, budgets: dict[str, P.Budget] | None = None) -> str | None:
        spending = P.Spending(ledger, {"replace": budget} if budgets is None else budgets, now)
        return spending.blocked("replace", group, 10)

    assert blocked("g1", T0) is None and blocked("g1", T0, {}) is None
    ledger.record("replace", "h1", "g1", T0)
    ledger.record("reboot", "h2", "g2", T0)  # another action: another budget
    assert blocked("g1", T0 + 1) == "budget: replace 1/h in group g1 used"
    assert blocked("g2", T0 + 1) is None
    ledger.record("replace", "h3", "g2", T0 + 2)
    assert blocked("g3", T0 + 3) == "budget: replace 2/h across the fleet used"
    assert blocked("g1", T0 + HOUR) is None  # the first one left the window
    # another controller's clock behind the one that took it, within the skew allowed: it counts
    assert blocked("g1", T0 - 10) == "budget: replace 2/h across the fleet used"
    assert blocked("g1", T0 - P.CLOCK_SKEW_S - 1) is None  # before any was taken


# ------------------------------------------------------------------------------ state files


def test_state_files_round_trip_atomically_and_privately(tmp_path: Path, default: P.Policy) -> None:
    ladder, ledger = P.LadderState(), P.BudgetLedger()
    run_pass(default, report({"a-1": [gpu_xid_finding()], "b-1": [ZOMBIE]}), ladder, ledger, T0)
    lpath, bpath = tmp_path / "state" / "ladder.json", tmp_path / "state" / "ledger.json"
    ladder.save(lpath)
    ledger.save(bpath, now=T0)
    assert stat.S_IMODE(lpath.stat().st_mode) == 0o600 and stat.S_IMODE(bpath.stat().st_mode) == 0o600
    assert stat.S_IMODE(lpath.parent.stat().st_mode) == 0o700
    assert sorted(p.name for p in lpath.parent.iterdir()) == ["ladder.json", "ledger.json"]  # no temp left
    assert P.LadderState.load(lpath) == ladder
    assert P.BudgetLedger.load(bpath) == ledger
    assert json.loads(lpath.read_text())["hosts"]["a-1"]["gpu-fatal"] == {
        "action": "quarantine", "check": "gpu_health", "first_tried": T0, "last_tried": T0, "rung": 0, "tries": 1,
        "quarantined": True,
    }  # fmt: skip
    assert P.LadderState.load(tmp_path / "none.json") == P.LadderState()  # the first pass
    ledger.save(bpath, now=T0 + 8 * 86400)  # older than any window: forgotten
    assert P.BudgetLedger.load(bpath).entries == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "empty file: no JSON document"),
        ('{"schema": "fleetops.policy.ladder/v1", "hosts": {"a": {"r": {"check": "x", "rung": -1, '
         '"action": "reboot", "first_tried": 1, "last_tried": 1}}}}', "hosts.a.r.rung: Input should be greater"),
        ('{"schema": "fleetops.policy.ledger/v1", "entries": []}', "schema: Input should be 'fleetops.policy.ladder/v1'"),
        ("[1]", "not a fleetops.policy.ladder/v1 document"),
    ],
)  # fmt: skip
def test_a_bad_ladder_file_is_one_line(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "ladder.json"
    path.write_text(text)
    with pytest.raises(DocumentError) as err:
        P.LadderState.load(path)
    assert str(err.value) == f"{path}: {problem}" or str(err.value).startswith(f"{path}: {problem}")
    assert "\n" not in str(err.value)


def test_a_bad_ledger_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    path.write_text('{"schema": "fleetops.policy.ledger/v1", "entries": [{"id": "x", "action": "reboot", '
                    '"host": "a", "group": "g", "at": "yesterday"}]}')  # fmt: skip
    with pytest.raises(
        DocumentError, match=r"ledger\.json: entries\[0\]\.at: Input should be a valid number"
    ):
        P.BudgetLedger.load(path)


CONTROLLER = """
import json, sys, time
from pathlib import Path
from fleetops import policy as P
pol = P.parse_policy(Path(sys.argv[1]).read_text(), "p")
rep = json.loads(Path(sys.argv[2]).read_text())
start, ledger_path, host = float(sys.argv[3]), Path(sys.argv[4]), sys.argv[5]
rep["hosts"] = {host: rep["hosts"][host]}
while time.time() < start:
    time.sleep(0.005)
with P.BudgetLedger.locked(ledger_path) as ledger:
    decisions = P.decide(pol, rep, P.LadderState(), ledger, time.time(), lambda h: "us-east-1a",
                         group_sizes={"us-east-1a": 10})
    time.sleep(0.3)  # the controller's engine runs: the other one must wait, not decide meanwhile
    P.commit(decisions, P.LadderState(), ledger, time.time(), controller=host)
print(decisions[0].status, decisions[0].reason)
"""


def test_two_controllers_sharing_a_ledger_file_spend_a_budget_once(tmp_path: Path) -> None:
    (event,) = ec2_findings("instance-retirement")
    pol_path, rep_path = tmp_path / "p.yml", tmp_path / "scan.json"
    pol_path.write_text(REPLACE_NOW)
    rep_path.write_text(json.dumps(report({"a-1": [event], "a-2": [event]})))
    ledger_path = tmp_path / "state" / "ledger.json"
    start = time.time() + 1.0
    procs = [
        subprocess.Popen([sys.executable, "-c", CONTROLLER, str(pol_path), str(rep_path), str(start),
                          str(ledger_path), host], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for host in ("a-1", "a-2")
    ]  # fmt: skip
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    lines = sorted(out.strip() for out, _err in outs)
    assert lines == ["act replace now (first rung)", "budget budget: replace 1/h in group us-east-1a used"]
    entries = P.BudgetLedger.load(ledger_path).entries
    assert [(e.action, e.group) for e in entries] == [("replace", "us-east-1a")]
    assert entries[0].controller in ("a-1", "a-2")


def test_a_lock_held_too_long_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    with (
        P.file_lock(path),
        pytest.raises(P.StateError, match=r"ledger\.json: another controller holds its lock"),
        P.BudgetLedger.locked(path, timeout=0.2),
    ):
        pytest.fail("the ledger was loaded while another controller held its lock")
    with P.BudgetLedger.locked(path, timeout=0.2) as ledger:  # released: free again
        ledger.record("reboot", "h", "g", T0)
    assert len(P.BudgetLedger.load(path).entries) == 1


def test_a_healed_host_stays_quarantined_and_the_decision_says_so(default: P.Policy) -> None:
    ladder, ledger = P.LadderState(), P.BudgetLedger()
    sick = report({"a-1": [gpu_xid_finding()]})
    run_pass(default, sick, ladder, ledger, T0)  # quarantine
    d = one(run_pass(default, sick, ladder, ledger, T0 + 15 * MIN), "a-1")
    assert (d.action, d.still_quarantined) == ("stop-start", ())
    rec = ladder.get("a-1", "gpu-fatal")
    assert rec is not None and rec.quarantined and rec.action == "stop-start"
    d = one(run_pass(default, report({"a-1": []}), ladder, ledger, T0 + HOUR), "a-1")  # new hardware: clean
    assert (d.status, d.reset, d.still_quarantined) == ("clean", ("gpu-fatal",), ("gpu-fatal",))
    assert d.reason == (
        "clean; gpu-fatal reset (was at stop-start); still quarantined by gpu-fatal: release it when the host "
        "is trusted again"
    )
    assert json.loads(json.dumps(d.to_dict()))["still_quarantined"] == ["gpu-fatal"]


def test_the_ec2_tag_carries_a_hosts_ladders_to_another_controller() -> None:
    mine = P.LadderState()
    mine.record("a-1", "gpu-fatal", "gpu_health", 0, "quarantine", T0)
    mine.record("a-1", "gpu-fatal", "gpu_health", 1, "stop-start", T0 + HOUR)
    mine.record("a-1", "ena-resets", "ena_resets", 0, "reboot", T0 + 10)
    value = mine.tag_value("a-1")
    assert value == (
        f"gpu-fatal=1:stop-start:{int(T0)}:{int(T0 + HOUR)}:2:1:gpu_health;ena-resets=0:reboot:{int(T0 + 10)}:"
        f"{int(T0 + 10)}:1:0:ena_resets"
    )
    assert mine.tag_value("b-1") is None
    other = P.LadderState()
    other.record("a-1", "gpu-fatal", "gpu_health", 0, "quarantine", T0)  # older than the tag's
    other.record("a-1", "ena-resets", "ena_resets", 1, "stop-start", T0 + 2 * HOUR)  # newer: kept
    assert value is not None
    other.merge_tag("a-1", value, "tag fleetops.io/ladder of i-0abc")
    assert other.get("a-1", "gpu-fatal") == mine.get("a-1", "gpu-fatal")
    ena_rec = other.get("a-1", "ena-resets")
    assert ena_rec is not None and ena_rec.action == "stop-start"
    many = P.LadderState()
    for i in range(12):
        many.record("h", f"rule-number-{i:02d}", "gpu_health", 0, "quarantine", T0 + i)
    tag = many.tag_value("h")
    assert tag is not None and len(tag) <= P.TAG_MAX and tag.startswith("rule-number-11=")  # newest first
    # a full tag never loses the ladder that quarantined the host, however old: its taint would stay forever
    crowded = P.LadderState()
    crowded.record("h", "gpu-fatal", "gpu_health", 0, "quarantine", T0 - HOUR)
    for i in range(12):
        crowded.record("h", f"rule-number-{i:02d}", "ena_resets", 0, "reboot", T0 + i)
    tag = crowded.tag_value("h")
    assert tag is not None and len(tag) <= P.TAG_MAX and tag.startswith("gpu-fatal=0:quarantine:")
    assert ";rule-number-11=" in tag  # then the newest
    back = P.LadderState()
    back.merge_tag("h", tag, "tag")
    rec = back.get("h", "gpu-fatal")
    assert rec is not None and rec.quarantined
    for bad in ("gpu-fatal", "gpu-fatal=1:stop-start:1:2:2:1", "gpu-fatal=1:reimage:1:2:2:1:gpu_health",
                "Gpu=1:reboot:1:2:2:1:gpu_health", "gpu-fatal=1:reboot:5:2:2:1:gpu_health"):  # fmt: skip
        with pytest.raises(DocumentError, match=r"^tag of i-0abc: entry 1 is not rule=rung:action:"):
            P.LadderState().merge_tag("a-1", bad, "tag of i-0abc")


def test_record_once_skips_an_action_it_has_within_a_second_however_the_entries_changed() -> None:
    """record_once keeps an index of the entries: it must follow every way they change."""
    ledger = P.BudgetLedger()
    ledger.record("fix", "a-1", "az-a", T0 + 0.7)
    assert not ledger.record_once("fix", "a-1", "az-a", T0 + 1)  # 0.3 s apart: the same action
    assert ledger.record_once("fix", "a-1", "az-a", T0 + 2)
    assert ledger.record_once("reboot", "a-1", "az-a", T0 + 2) and ledger.record_once(
        "fix", "b-1", "az-a", T0 + 2
    )
    ledger.record("fix", "c-1", "az-a", T0)  # a plain record after the index was built
    assert not ledger.record_once("fix", "c-1", "az-a", T0 + 0.5)
    ledger.prune(T0 + 1.5 + P.MAX_WINDOW_S)  # a new list: only the entries at T0 + 2 stay
    assert [e.host for e in ledger.entries] == ["a-1", "a-1", "b-1"]
    assert ledger.record_once("fix", "c-1", "az-a", T0 + 0.5)  # pruned, so not a duplicate any more
    ledger.entries = []  # replaced by hand
    assert ledger.record_once("fix", "a-1", "az-a", T0 + 2)
    assert [(e.action, e.host, e.at) for e in ledger.entries] == [("fix", "a-1", T0 + 2)]


def test_rewriting_the_spent_tag_keeps_what_another_controller_budgets_and_this_one_does_not() -> None:
    """Controller B's policy budgets replace, this one's only reboot: the replace B spent, read from the
    host's tag, stays in the tag this controller writes back (for up to the longest window, after the
    entries this one counts); this controller's own unbudgeted actions (fix) are not added."""
    ledger = P.BudgetLedger()
    ledger.merge_tag("h", "az-a", f"replace:{int(T0 - HOUR)}", "tag of i-0abc", T0)
    ledger.record("reboot", "h", "az-a", T0 - 60, "me")
    ledger.record("fix", "h", "az-a", T0 - 30, "me")
    windows = {"reboot": float(HOUR)}
    assert ledger.tag_value("h", windows, T0) == f"reboot:{int(T0 - 60)};replace:{int(T0 - HOUR)}"
    assert ledger.tag_value("h", windows, T0 + P.MAX_WINDOW_S) is None  # past the longest window: gone
    # a rung another controller's ladder tag shows is counted where budgeted, but never carried on as spent
    from fleetops import auto

    ladder, other = P.LadderState(), P.BudgetLedger()
    tag = f"crash=0:fix:{int(T0 - 60)}:{int(T0 - 60)}:1:0:crashloop_unit"
    auto.merge_tags(ladder, other, {"h": tag}, lambda h: "az-a", T0, lambda line: None)
    assert [(e.action, e.controller) for e in other.entries] == [("fix", P.FROM_LADDER_TAG)]
    assert other.tag_value("h", windows, T0) is None


def test_the_spent_tag_carries_the_budgeted_actions_of_their_windows_to_another_controller() -> None:
    mine = P.BudgetLedger()
    mine.record("stop-start", "a-1", "az-a", T0 - 2 * HOUR)  # outside its 1h window: not carried
    mine.record("stop-start", "a-1", "az-a", T0 - 600)
    mine.record("quarantine", "a-1", "az-a", T0 - 900)
    mine.record("fix", "a-1", "az-a", T0 - 60)  # no budget for fix: not carried
    mine.record("stop-start", "b-1", "az-a", T0 - 60)  # another host
    windows = {"stop-start": HOUR, "quarantine": HOUR, "replace": 24 * HOUR}
    value = mine.tag_value("a-1", windows, T0)
    assert value == f"stop-start:{int(T0 - 600)};quarantine:{int(T0 - 900)}"  # newest first
    assert mine.tag_value("c-1", windows, T0) is None  # nothing to carry: delete the tag
    assert mine.tag_value("a-1", windows, T0 + HOUR) is None  # every window has passed

    other = P.BudgetLedger()  # an AWX job's fresh state directory
    other.record("quarantine", "a-1", "az-a", T0 - 900 + 0.4)  # this controller has that one already
    assert value is not None
    assert other.merge_tag("a-1", "az-a", value, "a-1: tag fleetops.io/spent", T0) == 1
    in_hour = [e for e in other.entries if T0 - HOUR < e.at <= T0]
    assert [(e.action, e.at, e.controller) for e in in_hour if e.action == "stop-start"] == [
        ("stop-start", T0 - 600, "tag")
    ]
    assert len([e for e in in_hour if e.action == "quarantine"]) == 1  # not counted twice
    assert other.merge_tag("a-1", "az-a", value, "again", T0) == 0  # a second read adds nothing
    budget = P.Budget(window="1h", max=1)
    spending = P.Spending(other, {"stop-start": budget}, T0)
    assert spending.blocked("stop-start", "az-b", 4) is not None  # the budget is spent

    # Another controller's clock a little ahead counts as now; far ahead, or past every window: left out.
    skewed = P.BudgetLedger()
    value = f"reboot:{int(T0 + 120)};replace:{int(T0 + 3600)};reboot:{int(T0 - 8 * 86400)}"
    assert skewed.merge_tag("a-1", "az-a", value, "s", T0) == 1
    assert [e.at for e in skewed.entries] == [T0]

    many = P.BudgetLedger()
    for i in range(20):
        many.record("reboot", "h", "az-a", T0 - i)
    tag = many.tag_value("h", {"reboot": HOUR}, T0)
    assert tag is not None and len(tag) <= P.TAG_MAX and tag.startswith(f"reboot:{int(T0)};")  # newest kept
    assert tag.count(";") + 1 == (P.TAG_MAX + 1) // len(f"reboot:{int(T0)};")

    for bad in ("stop-start", "human:1800000000", "reimage:1800000000", "reboot:18e8", "reboot:-5", ":1"):
        with pytest.raises(DocumentError, match=r"^tag of i-0abc: entry 1 is not action:epoch: "):
            P.BudgetLedger().merge_tag("a-1", "az-a", bad, "tag of i-0abc", T0)
    for merge in (
        lambda v: P.BudgetLedger().merge_tag("a-1", "az-a", v, "tag of i-0abc", T0),
        lambda v: P.LadderState().merge_tag("a-1", v, "tag of i-0abc"),
    ):  # a value no EC2 tag can hold (a hand-written inventory's ec2_tags) is refused before it is parsed
        with pytest.raises(
            DocumentError, match=r"^tag of i-0abc: 257 characters: longer than an EC2 tag value"
        ):
            merge(("reboot:1800000000;" * 15)[:257])
    half = P.BudgetLedger()
    with pytest.raises(DocumentError, match="entry 2"):
        half.merge_tag("a-1", "az-a", f"reboot:{int(T0)};nonsense", "tag of i-0abc", T0)
    assert half.entries == []  # a malformed tag counts nothing of itself


@settings(max_examples=200, deadline=None)
@given(
    entries=st.lists(
        st.tuples(
            st.sampled_from(["reboot", "replace"]),
            st.sampled_from(["us-east-1a", "us-east-1b"]),
            st.floats(min_value=-3 * HOUR, max_value=60),
        ),
        max_size=12,
    ),
    fleet=st.one_of(st.none(), st.integers(0, 6)),
    per_group=st.one_of(st.none(), st.integers(0, 4)),
    pct=st.one_of(st.none(), st.floats(min_value=1, max_value=100)),
    size=st.integers(1, 40),
)
def test_decide_spends_budgets_as_the_ledger_counts_them(
    entries: list[tuple[str, str, float]],
    fleet: int | None,
    per_group: int | None,
    pct: float | None,
    size: int,
) -> None:
    if fleet is None and per_group is None and pct is None:
        per_group = 1
    budget = P.Budget(window="1h", max=fleet, per_group=per_group, per_group_pct=pct)
    pol = policy(REPLACE_NOW).model_copy(update={"budgets": {"replace": budget}})
    ledger = P.BudgetLedger()
    for action, group, at in entries:
        ledger.record(action, "x", group, T0 + at)
    (event,) = EC2_RETIREMENT
    (d,) = P.decide(
        pol, report({"a-1": [event]}), P.LadderState(), ledger, T0, az, group_sizes={"us-east-1a": size}
    )
    # counted here by hand, not by Spending (what decide counts with)
    recent = [
        group
        for action, group, at in entries
        if action == "replace" and T0 - HOUR < T0 + at <= T0 + P.CLOCK_SKEW_S
    ]
    limit = budget.group_limit(size)
    want = None
    if fleet is not None and len(recent) >= fleet:
        want = f"budget: replace {fleet}/h across the fleet used"
    elif limit is not None and recent.count("us-east-1a") >= limit[0]:
        want = f"budget: replace {limit[1]} in group us-east-1a used"
    assert (d.status, d.reason) == (("budget", want) if want else ("act", "replace now (first rung)"))


def test_the_modules_example_policy_is_valid() -> None:
    doc = P.__doc__ or ""
    example = doc.split("::\n\n", 1)[1].split("\n\n", 1)[0]
    pol = policy("\n".join(line.removeprefix("    ") for line in example.splitlines()))
    assert [r.action for r in pol.rules[0].ladder] == ["quarantine", "stop-start", "replace", "human"]
    assert P.matches(pol.rules[0].match[0], gpu_xid_finding())
