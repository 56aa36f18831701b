"""Preflight: before anything changes, every target's ssh port, host key and login are checked (paramiko)."""

from __future__ import annotations

import contextlib
import getpass
import os
import shlex
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import paramiko

from fleetops.ansible.inventory import InventoryHost


def _ssh_params(host: InventoryHost) -> dict[str, Any] | None:
    """paramiko connection parameters from a host's (untemplated) hostvars; None for a local host."""
    hv = host.hostvars
    if hv.get("ansible_connection") in ("local", "community.general.chroot") or (
        host.name in ("localhost", "127.0.0.1") and "ansible_host" not in hv
    ):
        return None
    args = shlex.split(
        str(hv.get("ansible_ssh_common_args", "")) + " " + str(hv.get("ansible_ssh_extra_args", ""))
    )
    known_hosts: list[str] = []
    for i, arg in enumerate(args):
        opt = (
            arg[2:]
            if arg.startswith("-o") and len(arg) > 2
            else (args[i + 1] if arg == "-o" and i + 1 < len(args) else "")
        )
        key, _, value = opt.partition("=")
        if key.strip().lower() == "userknownhostsfile" and value:
            known_hosts.extend(os.path.expanduser(v) for v in value.split())
    return {
        "hostname": str(hv.get("ansible_host", host.name)),
        "port": int(hv.get("ansible_port", 22)),
        "username": str(hv.get("ansible_user") or getpass.getuser()),
        "key_filename": os.path.expanduser(str(hv["ansible_ssh_private_key_file"]))
        if hv.get("ansible_ssh_private_key_file")
        else None,
        "known_hosts": known_hosts,
    }


def check_ssh(host: InventoryHost, timeout: float = 5.0) -> str | None:
    """None when the host answers ssh with a known host key and lets us log in; else why not."""
    params = _ssh_params(host)
    if params is None:
        return None
    client = paramiko.SSHClient()
    try:
        client.load_system_host_keys()
        for path in params["known_hosts"]:
            with contextlib.suppress(FileNotFoundError):
                client.load_host_keys(path)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(
            params["hostname"],
            port=params["port"],
            username=params["username"],
            key_filename=params["key_filename"],
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
            allow_agent=params["key_filename"] is None,
            look_for_keys=params["key_filename"] is None,
        )
    except paramiko.BadHostKeyException:
        return "host key mismatch (possible MITM or a rebuilt host)"
    except paramiko.SSHException as exc:
        text = str(exc)
        if "not found in known_hosts" in text:
            return "host key unknown (not in known_hosts)"
        return f"ssh: {text}"
    except OSError as exc:  # includes socket.timeout
        return f"unreachable: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}"
    finally:
        client.close()
    return None


def preflight(
    hosts: Sequence[InventoryHost], timeout: float = 5.0, workers: int = 32
) -> dict[str, str | None]:
    """Check every host concurrently: {host: None (ok) or the reason it is not reachable}."""
    if not hosts:
        return {}
    with ThreadPoolExecutor(max_workers=min(workers, len(hosts))) as pool:
        reasons = list(pool.map(lambda h: check_ssh(h, timeout), hosts))
    return {h.name: r for h, r in zip(hosts, reasons, strict=True)}
