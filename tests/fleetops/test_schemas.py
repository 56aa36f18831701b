"""The documents fleetops reads back (state, scan and drift reports, plans) are validated: a bad
file is one DocumentError line naming the field, never a traceback (src/fleetops/schemas.py).

The samples are real output of the commands (tests/unit/fixtures/documents/README.md).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetops import schemas
from fleetops.documents import DocumentError
from fleetops.errors import UsageError
from tests.paths import FIXTURES, REPO

DOCS = FIXTURES / "documents"
LOADERS: dict[str, tuple[str, Callable[[Path], dict[str, Any]]]] = {
    "state": ("rollout-state", schemas.load_state),
    "scan": ("scan-report", schemas.load_scan_report),
    "drift": ("drift-report", schemas.load_drift_report),
    "plan": ("plan", schemas.load_plan),
}
SAMPLES = sorted(p.name for p in DOCS.glob("*.json"))
PROPERTY = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def loader(name: str) -> Callable[[Path], dict[str, Any]]:
    return LOADERS[name.split("-")[0]][1]


def schema_name(name: str) -> str:
    return LOADERS[name.split("-")[0]][0]


def sample(name: str) -> Any:
    return json.loads((DOCS / name).read_text(encoding="utf-8"))


def error_of(fn: Callable[[], object]) -> str:
    with pytest.raises(DocumentError) as info:
        fn()
    return str(info.value)


def assert_one_line(msg: str, source: str) -> None:
    assert msg.startswith(f"{source}: "), msg
    assert len(msg.splitlines()) == 1 and msg.isprintable(), repr(msg)


# --------------------------------------------------------------------------------- the samples


def test_every_kind_has_samples() -> None:
    assert {n.split("-")[0] for n in SAMPLES} == set(LOADERS)
    assert len(SAMPLES) >= 9


@pytest.mark.parametrize("name", SAMPLES)
def test_real_samples_load_unchanged(name: str) -> None:
    assert loader(name)(DOCS / name) == sample(name)


@pytest.mark.parametrize("name", SAMPLES)
def test_committed_json_schemas_accept_the_samples(name: str) -> None:
    schema = json.loads((REPO / "schemas" / f"{schema_name(name)}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(sample(name))


@pytest.mark.parametrize("name", sorted(schemas.MODELS))
def test_committed_json_schemas_are_generated_from_the_models(name: str) -> None:
    committed = (REPO / "schemas" / f"{name}.schema.json").read_text(encoding="utf-8")
    assert committed == schemas.json_schema_text(name), (
        f"schemas/{name}.schema.json is stale: run `python -m fleetops.schemas --write schemas`"
    )


def test_committed_json_schemas_reject_what_the_models_reject() -> None:
    doc = sample("state-stopped.json")
    doc["hosts"]["broken"] = "exploded"
    schema = json.loads((REPO / "schemas" / "rollout-state.schema.json").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema).validate(doc)
    assert error_of(lambda: schemas.validate_state(doc, "s.json")).startswith("s.json: hosts.broken: ")


def test_the_error_is_a_usage_error() -> None:
    assert issubclass(DocumentError, UsageError)
    assert DocumentError("f", "x").exit_code == 2


# ------------------------------------------------------------------------------ exact messages


def write(tmp_path: Path, content: str | bytes, name: str = "doc.json") -> Path:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def test_truncated_state(tmp_path: Path) -> None:
    text = (DOCS / "state-done.json").read_text()
    path = write(tmp_path, text[:200])
    msg = error_of(lambda: schemas.load_state(path))
    assert msg == f"{path}: not valid JSON (truncated?) at line 10 column 5"


def test_file_problems(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    assert error_of(lambda: schemas.load_state(missing)) == f"{missing}: no such file"
    assert error_of(lambda: schemas.load_state(tmp_path)) == f"{tmp_path}: is a directory, not a file"
    empty = write(tmp_path, "\n")
    assert error_of(lambda: schemas.load_plan(empty)) == f"{empty}: empty file: no JSON document"
    cut = write(tmp_path, '{"schema": "\xe9'.encode()[:-1])
    assert error_of(lambda: schemas.load_plan(cut)) == f"{cut}: not UTF-8 text (byte 12; truncated?)"
    junk = write(tmp_path, '{"schema": 1} {}')
    assert (
        error_of(lambda: schemas.load_plan(junk)) == f"{junk}: not valid JSON: Extra data at line 1 column 15"
    )
    deep = write(tmp_path, "[" * 100_000 + "]" * 100_000)
    assert error_of(lambda: schemas.load_plan(deep)) == f"{deep}: not valid JSON: nested too deeply"


def test_not_an_object(tmp_path: Path) -> None:
    path = write(tmp_path, "[1, 2]")
    assert error_of(lambda: schemas.load_scan_report(path)) == (
        f"{path}: not a fleetops.scan/v1 document: a JSON object was expected, got an array"
    )


def test_wrong_kind_of_document(tmp_path: Path) -> None:
    path = DOCS / "scan-3hosts.json"
    msg = error_of(lambda: schemas.load_state(path))
    assert msg.startswith(
        f"{path}: schema: Input should be 'fleetops.rollout.engine-state/v1' (got \"fleetops.scan/v1\")"
    )


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d.pop("plan"), "plan: required field missing"),
        (lambda d: d.update(apply="yes"), 'apply: Input should be a valid boolean (got "yes")'),
        (lambda d: d.update(max_failures="0"), 'max_failures: Input should be a valid integer (got "0")'),
        (
            lambda d: d.update(max_failures=-1),
            "max_failures: Input should be greater than or equal to 0 (got -1)",
        ),
        (lambda d: d.update(id="../../etc/x"), "id: String should match pattern"),
        (
            lambda d: d["hosts"].update(localhost="exploded"),
            "hosts.localhost: Input should be 'pending', 'running'",
        ),
        (
            lambda d: d["results"].update(broken=[]),
            "results.broken: Input should be a valid dictionary or instance of HostOutcome (got an array)",
        ),
        (lambda d: d["batches"][0].pop("started"), "batches[0].started: required field missing"),
        (lambda d: d["batches"][0].update(finished=1.0), "batches[0].finished: before started"),
        (
            lambda d: d["batches"][0].update(started=1e300),
            "batches[0].started: Input should be less than or equal to",
        ),
        (
            lambda d: d["plan"]["batches"].append(["broken"]),
            "plan.batches[3]: host 'broken' is in more than one batch",
        ),
        (
            lambda d: d["plan"]["batches"][1].append(7),
            "plan.batches[1][1]: Input should be a valid string (got 7)",
        ),
        (lambda d: d["hosts"].pop("gone"), "hosts: no entry for planned host 'gone'"),
        (lambda d: d["stopped"].pop("pending"), "stopped.pending: required field missing"),
        (
            lambda d: d.update(stopped="no"),
            'stopped: Input should be a valid dictionary or instance of Stopped (got "no")',
        ),
        (lambda d: d["hosts"].update({"a.b\nc": "done"}), None),
    ],
)
def test_state_field_messages(edit: Callable[[dict[str, Any]], object], expected: str | None) -> None:
    doc = sample("state-stopped.json")
    edit(doc)
    if expected is None:  # an extra host: allowed (preflight-skipped hosts are not in the plan)
        assert schemas.validate_state(doc, "s.json") is doc
        return
    msg = error_of(lambda: schemas.validate_state(doc, "s.json"))
    assert msg.startswith(f"s.json: {expected}"), msg
    assert_one_line(msg, "s.json")


def test_key_with_a_newline_is_escaped_in_the_field_path() -> None:
    doc = sample("state-stopped.json")
    doc["hosts"]["evil\nhost"] = "bogus"
    msg = error_of(lambda: schemas.validate_state(doc, "s.json"))
    assert msg.startswith('s.json: hosts["evil\\nhost"]: Input should be'), msg
    assert_one_line(msg, "s.json")


def test_unknown_action_only_when_the_caller_names_the_known_ones() -> None:
    doc = sample("state-done.json")
    assert schemas.validate_state(doc, "s.json", actions={"reclaim", "reboot"}) is doc
    msg = error_of(lambda: schemas.validate_state(doc, "s.json", actions=("reboot", "fix")))
    assert msg == "s.json: action: unknown remediation 'reclaim' (known: fix, reboot)"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('"duration_ms": 66.632', '"duration_ms": NaN'),
        ('"duration_ms": 66.632', '"duration_ms": -Infinity'),
        ('"duration_ms": 66.632', '"duration_ms": 1e999'),
        ('"zombies": 48', '"zombies": ' + "9" * 5000),
    ],
)
def test_numbers_json_cannot_carry(tmp_path: Path, text: str, expected: str) -> None:
    original = (DOCS / "scan-localhost.json").read_text()
    assert text in original
    path = write(tmp_path, original.replace(text, expected, 1))
    msg = error_of(lambda: schemas.load_scan_report(path))
    field = "hosts.localhost.duration_ms" if "duration" in text else "hosts.localhost.facts.memcg.zombies"
    assert msg.startswith(f"{path}: {field}: "), msg
    assert_one_line(msg, str(path))


def test_scan_report_fields_drift_and_fix_read() -> None:
    cases: list[tuple[Callable[[dict[str, Any]], object], str]] = [
        (lambda d: d["hosts"]["localhost"]["facts"].update(host=["x"]), "hosts.localhost.facts.host: "),
        (
            lambda d: d["hosts"]["localhost"]["facts"]["units"].update(enabled="a.service"),
            "hosts.localhost.facts.units.enabled: ",
        ),
        (
            lambda d: d["hosts"]["localhost"]["facts"]["ucx"]["processes"].append("p"),
            "hosts.localhost.facts.ucx.processes[0]: ",
        ),
        (
            lambda d: d["hosts"]["localhost"]["findings"][0].pop("data"),
            "hosts.localhost.findings[0].data: required",
        ),
        (
            lambda d: d["hosts"]["localhost"]["findings"][0].update(severity="high"),
            "hosts.localhost.findings[0].severity: ",
        ),
        (lambda d: d["hosts"]["gone"].update(status="gone"), "hosts.gone.status: "),
        (lambda d: d["summary"].pop("findings"), "summary.findings: required"),
    ]
    for edit, expected in cases:
        doc = sample("scan-3hosts.json")
        edit(doc)
        msg = error_of(lambda doc=doc: schemas.validate_scan_report(doc, "r.json"))  # type: ignore[misc]
        assert msg.startswith(f"r.json: {expected}"), msg


def test_drift_and_plan_fields() -> None:
    drift = sample("drift-odd.json")
    drift["fleet"][0]["odd"]["local3"] = 6
    assert error_of(lambda: schemas.validate_drift_report(drift, "d.json")) == (
        "d.json: fleet[0].odd.local3: Input should be a valid string (got 6)"
    )
    plan = sample("plan-6hosts.json")
    plan["hosts"] = 5
    assert error_of(lambda: schemas.validate_plan(plan, "p.json")) == (
        "p.json: hosts: is 5 but the batches hold 6 host(s)"
    )
    plan = sample("plan-6hosts.json")
    plan["batches"].insert(1, [])
    assert error_of(lambda: schemas.validate_plan(plan, "p.json")).startswith(
        "p.json: batches[1]: List should have at least 1 item"
    )


@pytest.mark.parametrize("name", SAMPLES)
def test_extra_fields_are_accepted(name: str) -> None:
    doc = sample(name)
    doc["added_by_a_later_version"] = {"anything": [1, None, "x"]}
    validate = {"state": schemas.validate_state, "scan": schemas.validate_scan_report,
                "drift": schemas.validate_drift_report, "plan": schemas.validate_plan}[name.split("-")[0]]  # fmt: skip
    assert validate(doc, name) is doc


# ------------------------------------------------------------------------ properties (hypothesis)


@pytest.mark.parametrize("name", SAMPLES)
def test_truncated_anywhere_is_one_line_or_still_whole(name: str, tmp_path: Path) -> None:
    raw = (DOCS / name).read_bytes()

    @PROPERTY
    @given(st.integers(min_value=0, max_value=len(raw) - 1))
    def check(cut: int) -> None:
        path = write(tmp_path, raw[:cut])
        if raw[:cut].strip() == raw.strip():  # only the final newline went: still the document
            assert loader(name)(path) == sample(name)
            return
        msg = error_of(lambda: loader(name)(path))
        assert_one_line(msg, str(path))

    check()


def paths_in(value: Any, where: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """Every place in a document a mutation can hit (not the root)."""
    out: list[tuple[str | int, ...]] = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        out.append((*where, key))
        out.extend(paths_in(child, (*where, key)))
    return out


REPLACEMENTS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.just([]),
    st.just({}),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)


@pytest.mark.parametrize("name", SAMPLES)
def test_mutated_fields_are_accepted_or_one_line(name: str, tmp_path: Path) -> None:
    original = sample(name)
    places = paths_in(original)

    @PROPERTY
    @given(st.data())
    def check(data: st.DataObject) -> None:
        doc = copy.deepcopy(original)
        for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
            where = data.draw(st.sampled_from(places))
            parent: Any = doc
            try:
                for key in where[:-1]:
                    parent = parent[key]
                parent[where[-1]]  # the place may be gone after an earlier mutation
            except (KeyError, IndexError, TypeError):
                continue
            if not isinstance(parent, dict | list):
                continue
            kind = data.draw(st.sampled_from(["delete", "replace", "huge", "rename"]))
            if kind == "delete":
                del parent[where[-1]]
            elif kind == "replace":
                parent[where[-1]] = data.draw(REPLACEMENTS)
            elif kind == "huge":
                parent[where[-1]] = data.draw(st.sampled_from([10**400, -(10**60), 1e308 * 10]))
            elif isinstance(parent, dict):
                parent[data.draw(st.text(max_size=8))] = parent.pop(where[-1])
        path = write(tmp_path, json.dumps(doc, allow_nan=True))  # NaN / Infinity as text
        try:
            loaded = loader(name)(path)
        except DocumentError as err:
            assert_one_line(str(err), str(path))
            return
        # accepted: only what the schema leaves open changed, and the numbers are finite
        assert loaded == doc
        assert all(not isinstance(v, float) or math.isfinite(v) for v in _leaves(loaded))

    check()


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


def test_a_state_needs_only_the_batches_of_its_plan() -> None:
    doc = sample("state-stopped.json")
    doc["plan"] = {"batches": doc["plan"]["batches"]}  # what the engine reads; the rest is for people
    assert schemas.validate_state(doc, "s.json") is doc
    doc["plan"]["caps"] = {"max_parallel": 1}
    assert error_of(lambda: schemas.validate_state(doc, "s.json")) == (
        "s.json: plan.caps.max_parallel: Input should be a valid string (got 1) (and 3 more problem(s))"
    )
