"""``fleetops policy check FILE`` through the real CLI: a policy that loads but can never match is
refused (exit 2, one line per problem naming the file, the field and the rule)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fleetops.cli.app import main
from fleetops.policy import CHECKS, default_policy_path
from fleetops.schemas import FINDING_DATA_KEYS
from fleetops.schemas.reports import FINDING_DATA

HEAD = """\
schema: fleetops.policy/v1
budgets:
  reboot: {unlimited: true}
rules:
"""


def check(tmp_path: Path, rules: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str], str]:
    path = tmp_path / "p.yml"
    path.write_text(HEAD + rules, encoding="utf-8")
    rc = main(["policy", "check", str(path)])
    out, err = capsys.readouterr()
    return rc, [line.replace(f"{path}: ", "FILE: ", 1) for line in err.splitlines()], out


def test_the_default_policy_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "check", str(default_policy_path())]) == 0
    out, err = capsys.readouterr()
    assert out == f"{default_policy_path()}: ok (15 rules)\n" and err == ""


def test_a_data_key_no_finding_of_the_check_declares_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, lines, out = check(
        tmp_path,
        """\
  - name: gpu-fatal
    match:
      - {check: gpu_health, data: {xid: {has_any: ["79"]}}}
      - {check: gpu_health, data: {xid_typo: {has_any: ["79"]}, "gpus.*.remapped": true, "*.x": 1}}
      - {check: ucx_mmap_hooks, data: {pid: {exists: true}, fixable_unit: true, growth.rss: {gt: 1}}}
    ladder: [{action: reboot, clear_after: 15m}]
""",
        capsys,
    )
    assert rc == 2 and out == ""
    assert lines == [
        "FILE: rules[0].match[1].data.xid_typo: rule gpu-fatal: no gpu_health finding has the data key "
        "'xid_typo', so this never matches (its keys: gpus, new_xid_events, smi_error, xid)"
    ]


def test_unknown_severities_and_checks_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, lines, _ = check(
        tmp_path, "  - name: r\n    match: [{check: gpu_healht}]\n    ladder: [{action: human}]\n", capsys
    )
    assert rc == 2
    assert lines == [
        f"FILE: rules[0].match[0].check: unknown check 'gpu_healht' (known: {', '.join(CHECKS)})"
    ]
    rc, lines, _ = check(
        tmp_path,
        "  - name: r\n    match: [{check: gpu_health, severity: [fatal]}]\n    ladder: [{action: human}]\n",
        capsys,
    )
    assert rc == 2 and len(lines) == 1
    assert lines[0].startswith(
        "FILE: rules[0].match[0].severity[0]: Input should be 'critical', 'warning' or 'info'"
    )


def test_a_rule_an_earlier_rule_always_takes_first_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, lines, _ = check(
        tmp_path,
        """\
  - name: nic
    match: [{check: ena_resets}, {check: gpu_health, severity: [critical], data: {xid: {has_any: ["79"]}}}]
    ladder: [{action: reboot, clear_after: 15m}]
  - name: nic-critical
    match: [{check: ena_resets, severity: [critical], data: {recent: {gt: 3}}}]
    ladder: [{action: human}]
  - name: gpu-79
    match:
      - {check: gpu_health, severity: [critical], data: {xid: {has_any: ["79"]}, gpus.*.remapped_rows_failure: true}}
      - {check: gpu_health, severity: [critical, warning], data: {xid: {has_any: ["79"]}}}
      - {check: gpu_health, data: {xid: {has_any: ["48"]}}}
      - {check: cpu_starvation}
    ladder: [{action: human}]
""",
        capsys,
    )
    assert rc == 2
    assert lines == [
        "FILE: rules[1].match[0]: rule nic-critical: shadowed by rule nic (rules[0]), which is earlier and takes "
        "every ena_resets finding this entry would (same check, no narrower match): it never matches",
        "FILE: rules[2].match[0]: rule gpu-79: shadowed by rule nic (rules[0]), which is earlier and takes "
        "every gpu_health finding this entry would (same check, no narrower match): it never matches",
    ]


def test_the_module_form_is_an_alias(tmp_path: Path) -> None:
    path = tmp_path / "p.yml"
    path.write_text(
        HEAD
        + "  - name: r\n    match: [{check: ena_resets, data: {resets: {gt: 1}}}]\n    ladder: [{action: human}]\n",
        encoding="utf-8",
    )
    done = subprocess.run([sys.executable, "-m", "fleetops.policy", "--check", str(path)],
                          capture_output=True, text=True, check=False, timeout=60)  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"{path}: rules[0].match[0].data.resets: rule r: no ena_resets finding")


def test_the_declared_keys_cover_every_check_and_the_models_fields() -> None:
    assert set(FINDING_DATA_KEYS) == set(CHECKS)
    for check, model in FINDING_DATA.items():
        assert set(model.model_fields) <= FINDING_DATA_KEYS[check]
