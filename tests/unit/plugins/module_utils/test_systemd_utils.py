"""Unit names, identity and protection, `systemctl show` parsing, and Environment= drop-ins (module_utils/systemd)."""

from __future__ import annotations

import hashlib

import pytest
from ansible_collections.fleetops.node.plugins.module_utils import systemd

from tests.paths import FIXTURES


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


# ---------------------------------------------------------------------------------------------
# One normalisation rule; names checked whole (fullmatch), never with "$"
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("dbus-org.freedesktop.login1", "dbus-org.freedesktop.login1.service"),  # ".login1" is no unit type
        ("multi-user.target", "multi-user.target"),
        ("sshd@h3", "sshd@h3.service"),
        ("ssh@1-10.0.0.1:22-10.0.0.2:5555", "ssh@1-10.0.0.1:22-10.0.0.2:5555.service"),
    ],
)
def test_normalisation_appends_service_like_systemctl(given: str, expected: str) -> None:
    assert systemd.normalize_unit_name(given) == expected


@pytest.mark.parametrize(
    "bad",
    [
        "-.mount",
        "-.slice",
        "--now",
        "-foo.service",
        "ecs.service\n",
        "ecs\n",
        "a|b",
        "a>b.service",
        "a*.service",
    ],
)
def test_leading_dash_trailing_newline_and_metacharacters_are_refused(bad: str) -> None:
    with pytest.raises(systemd.UnitNameError):
        systemd.normalize_unit_name(bad)


@pytest.mark.parametrize(
    ("name", "kind"),
    [("a.service", "service"), ("a.target", "target"), ("a.b.login1", None), (".service", None), ("a", None)],
)
def test_unit_type(name: str, kind: str | None) -> None:
    assert systemd.unit_type(name) == kind


# ---------------------------------------------------------------------------------------------
# Identity: what systemd resolves a name to (real captures), and protection over every name
# ---------------------------------------------------------------------------------------------


def _captured(name: str) -> list[dict[str, str]]:
    return systemd.parse_show((FIXTURES / "systemd_identity" / name).read_text())


def test_identity_of_real_units() -> None:
    blocks = _captured("show-identity.txt")
    asked = [
        "dbus-org.freedesktop.login1.service", "multi-user.target", "system.slice", "ssh@h3.service",
        "sshd.service", "no-such-unit-h3.service", "-.mount", "dbus.socket", "getty@tty1.service",
    ]  # fmt: skip
    identities = [systemd.unit_identity(props, name) for props, name in zip(blocks, asked, strict=True)]
    assert identities[0] == {
        "id": "systemd-logind.service",
        "names": ["systemd-logind.service", "dbus-org.freedesktop.login1.service"],
    }
    assert identities[1]["names"] == [
        "multi-user.target", "runlevel4.target", "runlevel2.target", "runlevel3.target",
    ]  # fmt: skip
    assert identities[4] == {"id": "ssh.service", "names": ["ssh.service", "sshd.service"]}
    assert identities[5] == {"id": "no-such-unit-h3.service", "names": ["no-such-unit-h3.service"]}


def test_quoted_names_are_unescaped() -> None:
    (props,) = _captured("show-escaped-name.txt")
    assert systemd.parse_words(props["Names"]) == ["bad\\x3bname.service"]
    assert systemd.unit_identity(props, "x.service")["names"] == ["bad\\x3bname.service", "x.service"]


@pytest.mark.parametrize(
    "name",
    [
        "ssh.service", "sshd.service", "ssh.socket", "sshd@h3.service", "ssh@1-10.0.0.1:22-10.0.0.2:5555.service",
        "systemd-logind.service", "systemd-udevd.service", "udev.service", "dbus.socket",
        "dbus-org.freedesktop.login1.service", "getty@tty1.service", "serial-getty@ttyS0.service",
        "networking.service", "ifup@eth0.service", "kubelet.service", "containerd.service", "docker.socket",
        "amazon-ssm-agent.service", "snap.amazon-ssm-agent.amazon-ssm-agent.service",
        "nvidia-fabricmanager.service", "nvidia-persistenced.service",
    ],
)  # fmt: skip
def test_the_default_protected_set(name: str) -> None:
    assert systemd.is_protected(name)


def test_protection_follows_every_name() -> None:
    # the alias alone would pass a check on the name typed; the unit's Id does not
    assert systemd.protected_match(["systemd-logind.service", "dbus-org.freedesktop.login1.service"]) == (
        "systemd-logind.service",
        "systemd-*",
    )
    assert systemd.protected_match(["ssh.service", "sshd.service"]) == ("ssh.service", "ssh.service")
    assert systemd.protected_match(["ecs.service"]) is None
    assert systemd.protected_match(["vllm-decode.service"], ["vllm-*"]) == ("vllm-decode.service", "vllm-*")
    assert systemd.protected_match(["ray-head.service"], ["ray-head"]) == (
        "ray-head.service",
        "ray-head.service",
    )


@pytest.mark.parametrize(
    ("patterns", "ok"), [(["vllm-*", "a@*.service"], True), (["a;b"], False), (["-x"], False)]
)
def test_unit_patterns(patterns: list[str], ok: bool) -> None:
    assert (systemd.validate_unit_patterns(patterns) is None) is ok


# ---------------------------------------------------------------------------------------------
# Environment= drop-ins
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["UCX_X\n", "UCX_X\r", "\nUCX_X", "A B", "1A", "A-B", ""])
def test_variable_names_are_matched_whole(name: str) -> None:
    with pytest.raises(systemd.DropInError, match="is not a valid variable name"):
        systemd.validate_env({name: "1"})


def test_errors_never_carry_the_value() -> None:
    for value in (["s3cr3t"], {"k": "s3cr3t"}):
        with pytest.raises(systemd.DropInError) as err:
            systemd.validate_env({"TOKEN": value})
        assert "s3cr3t" not in str(err.value)
    with pytest.raises(systemd.DropInError) as err:
        systemd.parse_drop_in("[Service]\nEnvironment=TOKEN=s3cr3t\ns3cr3t-garbage\n")
    assert str(err.value) == "line 3: expected KEY=VALUE"


@pytest.mark.parametrize("name", ["../x.conf", "x.conf\n", ".hidden.conf", "-x.conf", "x.txt", "a/b.conf"])
def test_drop_in_names(name: str) -> None:
    with pytest.raises(systemd.DropInError):
        systemd.check_drop_in_name(name)
    systemd.check_drop_in_name("50-fleetops-env.conf")


def test_parse_drop_in_names_what_is_not_environment() -> None:
    text = (
        "### Editing /etc/systemd/system/vllm.service.d/override.conf\n[Service]\nExecStart=\n"
        "ExecStart=/usr/bin/vllm serve\nLimitNOFILE=1048576\nEnvironment=A=1\n\n[Unit]\nAfter=x\n"
    )
    env, other = systemd.parse_drop_in(text)
    assert env == {"A": "1"}
    assert other == ["line 3: ExecStart=", "line 4: ExecStart=", "line 5: LimitNOFILE=", "line 8: [Unit]",
                     "line 9: After="]  # fmt: skip
    assert systemd.parse_drop_in("# c\n; c\n\n[Service]\nEnvironment=A=1 B=2\n") == ({"A": "1", "B": "2"}, [])


def test_parse_environment() -> None:
    assert systemd.parse_environment('A=1 "B=x y" C=a\\ b') == {"A": "1", "B": "x y", "C": "a b"}
    assert systemd.parse_environment('"A=x\\"q"') == {"A": 'x"q'}


def test_digest() -> None:
    assert systemd.digest_value("none") == "sha256:" + hashlib.sha256(b"none").hexdigest()[:12]
    assert systemd.digest_value("none") != systemd.digest_value("None")
