"""Reading a JSON document fleetops wrote, before any schema: the bytes of a file, JSON with every
number a reader can use, and the one-line error (:class:`DocumentError`, exit 2) that names the file,
the field and the problem. ``fleetops.schemas`` validates what this reads against its models;
``fleetops.policy`` reads its YAML through ``read_document`` and reports with ``raise_validation``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from fleetops.errors import UsageError

# Longer integer literals are refused before Python parses them (its own limit is 4,300 digits).
MAX_INT_DIGITS = 40


class OpenModel(BaseModel):
    """A document's model (``fleetops.schemas``, ``fleetops.auto_schema``): strict types for the fields
    named; any other key is allowed (formats grow)."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False, populate_by_name=False)


class DocumentError(UsageError):
    """A document fleetops reads back is unreadable, not JSON, or not of its schema.

    ``str(err)`` is one line: ``"<source>: <field>: <problem>"`` (no field when the whole
    document is at fault). ``source``, ``field`` and ``problem`` are kept as attributes.
    """

    def __init__(self, source: str, problem: str, field: str = "") -> None:
        self.source = one_line(source)
        self.field = one_line(field)
        self.problem = one_line(problem)
        parts = [self.source, self.field, self.problem] if self.field else [self.source, self.problem]
        super().__init__(": ".join(parts))


def one_line(text: str) -> str:
    """``text`` with every non-printable character (newlines, line and paragraph separators,
    controls) written as a Python escape, so a message is always one line of a log."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


class FieldProblem(ValueError):
    """Raised by a model's cross-field check: names the field (relative to the model) at fault."""

    def __init__(self, loc: tuple[str | int, ...], msg: str) -> None:
        super().__init__(msg)
        self.loc = loc


class _BadNumber:
    """What the parser puts where the text has a number no JSON reader can use (NaN, 1e999, 10**50)."""

    def __init__(self, text: str, why: str) -> None:
        self.text = text
        self.why = why


def _parse_float(text: str) -> float | _BadNumber:
    value = float(text)
    return value if math.isfinite(value) else _BadNumber(text, "too large for a number")


def _parse_int(text: str) -> int | _BadNumber:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        return _BadNumber(text[:12] + "...", f"an integer of more than {MAX_INT_DIGITS} digits")
    return int(text)


def _parse_constant(text: str) -> _BadNumber:
    return _BadNumber(text, "not a JSON number")


def bad_numbers(
    value: Any, loc: tuple[str | int, ...] = ()
) -> Iterator[tuple[tuple[str | int, ...], _BadNumber]]:
    stack: list[tuple[tuple[str | int, ...], Any]] = [(loc, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, _BadNumber):
            yield where, item
        elif isinstance(item, dict):
            stack.extend(((*where, k), v) for k, v in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend(((*where, i), v) for i, v in reversed(list(enumerate(item))))


def field_path(loc: tuple[str | int, ...]) -> str:
    """``("hosts", "gpu-1", "findings", 0, "data")`` -> ``hosts.gpu-1.findings[0].data``; a key
    that is not a plain name (dots, spaces, empty) is quoted: ``hosts["a.b"].status``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part and all(c.isalnum() or c in "-_:/@!*%+" for c in part):
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part)}]"
    return out


def got(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if value is None:
        return "null"
    text = json.dumps(value) if isinstance(value, str | bool | int | float) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def problem(err: Any) -> str:
    msg = str(err.get("msg") or "invalid")
    kind = err.get("type", "")
    if kind == "missing":
        return "required field missing"
    if kind.startswith("value_error"):
        return msg.removeprefix("Value error, ")
    if kind in ("extra_forbidden",):
        return msg
    if "input" in err and kind != "model_attributes_type":
        return f"{msg} (got {got(err['input'])})"
    return msg


def raise_validation(exc: ValidationError, source: str) -> None:
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = tuple(first.get("loc", ()))
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, FieldProblem):
        loc = (*loc, *cause.loc)
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    raise DocumentError(source, problem(first) + more, field_path(loc)) from None


def parse_json(text: str | bytes, source: str) -> Any:
    """``text`` parsed as JSON (NaN, Infinity and numbers out of range come back marked, for
    ``validate_*`` to name); :class:`DocumentError` when it is not JSON."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DocumentError(source, f"not UTF-8 text (byte {exc.start}; truncated?)") from None
    if not text.strip():
        raise DocumentError(source, "empty file: no JSON document")
    try:
        return json.loads(
            text, parse_float=_parse_float, parse_int=_parse_int, parse_constant=_parse_constant
        )
    except json.JSONDecodeError as exc:
        where = f"at line {exc.lineno} column {exc.colno}"
        # cut short: the error is at the end, or a string runs to the end (json names its start)
        if exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string"):
            raise DocumentError(source, f"not valid JSON (truncated?) {where}") from None
        raise DocumentError(source, f"not valid JSON: {exc.msg.removesuffix(' at')} {where}") from None
    except RecursionError:
        raise DocumentError(source, "not valid JSON: nested too deeply") from None
    except ValueError as exc:  # a number Python cannot convert
        raise DocumentError(source, f"not valid JSON: {exc}") from None


def read_document(path: Path | str) -> bytes:
    """The bytes of the document file at ``path``; :class:`DocumentError` (one line) when unreadable."""
    source = str(path)
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise DocumentError(source, "no such file") from None
    except IsADirectoryError:
        raise DocumentError(source, "is a directory, not a file") from None
    except OSError as exc:
        raise DocumentError(source, f"cannot read: {exc.strerror or exc}") from None


def read_json(path: Path | str) -> Any:
    """The parsed content of the file at ``path``; :class:`DocumentError` when unreadable or not JSON."""
    return parse_json(read_document(path), str(path))
