"""sdbus: the D-Bus client crashloop_unit and unexpected_unit ask systemd with, against a fake systemd on a Unix
socket (its replies written by an encoder of the test's own), and the detectors' fallback to systemctl.

That its answers are systemctl's on a real systemd is tests/integration/test_sdbus_lab.py's to show."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.fleetops.node.plugins.module_utils import crashloop, sdbus, units

from tests.paths import FIXTURES

LIST_UNITS = (FIXTURES / "systemd" / "list-units-crashloop-ecs.txt").read_text()


# ------------------------------------------------------------------------------------- a reply encoder


def _align(buf: bytearray, size: int) -> None:
    buf.extend(b"\0" * (-len(buf) % size))


def _encode(buf: bytearray, sig: str, value: Any, order: str) -> None:
    """One value of the complete type ``sig`` (s, o, g, u, b, a..., (...), v as (sig, value))."""
    code = sig[0]
    if code in "so":
        data = value.encode()
        _align(buf, 4)
        buf.extend(struct.pack(order + "I", len(data)) + data + b"\0")
    elif code == "g":
        buf.extend(bytes([len(value)]) + value.encode() + b"\0")
    elif code in "ub":
        _align(buf, 4)
        buf.extend(struct.pack(order + "I", int(value)))
    elif code == "y":
        buf.append(value)
    elif code == "a":
        _align(buf, 4)
        at = len(buf)
        buf.extend(b"\0\0\0\0")
        _align(buf, 8 if sig[1] in "({" else 4 if sig[1] in "soub" else 1)
        start = len(buf)
        for item in value:
            _encode(buf, sig[1:], item, order)
        buf[at : at + 4] = struct.pack(order + "I", len(buf) - start)
    elif code == "(":
        _align(buf, 8)
        for part, item in zip(sdbus._split(sig[1:-1]), value, strict=True):
            _encode(buf, part, item, order)
    elif code == "v":
        _encode(buf, "g", value[0], order)
        _encode(buf, value[0], value[1], order)
    else:
        raise AssertionError(sig)


def reply(reply_serial: int, signature: str, values: list[Any], *, kind: int = 2, error: str = "",
          order: str = "<") -> bytes:  # fmt: skip
    body = bytearray()
    for part, value in zip(sdbus._split(signature), values, strict=True):
        _encode(body, part, value, order)
    fields: list[tuple[int, tuple[str, Any]]] = [(5, ("u", reply_serial)), (8, ("g", signature))]
    if error:
        fields.append((4, ("s", error)))
    head = bytearray(b"l" if order == "<" else b"B")
    head.extend(struct.pack(order + "BBBII", kind, 1, 1, len(body), 7))
    _encode(head, "a(yv)", fields, order)
    _align(head, 8)
    return bytes(head + body)


# ------------------------------------------------------------------------------------- a fake systemd


class FakeSystemd:
    """A Unix socket that speaks as PID 1's private bus: EXTERNAL authentication, then one answer a call
    from ``answer(path, interface, member, args) -> bytes-producing (serial -> reply)``; records the calls."""

    def __init__(
        self, path: Path, answer: Callable[[str, str, str, list[Any]], Callable[[int], bytes] | None]
    ):
        self.path = str(path)
        self.answer = answer
        self.calls: list[tuple[str, str, str, list[Any]]] = []
        self.auth = b""
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(4)
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            # OSError: the client hung up (it does, at the first error reply)
            with conn, contextlib.suppress(OSError):
                self.converse(conn)

    def converse(self, conn: socket.socket) -> None:
        data = b""
        while b"BEGIN\r\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
        self.auth, _, data = data.partition(b"BEGIN\r\n")
        conn.sendall(b"OK 0123456789abcdef0123456789abcdef\r\n")
        while True:
            while len(data) < 16:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            if len(data) < 16:
                break
            body_len, serial, fields_len = struct.unpack_from("<III", data, 4)
            total = 16 + fields_len + (-(16 + fields_len) % 8) + body_len
            while len(data) < total:
                data += conn.recv(65536)
            message, data = data[:total], data[total:]
            header = sdbus._Reader(message[: 16 + fields_len], "<")
            header.pos = 12
            fields = dict(header.read("a(yv)"))
            _kind, _reply, _error, _sig, args = sdbus.parse_message(message)
            self.calls.append((fields[1], fields[2], fields[3], args))
            make = self.answer(fields[1], fields[2], fields[3], args)
            if make is not None:
                conn.sendall(make(serial))

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sdbus.os, "geteuid", lambda: 0)


UNIT_ROWS = [
    ("ecs.service", "ECS agent", "loaded", "activating", "auto-restart", "", "/org/freedesktop/systemd1/unit/ecs_2eservice",
     0, "", "/"),
    ("ssh.service", "OpenBSD Secure Shell server", "loaded", "active", "running", "",
     "/org/freedesktop/systemd1/unit/ssh_2eservice", 0, "", "/"),
    ("gone.service", "gone.service", "not-found", "inactive", "dead", "", "/org/freedesktop/systemd1/unit/gone_2eservice",
     0, "", "/"),
]  # fmt: skip

PROPERTIES: dict[tuple[str, str], Any] = {
    ("ecs.service", "Id"): ("s", "ecs.service"),
    ("ecs.service", "UnitFileState"): ("s", "enabled"),
    ("ecs.service", "UnitFilePreset"): ("s", "enabled"),
    ("ecs.service", "Environment"): ("as", ["A=1", "SPACE=a b", 'QUOTE=say "hi"', "NL=x\ny"]),
    ("sshd.service", "Id"): ("s", "ssh.service"),  # an alias: shown as the unit it names
    ("sshd.service", "UnitFileState"): ("s", "enabled"),
    ("sshd.service", "UnitFilePreset"): ("s", ""),
    ("sshd.service", "Environment"): ("as", []),
    ("remote-fs.target", "Id"): ("s", "remote-fs.target"),
    ("remote-fs.target", "UnitFileState"): ("s", "enabled"),
    ("remote-fs.target", "UnitFilePreset"): ("s", "enabled"),
    ("bad.service", "Id"): ("s", "bad.service"),
    ("bad.service", "UnitFileState"): ("s", "enabled"),
    ("bad.service", "UnitFilePreset"): ("s", "enabled"),
    ("bad.service", "Environment"): ("as", ["CTRL=a\x01b"]),
}
PATHS = dict((sdbus.unit_path(name), name) for name, _prop in PROPERTIES)


def systemd_answer(path: str, interface: str, member: str, args: list[Any]) -> Callable[[int], bytes] | None:
    if member == "ListUnitsByPatterns":
        return lambda serial: reply(serial, "a(ssssssouso)", [UNIT_ROWS])
    if member == "Get" and interface == sdbus.PROPERTIES:
        key = (PATHS.get(path, ""), args[1])
        if key not in PROPERTIES:
            return lambda serial: reply(serial, "s", ["Unknown property"], kind=3,
                                        error="org.freedesktop.DBus.Error.UnknownProperty")  # fmt: skip
        return lambda serial: reply(serial, "v", [PROPERTIES[key]])
    return lambda serial: reply(serial, "s", ["no"], kind=3, error="org.freedesktop.DBus.Error.UnknownMethod")


@pytest.fixture
def fake(tmp_path: Path, root: None) -> Iterator[FakeSystemd]:
    server = FakeSystemd(tmp_path / "private", systemd_answer)
    yield server
    server.close()


# ------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize(
    ("name", "path"),
    [
        # as PID 1 names them (lab host, systemd 252: ListUnits' object paths)
        ("remote-cryptsetup.target", "/org/freedesktop/systemd1/unit/remote_2dcryptsetup_2etarget"),
        ("systemd-udevd-kernel.socket", "/org/freedesktop/systemd1/unit/systemd_2dudevd_2dkernel_2esocket"),
        ("getty@tty1.service", "/org/freedesktop/systemd1/unit/getty_40tty1_2eservice"),
        ("9p.mount", "/org/freedesktop/systemd1/unit/_39p_2emount"),  # a leading digit is escaped
        ("a\\x2db.service", "/org/freedesktop/systemd1/unit/a_5cx2db_2eservice"),
    ],
)
def test_unit_path_escapes_as_systemd(name: str, path: str) -> None:
    assert sdbus.unit_path(name) == path


def test_a_call_reads_back_and_a_big_endian_reply_parses() -> None:
    call = sdbus.method_call(3, "/org/freedesktop/systemd1", sdbus.MANAGER, "ListUnitsByPatterns", "asas",
                             ([], ["*.service"]))  # fmt: skip
    assert sdbus.parse_message(call) == (1, None, None, "asas", [[], ["*.service"]])
    big = reply(3, "a(ssssssouso)", [UNIT_ROWS[:1]], order=">")
    assert sdbus.parse_message(big) == (2, 3, None, "a(ssssssouso)", [[UNIT_ROWS[0]]])
    with pytest.raises(sdbus.BusError, match="message length"):
        sdbus.parse_message(big + b"\0")


def test_list_units_asks_what_systemctl_asks(fake: FakeSystemd) -> None:
    bus = sdbus.Systemd(fake.path)
    assert bus.list_units(["*.service"]) == UNIT_ROWS
    assert fake.calls == [
        ("/org/freedesktop/systemd1", sdbus.MANAGER, "ListUnitsByPatterns", [[], ["*.service"]])
    ]
    assert fake.auth == b"\0AUTH EXTERNAL 30\r\n"  # uid 0, in hex digits
    bus.close()


def test_list_services_over_dbus_is_list_units_text(fake: FakeSystemd) -> None:
    """The same {unit: (load, active, sub)} as parse_list_units of systemctl's lines for those units."""
    text = "".join(f"{u[0]} {u[2]} {u[3]} {u[4]} {u[1]}\n" for u in UNIT_ROWS)
    calls: list[list[str]] = []

    def run(argv: list[str]) -> tuple[int, str, str]:
        calls.append(argv)
        return 0, text, ""

    over_bus = crashloop.list_services(run, sdbus.Systemd(fake.path))
    assert calls == []
    assert over_bus == crashloop.list_services(run) == crashloop.parse_list_units(text)
    assert over_bus["ecs.service"] == ("loaded", "activating", "auto-restart")


def test_show_asks_each_property_on_its_interface(fake: FakeSystemd) -> None:
    bus = sdbus.Systemd(fake.path)
    shown = bus.show(["ecs.service", "remote-fs.target"], units.SHOW_UNIT_PROPERTIES, ("Environment",))
    assert shown == [
        {"Id": "ecs.service", "UnitFileState": "enabled", "UnitFilePreset": "enabled",
         "Environment": ["A=1", "SPACE=a b", 'QUOTE=say "hi"', "NL=x\ny"]},
        {"Id": "remote-fs.target", "UnitFileState": "enabled", "UnitFilePreset": "enabled"},  # a target: none
    ]  # fmt: skip
    assert [(iface, args[1]) for _p, _i, _m, args in fake.calls for iface in [args[0]]] == [
        (sdbus.UNIT, "Id"), (sdbus.UNIT, "UnitFileState"), (sdbus.UNIT, "UnitFilePreset"),
        ("org.freedesktop.systemd1.Service", "Environment"),
        (sdbus.UNIT, "Id"), (sdbus.UNIT, "UnitFileState"), (sdbus.UNIT, "UnitFilePreset"),
    ]  # fmt: skip
    # a control character systemctl would print as an octal escape: the caller runs systemctl
    with pytest.raises(sdbus.BusError, match="control character"):
        bus.show(["bad.service"], units.SHOW_UNIT_PROPERTIES, ("Environment",))


class Systemctl:
    """systemctl show answering what the fake systemd holds, as systemd 252 prints it; records the calls."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> tuple[int, str, str]:
        self.calls.append(argv)
        assert argv[:5] == ["systemctl", "show", "-p", "Id,UnitFileState,UnitFilePreset,Environment", "--"]
        blocks = []
        for name in argv[5:]:
            lines = []
            for prop in ("Environment", "Id", "UnitFileState", "UnitFilePreset"):
                if (name, prop) in PROPERTIES:
                    value = PROPERTIES[name, prop][1]
                    if isinstance(value, list):
                        value = " ".join(_quote(word) for word in value)
                    lines.append(f"{prop}={value}")
            blocks.append("\n".join(lines) + "\n")
        return 0, "\n".join(blocks), ""


def _quote(word: str) -> str:
    if all(c.isalnum() or c in "=_-./" for c in word):
        return word
    escaped = "".join("\\" + c if c in '"\\`$' else "\\n" if c == "\n" else
                      f"\\{ord(c):03o}" if ord(c) < 32 else c for c in word)  # fmt: skip
    return f'"{escaped}"'


def _dirs(tmp_path: Path, names: list[str]) -> tuple[str, list[str]]:
    run_dir = tmp_path / "run-systemd-system"
    run_dir.mkdir()
    wants = tmp_path / "etc" / "multi-user.target.wants"
    wants.mkdir(parents=True)
    for name in names:
        os.symlink("/usr/lib/systemd/system/" + name, wants / name)
    return str(run_dir), [str(tmp_path / "etc")]


def _facts(facts: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in facts.items() if k != "collect_ms"}


def test_units_over_dbus_are_what_systemctl_gives(fake: FakeSystemd, tmp_path: Path) -> None:
    run_dir, dirs = _dirs(tmp_path, ["ecs.service", "remote-fs.target", "sshd.service"])
    systemctl = Systemctl()
    by_systemctl = units.collect(systemctl, ["sshd", "ecs"], systemd_dir=run_dir, config_dirs=dirs)
    assert len(systemctl.calls) == 1
    by_bus = units.collect(
        systemctl, ["sshd", "ecs"], systemd_dir=run_dir, config_dirs=dirs, bus=sdbus.Systemd(fake.path)
    )
    assert len(systemctl.calls) == 1  # no systemctl
    assert _facts(by_bus) == _facts(by_systemctl)
    assert by_bus["environment"]["ecs.service"] == {
        "A": "1",
        "SPACE": "a b",
        "QUOTE": 'say "hi"',
        "NL": "x\ny",
    }
    assert by_bus["enabled"] == ["ecs.service", "remote-fs.target"]  # sshd.service is ssh.service's alias


def test_a_value_systemctl_escapes_in_octal_is_read_by_systemctl(fake: FakeSystemd, tmp_path: Path) -> None:
    run_dir, dirs = _dirs(tmp_path, ["bad.service", "ecs.service"])
    systemctl = Systemctl()
    bus = sdbus.Systemd(fake.path)
    facts = units.collect(systemctl, systemd_dir=run_dir, config_dirs=dirs, bus=bus)
    assert len(systemctl.calls) == 1
    assert facts["environment"]["bad.service"] == {"CTRL": "a001b"}  # what systemctl's text always gave
    assert bus.failed is None  # the connection stays usable: only that answer came from systemctl
    assert crashloop.list_services(lambda argv: pytest.fail("systemctl"), bus)["ssh.service"][2] == "running"


def test_an_error_reply_falls_back_to_systemctl_for_good(fake: FakeSystemd, tmp_path: Path) -> None:
    run_dir, dirs = _dirs(tmp_path, ["ecs.service", "unknown.service"])  # systemd has no such property for it
    systemctl = Systemctl()
    bus = sdbus.Systemd(fake.path)
    facts = units.collect(systemctl, systemd_dir=run_dir, config_dirs=dirs, bus=bus)
    assert len(systemctl.calls) == 1
    assert facts["enabled"] == ["ecs.service"]
    assert bus.failed is not None and "UnknownProperty" in bus.failed
    calls = len(fake.calls)
    with pytest.raises(sdbus.BusError):
        bus.list_units(["*.service"])  # no second try on this connection
    assert len(fake.calls) == calls
    assert crashloop.list_services(lambda argv: (0, LIST_UNITS, ""), bus) == crashloop.parse_list_units(
        LIST_UNITS
    )


def test_no_socket_or_not_root_is_systemctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = lambda argv: (0, LIST_UNITS, "")  # noqa: E731
    monkeypatch.setattr(sdbus.os, "geteuid", lambda: 0)
    missing = sdbus.Systemd(str(tmp_path / "absent"))
    assert crashloop.list_services(run, missing) == crashloop.parse_list_units(LIST_UNITS)
    assert "absent" in (missing.failed or "")
    server = FakeSystemd(tmp_path / "private", systemd_answer)
    try:
        monkeypatch.setattr(sdbus.os, "geteuid", lambda: 1000)
        user = sdbus.Systemd(server.path)
        assert crashloop.list_services(run, user) == crashloop.parse_list_units(LIST_UNITS)
        assert server.calls == [] and "not root" in (user.failed or "")
    finally:
        server.close()


def test_no_answer_times_out_into_systemctl(tmp_path: Path, root: None) -> None:
    server = FakeSystemd(tmp_path / "private", lambda *call: None)  # reads the call, never answers
    try:
        bus = sdbus.Systemd(server.path, timeout=0.3)
        assert crashloop.list_services(lambda argv: (0, LIST_UNITS, ""), bus) == crashloop.parse_list_units(
            LIST_UNITS
        )
        assert "timed out" in (bus.failed or "")
    finally:
        server.close()
