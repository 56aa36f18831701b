"""Running the collection's event-driven rulebooks (extensions/eda/rulebooks/) in tests: ansible-rulebook as
docs/guides/alerts.md runs it, fed over HTTP as Alertmanager feeds it, stopped by its process group."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.paths import REPO

RULEBOOK = REPO / "extensions" / "eda" / "rulebooks" / "fleetops_alerts.yml"
LOCALHOST = REPO / "extensions" / "eda" / "inventory" / "localhost.yml"
BIN = Path(sys.executable).parent


def need_rulebook() -> str:
    """ansible-rulebook's path, or skip (fail under CI=true) when it or Java is missing."""
    rulebook, java = (
        shutil.which("ansible-rulebook", path=f"{BIN}:{os.environ.get('PATH', '')}"),
        shutil.which("java"),
    )
    missing = [what for what, found in (("ansible-rulebook (pip: the test extras)", rulebook),
                                        ("java (Debian openjdk-17-jre-headless)", java)) if not found]  # fmt: skip
    if missing:
        message = f"{' and '.join(missing)} not installed (tools/debian-deps.sh --ci; make venv)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: {message}")
        pytest.skip(message)
    assert rulebook is not None
    return rulebook


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_listening(port: int, proc: subprocess.Popen[str], log: Path, seconds: float = 90) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if proc.poll() is not None:
            pytest.fail(f"ansible-rulebook exited {proc.returncode}:\n{log.read_text()[-4000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    pytest.fail(f"the rulebook's webhook never listened on {port}:\n{log.read_text()[-4000:]}")


def start_rulebook(
    rulebook: str, tmp: Path, variables: dict[str, Any], env: dict[str, str], log: Path
) -> subprocess.Popen[str]:
    """ansible-rulebook on the collection's rulebook, as docs/guides/alerts.md runs it; stop() ends it."""
    (tmp / "vars.yml").write_text(json.dumps(variables))
    proc = subprocess.Popen(
        [rulebook, "-r", str(RULEBOOK), "-i", str(LOCALHOST), "-e", str(tmp / "vars.yml")],
        cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log.open("w"), stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def alert(host: str, name: str, i: int, status: str = "firing", **labels: str) -> dict[str, Any]:
    return {
        "status": status,
        "labels": {
            "alertname": name,
            "host": host,
            "severity": "critical",
            "check": "crashloop_unit",
            **labels,
        },
        "annotations": {"description": f"alert {i}"},
        "startsAt": "2026-12-01T10:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "fingerprint": f"{i:016x}",
    }


def burst(port: int, alerts: list[dict[str, Any]], per_post: int = 1) -> list[int]:
    """POST every alert (``per_post`` to a payload) at once, 50 connections side by side; the answers."""
    import aiohttp

    async def run() -> list[int]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=50)) as session:

            async def post(chunk: list[dict[str, Any]]) -> int:
                body = {"version": "4", "receiver": "fleetops-eda", "status": "firing", "alerts": chunk}
                async with session.post(f"http://127.0.0.1:{port}/", json=body) as r:
                    return r.status

            chunks = [alerts[i : i + per_post] for i in range(0, len(alerts), per_post)]
            return list(await asyncio.gather(*(post(c) for c in chunks)))

    return asyncio.run(run())
