"""fleetops.node.disable_unit: protection by identity, the unit-type rule, refusals that run nothing,
and actions on the unit systemd resolved.

``UnitDisabler`` runs in-process; its ``systemctl`` is a stand-in that replays ``systemctl show``
blocks captured on a Debian 12 lab host (tests/unit/fixtures/systemd_identity): this machine has no
systemd. The same refusals on a real systemd, with the host checked unchanged afterwards, are in
tests/integration/test_protected_units_lab.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.fleetops.node.plugins.module_utils import systemd
from ansible_collections.fleetops.node.plugins.modules import disable_unit

from tests.helpers import run_module
from tests.paths import FIXTURES

ASKED = [
    "dbus-org.freedesktop.login1.service", "multi-user.target", "system.slice", "ssh@h3.service", "sshd.service",
    "no-such-unit-h3.service", "-.mount", "dbus.socket", "getty@tty1.service",
]  # fmt: skip
BLOCKS = dict(
    zip(
        ASKED,
        systemd.parse_show((FIXTURES / "systemd_identity" / "show-identity.txt").read_text()),
        strict=True,
    )
)


class FakeSystemctl:
    """``systemctl show`` answers from the captures, by the name asked; every command is recorded."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> tuple[int, str, str]:
        self.calls.append(argv)
        if argv[1] == "show":
            assert argv[-2] == "--"
            # after a change the module reads the unit again by its Id
            props = BLOCKS.get(argv[-1]) or BLOCKS[ASKED[0]]
            return 0, "".join(f"{k}={v}\n" for k, v in props.items()), ""
        return 0, "", ""


def disabler(run: FakeSystemctl, **overrides: Any) -> disable_unit.UnitDisabler:
    params: dict[str, Any] = dict(
        name="ecs", containers=[], protected=[], allow_protected=False, backup_dir="/nonexistent/backup"
    )
    params.update(overrides)
    return disable_unit.UnitDisabler(run, params, systemctl="systemctl")


@pytest.mark.parametrize(
    ("name", "allow", "unit", "refusal", "message"),
    [
        (
            "dbus-org.freedesktop.login1", False, "systemd-logind.service", "protected",
            "Failed to disable systemd-logind.service: it is protected by 'systemd-*' (the way in",
        ),
        (
            "multi-user.target", False, "multi-user.target", "type",
            "Failed to disable multi-user.target: it is a target unit; only service, socket, timer, path units "
            "can be disabled",
        ),
        ("multi-user.target", True, "multi-user.target", "type", "Failed to disable multi-user.target: it is a target"),
        ("system.slice", True, "system.slice", "type", "Failed to disable system.slice: it is a slice unit"),
        ("sshd", False, "ssh.service", "protected", "Failed to disable ssh.service: it is protected by 'ssh.service'"),
        ("dbus.socket", False, "dbus.socket", "protected", "Failed to disable dbus.socket: it is protected by 'dbus.socket'"),
        ("ssh@h3", False, "ssh@h3.service", "protected", "it is protected by 'ssh@*.service'"),
        ("no-such-unit-h3", False, "no-such-unit-h3.service", "not-found", "no-such-unit-h3.service: no such unit on"),
    ],
)  # fmt: skip
def test_refusals_resolve_first_and_run_nothing_else(
    name: str, allow: bool, unit: str, refusal: str, message: str
) -> None:
    run = FakeSystemctl()
    with pytest.raises(disable_unit.DisableUnitError) as err:
        disabler(run, name=name, allow_protected=allow).decide()
    assert message in str(err.value)
    assert "\n" not in str(err.value)
    assert err.value.result["refusal"] == refusal
    assert err.value.result["unit"] == unit
    assert [argv[1] for argv in run.calls] == ["show"]  # one show, no stop, no mask


def test_an_alias_is_protected_by_its_unit_and_the_names_come_back() -> None:
    with pytest.raises(disable_unit.DisableUnitError) as err:
        disabler(FakeSystemctl(), name="dbus-org.freedesktop.login1").decide()
    assert err.value.result["requested"] == "dbus-org.freedesktop.login1.service"
    assert err.value.result["names"] == ["systemd-logind.service", "dbus-org.freedesktop.login1.service"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"name": "-.mount"}, "Failed to disable unit: '-.mount' starts with '-'"),
        ({"name": "--now"}, "Failed to disable unit: '--now' starts with '-'"),
        ({"name": "ecs;reboot"}, "is not a valid systemd unit name"),
        ({"name": "ecs\n"}, "is not a valid systemd unit name"),
        ({"containers": ["-rf"]}, "Failed to disable ecs.service: '-rf' is not a valid container name"),
        ({"containers": ["a;b"]}, "'a;b' is not a valid container name"),
        ({"protected": ["a b"]}, "protected entry 'a b' is not a unit-name pattern"),
    ],
)
def test_invalid_input_runs_nothing(overrides: dict[str, Any], message: str) -> None:
    run = FakeSystemctl()
    with pytest.raises(disable_unit.DisableUnitError) as err:
        disabler(run, **overrides).decide()
    assert message in str(err.value)
    assert err.value.result["refusal"] == "invalid"
    assert run.calls == []


def test_the_override_allows_a_protected_service_and_acts_on_its_id() -> None:
    run = FakeSystemctl()
    worker = disabler(run, name="dbus-org.freedesktop.login1", allow_protected=True)
    result = worker.decide()
    assert result["unit"] == "systemd-logind.service"
    assert result["actions"] == ["stop", "mask"]  # static: nothing to disable
    assert result["after"]["unit_file_state"] == "masked"
    assert worker.diff()["before_header"] == "systemd-logind.service (before)"
    worker.act()
    assert run.calls[1:] == [
        ["systemctl", "stop", "--", "systemd-logind.service"],
        ["systemctl", "mask", "--", "systemd-logind.service"],
        ["systemctl", "show", "-p", disable_unit._PROPS, "--", "systemd-logind.service"],
    ]


def test_the_override_allows_a_socket() -> None:
    result = disabler(FakeSystemctl(), name="dbus.socket", allow_protected=True).decide()
    assert result["unit"] == "dbus.socket" and result["actions"] == ["stop", "mask"]


def test_an_extra_protected_pattern_is_matched_against_every_name() -> None:
    with pytest.raises(disable_unit.DisableUnitError) as err:
        disabler(FakeSystemctl(), name="sshd", allow_protected=False, protected=["sshd"]).decide()
    assert err.value.result["names"] == ["ssh.service", "sshd.service"]


def test_an_already_masked_unit_is_no_change() -> None:
    result = disabler(FakeSystemctl(), name="getty@tty1", allow_protected=True).decide()
    assert result["changed"] is False and result["actions"] == []


def test_without_systemd_nothing_runs() -> None:
    run = FakeSystemctl()
    worker = disable_unit.UnitDisabler(
        run,
        dict(name="ecs", containers=[], protected=[], allow_protected=False, backup_dir="/x"),
        booted=False,
    )
    with pytest.raises(disable_unit.DisableUnitError, match="this host is not running systemd"):
        worker.decide()
    assert run.calls == []


# ---------------------------------------------------------------------------------------------
# End to end: ansible runs the module on this machine (its PID 1 is not systemd)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            {"name": "ecs;reboot"},
            "Failed to disable unit: 'ecs;reboot.service' is not a valid systemd unit name",
        ),
        ({"name": "--now"}, "Failed to disable unit: '--now' starts with '-'"),
        (
            {"name": "ecs", "containers": ["-f"]},
            "Failed to disable ecs.service: '-f' is not a valid container name",
        ),
    ],
)
def test_refusals_end_to_end(tmp_path: Path, args: dict[str, Any], message: str) -> None:
    rc, result = run_module(tmp_path, "fleetops.node.disable_unit", json.dumps(args))
    assert rc != 0
    assert result["msg"].startswith(message)
    assert result["refusal"] == "invalid"


@pytest.mark.skipif(
    os.path.isdir("/run/systemd/system"),
    reason="needs a host without systemd: this machine runs systemd as PID 1",
)
def test_a_host_without_systemd_is_a_clear_error(tmp_path: Path) -> None:
    rc, result = run_module(tmp_path, "fleetops.node.disable_unit", json.dumps({"name": "ecs"}), "--check")
    assert rc != 0
    assert result["msg"] == "Failed to disable ecs.service: this host is not running systemd"
