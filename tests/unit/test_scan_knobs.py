"""Every node_health option is a scan knob, and each default is defined once: in the module.

`playbooks/scan.yml` passes each option as `{{ fleetops_<option> | default(omit) }}`, documents the knob in
its header and the scanning guide's "Scan knobs" table (docs/guides/scanning.md); AWX surveys repeat no
default. The last tests run the real playbook through ansible-runner (what `fleetops scan` and AWX use) and ansible-playbook -e, and read the
arguments the module received (its `invocation`): every knob reaches its option, and unset knobs leave
the module's own defaults.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.fleetops.node.plugins.modules import node_health

from fleetops.ansible import knobs
from fleetops.ansible.runner import RunnerOptions, run_playbook
from tests.helpers import ansible_doc
from tests.paths import REPO

BIN = Path(sys.executable).parent
SCAN = REPO / "playbooks" / "scan.yml"
# Knobs that are the playbook's own (play and task keywords), not a module option: declared with the
# controller's check of every -e (fleetops.ansible.knobs).
PLAYBOOK_KNOBS = set(knobs.PLAYBOOK_KNOBS)
# The one option whose knob falls back to a host var before the module's default.
INVENTORY_EVENTS = "{{ fleetops_inventory_events | default(ec2_scheduled_events | default(omit)) }}"
# A value for every option, none of them its default (checked below), all cheap to run on this machine.
KNOB_VALUES: dict[str, Any] = {
    "checks": ["zombie_memcg"],
    "sample_seconds": 0.5,
    "zombie_warning": 500,
    "zombie_critical": 600,
    "headroom_critical_pct": 7.5,
    "crashloop_warning_per_min": 0.25,
    "crashloop_critical_per_min": 2.5,
    "journal_window_seconds": 120,
    "zombie_growth_warning_per_min": 3.5,
    "anon_growth_warning_mb_per_min": 50.0,
    "anon_growth_critical_mb_per_min": 500.0,
    "inventory_events": [{"Code": "system-reboot", "Description": "scheduled reboot", "EventId": "e-1"}],
    "imds": "never",
    "imds_url": "http://127.0.0.1:9",
    "unit_allowlist": ["ssh.service", "systemd-*"],
    "env_units": ["ssh.service"],
    "ena_resets_critical": 7,
    "cpu_system_warning_pct": 40.0,
    "cpu_system_critical_pct": 80.0,
}


def _scan_task() -> dict[str, Any]:
    (task,) = [t for t in yaml.safe_load(SCAN.read_text())[0]["tasks"] if "fleetops.node.node_health" in t]
    return task


def _header(path: Path) -> str:
    return path.read_text().split("\n- name:")[0]


def _documented_knobs(path: Path) -> set[str]:
    """The knobs a playbook's header documents (`#   fleetops_x   what it does`)."""
    return set(re.findall(r"^#\s+(fleetops_[a-z_]+)\s", _header(path), re.M))


def _readme_table() -> dict[str, tuple[str, str]]:
    """{knob: (option, default cell)} of the scanning guide's "Scan knobs" table."""
    text = (REPO / "docs" / "guides" / "scanning.md").read_text()
    section = text.split("\n## Scan knobs", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(fleetops_[a-z_]+)` \| `([a-z_]+)` \| ([^|]+) \|", section, re.M)
    return {knob: (option, default.strip()) for knob, option, default in rows}


def test_every_option_is_a_knob_that_omits_when_unset() -> None:
    args = _scan_task()["fleetops.node.node_health"]
    assert list(args) == list(node_health.ARGUMENT_SPEC)
    for option, value in args.items():
        want = (
            INVENTORY_EVENTS
            if option == "inventory_events"
            else f"{{{{ fleetops_{option} | default(omit) }}}}"
        )
        assert value == want, option


def test_the_header_documents_every_knob_and_repeats_no_default() -> None:
    knobs = {f"fleetops_{option}" for option in node_health.ARGUMENT_SPEC}
    assert _documented_knobs(SCAN) == knobs | PLAYBOOK_KNOBS
    for line in _header(SCAN).splitlines():
        knob = re.match(r"^#\s+(fleetops_[a-z_]+)\s", line)
        if knob and knob.group(1) in knobs:
            assert "(default:" not in line or knob.group(1) == "fleetops_inventory_events", line


def test_the_guides_table_has_every_knob_with_the_modules_default() -> None:
    table = _readme_table()
    assert set(table) == {f"fleetops_{option}" for option in node_health.ARGUMENT_SPEC}
    for option, spec in node_health.ARGUMENT_SPEC.items():
        documented, cell = table[f"fleetops_{option}"]
        assert documented == option
        if option == "checks":
            assert cell == "all" and spec.get("default") is None
        elif option == "inventory_events":
            assert "ec2_scheduled_events" in cell and "`[]`" in cell and spec["default"] == []
        else:
            (literal,) = re.findall(r"`([^`]*)`", cell)
            assert yaml.safe_load(literal) == spec["default"], (option, cell)


def test_module_docs_repeat_the_argument_specs_defaults() -> None:
    """The docs necessarily say each default as text; validate-modules checks the same in sanity."""
    options = yaml.safe_load(node_health.DOCUMENTATION)["options"]
    for name, entry in node_health.ARGUMENT_SPEC.items():
        assert options[name].get("default") == entry.get("default"), name


def test_reclaim_memcg_defaults_are_the_scans_warning_level() -> None:
    from ansible_collections.fleetops.node.plugins.module_utils import memcg

    options = ansible_doc("fleetops.node.reclaim_memcg")["options"]
    level = memcg.DEFAULT_THRESHOLDS["zombie_warning"]
    assert level == node_health.ARGUMENT_SPEC["zombie_warning"]["default"]
    assert options["min_zombies"]["default"] == options["reboot_threshold"]["default"] == level


# Knobs whose fallback is computed from other knobs, not a copy of the module's default: the reboot's
# lease must outlast one batch (its reboot and drain timeouts plus a margin), and so must stop-start's and
# replace's.
COMPUTED = {
    ("rolling_reboot.yml", "fleetops.node.ec2_lease", "ttl"),
    ("stop_start.yml", "fleetops.node.ec2_lease", "ttl"),  # a stop and a start
    ("replace.yml", "fleetops.node.ec2_lease", "ttl"),  # the group's replacement and the new host's ssh
    # a Slurm node is named as its host unless the inventory says otherwise (not a module default)
    ("quarantine.yml", "fleetops.node.slurm_node", "name"),
    ("unquarantine.yml", "fleetops.node.slurm_node", "name"),
}


def _tasks(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every task, those inside blocks too (the remediation playbooks' changes sit in the lease block)."""
    for task in items:
        yield task
        for key in ("block", "rescue", "always"):
            yield from _tasks(task.get(key) or [])


def test_playbooks_pass_knobs_to_fleetops_modules_with_omit_only() -> None:
    """In every playbook, a fleetops.node module option fed by a knob falls back to omit, never a copy."""
    knob = re.compile(r"\{\{\s*fleetops_[a-z_]+\s*\|\s*default\((.*)\)\s*\}\}")
    checked = 0
    for path in sorted((REPO / "playbooks").glob("*.yml")):
        for play in yaml.safe_load(path.read_text()):
            for task in _tasks(play.get("tasks", [])):
                for module, args in task.items():
                    if not module.startswith("fleetops.node.") or not isinstance(args, dict):
                        continue
                    for option, value in args.items():
                        match = knob.search(str(value))
                        if match and (path.name, module, option) in COMPUTED:
                            continue
                        if match:
                            checked += 1
                            assert match.group(1).endswith("omit") or "default(omit)" in match.group(1), (
                                f"{path.name}: {module} {option}: {value}"
                            )
    assert checked >= len(node_health.ARGUMENT_SPEC) + 8


def test_awx_scan_template_reaches_every_knob() -> None:
    jts = yaml.safe_load((REPO / "awx" / "job_templates.yml").read_text())["fleetops_awx_job_templates"]
    (scan,) = [jt for jt in jts if jt["playbook"] == "playbooks/scan.yml"]
    assert scan["ask_variables_on_launch"] is True  # the knobs without a question: launch extra variables
    questions = {q["variable"]: q for q in scan["survey_spec"]["spec"]}
    assert set(questions) <= _documented_knobs(SCAN)
    for name in ("fleetops_anon_growth_warning_mb_per_min", "fleetops_crashloop_warning_per_min"):
        assert name in questions
    for name, question in questions.items():
        if name.removeprefix("fleetops_") in node_health.ARGUMENT_SPEC:
            assert "default" not in question and question["required"] is False, name


# ---------------------------------------------------------------------------------------------
# The real playbook: what the module receives
# ---------------------------------------------------------------------------------------------


def _inventory(tmp_path: Path) -> Path:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
        f"      ansible_python_interpreter: {sys.executable}\n"
    )
    return inventory


def _module_args_via_runner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extravars: dict[str, Any]
) -> dict[str, Any]:
    """Run fleetops.node.scan the way `fleetops scan` does (its runner layer); node_health's module_args."""
    # ansible-core >= 2.21 leaves the module's arguments out of results unless asked
    monkeypatch.setenv("ANSIBLE_INJECT_INVOCATION", "1")
    monkeypatch.setenv("ANSIBLE_LOCAL_TEMP", str(tmp_path / "ansible-tmp"))
    run = run_playbook(
        RunnerOptions(
            playbook="fleetops.node.scan", inventory=[_inventory(tmp_path)], extravars=extravars, timeout=180
        )
    )
    assert run.status == "successful", run
    (args,) = [
        t.result["invocation"]["module_args"]
        for t in run.tasks["localhost"]
        if t.action == "fleetops.node.node_health"
    ]
    return dict(args)


def test_every_knob_reaches_its_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(KNOB_VALUES) == set(node_health.ARGUMENT_SPEC)
    for option, value in KNOB_VALUES.items():
        assert value != node_health.DEFAULTS[option], option
    args = _module_args_via_runner(
        tmp_path, monkeypatch, {f"fleetops_{k}": v for k, v in KNOB_VALUES.items()}
    )
    assert args == KNOB_VALUES


def test_unset_knobs_leave_the_modules_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = _module_args_via_runner(tmp_path, monkeypatch, {"fleetops_checks": ["zombie_memcg"]})
    assert args == dict(node_health.DEFAULTS, checks=["zombie_memcg"])


def test_ansible_playbook_e_strings_reach_typed_options(tmp_path: Path) -> None:
    """`-e key=value` gives strings; the module's argument_spec types them (a 90 MiB/min leak needs 50 MB/min)."""
    proc = subprocess.run(
        [
            str(BIN / "ansible-playbook"), "-vvv", "-i", str(_inventory(tmp_path)), "fleetops.node.scan",
            "-e", "fleetops_checks=zombie_memcg,crashloop_unit",
            "-e", "fleetops_anon_growth_warning_mb_per_min=50",
            "-e", "fleetops_zombie_warning=700",
            "-e", "fleetops_imds=never",
        ],
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")},
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections"),
            "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
            "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
            "ANSIBLE_INJECT_INVOCATION": "1",
            "ANSIBLE_NOCOLOR": "1",
        },
        capture_output=True, text=True, timeout=180, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    # -vvv: the default callback prints each result with its invocation (injected, see above)
    results = [
        json.loads(m) for m in re.findall(r"^ok: \[localhost\] => (\{\n.*?\n\})$", proc.stdout, re.M | re.S)
    ]
    (args,) = [
        r["invocation"]["module_args"]
        for r in results
        if "zombie_warning" in r.get("invocation", {}).get("module_args", {})
    ]
    assert args == dict(
        node_health.DEFAULTS,
        checks=["zombie_memcg", "crashloop_unit"],
        anon_growth_warning_mb_per_min=50.0,
        zombie_warning=700,
        imds="never",
    )


def test_the_controller_knows_every_knob_the_playbook_reads() -> None:
    """fleetops scan checks each -e against these knobs (fleetops.ansible.knobs): exactly the fleetops_ variables
    scan.yml reads, each typed as the option it sets."""
    play = SCAN.read_text().split("\n- name: Report")[0]
    templates = re.findall(r"\{\{.*?\}\}", play)
    read = {name for template in templates for name in re.findall(r"\bfleetops_[a-z_]+", template)}
    assert {k for k in knobs.knobs() if k.startswith("fleetops_")} == read
    for knob, (option, spec) in knobs.knobs().items():
        if option in node_health.ARGUMENT_SPEC:
            assert spec == node_health.ARGUMENT_SPEC[option], knob
