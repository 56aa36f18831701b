"""The collection's Alertmanager event source (extensions/eda/plugins/event_source/alertmanager.py), served
for real on a loopback port and posted to over HTTP, as Alertmanager would, without ansible-rulebook
(tests/unit/test_eda_rulebook.py runs it under the rulebook).

What it must do with bad input (issue 27, issue 38): a payload that does not parse (not UTF-8, not JSON, a
nesting deep enough to raise RecursionError: 400, never 500, which Alertmanager would retry), lacks labels, names a host not in
the inventory or names many hosts logs ONE line and queues nothing for those hosts; a label can never put
a pattern (all, a group, a glob), a template or a shell's special characters into what a rulebook passes on.
Listening beyond loopback without a token is refused at start, in one line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import runpy
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.paths import REPO

aiohttp = pytest.importorskip(
    "aiohttp", reason="aiohttp comes with ansible-rulebook (pip install -e '.[test]')"
)

SOURCE = REPO / "extensions" / "eda" / "plugins" / "event_source" / "alertmanager.py"
HOSTS = ["lab-01", "lab-02", "lab-03"]
Post = Callable[[Any], Awaitable[tuple[int, list[dict[str, Any]]]]]


def _module() -> dict[str, Any]:
    return runpy.run_path(str(SOURCE))  # as ansible-rulebook loads a source


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def alert(host: str | None = "lab-01", status: str = "firing", **labels: str) -> dict[str, Any]:
    all_labels = {"alertname": "FleetopsUnitsCrashLooping", "severity": "critical", **labels}
    if host is not None:
        all_labels["host"] = host
    return {
        "status": status,
        "labels": all_labels,
        "annotations": {"description": "ecs.service restarted 40 times"},
        "startsAt": "2026-12-01T10:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "fingerprint": "0123456789abcdef",
    }


def payload(*alerts: dict[str, Any]) -> dict[str, Any]:
    return {"version": "4", "receiver": "fleetops-eda", "status": "firing", "alerts": list(alerts)}


def serve(args: dict[str, Any], scenario: Callable[[Post], Awaitable[None]]) -> None:
    """Run the source with ``args`` on a free port; ``scenario`` posts (a dict as JSON, bytes as they
    are) and gets (status, events queued by that post)."""
    source = _module()
    port = _free_port()

    async def run() -> None:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        task = asyncio.create_task(source["main"](queue, {"port": port, **args}))
        async with aiohttp.ClientSession() as session:
            for _ in range(100):
                try:
                    async with session.get(f"http://127.0.0.1:{port}/"):  # 405, and nothing logged
                        break
                except aiohttp.ClientConnectorError:
                    await asyncio.sleep(0.1)

            async def post(
                body: Any, headers: dict[str, str] | None = None
            ) -> tuple[int, list[dict[str, Any]]]:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                async with session.post(f"http://127.0.0.1:{port}/alerts", data=data, headers=headers) as r:
                    status = r.status
                events = []
                while not queue.empty():
                    events.append(queue.get_nowait())
                return status, events

            try:
                await scenario(post)
            finally:
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task

    asyncio.run(run())


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    caplog.clear()
    return lines


def test_a_good_alert_is_one_event_naming_its_host_and_its_cause(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(post: Post) -> None:
        status, events = await post(payload(alert("lab-02", unit="ecs.service")))
        assert status == 202
        (event,) = events
        assert event["fleetops"]["host"] == "lab-02" and event["fleetops"]["status"] == "firing"
        assert event["alert"]["labels"]["alertname"] == "FleetopsUnitsCrashLooping"
        cause = event["fleetops"]["cause"]
        assert cause == (
            "alertmanager fleetops-eda: FleetopsUnitsCrashLooping (host=lab-02,severity=critical,"
            "unit=ecs.service) on lab-02 fingerprint 0123456789abcdef since 2026-12-01T10:00:00Z"
        )
        status, events = await post(payload(alert("lab-02", status="resolved")))
        assert status == 202 and events[0]["fleetops"]["status"] == "resolved"

    with caplog.at_level(logging.INFO):
        serve({"hosts": HOSTS}, scenario)
    assert warnings(caplog) == []


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"this is not json {", "is not JSON (18 bytes)"),
        (b"", "is not JSON (0 bytes)"),
        (b'["a list"]', "has no alerts list"),
        (b'{"alerts": {"not": "a list"}}', "has no alerts list"),
        (b'"a string"', "has no alerts list"),
        (b'{"alerts": [], "receiver": "\xff\xfe"}', "is not UTF-8 (32 bytes)"),
        # json raises RecursionError on this (aiohttp answered 500, which Alertmanager sends again)
        (b"[" * 100_000 + b"]" * 100_000, "is nested deeper than 16 levels (200000 bytes)"),
        (
            b'{"alerts": [{"labels": {"host": "lab-01", "x": ' + b"[" * 20 + b"]" * 20 + b"}}]}",
            "is nested deeper than 16 levels",
        ),
    ],
    ids=["text", "empty", "list", "alerts-dict", "string", "utf8", "recursion", "deep-label"],
)
def test_a_payload_that_is_not_alertmanagers_is_one_line_and_nothing_runs(
    body: bytes, needle: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario(post: Post) -> None:
        assert await post(body) == (400, [])
        status, events = await post(payload(alert("lab-01")))  # it still serves
        assert status == 202 and len(events) == 1

    serve({"hosts": HOSTS}, scenario)
    (line,) = warnings(caplog)
    assert needle in line and line.startswith("fleetops.node.alertmanager: payload from 127.0.0.1")


def test_alerts_without_labels_or_a_known_host_are_dropped_in_one_line_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bad_hosts = ["gpu-99", "all", "lab-*", "lab-01,lab-02", "lab-0[1:3]", "~lab.*", "-lab-01", "gpu_workers",
                 "{{ lookup('pipe', 'id') }}", "lab-01; reboot", "lab-01 lab-02", "$(reboot)"]  # fmt: skip

    async def scenario(post: Post) -> None:
        alerts = [alert(h) for h in bad_hosts]
        alerts += [{"status": "firing"}, {"status": "firing", "labels": {}}, alert(None), "not an alert"]  # type: ignore[list-item]
        alerts.append(alert("lab-03"))
        status, events = await post(payload(*alerts))
        assert status == 202
        assert [e["fleetops"]["host"] for e in events] == ["lab-03"]
        # every one dropped: 400, so that Alertmanager does not send it again
        assert await post(payload(alert("gpu-99"), alert(None))) == (400, [])

    serve({"hosts": HOSTS, "inventory": [], "max_hosts": 20}, scenario)
    first, second = warnings(caplog)
    assert first.startswith(
        f"fleetops.node.alertmanager: {len(bad_hosts) + 4} of {len(bad_hosts) + 5} alert(s) from 127.0.0.1 dropped ("
    )
    for why in ("not in the inventory: all gpu-99 gpu_workers", "not a host name:", "no labels: #12 #13 #15", "no host label: FleetopsUnitsCrashLooping"):  # fmt: skip
        assert why in first, (why, first)
    assert (
        "{" not in first
        and "$(" not in first
        and ";" not in first.partition("dropped (")[2].replace("; ", "")
    )
    assert "2 of 2 alert(s)" in second


def test_a_payload_naming_more_hosts_than_max_hosts_runs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    hosts = [f"gpu-{i:02}" for i in range(12)]

    async def scenario(post: Post) -> None:
        assert await post(payload(*(alert(h) for h in hosts))) == (400, [])
        status, events = await post(payload(*(alert(h) for h in hosts[:10])))
        assert status == 202 and len(events) == 10

    serve({"hosts": hosts, "max_hosts": 10}, scenario)
    (line,) = warnings(caplog)
    assert (
        "12 of 12 alert(s)" in line and "12 hosts in one payload (max_hosts 10; route with group_by" in line
    )


def test_label_values_reach_the_cause_only_as_plain_characters() -> None:
    hostile = {"unit": "{{ lookup('pipe','touch /tmp/x') }}", "check": "$(reboot)`id`;|&<>\"'\n\x1b[2J",
               "gpu": "x" * 5000}  # fmt: skip

    async def scenario(post: Post) -> None:
        _status, (event,) = await post(payload(alert("lab-01", **hostile)))
        cause = event["fleetops"]["cause"]
        assert not set(cause) & set("{}$`;|&<>\"'\n\x1b%#"), cause
        assert len(cause) <= 1000 and cause.isprintable()
        assert event["alert"]["labels"]["unit"] == hostile["unit"]  # conditions see the label as sent

    serve({"hosts": HOSTS}, scenario)


def test_with_a_token_a_request_without_it_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(post: Post) -> None:
        assert await post(payload(alert())) == (401, [])
        assert await post(payload(alert()), {"Authorization": "Bearer wrong"}) == (401, [])
        status, events = await post(payload(alert()), {"Authorization": "Bearer s3cret"})
        assert status == 202 and len(events) == 1

    serve({"hosts": HOSTS, "token": "s3cret"}, scenario)
    assert len(warnings(caplog)) == 2


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.1.2.3", "alertmanager.example", "localhost.evil"])
@pytest.mark.parametrize("token", [None, ""])
def test_listening_beyond_loopback_without_a_token_is_refused_in_one_line(
    host: str, token: str | None
) -> None:
    """Anyone who reaches the port could start passes: without a token (the rulebooks' default is '') the
    source raises before it listens or lists anything, and ansible-rulebook stops with that line."""
    args: dict[str, Any] = {"host": host, "port": _free_port(), "hosts": HOSTS}
    if token is not None:
        args["token"] = token
    with pytest.raises(ValueError) as exc:  # not TimeoutError: it never listens
        asyncio.run(asyncio.wait_for(_module()["main"](asyncio.Queue(), args), 5))
    message = str(exc.value)
    assert message.startswith(
        f"fleetops.node.alertmanager: refusing to listen on {host or '(every address)'}:"
    )
    assert "without a token" in message and "\n" not in message


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost", "LOCALHOST."])
def test_loopback_needs_no_token_and_any_address_with_a_token_serves(host: str) -> None:
    assert _module()["listen_problem"](host, 5050, None) is None
    assert _module()["listen_problem"]("0.0.0.0", 5050, "s3cret") is None

    async def serving(post: Post) -> None:
        status, events = await post(payload(alert()), {"Authorization": "Bearer s3cret"})
        assert status == 202 and len(events) == 1
        assert await post(payload(alert()), {"Authorization": "Bearer s3cre"}) == (401, [])

    serve({"hosts": HOSTS, "host": "0.0.0.0", "token": "s3cret"}, serving)


def test_the_token_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """hmac.compare_digest, not ``!=`` (which returns at the first byte that differs): the source's handler
    calls it with what was sent and what is expected."""
    import hmac

    seen: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)

    async def scenario(post: Post) -> None:
        assert (await post(payload(alert()), {"Authorization": "Bearer nope"}))[0] == 401
        assert (await post(payload(alert()), {"Authorization": "Bearer s3cret"}))[0] == 202

    serve({"hosts": HOSTS, "token": "s3cret"}, scenario)
    assert seen == [(b"Bearer nope", b"Bearer s3cret"), (b"Bearer s3cret", b"Bearer s3cret")]


def test_the_inventory_is_listed_with_ansible_inventory_and_its_groups_are_not_hosts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    inventory = tmp_path / "fleet.yml"
    inventory.write_text(
        "all:\n  children:\n    az_a:\n      hosts:\n        gpu-1: {}\n        gpu-2: {}\n    az_b:\n"
        "      hosts:\n        gpu-3: {}\n"
    )

    async def scenario(post: Post) -> None:
        status, events = await post(payload(alert("gpu-1"), alert("gpu-3"), alert("az_a"), alert("gpu-4")))
        assert status == 202 and sorted(e["fleetops"]["host"] for e in events) == ["gpu-1", "gpu-3"]

    serve({"inventory": str(inventory)}, scenario)
    (line,) = warnings(caplog)
    assert "a group, not a host: az_a" in line and "not in the inventory: gpu-4" in line


def test_without_hosts_or_inventory_every_alert_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(post: Post) -> None:
        assert await post(payload(alert("lab-01"))) == (400, [])

    serve({}, scenario)
    start, line = warnings(caplog)
    assert "neither hosts nor inventory given" in start and "not in the inventory: lab-01" in line
