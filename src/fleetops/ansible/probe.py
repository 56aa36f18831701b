"""Probe hosts through ansible itself: one ad-hoc ``ansible.builtin.ping`` over the inventory.

For the hosts whose connection settings only ansible can resolve: templated connection vars
(``ansible_port: "{{ 2222 }}"``), a ProxyJump / ProxyCommand in ``ansible_ssh_common_args``,
password logins. The answer is per host: None when ansible logged in and the module answered, else
why not (ansible's own one-line message). Nothing here raises for a host: a run that could not
start is every probed host's reason.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fleetops.ansible.runner import ansible_env

PING = "ansible.builtin.ping"


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return " ".join(lines)[:300] if lines else ""


def _never() -> bool:
    return False


def probe_hosts(
    inventory: Sequence[Path], hosts: Sequence[str], timeout: float = 5.0
) -> dict[str, str | None]:
    """``{host: None (reachable, logged in) or why not}`` for each of ``hosts`` (exact inventory names)."""
    if not hosts:
        return {}
    import ansible_runner  # here, not at the top: the CLI's --help does not pay for it

    wanted = set(hosts)
    answers: dict[str, str | None] = {}

    def handle(event: dict[str, Any]) -> bool:
        data = event.get("event_data") or {}
        host = str(data.get("host", ""))
        kind = event.get("event", "")
        raw = data.get("res")
        res: dict[str, Any] = raw if isinstance(raw, dict) else {"msg": str(raw or "")}
        if host in wanted and kind == "runner_on_ok":
            answers[host] = None
        elif host in wanted and kind in ("runner_on_unreachable", "runner_on_failed"):
            why = _one_line(res.get("msg") or res.get("module_stderr") or res.get("stderr") or "")
            answers[host] = ("unreachable: " if kind == "runner_on_unreachable" else "ping failed: ") + (
                why or "no reason given"
            )
        return False

    private = Path(tempfile.mkdtemp(prefix="fleetops-probe-"))
    connect = max(1, round(timeout))
    try:
        result = ansible_runner.run(
            private_data_dir=str(private),
            host_pattern="all",
            module=PING,
            inventory=[str(p.resolve()) for p in inventory],
            limit=",".join(hosts),
            envvars=ansible_env(),
            event_handler=handle,
            # never None: without a callback runner installs SIGINT/SIGTERM handlers of its own, for good
            cancel_callback=_never,
            quiet=True,
            suppress_env_files=True,
            cmdline=f"--timeout {connect}",
            timeout=int(connect * 4 + 30),
        )
        status = str(result.status)
    except Exception as exc:  # the probe's failure is each probed host's reason, never a traceback
        status = f"error: {exc}"
    finally:
        shutil.rmtree(private, ignore_errors=True)
    missing = f"no answer from ansible's ping ({status})"
    return {h: answers.get(h, missing) for h in hosts}
