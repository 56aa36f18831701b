"""unexpected_unit: parsing real `systemctl list-unit-files` / `show` captures, allow-lists, host facts."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.fleetops.node.plugins.module_utils import units
from ansible_collections.fleetops.node.plugins.modules import node_health

from tests.paths import FIXTURES

FIXTURES = FIXTURES / "units"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_parse_list_unit_files_lab_capture() -> None:
    assert units.parse_list_unit_files(fixture("lab-enabled-ecs.txt")) == [
        {"unit": "ecs.service", "state": "enabled", "preset": "enabled"},
        {"unit": "ssh.service", "state": "enabled", "preset": "enabled"},
        {"unit": "systemd-remount-fs.service", "state": "enabled-runtime", "preset": "enabled"},
        {"unit": "remote-fs.target", "state": "enabled", "preset": "enabled"},
    ]


def test_parse_list_unit_files_with_legend_skips_header_and_footer() -> None:
    assert [u["unit"] for u in units.parse_list_unit_files(fixture("lab-enabled-legend.txt"))] == [
        "ssh.service",
        "remote-fs.target",
    ]


def test_parse_list_unit_files_debian12_machine() -> None:
    parsed = units.parse_list_unit_files(fixture("debian12-enabled.txt"))
    assert len(parsed) == 13
    assert {"unit": "getty@.service", "state": "enabled", "preset": "enabled"} in parsed
    assert {u["state"] for u in parsed} == {"enabled"}


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("foo.service enabled", {"unit": "foo.service", "state": "enabled", "preset": None}),  # systemd < 245
        ("foo.service enabled -", {"unit": "foo.service", "state": "enabled", "preset": None}),
    ],
)
def test_parse_list_unit_files_other_versions(line: str, expected: dict[str, Any]) -> None:
    assert units.parse_list_unit_files(line + "\n") == [expected]


def test_parse_list_unit_files_rejects_garbage() -> None:
    with pytest.raises(units.UnitsError, match="Failed to parse systemctl list-unit-files output: line 2"):
        units.parse_list_unit_files("ssh.service enabled enabled\nwhat is this line\n")


def test_parse_env_show_lab_capture() -> None:
    env = units.parse_env_show(fixture("lab-show-env.txt"))
    assert set(env) == {"ecs.service", "ssh.service"}  # nosuch.service: systemd does not know it
    assert env["ecs.service"] == {"unit_file_state": "enabled", "unit_file_preset": None, "environment": {}}
    ssh = env["ssh.service"]["environment"]
    assert ssh["UCX_MEM_MMAP_HOOK_MODE"] == "none"
    assert ssh["GREETING"] == "hello world"
    assert ssh["QUOTED"] == "a\\b"
    assert ssh["DB_PASSWORD"].startswith("<redacted sha256:") and "hunter2" not in ssh["DB_PASSWORD"]


def test_redaction_keeps_differences_visible() -> None:
    a = units.redact_env({"API_TOKEN": "one", "PATH": "/bin"})
    b = units.redact_env({"API_TOKEN": "two", "PATH": "/bin"})
    assert a["PATH"] == "/bin" and a["API_TOKEN"] != b["API_TOKEN"]


@pytest.mark.parametrize(
    ("unit", "patterns", "match"),
    [
        ("systemd-timesyncd.service", ["systemd-*"], "systemd-*"),
        ("getty@.service", ["getty@*"], "getty@*"),
        ("ssh.service", ["ssh"], "ssh"),  # no unit type: NAME.service
        ("ssh.socket", ["ssh"], None),
        ("ecs.service", ["ssh.service", "systemd-*"], None),
        ("apt-daily.timer", ["*.timer"], "*.timer"),
        ("fstrim.timer", ["[a-f]*"], "[a-f]*"),
    ],
)
def test_matching_pattern(unit: str, patterns: list[str], match: str | None) -> None:
    assert units.matching_pattern(unit, patterns) == match


@pytest.mark.parametrize(
    ("patterns", "problem"),
    [
        (["systemd-*", "getty@*", "ssh.service", "*.timer", "x[ab]?"], None),
        ([], None),
        ([""], "unit_allowlist entries must be non-empty strings"),
        (["ecs service"], "is not a unit-name pattern"),
        (["$(reboot)"], "is not a unit-name pattern"),
        (["a/b.service"], "is not a unit-name pattern"),
        (["x[ab"], "unbalanced"),
        (["x" * 300], "longer than 256"),
    ],
)
def test_validate_patterns(patterns: list[str], problem: str | None) -> None:
    got = units.validate_patterns(patterns)
    assert (got is None) if problem is None else (problem in (got or "")), got


def test_node_health_validates_allowlist_and_env_units() -> None:
    assert "is not a unit-name pattern" in (node_health._validate({"unit_allowlist": ["a;b"]}) or "")
    assert "env_units:" in (node_health._validate({"env_units": ["x y"]}) or "")
    assert node_health._validate({"unit_allowlist": ["ssh*"], "env_units": ["ssh", "cron.service"]}) is None


def test_enablement_candidates(tmp_path: Path) -> None:
    etc, gen = tmp_path / "etc", tmp_path / "generator"
    for link in (
        etc / "multi-user.target.wants" / "ecs.service",
        etc / "getty.target.wants" / "getty@tty1.service",
        etc / "sockets.target.requires" / "dbus.socket",
        gen / "local-fs.target.wants" / "systemd-remount-fs.service",
    ):
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink("/usr/lib/systemd/system/" + link.name, link)
    (etc / "sshd.service").symlink_to("/lib/systemd/system/ssh.service")  # an alias: not a candidate
    (etc / "foo.service.d").mkdir()
    assert units.enablement_candidates([str(etc), str(gen), str(tmp_path / "missing")]) == [
        "dbus.socket",
        "ecs.service",
        "getty@.service",
        "systemd-remount-fs.service",
    ]


class FakeSystemctl:
    """systemctl answering from the lab capture; records every call."""

    def __init__(self, show: str = "lab-show-ecs.txt") -> None:
        self.show = show
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> tuple[int, str, str]:
        self.calls.append(argv)
        if argv[1] == "show":
            return 0, fixture(self.show), ""
        raise AssertionError(argv)


def _systemd_dirs(tmp_path: Path) -> tuple[str, list[str]]:
    """The links of the lab host the capture comes from (README.md: lab-show-ecs.txt)."""
    run_dir = tmp_path / "run-systemd-system"
    run_dir.mkdir()
    etc, generator = tmp_path / "etc", tmp_path / "generator"
    for link in (
        etc / "multi-user.target.wants" / "ecs.service",
        etc / "multi-user.target.wants" / "ssh.service",
        etc / "multi-user.target.wants" / "remote-fs.target",
        generator / "local-fs.target.wants" / "systemd-remount-fs.service",
        generator / "getty.target.wants" / "console-getty.service",
    ):
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink("/usr/lib/systemd/system/" + link.name, link)
    return str(run_dir), [str(etc), str(generator)]


def test_collect_makes_one_call_and_reads_env_of_enabled_services(tmp_path: Path) -> None:
    """One ``systemctl show`` for the candidates: their UnitFileState and preset say which are enabled
    (console-getty: masked), and the same answer holds the enabled services' Environment=."""
    run_dir, dirs = _systemd_dirs(tmp_path)
    run = FakeSystemctl()
    facts = units.collect(run, systemd_dir=run_dir, config_dirs=dirs)
    assert run.calls == [["systemctl", "show", "-p", "Id,UnitFileState,UnitFilePreset,Environment", "--",
                          "console-getty.service", "ecs.service", "remote-fs.target", "ssh.service",
                          "systemd-remount-fs.service"]]  # fmt: skip
    assert facts["enabled"] == [
        "ecs.service",
        "remote-fs.target",
        "ssh.service",
        "systemd-remount-fs.service",
    ]
    assert facts["unit_files"]["systemd-remount-fs.service"] == {
        "state": "enabled-runtime",
        "preset": "enabled",
    }
    # the enabled services (templates and targets aside), sorted
    assert facts["environment_units"] == ["ecs.service", "ssh.service", "systemd-remount-fs.service"]
    assert facts["environment"]["ssh.service"]["UCX_MEM_MMAP_HOOK_MODE"] == "none"
    assert facts["environment"]["ecs.service"] == {}
    assert facts["environment_truncated"] is False
    assert facts["candidates"] == 5
    assert units.evaluate(facts) == []  # no allow-list: facts only


def test_collect_gives_what_list_unit_files_gave(tmp_path: Path) -> None:
    """The enabled units and their state and preset are those of the list-unit-files capture taken on the
    same host (lab-enabled-ecs.txt), which the detector read before."""
    run_dir, dirs = _systemd_dirs(tmp_path)
    facts = units.collect(FakeSystemctl(), systemd_dir=run_dir, config_dirs=dirs)
    listed = units.parse_list_unit_files(fixture("lab-enabled-ecs.txt"))
    assert facts["unit_files"] == {u["unit"]: {"state": u["state"], "preset": u["preset"]} for u in listed}


def test_collect_asks_an_instance_by_its_name_and_reports_its_template(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    wants = tmp_path / "etc" / "getty.target.wants"
    wants.mkdir(parents=True)
    for name in ("getty@tty1.service", "getty@.service", "bad name.service", "notes.txt"):
        (wants / name).symlink_to("/usr/lib/systemd/system/getty@.service")
    show = "Id=getty@tty1.service\nUnitFileState=enabled\nUnitFilePreset=enabled\nEnvironment=\n"
    calls: list[list[str]] = []

    def run(argv: list[str]) -> tuple[int, str, str]:
        calls.append(argv)
        return 0, show, ""

    facts = units.collect(run, systemd_dir=str(run_dir), config_dirs=[str(tmp_path / "etc")])
    assert calls[0][-2:] == ["--", "getty@tty1.service"]  # systemd refuses to show a template
    assert facts["enabled"] == ["getty@.service"]  # as list-unit-files names it
    assert facts["environment_units"] == []


def test_collect_with_env_units_given(tmp_path: Path) -> None:
    run_dir, dirs = _systemd_dirs(tmp_path)
    run = FakeSystemctl()
    facts = units.collect(
        run, env_units=["ssh", "ssh.service", "nosuch"], systemd_dir=run_dir, config_dirs=dirs
    )
    assert len(run.calls) == 1
    assert run.calls[0][-2:] == ["systemd-remount-fs.service", "nosuch.service"]  # the candidates, then these
    assert facts["environment_units"] == ["ssh.service", "nosuch.service"]
    assert set(facts["environment"]) == {"ssh.service"}  # systemd does not know nosuch.service


def test_collect_env_units_without_candidates(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run = FakeSystemctl()
    facts = units.collect(
        run, env_units=["ssh"], systemd_dir=str(run_dir), config_dirs=[str(tmp_path / "none")]
    )
    assert run.calls == [["systemctl", "show", "-p", "Id,UnitFileState,UnitFilePreset,Environment", "--",
                          "ssh.service"]]  # fmt: skip
    assert facts["enabled"] == [] and set(facts["environment"]) == {"ssh.service"}


def test_collect_nothing_enabled(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()

    def run(argv: list[str]) -> tuple[int, str, str]:
        raise AssertionError("no candidates: no systemctl call")

    facts = units.collect(run, systemd_dir=str(run_dir), config_dirs=[str(tmp_path / "none")])
    assert facts["enabled"] == [] and facts["environment"] == {}


def test_collect_candidates_none_enabled(tmp_path: Path) -> None:
    run_dir, dirs = _systemd_dirs(tmp_path)
    show = "".join(
        f"Id={u}\nUnitFileState=disabled\nUnitFilePreset=enabled\n\n" for u in ("ecs.service", "ssh.service")
    )
    facts = units.collect(lambda argv: (0, show, ""), systemd_dir=run_dir, config_dirs=dirs)
    assert facts["enabled"] == [] and facts["environment"] == {}


def test_collect_systemctl_failure_is_a_detector_error(tmp_path: Path) -> None:
    run_dir, dirs = _systemd_dirs(tmp_path)
    with pytest.raises(units.UnitsError, match="Failed to run systemctl show: Access denied"):
        units.collect(lambda argv: (1, "", "Access denied"), systemd_dir=run_dir, config_dirs=dirs)


def test_collect_without_systemd(tmp_path: Path) -> None:
    facts = units.collect(FakeSystemctl(), systemd_dir=str(tmp_path / "absent"))
    assert facts["systemd"] is False and facts["enabled"] == []
    assert units.evaluate(facts, ["ssh*"]) == []


def test_evaluate_names_each_unit_off_the_allowlist(tmp_path: Path) -> None:
    run_dir, dirs = _systemd_dirs(tmp_path)
    facts = units.collect(FakeSystemctl(), systemd_dir=run_dir, config_dirs=dirs)
    findings = units.evaluate(facts, ["ssh", "systemd-*", "*.target"])
    assert [f["data"]["unit"] for f in findings] == ["ecs.service"]
    (finding,) = findings
    assert finding["check"] == "unexpected_unit" and finding["severity"] == "warning"
    assert finding["summary"].startswith(
        "ecs.service is enabled but not on the fleet's unit allow-list (3 patterns)"
    )
    assert "the image enabled it (its vendor preset is enabled)" in finding["summary"]
    assert finding["data"] == {"unit": "ecs.service", "state": "enabled", "preset": "enabled",
                               "allowlist": ["ssh", "systemd-*", "*.target"]}  # fmt: skip
    runtime = units.evaluate(facts, ["ssh", "ecs", "*.target"])
    assert [f["data"]["unit"] for f in runtime] == ["systemd-remount-fs.service"]
    assert "enabled at runtime" in runtime[0]["summary"]


def test_parse_os_release() -> None:
    text = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\nVERSION_ID="12"\nID=debian\n# c\n'
    assert units.parse_os_release(text) == {
        "PRETTY_NAME": "Debian GNU/Linux 12 (bookworm)",
        "NAME": "Debian GNU/Linux",
        "VERSION_ID": "12",
        "ID": "debian",
    }


def test_host_facts_on_this_machine(tmp_path: Path) -> None:
    facts = units.host_facts()
    assert facts["kernel"] == os.uname().release
    assert facts["boot_id"] and len(facts["boot_id"]) == 36
    missing = units.host_facts(os_release=(str(tmp_path / "none"),), proc=str(tmp_path))
    assert missing["os"] is None and missing["boot_id"] is None and missing["kernel"]


def test_run_checks_returns_host_facts_even_for_one_detector() -> None:
    result = node_health.run_checks({"checks": ["zombie_memcg"]})
    assert set(result["facts"]) == {"memcg", "host"}
    assert result["facts"]["host"]["kernel"] == os.uname().release


def test_credentials_inside_values_are_digested_in_the_scan() -> None:
    """The issue's case: DATABASE_URL's name is not secret-looking, its userinfo password is."""
    text = (
        "Id=api.service\n"
        'Environment="DATABASE_URL=postgres://app:s3cr3t-9f2@db.internal/x" UCX_MEM_MMAP_HOOK_MODE=none\n'
        "UnitFileState=enabled\n"
    )
    env = units.parse_env_show(text)["api.service"]["environment"]
    assert "s3cr3t-9f2" not in env["DATABASE_URL"]
    assert env["DATABASE_URL"].startswith("postgres://app:<redacted sha256:")
    assert env["DATABASE_URL"].endswith("@db.internal/x")
    assert env["UCX_MEM_MMAP_HOOK_MODE"] == "none"
