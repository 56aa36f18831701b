"""ec2_scheduled_event: inventory events merged with IMDSv2, against a real loopback HTTP server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from ansible_collections.fleetops.node.plugins.module_utils import ec2events

# The shape IMDS documents for /latest/meta-data/events/maintenance/scheduled.
IMDS_EVENTS = [
    {
        "NotBefore": "21 Jan 2027 09:00:43 GMT",
        "Code": "system-reboot",
        "Description": "scheduled reboot",
        "EventId": "instance-event-0d59937288b749b32",
        "NotAfter": "21 Jan 2027 09:17:23 GMT",
        "State": "active",
    },
    {
        "NotBefore": "3 Feb 2027 00:00:00 GMT",
        "Code": "instance-retirement",
        "EventId": "instance-event-1",
        "State": "active",
    },
]


class Imds:
    def __init__(self, body: str) -> None:
        self.body = body
        self.requests: list[str] = []


@pytest.fixture()
def imds() -> Iterator[tuple[str, Imds]]:
    state = Imds(json.dumps(IMDS_EVENTS))

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            state.requests.append(f"PUT {self.path}")
            if self.path != "/latest/api/token" or not self.headers.get(
                "X-aws-ec2-metadata-token-ttl-seconds"
            ):
                self.send_response(400)
                self.end_headers()
                return
            self._send(200, b"TOKEN-123")

        def do_GET(self) -> None:
            state.requests.append(f"GET {self.path}")
            if self.headers.get("X-aws-ec2-metadata-token") != "TOKEN-123":
                self._send(401, b"")  # IMDSv2 enforced: no token, no data
                return
            if self.path != ec2events.EVENTS_PATH:
                self._send(404, b"")
                return
            self._send(200, state.body.encode())

        def _send(self, code: int, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()


INVENTORY = [
    {
        "code": "system-reboot",
        "description": "",
        "not_before": "2027-01-21T09:00:43Z",
        "instance_event_id": None,
    }
]


def test_imds_v2_events_merge_with_the_inventory(imds: tuple[str, Imds]) -> None:
    url, state = imds
    facts = ec2events.collect(INVENTORY, imds="always", imds_url=url, timeout=2)
    assert state.requests == ["PUT /latest/api/token", f"GET {ec2events.EVENTS_PATH}"]
    assert facts["imds"] is True and facts["imds_error"] is None
    reboot, retire = facts["events"]
    assert reboot["source"] == "inventory+imds" and reboot["description"] == "scheduled reboot"
    assert retire["source"] == "imds"
    findings = ec2events.evaluate(facts)
    assert [(f["severity"], f["data"]["code"]) for f in findings] == [
        ("warning", "system-reboot"),
        ("critical", "instance-retirement"),
    ]
    assert "EC2 scheduled event system-reboot" in findings[0]["summary"]


def test_garbage_from_imds_is_an_error_not_a_finding(imds: tuple[str, Imds]) -> None:
    url, state = imds
    state.body = "<html>not json</html>"
    facts = ec2events.collect([], imds="always", imds_url=url, timeout=2)
    assert facts["events"] == []
    assert "not an events list" in str(facts["imds_error"])


def test_off_ec2_imds_is_never_asked(imds: tuple[str, Imds], tmp_path: Path) -> None:
    url, state = imds
    assert ec2events.on_ec2(str(tmp_path / "none"), str(tmp_path / "none")) is False
    facts = ec2events.collect(INVENTORY, imds="auto", imds_url=url)  # this machine is not an EC2 instance
    assert state.requests == []
    assert facts["on_ec2"] is False
    assert [e["source"] for e in facts["events"]] == ["inventory"]


def test_unreachable_imds_is_quick_and_quiet() -> None:
    facts = ec2events.collect([], imds="always", imds_url="http://127.0.0.1:9", timeout=0.5)
    assert facts["events"] == [] and facts["imds"] is False
    assert "IMDS not reachable" in str(facts["imds_error"])


def test_dmi_says_ec2(tmp_path: Path) -> None:
    vendor = tmp_path / "board_vendor"
    vendor.write_text("Amazon EC2\n")
    assert ec2events.on_ec2(str(vendor), str(tmp_path / "none")) is True
    (tmp_path / "uuid").write_text("ec2e1916-9099-7caf-fd21-012345abcdef\n")
    assert ec2events.on_ec2(str(tmp_path / "none"), str(tmp_path / "uuid")) is True


def test_completed_events_are_not_findings() -> None:
    facts = {"events": [{"code": "system-reboot", "state": "completed", "source": "imds"}]}
    assert ec2events.evaluate(facts) == []
