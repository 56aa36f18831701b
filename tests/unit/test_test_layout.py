"""The test loop's own rules: the integration list check can fail, and the product assumes no lab."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.integration import ids
from tests.paths import REPO

# What only a lab is: its addresses, bridge and link names, state and lock paths, the env that picks one.
LAB_ONLY = re.compile(
    r"10\.213\.|10\.2(1[4-9]|2\d)\.\d+\.|fleetops0|fleetops-lab-|/var/lib/fleetops/lab|/run/fleetops/lab|FLEETOPS_LAB"
)


def _records(outcomes: dict[str, str]) -> dict[str, dict[str, object]]:
    return {i: {"id": i, "outcome": o, "reason": "why"} for i, o in outcomes.items()}


def test_the_list_check_fails_on_a_missing_an_unlisted_and_a_skipped_test(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listed = ["tests/integration/test_a.py::test_one", "tests/integration/test_a.py::test_two"]
    monkeypatch.setattr(ids, "listed", lambda: listed)
    assert ids.check(_records(dict.fromkeys(listed, "passed")), ci=True) == []
    assert ids.check(_records({listed[0]: "passed", listed[1]: "failed"}), ci=True) == []  # pytest fails it
    missing = ids.check(_records({listed[0]: "passed"}), ci=True)
    assert missing == [f"listed but did not run: {listed[1]}"]
    extra = ids.check(
        _records({**dict.fromkeys(listed, "passed"), "tests/integration/test_b.py::test_new": "passed"}),
        ci=False,
    )
    assert len(extra) == 1 and "test_b.py::test_new" in extra[0] and "ids write" in extra[0]
    skipped = _records({listed[0]: "passed", listed[1]: "skipped"})
    assert ids.check(skipped, ci=False) == []
    assert ids.check(skipped, ci=True) == [f"skipped under CI=true: {listed[1]} (why)"]


def test_a_tests_cpu_line_joins_its_outcome_and_a_cpu_line_alone_is_no_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    listed = ["tests/integration/test_a.py::test_one", "tests/integration/test_b.py::test_two"]
    monkeypatch.setattr(ids, "listed", lambda: listed)
    record = tmp_path / "record"
    record.write_text(
        json.dumps({"id": listed[0], "outcome": "passed", "seconds": 1.0}) + "\n"
        + json.dumps({"id": listed[0], "cpu_seconds": 3.5}) + "\n"
        + json.dumps({"id": listed[1], "cpu_seconds": 1.0}) + "\n"  # its outcome never came
    )  # fmt: skip
    records = ids.read_records([record])
    assert records[listed[0]] == {"id": listed[0], "outcome": "passed", "seconds": 1.0, "cpu_seconds": 3.5}
    assert ids.check(records, ci=True) == [f"listed but did not run: {listed[1]}"]
    (_, tests) = ids.cpu_report(records, "cpu 100 0 100 700 100 0 0 0 0 0", 10)
    assert tests == "integration CPU of the tests: 4 core-s; most: test_a.py 4, test_b.py 1"
    assert ids.cpu_jiffies("cpu 100 5 100 700 100 1 2 3 0 0") == (211, 1011)  # idle, iowait left out
    with pytest.raises(SystemExit, match="not the cpu line"):
        ids.cpu_jiffies("cpu0 1 2 3 4 5 6 7 8")


def test_the_checked_in_list_is_what_pytest_collects() -> None:
    # A test added, renamed or merged without `make test-ids` fails here, before any lab boots.
    assert ids.listed() == ids.collected()


def test_the_list_names_every_integration_file_it_orders() -> None:
    files = {i.split("::", 1)[0].rsplit("/", 1)[-1] for i in ids.listed()}
    assert set(ids.SECONDS) <= files, set(ids.SECONDS) - files


@pytest.mark.parametrize("top", ["src/fleetops", "plugins", "playbooks", "roles", "extensions"])
def test_the_product_hard_codes_no_lab(top: str) -> None:
    found = []
    for path in sorted((REPO / top).rglob("*")):
        if path.is_file() and path.suffix in (".py", ".yml", ".yaml", ".j2", ".json", ".cfg"):
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if LAB_ONLY.search(line):
                    found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)
