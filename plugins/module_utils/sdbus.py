# -*- coding: utf-8 -*-

# Copyright: (c) 2026, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""What two ``systemctl`` commands of a scan ask systemd, asked over D-Bus instead.

A scan asked PID 1 twice through ``systemctl`` (``list-units`` for crashloop_unit, ``show -p
Id,UnitFileState,UnitFilePreset,Environment`` for unexpected_unit): each a process that loads libsystemd-shared,
connects to PID 1 and asks it one thing, about 5 ms of the host's CPU apiece, plus PID 1 serializing every
property of every interface of each shown unit. This module sends the same calls systemctl sends over one
connection to systemd's private socket (``/run/systemd/private``, root only, as systemctl itself uses it as
root): ``ListUnitsByPatterns`` and ``org.freedesktop.DBus.Properties.Get`` of the properties asked for, on the
unit's object path (systemctl show's path: PID 1 loads a unit that is not loaded yet, as for systemctl).

Whenever anything is not what this module expects (no socket, not root, a refused authentication, an error
reply, an unexpected signature, a timeout), it raises ``BusError`` and its callers run systemctl as before, so
a host whose systemd this does not understand is read exactly as it always was.

Only the wire format's parts these calls use: little or big endian replies, the basic types, arrays, structs,
dict entries and variants; no file descriptors, no signals.

Stdlib only (``_socket``: importing ``socket`` costs the host ~6 ms for its enum conversions); importable on
Python >= 3.9.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import struct

PRIVATE_SOCKET = "/run/systemd/private"
MANAGER_PATH = "/org/freedesktop/systemd1"
MANAGER = "org.freedesktop.systemd1.Manager"
PROPERTIES = "org.freedesktop.DBus.Properties"
UNIT = "org.freedesktop.systemd1.Unit"
# the unit types with an execution context (Environment=, ...), each on its own interface
EXEC_INTERFACES = dict((kind, "org.freedesktop.systemd1." + kind.capitalize()) for kind in ("service", "socket", "mount", "swap"))
TIMEOUT_S = 10.0
MAX_MESSAGE = 128 * 1024 * 1024  # the specification's limit

_METHOD_CALL, _METHOD_RETURN, _ERROR = 1, 2, 3
_FIXED = {"y": (1, "B"), "b": (4, "I"), "n": (2, "h"), "q": (2, "H"), "i": (4, "i"), "u": (4, "I"),
          "x": (8, "q"), "t": (8, "Q"), "d": (8, "d"), "h": (4, "I")}  # fmt: skip
_ALIGN = dict((code, size) for code, (size, _fmt) in _FIXED.items())
_ALIGN.update({"s": 4, "o": 4, "g": 1, "a": 4, "(": 8, "{": 8, "v": 1})
# the control characters systemctl prints as octal escapes (all but tab, newline and carriage return)
_OCTAL_ESCAPED = frozenset(chr(code) for code in list(range(32)) + [127] if code not in (9, 10, 13))


class BusError(Exception):
    """The D-Bus answer is not there or not understood: run systemctl instead."""


def unit_path(name):
    """A unit's object path, as systemd's ``unit_dbus_path_from_name`` escapes its name (bus_label_escape):
    every byte but an ASCII letter, or a digit after the first, is ``_`` and two hex digits."""
    label = []
    for index, byte in enumerate(bytearray(name.encode("utf-8"))):
        if 65 <= byte <= 90 or 97 <= byte <= 122 or (index and 48 <= byte <= 57):
            label.append(chr(byte))
        else:
            label.append("_%02x" % byte)
    return MANAGER_PATH + "/unit/" + ("".join(label) or "_")


# ------------------------------------------------------------------------------------- marshalling


def _pad(buf, size):
    buf.extend(b"\0" * (-len(buf) % size))


def _put(buf, code, value):
    """Append one value of a basic type, a string array (``as``) or a variant of those (``v``: (sig, value))."""
    if code in "so":
        data = value.encode("utf-8")
        _pad(buf, 4)
        buf.extend(struct.pack("<I", len(data)) + data + b"\0")
    elif code == "g":
        data = value.encode("ascii")
        buf.extend(struct.pack("<B", len(data)) + data + b"\0")
    elif code == "u":
        _pad(buf, 4)
        buf.extend(struct.pack("<I", value))
    elif code == "as":
        _pad(buf, 4)
        at = len(buf)
        buf.extend(b"\0\0\0\0")
        start = len(buf)
        for item in value:
            _put(buf, "s", item)
        buf[at:start] = struct.pack("<I", len(buf) - start)
    else:
        raise ValueError("cannot write %r" % code)


def method_call(serial, path, interface, member, signature="", args=()):
    """One METHOD_CALL message (little endian) to systemd."""
    body = bytearray()
    codes = _split(signature)
    if len(codes) != len(args):
        raise ValueError("%d arguments for the signature %r" % (len(args), signature))
    for index, code in enumerate(codes):
        _put(body, code, args[index])
    fields = bytearray()
    for code, sig, value in ((1, "o", path), (2, "s", interface), (3, "s", member), (8, "g", signature)):
        if code == 8 and not signature:
            continue
        _pad(fields, 8)
        fields.append(code)
        _put(fields, "g", sig)
        _put(fields, sig, value)
    head = struct.pack("<cBBBIII", b"l", _METHOD_CALL, 0, 1, len(body), serial, len(fields))
    message = bytearray(head)
    message.extend(fields)
    _pad(message, 8)
    message.extend(body)
    return bytes(message)


def _split(signature):
    """The complete types of a signature: ``"a(so)sv"`` -> ``["a(so)", "s", "v"]``."""
    types, index = [], 0
    while index < len(signature):
        end = _type_end(signature, index)
        types.append(signature[index:end])
        index = end
    return types


def _type_end(signature, index):
    code = signature[index]
    if code == "a":
        return _type_end(signature, index + 1)
    if code in "({":
        close = ")" if code == "(" else "}"
        index += 1
        while signature[index] != close:
            index = _type_end(signature, index)
        return index + 1
    if code in _ALIGN:
        return index + 1
    raise BusError("signature %r: unknown type %r" % (signature, code))


class _Reader:
    """Values of one message's body (or header fields) in byte order ``order`` (``<`` or ``>``)."""

    def __init__(self, data, order, base=0):
        self.data = data
        self.order = order
        self.pos = base
        self.base = base  # alignment is relative to the message's start

    def align(self, size):
        self.pos += -(self.pos - self.base) % size

    def read(self, signature):
        code = signature[0]
        data = self.data
        if code in "so":
            self.align(4)
            (length,) = struct.unpack_from(self.order + "I", data, self.pos)
            start = self.pos + 4
            self.pos = start + length + 1
            if self.pos > len(data):
                raise BusError("truncated string")
            return data[start : start + length].decode("utf-8")
        if code == "g":
            length = data[self.pos]
            start = self.pos + 1
            self.pos = start + length + 1
            return data[start : start + length].decode("ascii")
        if code in _FIXED:
            size, fmt = _FIXED[code]
            self.align(size)
            (value,) = struct.unpack_from(self.order + fmt, data, self.pos)
            self.pos += size
            return bool(value) if code == "b" else value
        if code == "a":
            self.align(4)
            (length,) = struct.unpack_from(self.order + "I", data, self.pos)
            self.pos += 4
            element = signature[1:]
            self.align(_ALIGN[element[0]])
            end = self.pos + length
            if end > len(data):
                raise BusError("truncated array")
            items = []
            while self.pos < end:
                items.append(self.read(element))
            if element[0] == "{":
                return dict(items)
            return items
        if code in "({":
            self.align(8)
            return tuple(self.read(part) for part in _split(signature[1:-1]))
        if code == "v":
            inner = self.read("g")
            if len(_split(inner)) != 1:
                raise BusError("variant signature %r" % inner)
            return self.read(inner)
        raise BusError("cannot read %r" % code)


def parse_message(data):
    """``(type, reply_serial, error_name, signature, body values)`` of one whole message."""
    if data[:1] not in (b"l", b"B"):
        raise BusError("bad byte order mark %r" % data[:1])
    order = "<" if data[:1] == b"l" else ">"
    kind, _flags, version, body_len, _serial, fields_len = struct.unpack_from(order + "BBBIII", data, 1)
    if version != 1:
        raise BusError("protocol version %d" % version)
    fields = _Reader(data[: 16 + fields_len], order)
    fields.pos = 12
    header = dict(fields.read("a(yv)"))
    body_at = 16 + fields_len + (-(16 + fields_len) % 8)
    if body_at + body_len != len(data):
        raise BusError("message length")
    if header.get(9):
        raise BusError("a reply with file descriptors")
    signature = header.get(8, "")
    body = _Reader(data[: body_at + body_len], order, body_at)
    values = [body.read(part) for part in _split(signature)]
    if body.pos != len(data):
        raise BusError("trailing bytes in the body")
    return kind, header.get(5), header.get(4), signature, values


# ------------------------------------------------------------------------------------- the connection


class Systemd:
    """One connection to PID 1's private socket, opened on first use; ``BusError`` whenever it cannot serve
    (and every later call after a failure: the caller falls back to systemctl)."""

    def __init__(self, path=PRIVATE_SOCKET, timeout=TIMEOUT_S):
        self.path = path
        self.timeout = timeout
        self.sock = None
        self.failed = None
        self.serial = 0
        self.pending = b""

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _connect(self):
        if self.failed:
            raise BusError(self.failed)
        if self.sock is not None:
            return
        if os.geteuid() != 0:
            self.failed = "not root: systemd's private socket is root's"
            raise BusError(self.failed)
        import _socket

        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.path)
            uid = "".join("%02x" % ord(digit) for digit in "%d" % os.geteuid())  # the uid's digits, in hex
            # BEGIN with the AUTH, before the OK, as sd-bus' own client sends it: a BEGIN that reaches PID 1
            # in one read with the first call leaves that call unanswered (systemd 252 waits for more input)
            sock.sendall(b"\0AUTH EXTERNAL " + uid.encode("ascii") + b"\r\nBEGIN\r\n")
            line = b""
            while not line.endswith(b"\r\n"):
                chunk = sock.recv(256)
                if not chunk or len(line) > 512:
                    raise BusError("authentication: no answer")
                line += chunk
            if not line.startswith(b"OK "):
                raise BusError("authentication refused: %r" % line[:80])
        except (OSError, BusError) as err:
            sock.close()
            self.failed = "%s: %s" % (self.path, err)
            raise BusError(self.failed)
        self.sock = sock

    def calls(self, requests):
        """The bodies (lists of values) of the replies to ``requests`` [(path, interface, member, signature,
        args)], sent at once; ``BusError`` for any error reply."""
        self._connect()
        try:
            return self._calls(requests)
        except (OSError, BusError, ValueError, IndexError, struct.error) as err:
            self.close()
            self.failed = "%s: %s" % (self.path, err)
            raise BusError(self.failed)

    def _calls(self, requests):
        serials = []
        out = []
        for request in requests:
            self.serial += 1
            serials.append(self.serial)
            out.append(method_call(self.serial, *request))
        self.sock.sendall(b"".join(out))
        replies = {}
        while len(replies) < len(serials):
            kind, reply_serial, error, signature, values = parse_message(self._message())
            if reply_serial is None or reply_serial not in serials:
                continue  # a signal or anything else not ours
            if kind == _ERROR:
                raise BusError("%s: %s" % (error, values[0] if values else ""))
            if kind != _METHOD_RETURN:
                raise BusError("message type %d" % kind)
            replies[reply_serial] = (signature, values)
        return [replies[serial] for serial in serials]

    def _recv(self, size):
        while len(self.pending) < size:
            chunk = self.sock.recv(max(65536, size - len(self.pending)))
            if not chunk:
                raise BusError("connection closed by systemd")
            self.pending += chunk

    def _message(self):
        self._recv(16)
        order = "<" if self.pending[:1] == b"l" else ">"
        body_len, _serial, fields_len = struct.unpack_from(order + "III", self.pending, 4)
        total = 16 + fields_len + (-(16 + fields_len) % 8) + body_len
        if total > MAX_MESSAGE:
            raise BusError("message of %d bytes" % total)
        self._recv(total)
        data, self.pending = self.pending[:total], self.pending[total:]
        return data

    # ------------------------------------------------------------------- what the detectors ask

    def list_units(self, patterns=()):
        """``ListUnitsByPatterns([], patterns)``: [(id, description, load, active, sub, following, path, job id,
        job type, job path)], what ``systemctl list-units`` asks (it filters by type on its side)."""
        ((signature, values),) = self.calls(
            [(MANAGER_PATH, MANAGER, "ListUnitsByPatterns", "asas", ([], list(patterns)))]
        )
        if signature != "a(ssssssouso)":
            raise BusError("ListUnitsByPatterns answered %r" % signature)
        return values[0]

    def show(self, names, unit_properties, exec_properties=()):
        """What ``systemctl show -p PROPERTIES -- NAMES`` reads, one ``{property: value}`` a name, in order:
        ``unit_properties`` of the Unit interface and, for a unit type with an execution context (service, socket,
        mount, swap; systemctl shows no such property of the others), ``exec_properties`` of its own interface.
        Strings are str, string arrays lists. A string with a control character other than tab, newline and
        carriage return raises: systemctl prints it as an octal escape that ``systemd.parse_words`` does not read
        back, and the fallback keeps the result what systemctl's text gave."""
        asked = []
        for name in names:
            path = unit_path(name)
            asked.extend((path, UNIT, prop) for prop in unit_properties)
            interface = EXEC_INTERFACES.get(name.rpartition(".")[2])
            if interface:
                asked.extend((path, interface, prop) for prop in exec_properties)
        values = iter(self.properties(asked))
        shown = []
        for name in names:
            props = dict((prop, next(values)) for prop in unit_properties)
            if name.rpartition(".")[2] in EXEC_INTERFACES:
                props.update((prop, next(values)) for prop in exec_properties)
            for value in props.values():
                for text in value if isinstance(value, list) else (value,):
                    if isinstance(text, str) and not text.isprintable() and not _OCTAL_ESCAPED.isdisjoint(text):
                        raise BusError("%s: a value with a control character" % name)
            shown.append(props)
        return shown

    def properties(self, asked):
        """The values of ``asked`` [(path, interface, property)] (Properties.Get each, sent at once)."""
        replies = self.calls([(path, PROPERTIES, "Get", "ss", (interface, name)) for path, interface, name in asked])
        values = []
        for signature, body in replies:
            if signature != "v":
                raise BusError("Properties.Get answered %r" % signature)
            values.append(body[0])
        return values
