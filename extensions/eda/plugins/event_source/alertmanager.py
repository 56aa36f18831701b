"""fleetops.node.alertmanager: an ansible-rulebook event source for Alertmanager's webhook.

Written for fleetops because ansible.eda (whose alertmanager source this follows: one event per alert)
cannot be installed where Galaxy is unreachable, and because an alert here starts a remediation: what
it lets through must name exactly one host of the inventory, and nothing from a label may reach a
template or a shell. Each alert of a payload becomes one event:

    {"alert": {"status", "labels", "fingerprint", "startsAt", "endsAt"},
     "fleetops": {"host": HOST, "status": "firing" | "resolved", "cause": ONE LINE}}

``fleetops.host`` is the alert's host label (``host_label``), an exact host name of the inventory;
``fleetops.cause`` names the alert (name, labels, fingerprint, start) in characters no template or
shell reads specially, for ``fleetops remediate auto --cause``. ``alert.labels`` are as Alertmanager
sent them: conditions may match on them; a rulebook never puts them in a template. Resolved alerts are
events too (``fleetops.status``); the fleetops rulebooks act on firing ones only. No ``meta.hosts`` is
set: the rulebooks run their playbook on localhost and pass the host as a value, never as a limit.

A payload that does not parse (not UTF-8, not JSON, nested deeper than ``MAX_DEPTH``), has no ``alerts``
list, an alert without labels or host label, a host name that is no exact name of the inventory (unknown, a group, a pattern), or more than ``max_hosts``
different hosts, is logged as ONE warning line per payload; the alerts that pass still become events,
except over ``max_hosts``, where none does (an alert storm across the fleet is the scheduled full pass's
to handle, and the people's: route the rulebook's receiver with ``group_by: [alertname, host]`` so a
payload names one host). Alertmanager is answered 400 for a payload it should not retry, 202 otherwise:
never 500 for what it sent (it would send it again).

Listening on anything but a loopback address (``127.0.0.0/8``, ``::1``, ``localhost``) without a
``token`` is refused at start: the source raises, in one line, and ansible-rulebook stops. The token is
compared in constant time.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import os
import re
import shutil
import sys
import time
from typing import Any

from aiohttp import web

DOCUMENTATION = r"""
---
short_description: Receive Alertmanager webhook notifications, one event per alert naming one known host.
description:
  - An ansible-rulebook event source for Alertmanager's webhook (webhook_configs). Each alert becomes
    one event with the alert and a `fleetops` key (host, status, cause); payloads and alerts that do not
    name exactly one host of the inventory are dropped with one warning line per payload.
options:
  host:
    description:
      - The address to listen on (never 0.0.0.0 unless Alertmanager runs elsewhere). Any but a loopback
        address (127.0.0.0/8, ::1, localhost) requires O(token): without one the source refuses to start.
    type: str
    default: 127.0.0.1
  port:
    description: The TCP port to listen on.
    type: int
    default: 5050
  token:
    description:
      - When set, a request must carry `Authorization: Bearer TOKEN` (Alertmanager's
        http_config.authorization) or it is answered 401 (compared in constant time). Required when
        O(host) is not a loopback address; an empty token is no token.
    type: str
  host_label:
    description: The alert label that names the host (fleetops' gauges and alerts carry `host`).
    type: str
    default: host
  hosts:
    description: The host names alerts may name (a list); with `inventory`, both count.
    type: list
  inventory:
    description:
      - Inventory sources (a path or a list) whose hosts alerts may name, listed with ansible-inventory
        at start, again when older than `inventory_refresh`, and on an unknown name at most once a
        minute. Without `hosts` or `inventory` every alert is dropped (fail closed).
    type: list
  inventory_refresh:
    description: Seconds an inventory listing is used before it is listed again.
    type: int
    default: 300
  max_hosts:
    description: A payload naming more different hosts than this is dropped whole (one line).
    type: int
    default: 10
"""

EXAMPLES = r"""
- fleetops.node.alertmanager:
    host: 127.0.0.1
    port: 5050
    inventory: /etc/fleetops/fleet.fleet_ec2.yml
"""

LOG = logging.getLogger("fleetops.node.alertmanager")
# An exact inventory host name: no pattern (all, *, ?, [], ~, !, &, :, comma), no space, no option.
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
# What of a label value goes into a cause: no braces (templates), quotes, $ ` ; | & < > or controls.
SAFE = re.compile(r"[^A-Za-z0-9 _.,:/@=+-]")
CAUSE_MAX = 1000  # fleetops.values.CAUSE_MAX
LABEL_MAX = 200
MIN_RELIST_S = 60.0  # an unknown name lists the inventory again at most this often
BODY_MAX = 4 * 1024 * 1024  # aiohttp's limit on one request body (Alertmanager's are a few kB)
MAX_DEPTH = 16  # nesting a payload may have (Alertmanager's: payload, alerts, alert, labels: 4)
LOOPBACK_NAMES = ("localhost",)  # host names that listen on loopback alone (else an address is needed)


def loopback(host: str) -> bool:
    """Whether listening on ``host`` (an address or ``localhost``) is reachable from this machine alone."""
    if host.lower().rstrip(".") in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # another name (it may resolve to any address), empty: everything
        return False


def listen_problem(host: str, port: Any, token: str | None) -> str | None:
    """Why the source must not start listening on ``host`` (one line), or None."""
    if token is None and not loopback(host):
        return (
            f"fleetops.node.alertmanager: refusing to listen on {host or '(every address)'}:{port} without "
            "a token: anyone who reaches it could start remediations; set token (Alertmanager's "
            "http_config.authorization sends it) or listen on 127.0.0.1"
        )
    return None


def _depth_over(value: Any, limit: int) -> bool:
    """Whether ``value`` (parsed JSON) nests deeper than ``limit`` (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def parse_body(body: bytes) -> tuple[Any, str | None]:
    """``(payload, None)``, or ``(None, why)`` for a body that does not parse: not UTF-8, not JSON, or
    nested deeper than MAX_DEPTH (json's own RecursionError included: never a 500 Alertmanager retries)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8"
    try:
        payload = json.loads(text)
    except RecursionError:
        return None, f"nested deeper than {MAX_DEPTH} levels"
    except ValueError:
        return None, "not JSON"
    if _depth_over(payload, MAX_DEPTH):
        return None, f"nested deeper than {MAX_DEPTH} levels"
    return payload, None


def _safe(value: Any, limit: int = LABEL_MAX) -> str:
    return SAFE.sub("?", str(value))[:limit]


def cause_of(alert: dict[str, Any], host: str, receiver: str) -> str:
    """One line naming the alert: name, host, the other labels, fingerprint and start (each value
    cut to ``LABEL_MAX`` characters, the line to ``CAUSE_MAX``), in characters templates and shells
    leave alone."""
    labels = alert.get("labels") or {}
    name = _safe(labels.get("alertname", "?"))
    rest = ",".join(
        f"{_safe(k, 60)}={_safe(v)}"
        for k, v in sorted(labels.items())
        if k not in ("alertname",) and isinstance(v, str)
    )
    text = (
        f"alertmanager {_safe(receiver, 60) or '-'}: {name} ({rest}) on {_safe(host)}"
        f" fingerprint {_safe(alert.get('fingerprint', '-'), 40)} since {_safe(alert.get('startsAt', '-'), 40)}"
    )
    return text[:CAUSE_MAX]


class Inventory:
    """The host names alerts may name: ``hosts`` and the ``inventory`` sources' hosts (group names
    are never host names here)."""

    def __init__(self, hosts: list[str], sources: list[str], refresh_s: float) -> None:
        self.fixed = {str(h) for h in hosts}
        self.sources = [str(s) for s in sources]
        self.refresh_s = refresh_s
        self.listed: set[str] = set()
        self.groups: set[str] = set()
        self.listed_at: float | None = None
        self._lock = asyncio.Lock()

    async def _list(self) -> None:
        if not self.sources:
            return
        exe = shutil.which("ansible-inventory") or os.path.join(
            os.path.dirname(sys.executable), "ansible-inventory"
        )
        argv = [exe, "--list"]
        for source in self.sources:
            argv += ["-i", source]
        self.listed_at = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
            out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
            if proc.returncode != 0:
                raise RuntimeError(f"exit {proc.returncode}: {err.decode(errors='replace').strip()[-300:]}")
            listing = json.loads(out)
        except (OSError, RuntimeError, ValueError, asyncio.TimeoutError) as exc:  # noqa: UP041 (3.10)
            LOG.warning("fleetops.node.alertmanager: listing the inventory %s failed (%s): kept the last "
                        "listing (%d hosts)", " ".join(self.sources), exc, len(self.listed))  # fmt: skip
            return
        self.listed = set((listing.get("_meta") or {}).get("hostvars") or {})
        self.groups = {g for g in listing if g != "_meta"}
        for group in listing.values():
            if isinstance(group, dict):
                self.listed.update(group.get("hosts") or [])
        LOG.info("fleetops.node.alertmanager: %d hosts in the inventory", len(self.listed))

    async def problem(self, name: str) -> str | None:
        """None when ``name`` is a host alerts may name, else why not (a few words)."""
        if not HOST_NAME.fullmatch(name):
            return "not a host name"
        async with self._lock:
            now = time.monotonic()
            stale = self.listed_at is None or now - self.listed_at > self.refresh_s
            missing = name not in self.fixed and name not in self.listed
            if self.sources and (stale or (missing and now - (self.listed_at or 0) > MIN_RELIST_S)):
                await self._list()
        if name in self.groups and name not in self.fixed:
            return "a group, not a host"
        if name in self.fixed or name in self.listed:
            return None
        return "not in the inventory"


def _alerts(payload: Any) -> list[Any] | None:
    if not isinstance(payload, dict) or not isinstance(payload.get("alerts"), list):
        return None
    return payload["alerts"]


async def handle(
    request: web.Request, queue: Any, inventory: Inventory, token: str | None, host_label: str, max_hosts: int
) -> web.Response:
    """One webhook request: its alerts as events, or one warning line saying what was dropped and why."""
    peer = request.remote or "-"
    if token is not None and not hmac.compare_digest(
        request.headers.get("Authorization", "").encode("utf-8", "surrogateescape"),
        f"Bearer {token}".encode("utf-8", "surrogateescape"),
    ):
        LOG.warning("fleetops.node.alertmanager: request from %s without the bearer token: dropped", peer)
        return web.Response(status=401, text="bearer token required\n")
    body = await request.read()
    payload, why = parse_body(body)
    if why is not None:
        LOG.warning(
            "fleetops.node.alertmanager: payload from %s is %s (%d bytes): dropped", peer, why, len(body)
        )
        return web.Response(status=400, text=f"{why}\n")
    alerts = _alerts(payload)
    if alerts is None:
        LOG.warning("fleetops.node.alertmanager: payload from %s has no alerts list: dropped", peer)
        return web.Response(status=400, text="no alerts list\n")
    receiver = str(payload.get("receiver", ""))
    dropped: dict[str, list[str]] = {}
    accepted: list[tuple[dict[str, Any], str]] = []
    for i, alert in enumerate(alerts):
        labels = alert.get("labels") if isinstance(alert, dict) else None
        if not isinstance(labels, dict) or not labels:
            dropped.setdefault("no labels", []).append(f"#{i}")
            continue
        host = labels.get(host_label)
        if not isinstance(host, str) or not host:
            dropped.setdefault(f"no {host_label} label", []).append(
                _safe(labels.get("alertname", f"#{i}"), 60)
            )
            continue
        why = await inventory.problem(host)
        if why is not None:
            dropped.setdefault(why, []).append(_safe(host, 60))
            continue
        accepted.append((alert, host))
    hosts = sorted({h for _a, h in accepted})
    if len(hosts) > max_hosts:
        dropped = {f"{len(hosts)} hosts in one payload (max_hosts {max_hosts}; route with group_by [alertname, "
                   f"{host_label}])": hosts[:5] + (["..."] if len(hosts) > 5 else []), **dropped}  # fmt: skip
        accepted = []
    if dropped:
        told = "; ".join(f"{why}: {' '.join(sorted(set(names))[:10])}" for why, names in dropped.items())
        LOG.warning("fleetops.node.alertmanager: %d of %d alert(s) from %s dropped (%s)",
                    len(alerts) - len(accepted), len(alerts), peer, told)  # fmt: skip
    for alert, host in accepted:
        status = "firing" if alert.get("status") == "firing" else "resolved"
        await queue.put(
            {
                "alert": {
                    "status": status,
                    "labels": {str(k): str(v) for k, v in alert["labels"].items()},
                    "fingerprint": str(alert.get("fingerprint", "")),
                    "startsAt": str(alert.get("startsAt", "")),
                    "endsAt": str(alert.get("endsAt", "")),
                },
                "fleetops": {"host": host, "status": status, "cause": cause_of(alert, host, receiver)},
            }
        )
    # 400 when every alert was dropped: Alertmanager retries 5xx answers only, and sending these again
    # would not change them
    return web.Response(status=400 if alerts and not accepted else 202, text=f"{len(accepted)} event(s)\n")


def _list_arg(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


async def main(queue: Any, args: dict[str, Any]) -> None:
    """Serve until cancelled (ansible-rulebook's shutdown). ValueError (one line, before anything is
    listened on or listed) when ``host`` is not loopback and no token is set."""
    token = str(args["token"]) if args.get("token") else None  # the rulebooks' default is ''
    host, port = str(args.get("host", "127.0.0.1")), int(args.get("port", 5050))
    refused = listen_problem(host, port, token)
    if refused is not None:
        raise ValueError(refused)
    inventory = Inventory(
        _list_arg(args.get("hosts")),
        _list_arg(args.get("inventory")),
        float(args.get("inventory_refresh", 300)),
    )
    if not inventory.fixed and not inventory.sources:
        LOG.warning(
            "fleetops.node.alertmanager: neither hosts nor inventory given: every alert will be dropped"
        )
    host_label = str(args.get("host_label", "host"))
    max_hosts = int(args.get("max_hosts", 10))
    await inventory.problem("localhost")  # the first listing, before the first alert waits for it

    async def on_post(request: web.Request) -> web.Response:
        return await handle(request, queue, inventory, token, host_label, max_hosts)

    app = web.Application(client_max_size=BODY_MAX)
    app.router.add_post("/{tail:.*}", on_post)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    LOG.info("fleetops.node.alertmanager: listening on %s:%s", host, port)
    try:
        await asyncio.Future()
    finally:
        await runner.cleanup()


if __name__ == "__main__":  # a quick look by hand: python alertmanager.py, then POST to :5050

    class _Print:
        async def put(self, event: dict[str, Any]) -> None:
            print(json.dumps(event))

    logging.basicConfig(level=logging.INFO)
    asyncio.run(main(_Print(), {"hosts": ["localhost"]}))
