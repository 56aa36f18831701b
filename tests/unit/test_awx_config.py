"""awx/: AWX as code, validated as far as it can be without an AWX.

No AWX runs here, and Galaxy cannot be reached. The awx.awx collection (24.6.1, its last release) is
taken from PyPI instead: the `ansible` package 13.8.0 bundles it. Its wheel (about 50 MB, fetched once
with pip and checked against a pinned sha256) is cached, and only `ansible_collections/awx/awx`
(about 1 MB) is kept. With it:

- `ansible-playbook --syntax-check` resolves every awx.awx module the playbook names (without the
  collection the same check fails, so the pass means something);
- ansible-lint (production profile, plus its `args` rule, warnings fatal) imports each awx.awx module
  and validates every task's literal arguments against the module's real argument_spec: names,
  types, choices, required. Templated values are not checked there; the data they come from is
  checked below.

And without it: the surveys against AWX's own survey-spec validation rules, the survey variables
against the playbooks' documented knobs, the schedule's rrule with dateutil (which AWX uses), and the
inventory config against the plugin's options and file-name rule.

What this does not prove: that an AWX accepts the objects (references between them resolve on the
server) — that needs an AWX.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from dateutil import rrule

from fleetops.exitcodes import AUTO_FAIL_ON
from tests.helpers import ansible_doc

REPO = Path(__file__).resolve().parents[2]
AWX = REPO / "awx"
BIN = Path(sys.executable).parent

ANSIBLE_WHEEL = "ansible==13.8.0"
ANSIBLE_WHEEL_SHA256 = "daf9c9a2850bbc6c098ba3368aeba99d4ae37c90bca47f974dc19342c0571361"
AWX_COLLECTION_VERSION = "24.6.1"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fleetops" / "collections"

# AWX's JobTemplateSurveySpec.ALLOWED_TYPES: question type -> types its default may have
SURVEY_TYPES: dict[str, tuple[type, ...]] = {
    "text": (str,),
    "textarea": (str,),
    "password": (str,),
    "multiplechoice": (str,),
    "multiselect": (str,),
    "integer": (int,),
    "float": (float, int),
}


def _env(collections: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env["ANSIBLE_COLLECTIONS_PATH"] = (
        f"{collections}:{REPO / 'collections'}" if collections else str(REPO / "collections")
    )
    env["ANSIBLE_NOCOLOR"] = "1"
    return env


@pytest.fixture(scope="session")
def awx_collections() -> Path:
    """A collections path holding awx.awx, extracted from the `ansible` wheel on PyPI (cached)."""
    root = CACHE / f"awx.awx-{AWX_COLLECTION_VERSION}"
    manifest = root / "ansible_collections" / "awx" / "awx" / "MANIFEST.json"
    if manifest.is_file():
        return root
    CACHE.mkdir(parents=True, exist_ok=True)
    download = CACHE / f"download-{os.getpid()}"  # per process: other sessions may fill the cache at once
    shutil.rmtree(download, ignore_errors=True)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "-q",
            "-d",
            str(download),
            ANSIBLE_WHEEL,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"pip download {ANSIBLE_WHEEL} (PyPI) failed: {proc.stderr}"
    (wheel,) = download.glob("ansible-*.whl")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert digest == ANSIBLE_WHEEL_SHA256, f"{wheel.name}: sha256 {digest}, expected {ANSIBLE_WHEEL_SHA256}"
    tmp = CACHE / f"awx.awx-{AWX_COLLECTION_VERSION}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    prefix = "ansible_collections/awx/awx/"
    keep = ("plugins/", "meta/", "MANIFEST.json", "FILES.json")
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith(prefix) and name[len(prefix) :].startswith(keep):
                z.extract(name, tmp)
    shutil.rmtree(download)
    info = json.loads((tmp / manifest.relative_to(root)).read_text())["collection_info"]
    assert (info["namespace"], info["name"], info["version"]) == ("awx", "awx", AWX_COLLECTION_VERSION)
    try:
        tmp.rename(root)
    except OSError:  # another process got there first
        shutil.rmtree(tmp)
    assert manifest.is_file()
    return root


def _load(name: str) -> Any:
    return yaml.safe_load((AWX / name).read_text())


def _job_templates() -> list[dict[str, Any]]:
    jts: list[dict[str, Any]] = _load("job_templates.yml")["fleetops_awx_job_templates"]
    return jts


def _playbook_knobs(playbook: Path) -> set[str]:
    """The extra vars a playbook documents in its header (`#   fleetops_x   what it does`)."""
    return set(re.findall(r"^#\s+(fleetops_[a-z_]+)\s", playbook.read_text(), re.M))


def test_syntax_check_resolves_every_awx_module(awx_collections: Path) -> None:
    ok = subprocess.run(
        [str(BIN / "ansible-playbook"), "--syntax-check", str(AWX / "configure.yml")],
        capture_output=True,
        text=True,
        env=_env(awx_collections),
        cwd=REPO,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # without awx.awx on the path the same check fails: the pass above did resolve the modules
    missing = subprocess.run(
        [str(BIN / "ansible-playbook"), "--syntax-check", str(AWX / "configure.yml")],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=REPO,
    )
    assert missing.returncode != 0 and "couldn't resolve module/action 'awx.awx." in missing.stderr


def test_ansible_lint_validates_awx_module_arguments(awx_collections: Path, tmp_path: Path) -> None:
    """The repo's lint settings (minus the exclusion of awx/), plus the args rule, warnings fatal.

    One run (ansible-lint takes seconds to start) over awx/ and a playbook with a wrong argument:
    the wrong one must be the only violation, which shows the args rule ran on real argument specs.
    """
    config = yaml.safe_load((REPO / ".ansible-lint").read_text())
    config["exclude_paths"] = [p for p in config.get("exclude_paths", []) if p.rstrip("/") != "awx"]
    config["enable_list"] = [*config.get("enable_list", []), "args"]
    (tmp_path / "lint.yml").write_text(yaml.safe_dump(config))
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "---\n- name: Bad\n  hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - name: Schedule with a typo\n      awx.awx.schedule:\n        name: x\n"
        "        unified_job_template: y\n        rule: FREQ=DAILY\n"
    )
    files = sorted(str(p.relative_to(REPO)) for p in AWX.rglob("*.yml"))
    proc = subprocess.run(
        [
            str(BIN / "ansible-lint"),
            "-c",
            str(tmp_path / "lint.yml"),
            "--offline",
            "--strict",
            "--nocolor",
            "-f",
            "pep8",
            *files,
            str(bad),
        ],
        capture_output=True,
        text=True,
        env=_env(awx_collections),
        cwd=REPO,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    violations = [line for line in proc.stdout.splitlines() if re.match(r"^\S+:\d+(:\d+)?: ", line)]
    assert len(violations) == 1, out
    assert violations[0].startswith(str(bad)) and "args[module]" in violations[0], out
    assert "Unsupported parameters" in violations[0] and "rule" in violations[0], out
    assert f"{len(files) + 1} files processed" in out, out


def _survey_errors(spec: dict[str, Any]) -> list[str]:
    """AWX's JobTemplateSurveySpec._validate_spec_data, the checks that do not need a database."""
    errors = [
        f"'{k}' missing or not {t.__name__}"
        for k, t in (("name", str), ("description", str), ("spec", list))
        if not isinstance(spec.get(k), t)
    ]
    if errors:
        return errors
    if not spec["spec"]:
        return ["'spec' doesn't contain any items"]
    seen: set[str] = set()
    for i, q in enumerate(spec["spec"]):
        for key, kind in (("type", str), ("question_name", str), ("variable", str), ("required", bool)):
            if not isinstance(q.get(key), kind):
                errors.append(f"question {i}: '{key}' missing or not {kind.__name__}")
        if q.get("variable") in seen:
            errors.append(f"question {i}: variable {q['variable']} duplicated")
        seen.add(q.get("variable", ""))
        qtype = q.get("type")
        if qtype not in SURVEY_TYPES:
            errors.append(f"question {i}: type {qtype!r}")
            continue
        if q.get("default", "") != "" and not isinstance(q["default"], SURVEY_TYPES[qtype]):
            errors.append(f"question {i}: default {q['default']!r} is not a {qtype}")
        for key in ("min", "max"):
            if q.get(key) is not None and not isinstance(q[key], int):
                errors.append(f"question {i}: {key} must be an integer")
        if qtype in ("multiplechoice", "multiselect"):
            choices = q.get("choices")
            if not choices:
                errors.append(f"question {i}: {qtype} needs choices")
            elif "default" in q and q["default"] not in choices:
                errors.append(f"question {i}: default not among the choices")
        if "$encrypted$" in str(q.get("default", "")):
            errors.append(f"question {i}: $encrypted$ is reserved")
    return errors


def test_job_templates_cover_the_scan_and_every_remediation_playbook() -> None:
    jts = _job_templates()
    playbooks = {jt["playbook"] for jt in jts}
    wanted = {"playbooks/scan.yml", "playbooks/rolling_reboot.yml"} | {
        str(p.relative_to(REPO)) for p in (REPO / "playbooks").glob("remediate_*.yml")
    }
    assert wanted <= playbooks, (
        f"no AWX job template for {sorted(wanted - playbooks)} (awx/job_templates.yml)"
    )
    for pb in playbooks:
        assert (REPO / pb).is_file(), pb
    assert len({jt["name"] for jt in jts}) == len(jts)


def test_surveys_are_valid_and_only_set_the_playbooks_documented_knobs() -> None:
    for jt in _job_templates():
        spec = jt["survey_spec"]
        assert _survey_errors(spec) == [], jt["name"]
        knobs = _playbook_knobs(REPO / jt["playbook"])
        variables = {q["variable"] for q in spec["spec"]}
        assert variables <= knobs, f"{jt['name']}: {sorted(variables - knobs)} not read by {jt['playbook']}"
        assert "fleetops_targets" in variables  # where the canary / the rest is chosen


def test_surveys_repeat_no_playbook_or_module_default() -> None:
    """A question left blank passes nothing (AWX adds a survey variable only for an answer or a default),
    so the playbook's `default(omit)` leaves the module's default: the one definition. Only the host
    pattern keeps a default, `all`, shown so that the operator sees what a launch acts on.
    """
    for jt in _job_templates():
        for q in jt["survey_spec"]["spec"]:
            if q["variable"] == "fleetops_targets":
                assert q["default"] == "all" and q["required"] is True
                continue
            assert "default" not in q, f"{jt['name']}: {q['variable']} repeats a default"


def test_survey_validation_catches_what_awx_refuses() -> None:
    good = {
        "name": "n",
        "description": "d",
        "spec": [{"type": "integer", "question_name": "q", "variable": "v", "required": True, "default": 3}],
    }
    assert _survey_errors(good) == []
    for broken in (
        {**good, "spec": []},
        {"name": "n", "spec": good["spec"]},
        {**good, "spec": [{**good["spec"][0], "default": "3"}]},
        {**good, "spec": [{**good["spec"][0], "type": "number"}]},
        {**good, "spec": [good["spec"][0], good["spec"][0]]},
        {**good, "spec": [{**good["spec"][0], "type": "multiplechoice", "default": "c", "choices": ["a"]}]},
    ):
        assert _survey_errors(broken), broken


def test_remediations_are_dry_runs_unless_launched_as_run() -> None:
    """configure.yml derives job_type/diff/prompts from `remediation`; the scan is a plain run."""
    task = next(t for t in _load("configure.yml")[0]["tasks"] if "awx.awx.job_template" in t)
    args = task["awx.awx.job_template"]
    assert args["job_type"] == "{{ 'check' if item.remediation | default(false) else item.job_type }}"
    assert args["ask_job_type_on_launch"] == "{{ item.remediation | default(false) }}"
    assert args["diff_mode"] == "{{ item.remediation | default(false) }}"
    assert args["allow_simultaneous"] is False and args["survey_enabled"] is True
    jts = {jt["playbook"]: jt for jt in _job_templates()}
    for pb, jt in jts.items():
        changes_hosts = pb.startswith("playbooks/remediate_") or pb == "playbooks/rolling_reboot.yml"
        assert jt.get("remediation", False) is changes_hosts, pb
    scan = jts["playbooks/scan.yml"]
    assert scan["job_type"] == "run"
    assert scan["job_slice_count"] == "{{ fleetops_awx_scan_slices }}"
    assert scan["ask_job_slice_count_on_launch"] is True


def test_settings_are_typed_and_the_nightly_rrule_parses() -> None:
    settings = _load("settings.yml")
    for key in (
        "fleetops_awx_scan_slices",
        "fleetops_awx_scan_forks",
        "fleetops_awx_remediate_forks",
        "fleetops_awx_scan_timeout_s",
        "fleetops_awx_remediate_timeout_s",
        "fleetops_awx_inventory_cache_s",
    ):
        assert isinstance(settings[key], int) and settings[key] > 0, key
    assert settings["fleetops_awx_scm_url"] == "" and settings["fleetops_awx_ee_image"] == ""  # required -e
    rule = settings["fleetops_awx_scan_rrule"]
    # AWX: a DTSTART with a time zone (TZID= or a trailing Z), then one RRULE with an INTERVAL; no SECONDLY
    assert re.match(r"^DTSTART;TZID=[\w/+-]+:\d{8}T\d{6} RRULE:", rule), rule
    assert "FREQ=DAILY" in rule and "COUNT" not in rule and "UNTIL" not in rule
    parsed = rrule.rrulestr(rule.replace(" ", "\n"), forceset=True)
    first, second = list(parsed[:2])  # type: ignore[index]
    assert (second - first).total_seconds() == 86400 and first.hour == 2 and first.tzinfo is not None


def test_every_playbook_names_its_job_templates_objects_in_settings() -> None:
    """The names the tasks use are settings (no stray literal that would create a second object)."""
    settings = _load("settings.yml")
    text = (AWX / "configure.yml").read_text()
    for ref in set(re.findall(r"\{\{\s*(fleetops_awx_[a-z_]+)", text)):
        assert ref in settings or ref in _load("job_templates.yml"), ref
    schedules = [t["awx.awx.schedule"] for t in _load("configure.yml")[0]["tasks"] if "awx.awx.schedule" in t]
    assert len(schedules) == 2 and len({s["name"] for s in schedules}) == 2
    for schedule in schedules:
        assert schedule["unified_job_template"] in {jt["name"] for jt in _job_templates()}


def test_inventory_source_uses_our_plugin_with_a_file_it_accepts() -> None:
    settings = _load("settings.yml")
    config_path = REPO / settings["fleetops_awx_inventory_config"]
    config = yaml.safe_load(config_path.read_text())
    assert config["plugin"] == "fleetops.node.ec2"
    options = ansible_doc("fleetops.node.ec2", "inventory")["options"]  # fragments merged in
    assert set(config) <= set(options), sorted(set(config) - set(options))
    from ansible_collections.fleetops.node.plugins.inventory.ec2 import InventoryModule

    assert InventoryModule().verify_file(str(config_path))
    assert not InventoryModule().verify_file(str(REPO / "inventory" / "localhost.yml"))
    # the source's environment variables are real ansible settings
    task = next(t for t in _load("configure.yml")[0]["tasks"] if "awx.awx.inventory_source" in t)
    from ansible.config.manager import ConfigManager

    known_env = {
        e["name"] for d in ConfigManager().get_configuration_definitions().values() for e in d.get("env", [])
    }
    assert set(task["awx.awx.inventory_source"]["source_vars"]) <= known_env


def _job_template_args(item: dict[str, Any]) -> dict[str, Any]:
    """configure.yml's awx.awx.job_template arguments for one template, rendered as Ansible would
    render them (Jinja2 native types; a value that renders to another template is rendered again)."""
    from jinja2.nativetypes import NativeEnvironment

    env = NativeEnvironment()
    context = {**_load("settings.yml"), "item": item}
    task = next(t for t in _load("configure.yml")[0]["tasks"] if "awx.awx.job_template" in t)

    def render(value: Any) -> Any:
        while isinstance(value, str) and "{{" in value:
            value = env.from_string(value).render(context)
        return value

    return {key: render(value) for key, value in task["awx.awx.job_template"].items()}


def _changes_hosts(jt: dict[str, Any]) -> bool:
    return (
        jt["playbook"].startswith("playbooks/remediate_") or jt["playbook"] == "playbooks/rolling_reboot.yml"
    )


def test_only_the_scan_is_sliced_remediations_and_the_reboot_never() -> None:
    """AWX: a job that orchestrates across its hosts must not be sliced (each slice would run its own
    serial batches, canary and stop-at-first-failure side by side). Slice count 1 and no slice prompt
    for every template that changes hosts, whatever its entry says; the scan stays sliced."""
    settings = _load("settings.yml")
    jts = _job_templates()
    remediations = [jt for jt in jts if _changes_hosts(jt)]
    assert len(remediations) >= 5 and all(jt.get("remediation") for jt in remediations)
    for jt in remediations:
        assert "job_slice_count" not in jt and "ask_job_slice_count_on_launch" not in jt, jt["name"]
        args = _job_template_args(jt)
        assert args["job_slice_count"] == 1 and args["ask_job_slice_count_on_launch"] is False, jt["name"]
        # forced: an entry asking for slices still gets none
        forced = _job_template_args({**jt, "job_slice_count": 4, "ask_job_slice_count_on_launch": True})
        assert forced["job_slice_count"] == 1 and forced["ask_job_slice_count_on_launch"] is False
    scan = _job_template_args(next(jt for jt in jts if jt["playbook"] == "playbooks/scan.yml"))
    assert scan["job_slice_count"] == settings["fleetops_awx_scan_slices"] > 1
    assert scan["ask_job_slice_count_on_launch"] is True


def test_every_remediation_survey_asks_the_deadline_and_the_host_timeout() -> None:
    for jt in _job_templates():
        if not _changes_hosts(jt):
            continue
        questions = {q["variable"]: q for q in jt["survey_spec"]["spec"]}
        not_after, host_timeout = questions.get("fleetops_not_after"), questions.get("fleetops_host_timeout")
        assert not_after is not None and host_timeout is not None, jt["name"]
        assert not_after["type"] == "text" and host_timeout["type"] == "integer"
        for q in (not_after, host_timeout):  # optional, and blank passes nothing (no default)
            assert q["required"] is False and "default" not in q, (jt["name"], q["variable"])
        assert host_timeout["min"] >= 1


def test_remediations_carry_the_aws_credential_for_the_ec2_lease() -> None:
    """The remediation playbooks take the EC2 lease (fleetops.node.ec2_lease): their jobs need the
    AWS credential (AWX injects AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY); the scan does not."""
    settings = _load("settings.yml")
    for jt in _job_templates():
        creds = _job_template_args(jt)["credentials"]
        assert creds[0] == settings["fleetops_awx_machine_credential"]
        if _changes_hosts(jt):
            assert creds == [
                settings["fleetops_awx_machine_credential"],
                settings["fleetops_awx_aws_credential"],
            ]
        else:
            assert creds == [settings["fleetops_awx_machine_credential"]], jt["name"]
    # no AWS credential configured (an instance profile): the machine credential alone
    from jinja2.nativetypes import NativeEnvironment

    task = next(t for t in _load("configure.yml")[0]["tasks"] if "awx.awx.job_template" in t)
    rendered = (
        NativeEnvironment()
        .from_string(task["awx.awx.job_template"]["credentials"])
        .render({**settings, "fleetops_awx_aws_credential": "", "item": {"remediation": True}})
    )
    assert rendered == [settings["fleetops_awx_machine_credential"]]


# ------------------------------------------------------------------ remediate auto: template and schedule


def _auto_template() -> dict[str, Any]:
    (jt,) = [jt for jt in _job_templates() if jt["playbook"] == "playbooks/remediate_auto.yml"]
    return jt


def _auto_schedule() -> dict[str, Any]:
    (task,) = [
        t
        for t in _load("configure.yml")[0]["tasks"]
        if "awx.awx.schedule" in t and t["awx.awx.schedule"]["name"] == "fleetops remediate auto"
    ]
    return task


def test_auto_template_is_a_dry_run_remediation_with_both_credentials_never_sliced() -> None:
    """The template is created as Check (a dry run: the playbook passes no --apply), asks the job type,
    runs one job at a time, one slice, with the AWS credential (ladder tags, lease) and the machine one."""
    settings = _load("settings.yml")
    jt = _auto_template()
    assert jt["name"] == "fleetops remediate auto" and jt.get("remediation") is True
    args = _job_template_args(jt)
    assert args["job_type"] == "check" and args["ask_job_type_on_launch"] is True
    assert args["job_slice_count"] == 1 and args["ask_job_slice_count_on_launch"] is False
    assert args["allow_simultaneous"] is False
    assert args["credentials"] == [
        settings["fleetops_awx_machine_credential"],
        settings["fleetops_awx_aws_credential"],
    ]
    assert args["playbook"] == "playbooks/remediate_auto.yml"
    # the pass must end (SIGTERM, state saved) before AWX kills the job: the playbook's default
    # fleetops_auto_timeout plus its 60 s grace stays under the template's timeout
    text = (REPO / jt["playbook"]).read_text()
    (limit,) = re.findall(r"fleetops_auto_timeout \| default\((\d+)\)", text)
    assert int(limit) + 60 < args["timeout"] == settings["fleetops_awx_remediate_timeout_s"]


def test_auto_survey_asks_the_policy_the_floor_and_the_kubeconfig_and_repeats_no_default() -> None:
    questions = {q["variable"]: q for q in _auto_template()["survey_spec"]["spec"]}
    assert set(questions) == {
        "fleetops_targets",
        "fleetops_not_after",
        "fleetops_host_timeout",
        "fleetops_auto_policy",
        "fleetops_max_unhealthy",
        "fleetops_kubeconfig",
        "fleetops_auto_cause",  # the event-driven rulebook's answers (extensions/eda/rulebooks/)
        "fleetops_auto_fail_on",  # human: a host that needs a person fails the job (default: it does not)
        "fleetops_auto_locked_retries",
    }
    assert questions["fleetops_auto_fail_on"]["choices"] == list(AUTO_FAIL_ON)  # the CLI's --fail-on
    for variable, q in questions.items():
        if variable != "fleetops_targets":
            assert q["required"] is False and "default" not in q, variable


def test_the_controller_rulebook_launches_the_auto_template_with_survey_answers_only() -> None:
    """AWX refuses a launch whose extra vars are not the survey's (ask_variables_on_launch is off): the
    EDA controller's rulebook sends only survey variables, without the event (include_events: false)."""
    book = yaml.safe_load(
        (REPO / "extensions" / "eda" / "rulebooks" / "fleetops_alerts_controller.yml").read_text()
    )
    template = _auto_template()
    questions = {q["variable"] for q in template["survey_spec"]["spec"]}
    actions = [rule["action"]["run_job_template"] for rule in book[0]["rules"]]
    assert actions and all(a == actions[0] for a in actions)
    action = actions[0]
    assert action["include_events"] is False
    assert set(action["job_args"]["extra_vars"]) <= questions
    assert f"default('{template['name']}')" in action["name"]
    assert not template.get("ask_variables_on_launch")


def test_auto_playbooks_default_inventory_is_the_awx_inventory_sources_config() -> None:
    """Unset, the pass reads the same EC2 config the AWX inventory source imports (one fleet)."""
    settings = _load("settings.yml")
    play = yaml.safe_load((REPO / "playbooks" / "remediate_auto.yml").read_text())[0]
    argv = play["vars"]["fleetops_auto_argv"]
    assert f"(playbook_dir | dirname) ~ '/{settings['fleetops_awx_inventory_config']}'" in argv, argv
    assert (REPO / settings["fleetops_awx_inventory_config"]).is_file()


def test_auto_inventory_gives_the_fleet_become_as_a_host_variable() -> None:
    """The job's --become does not reach the CLI's own ansible runs in the EE: the inventory sets it per
    host (not for the implicit localhost, where the lease and kubectl run unprivileged)."""
    settings = _load("settings.yml")
    config = yaml.safe_load((REPO / settings["fleetops_awx_inventory_config"]).read_text())
    assert config["compose"]["ansible_become"] == "true"  # a Jinja expression: the boolean true


def test_auto_schedule_runs_the_auto_template_every_15_minutes_as_run_and_is_created_disabled() -> None:
    settings = _load("settings.yml")
    task = _auto_schedule()
    schedule = task["awx.awx.schedule"]
    assert schedule["unified_job_template"] == _auto_template()["name"]
    # a schedule's job type applies because the template asks for it on launch
    assert schedule["job_type"] == "run" and _job_template_args(_auto_template())["ask_job_type_on_launch"]
    assert schedule["rrule"] == "{{ fleetops_awx_auto_rrule }}"
    # disabled by default; enabled only by the setting (rendered as Ansible would, from -e strings too)
    from jinja2.nativetypes import NativeEnvironment

    env = NativeEnvironment()
    env.filters["bool"] = lambda v: v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes", "on")
    enabled = env.from_string(schedule["enabled"])
    assert settings["fleetops_awx_auto_schedule_enabled"] is False
    assert enabled.render(settings) is False
    assert enabled.render({**settings, "fleetops_awx_auto_schedule_enabled": "true"}) is True
    # the rrule as AWX wants it, and as dateutil (AWX's parser) reads it: every 15 minutes, forever
    rule = settings["fleetops_awx_auto_rrule"]
    assert re.match(r"^DTSTART;TZID=[\w/+-]+:\d{8}T\d{6} RRULE:", rule), rule
    assert "INTERVAL=" in rule and "SECONDLY" not in rule and "COUNT" not in rule and "UNTIL" not in rule
    parsed = rrule.rrulestr(rule.replace(" ", "\n"), forceset=True)
    first, second, third = list(parsed[:3])  # type: ignore[index]
    assert (second - first).total_seconds() == (third - second).total_seconds() == 15 * 60
    assert first.tzinfo is not None
