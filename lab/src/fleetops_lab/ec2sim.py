"""A real moto EC2 endpoint for tests and the lab, and a small HTTP proxy in front of it.

``MotoServer`` runs ``moto_server`` on 127.0.0.1 on a free port and stops it with SIGINT (by PID).

``Ec2Proxy`` forwards every request to an upstream EC2 endpoint (moto) and can

* answer the first ``throttle_first`` calls (optionally only for some Actions) with HTTP 503 and
  an EC2 ``RequestLimitExceeded`` error body, before forwarding anything;
* answer some Actions with HTTP 403 ``UnauthorizedOperation`` (``deny()``), as for a role without
  that permission;
* add ``<eventsSet>`` items to ``DescribeInstanceStatus`` answers for instances tagged
  ``fleetops:event=<code>`` (moto does not model scheduled events), e.g. ``system-reboot``; a
  successful ``StopInstances`` completes them (the tag is removed), as on EC2, where a stopped and
  started EBS instance leaves the hardware the event was about;
* report ``rootDeviceType`` ``instance-store`` in ``DescribeInstances`` answers for instances tagged
  ``fleetops:root-device=instance-store`` (moto makes every instance EBS-backed);
* report an instance tagged ``fleetops:stop-seconds=N`` ``stopping`` in ``DescribeInstances`` answers
  for N seconds after its ``StopInstances`` (moto says ``stopped`` at once; EC2 takes a while);
* tell a ``power_hook`` about ``StopInstances`` / ``TerminateInstances`` (before moto answers:
  the caller sees the answer only once the hook returned) and ``StartInstances`` (after moto
  answered), per instance with its tags: the lab ties its hosts' power to their instances this way
  (``fleetops_lab.ec2_server``).

``calls`` counts the requests received per Action (throttled ones included) and ``throttled``
the ones answered with 503. Loopback only.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

EVENT_TAG = "fleetops:event"
ROOT_DEVICE_TAG = "fleetops:root-device"
# An instance tagged fleetops:stop-seconds=N is reported "stopping" for N seconds after a StopInstances
# (moto stops at once; EC2 takes tens of seconds): the window a controller can die in mid stop-start.
STOP_SECONDS_TAG = "fleetops:stop-seconds"
# (phase "stop" | "terminate" | "start", instance id, its tags) -> None; see Ec2Proxy
PowerHook = Callable[[str, str, dict[str, str]], None]
_POWER_PHASES = {"StopInstances": "stop", "TerminateInstances": "terminate", "StartInstances": "start"}
EC2_API_VERSION = "2016-11-15"

EVENT_DESCRIPTIONS = {
    "system-reboot": "scheduled reboot",
    "instance-reboot": "scheduled reboot",
    "system-maintenance": "scheduled maintenance",
    "instance-retirement": "The instance is running on degraded hardware",
    "instance-stop": "The instance is scheduled to be stopped",
}

# Hop-by-hop headers (RFC 9110 7.6.1) and the ones the proxy recomputes.
_SKIP_HEADERS = frozenset(
    (
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
    )
)

_ERROR_BODY = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    "<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors>"
    "<RequestID>{request_id}</RequestID></Response>"
)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class MotoServer:
    """``moto_server`` on 127.0.0.1, random free port; ``stop()`` sends SIGINT to its PID.

    ``load_default_amis=False`` (the default) starts moto without its ~1,300 stock AMIs: every
    RunInstances then costs about half as much (moto filters all AMIs once per instance), and
    ``register_ami()`` gives the image to launch from.

    Without ``executable`` it is moto's server with DescribeInstanceStatus's status filters
    (``python -m fleetops_lab.motoserver``, see there); with it, that program as it is.
    """

    def __init__(self, executable: str | None = None, load_default_amis: bool = False) -> None:
        self.command = [executable] if executable else [sys.executable, "-m", "fleetops_lab.motoserver"]
        self.executable = executable or f"{sys.executable} -m fleetops_lab.motoserver"
        self.env = {**os.environ, "MOTO_EC2_LOAD_DEFAULT_AMIS": "true" if load_default_amis else "false"}
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout: float = 30.0) -> str:
        for _ in range(5):
            port = free_port()
            self.proc = subprocess.Popen(
                [*self.command, "-H", "127.0.0.1", "-p", str(port)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=self.env,
            )
            self.url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                    conn.request("GET", "/moto-api/")
                    conn.getresponse().read()
                    conn.close()
                    return self.url
                except OSError:
                    time.sleep(0.05)
            self.stop()  # port taken meanwhile, or too slow: try another port
        raise RuntimeError(f"moto_server ({self.executable}) did not start")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def __enter__(self) -> MotoServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def client(url: str, region: str, service: str = "ec2") -> Any:
    """A boto3 client for ``url`` with moto's dummy credentials."""
    import boto3  # type: ignore[import-untyped]  # no stubs installed; imported here so the proxy needs only the stdlib

    return boto3.client(
        service,
        endpoint_url=url,
        region_name=region,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def register_ami(url: str, region: str, name: str = "fleetops-gpu-base") -> str:
    """Register an image to launch instances from (a moto started without its stock AMIs has none)."""
    image_id: str = client(url, region).register_image(
        Name=name, RootDeviceName="/dev/sda1", Architecture="x86_64", VirtualizationType="hvm"
    )["ImageId"]
    return image_id


def launch_many(
    url: str,
    region: str,
    count: int,
    per_reservation: int = 100,
    instance_type: str = "g5.xlarge",
    zones: tuple[str, ...] = ("a", "b"),
) -> list[str]:
    """Register ``count`` running, untagged instances fast; returns their IDs.

    One instant EC2 Fleet per ``per_reservation`` instances (one reservation each; moto pages
    DescribeInstances by reservation), in subnets of a new VPC, one per zone of ``zones``, taken in
    turn. A fleet's answer lists only instance IDs, where a RunInstances answer serializes every
    instance: 5,000 instances take seconds instead of half a minute. Untagged on purpose: moto looks
    up an instance's tags by scanning every tag in the region, so listing N tagged instances costs
    O(N^2) in moto (5,000 Auto Scaling instances: 40 s to list instead of 10 s).
    """
    ec2 = client(url, region)
    image_id = register_ami(url, region)
    vpc = ec2.create_vpc(CidrBlock="10.80.0.0/16")["Vpc"]["VpcId"]
    subnets = [
        ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.80.{16 * i}.0/20", AvailabilityZone=region + zone)[
            "Subnet"
        ]["SubnetId"]
        for i, zone in enumerate(zones)
    ]
    template = f"fleetops-{instance_type.replace('.', '-')}"
    ec2.create_launch_template(
        LaunchTemplateName=template, LaunchTemplateData={"ImageId": image_id, "InstanceType": instance_type}
    )
    ids: list[str] = []
    for n, start in enumerate(range(0, count, per_reservation)):
        size = min(per_reservation, count - start)
        answer = ec2.create_fleet(
            Type="instant",
            TargetCapacitySpecification={
                "TotalTargetCapacity": size,
                "OnDemandTargetCapacity": size,
                "DefaultTargetCapacityType": "on-demand",
            },
            LaunchTemplateConfigs=[
                {
                    "LaunchTemplateSpecification": {"LaunchTemplateName": template, "Version": "$Latest"},
                    "Overrides": [{"SubnetId": subnets[n % len(subnets)]}],
                }
            ],
        )
        ids.extend(i for group in answer.get("Instances", []) for i in group.get("InstanceIds", []))
    if len(ids) != count:
        raise RuntimeError(f"moto launched {len(ids)} instances, not {count}")
    return ids


def _fields(method: str, path: str, body: bytes) -> dict[str, list[str]]:
    query = urllib.parse.urlsplit(path).query
    fields = urllib.parse.parse_qs(query)
    if method == "POST" and body:
        with contextlib.suppress(UnicodeDecodeError):
            fields.update(urllib.parse.parse_qs(body.decode("utf-8")))
    return fields


def _instance_ids(fields: dict[str, list[str]]) -> list[str]:
    """The ``InstanceId.N`` parameters of a request, in N order."""
    numbered = []
    for key, values in fields.items():
        match = re.fullmatch(r"InstanceId\.(\d+)", key)
        if match and values:
            numbered.append((int(match.group(1)), values[0]))
    return [iid for _n, iid in sorted(numbered)]


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _event_item(ns: str, instance_id: str, code: str) -> ET.Element:
    """One <eventsSet><item> as EC2 writes it (notBefore three days ahead, a two-hour window)."""
    not_before = datetime.datetime.now(datetime.UTC).replace(
        microsecond=0, second=0, minute=0
    ) + datetime.timedelta(days=3)
    fields = {
        "instanceEventId": "instance-event-"
        + hashlib.sha256(f"{instance_id}/{code}".encode()).hexdigest()[:17],
        "code": code,
        "description": EVENT_DESCRIPTIONS.get(code, f"scheduled {code}"),
        "notBefore": not_before.strftime("%Y-%m-%dT%H:%M:%S.000Z"),
        "notAfter": (not_before + datetime.timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%S.000Z"),
    }
    item = ET.Element(f"{{{ns}}}item")
    for name, value in fields.items():
        ET.SubElement(item, f"{{{ns}}}{name}").text = value
    return item


class Ec2Proxy:
    """HTTP proxy on 127.0.0.1 in front of an EC2 endpoint; see the module docstring."""

    def __init__(
        self,
        upstream_url: str,
        throttle_first: int = 0,
        throttle_actions: frozenset[str] | set[str] | None = None,
        deny_actions: frozenset[str] | set[str] | None = None,
        inject_events: bool = True,
        event_tag: str = EVENT_TAG,
        power_hook: PowerHook | None = None,
    ) -> None:
        parsed = urllib.parse.urlsplit(upstream_url)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"upstream_url must be http://host:port, got {upstream_url!r}")
        self.upstream_host = parsed.hostname
        self.upstream_port = parsed.port or 80
        self.inject_events = inject_events
        self.event_tag = event_tag
        self.power_hook = power_hook
        self.calls: Counter[str] = Counter()
        self.throttled: Counter[str] = Counter()
        self.status_ids: list[str] = []  # the InstanceIds DescribeInstanceStatus was asked about, in order
        self.in_flight = 0
        self.peak_in_flight = 0  # the most requests this proxy was answering at once
        self.delay = 0.0  # seconds each request is held before it is answered (to see concurrency)
        self._lock = threading.Lock()
        self._throttle_left = throttle_first
        self._throttle_actions = frozenset(throttle_actions) if throttle_actions else None
        self._deny_actions = frozenset(deny_actions or ())
        self._stopping_until: dict[str, float] = {}  # instance -> when it is reported stopped
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # ---- control ---------------------------------------------------------------------------

    def start(self) -> str:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                proxy._handle(self)

            def do_POST(self) -> None:
                proxy._handle(self)

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="ec2proxy", daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self.url

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def throttle(self, first: int, actions: frozenset[str] | set[str] | None = None) -> None:
        """Answer the next ``first`` calls (of ``actions``, or any) with 503 RequestLimitExceeded."""
        with self._lock:
            self._throttle_left = first
            self._throttle_actions = frozenset(actions) if actions else None

    def deny(self, actions: frozenset[str] | set[str] | None) -> None:
        """Answer these Actions with 403 UnauthorizedOperation (None: none)."""
        with self._lock:
            self._deny_actions = frozenset(actions or ())

    def reset_counters(self) -> None:
        with self._lock:
            self.calls.clear()
            self.throttled.clear()
            self.status_ids.clear()
            self.peak_in_flight = self.in_flight

    def __enter__(self) -> Ec2Proxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- request handling ------------------------------------------------------------------

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        with self._lock:
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            if self.delay:
                time.sleep(self.delay)
            self._answer(req)
        finally:
            with self._lock:
                self.in_flight -= 1

    def _answer(self, req: BaseHTTPRequestHandler) -> None:
        length = int(req.headers.get("Content-Length") or 0)
        body = req.rfile.read(length) if length else b""
        fields = _fields(req.command, req.path, body)
        action = fields.get("Action", ["?"])[0]
        with self._lock:
            self.calls[action] += 1
            if action == "DescribeInstanceStatus":
                self.status_ids.extend(_instance_ids(fields))
            denied = action in self._deny_actions
            throttle = not denied and (
                self._throttle_left > 0
                and (self._throttle_actions is None or action in self._throttle_actions)
            )
            if throttle:
                self._throttle_left -= 1
                self.throttled[action] += 1
        if denied:
            self._error(
                req, 403, "UnauthorizedOperation", "You are not authorized to perform this operation."
            )
            return
        if throttle:
            self._error(req, 503, "RequestLimitExceeded", "Request limit exceeded.")
            return
        authorization = req.headers.get("Authorization", "")
        phase = _POWER_PHASES.get(action)
        try:
            tags = self._instance_tags(authorization, _instance_ids(fields)) if phase else {}
            if phase in ("stop", "terminate"):
                self._power(phase, tags)  # the instance is off before EC2 says stopping
            status, headers, payload = self._forward(req.command, req.path, req.headers.items(), body)
            if status == 200 and phase == "stop":
                self._complete_events(authorization, tags)
                self._slow_stops(tags)
        except OSError as e:
            self._reply(
                req, 502, [("Content-Type", "text/plain")], f"ec2proxy: upstream failed: {e}".encode()
            )
            return
        if status == 200 and phase == "start":
            self._power(phase, tags)
        if action == "DescribeInstanceStatus" and status == 200 and self.inject_events:
            payload = self._add_events(payload, authorization)
        if action == "DescribeInstances" and status == 200:
            payload = self._rewrite_instances(payload)
        self._reply(req, status, headers, payload)

    def _power(self, phase: str, tags: dict[str, dict[str, str]]) -> None:
        if self.power_hook is None:
            return
        for iid, instance_tags in tags.items():
            self.power_hook(phase, iid, instance_tags)

    def _complete_events(self, authorization: str, tags: dict[str, dict[str, str]]) -> None:
        """A stopped instance's scheduled events are done (EC2 completes them): remove their tag."""
        done = [iid for iid, t in tags.items() if self.event_tag in t]
        if not done:
            return
        params = {"Action": "DeleteTags", "Version": EC2_API_VERSION, "Tag.1.Key": self.event_tag}
        for n, iid in enumerate(done, 1):
            params[f"ResourceId.{n}"] = iid
        self._upstream(authorization, params)

    def _upstream(self, authorization: str, params: dict[str, str]) -> tuple[int, bytes]:
        """One EC2 query to the upstream directly (moto reads the region from Authorization's
        credential scope and does not verify the signature)."""
        body = urllib.parse.urlencode(params).encode()
        headers = [("Content-Type", "application/x-www-form-urlencoded; charset=utf-8")]
        if authorization:
            headers.append(("Authorization", authorization))
        status, _, payload = self._forward("POST", "/", headers, body)
        return status, payload

    def _instance_tags(self, authorization: str, ids: list[str]) -> dict[str, dict[str, str]]:
        """instance id -> its tags, for ``ids`` (asked upstream directly)."""
        if not ids:
            return {}
        params = {"Action": "DescribeInstances", "Version": EC2_API_VERSION}
        for n, iid in enumerate(ids, 1):
            params[f"InstanceId.{n}"] = iid
        status, payload = self._upstream(authorization, params)
        found: dict[str, dict[str, str]] = {iid: {} for iid in ids}
        if status != 200:
            return found
        for inst in ET.fromstring(payload).iter():
            if _local(inst.tag) != "item":
                continue
            item_id = next((c.text or "" for c in inst if _local(c.tag) == "instanceId"), "")
            tagset = next((c for c in inst if _local(c.tag) == "tagSet"), None)
            if item_id not in found or tagset is None:
                continue
            for tag in tagset:
                kv = {_local(c.tag): c.text or "" for c in tag}
                if kv.get("key"):
                    found[item_id][kv["key"]] = kv.get("value", "")
        return found

    def _slow_stops(self, tags: dict[str, dict[str, str]]) -> None:
        now = time.monotonic()
        with self._lock:
            for iid, instance_tags in tags.items():
                with contextlib.suppress(KeyError, ValueError):
                    self._stopping_until[iid] = now + float(instance_tags[STOP_SECONDS_TAG])

    def _rewrite_instances(self, payload: bytes) -> bytes:
        """rootDeviceType as the ``fleetops:root-device`` tag says (moto: always ebs); ``stopping`` for
        an instance whose ``fleetops:stop-seconds`` have not passed since its stop (moto: stopped)."""
        with self._lock:
            now = time.monotonic()
            stopping = {iid for iid, until in self._stopping_until.items() if until > now}
        if ROOT_DEVICE_TAG.encode() not in payload and not any(i.encode() in payload for i in stopping):
            return payload
        root = ET.fromstring(payload)
        match = re.match(r"\{(.*)\}", root.tag)
        ET.register_namespace("", match.group(1) if match else "")
        for inst in root.iter():
            children = {_local(c.tag): c for c in inst}
            tagset, device = children.get("tagSet"), children.get("rootDeviceType")
            if tagset is not None and device is not None:
                for tag in tagset:
                    kv = {_local(c.tag): c.text or "" for c in tag}
                    if kv.get("key") == ROOT_DEVICE_TAG and kv.get("value"):
                        device.text = kv["value"]
            iid, state = children.get("instanceId"), children.get("instanceState")
            if iid is not None and state is not None and iid.text in stopping:
                fields = {_local(c.tag): c for c in state}
                if fields.get("name") is not None and fields["name"].text == "stopped":
                    fields["name"].text = "stopping"
                    if fields.get("code") is not None:
                        fields["code"].text = "64"
        out: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
        return out

    def _forward(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=120)
        try:
            out = {k: v for k, v in headers if k.lower() not in _SKIP_HEADERS}
            out["Content-Length"] = str(len(body))
            conn.request(method, path, body=body, headers=out)
            resp = conn.getresponse()
            payload = resp.read()
            kept = [(k, v) for k, v in resp.getheaders() if k.lower() not in _SKIP_HEADERS]
            return resp.status, kept, payload
        finally:
            conn.close()

    def _error(self, req: BaseHTTPRequestHandler, status: int, code: str, message: str) -> None:
        request_id = hashlib.sha256(f"{time.monotonic_ns()}".encode()).hexdigest()[:32]
        body = _ERROR_BODY.format(code=code, message=message, request_id=request_id).encode()
        self._reply(req, status, [("Content-Type", "text/xml")], body)

    @staticmethod
    def _reply(
        req: BaseHTTPRequestHandler, status: int, headers: list[tuple[str, str]], payload: bytes
    ) -> None:
        req.send_response(status)
        for k, v in headers:
            req.send_header(k, v)
        req.send_header("Content-Length", str(len(payload)))
        req.end_headers()
        req.wfile.write(payload)

    def _tagged_events(self, authorization: str) -> dict[str, str]:
        """instance id -> event code, for instances carrying the event tag (asked upstream directly)."""
        found: dict[str, str] = {}
        token = ""
        while True:
            params = {
                "Action": "DescribeInstances",
                "Version": EC2_API_VERSION,
                "Filter.1.Name": "tag-key",
                "Filter.1.Value.1": self.event_tag,
            }
            if token:
                params["NextToken"] = token
            body = urllib.parse.urlencode(params).encode()
            # moto reads the region from the credential scope of Authorization; it does not verify it.
            headers = [("Content-Type", "application/x-www-form-urlencoded; charset=utf-8")]
            if authorization:
                headers.append(("Authorization", authorization))
            status, _, payload = self._forward("POST", "/", headers, body)
            if status != 200:
                return found
            root = ET.fromstring(payload)
            for inst in root.iter():
                if not inst.tag.endswith("}item") and inst.tag != "item":
                    continue
                iid = next((c.text for c in inst if c.tag.rsplit("}", 1)[-1] == "instanceId"), None)
                tagset = next((c for c in inst if c.tag.rsplit("}", 1)[-1] == "tagSet"), None)
                if not iid or tagset is None:
                    continue
                for tag in tagset:
                    kv = {c.tag.rsplit("}", 1)[-1]: c.text or "" for c in tag}
                    if kv.get("key") == self.event_tag and kv.get("value"):
                        found[iid] = kv["value"]
            token = next((e.text or "" for e in root if e.tag.rsplit("}", 1)[-1] == "nextToken"), "")
            if not token:
                return found

    def _add_events(self, payload: bytes, authorization: str) -> bytes:
        events = self._tagged_events(authorization)
        if not events:
            return payload
        root = ET.fromstring(payload)
        match = re.match(r"\{(.*)\}", root.tag)
        ns = match.group(1) if match else ""
        ET.register_namespace("", ns)
        status_set = next((e for e in root if e.tag.rsplit("}", 1)[-1] == "instanceStatusSet"), None)
        if status_set is None:
            return payload
        for item in status_set:
            iid = next((c.text for c in item if c.tag.rsplit("}", 1)[-1] == "instanceId"), None)
            if iid is not None and iid in events:
                events_set = ET.SubElement(item, f"{{{ns}}}eventsSet" if ns else "eventsSet")
                for code in events[iid].split(","):
                    events_set.append(_event_item(ns, iid, code.strip()))
        out: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
        return out


def main(argv: list[str] | None = None) -> int:
    """``python -m fleetops_lab.ec2sim [UPSTREAM_URL]``: moto (started here unless given) + proxy, until ^C."""
    args = sys.argv[1:] if argv is None else argv
    moto = None
    if args:
        upstream = args[0]
    else:
        moto = MotoServer()
        upstream = moto.start()
    proxy = Ec2Proxy(upstream, throttle_first=int(os.environ.get("EC2PROXY_THROTTLE_FIRST", "0")))
    print(f"upstream {upstream}\nproxy    {proxy.start()}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        proxy.stop()
        if moto:
            moto.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
