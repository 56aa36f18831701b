"""Unit-name rules and `systemctl show` parsing shared by crashloop_unit and disable_unit."""

from __future__ import annotations

import pytest
from ansible_collections.fleetops.node.plugins.module_utils import systemd


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("ecs", "ecs.service"),
        ("ecs.service", "ecs.service"),
        ("getty@tty1.service", "getty@tty1.service"),
        ("getty@.service", "getty@.service"),
        ("dev-sda1.device", "dev-sda1.device"),
        ("system-serial\\x2dgetty.slice", "system-serial\\x2dgetty.slice"),
        ("apt-daily.timer", "apt-daily.timer"),
        ("nvidia-persistenced", "nvidia-persistenced.service"),
    ],
)
def test_valid_unit_names(given: str, expected: str) -> None:
    assert systemd.normalize_unit_name(given) == expected


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "ecs; rm -rf /",
        "ecs.service && reboot",
        "$(reboot).service",
        "ecs`id`",
        "../../etc/passwd.service",
        "a b.service",
        "ecs\n.service",
        "a@b@c.service",
        "x" * 300,
    ],
)
def test_invalid_unit_names_are_refused(bad: str) -> None:
    with pytest.raises(systemd.UnitNameError):
        systemd.normalize_unit_name(bad)


@pytest.mark.parametrize(
    ("unit", "extra", "protected"),
    [
        ("sshd.service", (), True),
        ("ssh.service", (), True),
        ("systemd-journald.service", (), True),
        ("systemd-networkd.service", (), True),
        ("dbus.service", (), True),
        ("kubelet.service", (), True),
        ("containerd.service", (), True),
        ("docker.service", (), True),
        ("networking.service", (), True),
        ("ecs.service", (), False),
        ("ecs.service", ("ecs",), True),
        ("nvidia-fabricmanager.service", ("nvidia-*",), True),
    ],
)
def test_protected_units(unit: str, extra: tuple[str, ...], protected: bool) -> None:
    assert systemd.is_protected(unit, extra) is protected


def test_parse_show_blocks_and_values_with_equals() -> None:
    text = (
        "Id=ecs.service\nNRestarts=41\nEnvironment=A=1 B=2\nSubState=auto-restart\n\n"
        "Id=ssh.service\nNRestarts=0\n\n\n"
    )
    assert systemd.parse_show(text) == [
        {"Id": "ecs.service", "NRestarts": "41", "Environment": "A=1 B=2", "SubState": "auto-restart"},
        {"Id": "ssh.service", "NRestarts": "0"},
    ]


def test_parse_show_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="line 2: expected KEY=VALUE"):
        systemd.parse_show("Id=a.service\nthis is not a property\n")
