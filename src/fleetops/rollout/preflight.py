"""Preflight: before anything changes, every target's ssh port, host key and login are checked.

Plain ssh hosts are checked with paramiko, all at once. A host whose connection settings only
ansible can resolve — a templated connection var (``ansible_port: "{{ 2222 }}"``), a ProxyJump /
ProxyCommand (``-J``) in its ssh args, a password login, another connection plugin — is probed
through ansible itself (``fleetops.ansible.probe``: an ad-hoc ping over the inventory). Whatever goes
wrong is that host's reason (unreachable), never a traceback: bad quotes in its ssh args, a port
that is not a number.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import shlex
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fleetops.ansible.inventory import InventoryHost

# the hostvars ansible's ssh connection reads (a template in any of them: ansible resolves it)
CONNECTION_VARS = (
    "ansible_host", "ansible_ssh_host", "ansible_port", "ansible_ssh_port", "ansible_user", "ansible_ssh_user",
    "ansible_ssh_private_key_file", "ansible_private_key_file", "ansible_ssh_common_args",
    "ansible_ssh_extra_args", "ansible_ssh_args", "ansible_connection",
)  # fmt: skip
PASSWORD_VARS = ("ansible_password", "ansible_ssh_pass", "ansible_ssh_password")
PROXY_OPTIONS = ("proxyjump", "proxycommand")
SSH_CONNECTIONS = ("ssh", "ansible.builtin.ssh", "smart", None)


class NeedsAnsible(Exception):
    """The host's connection settings are ansible's to resolve (templated, proxied, password)."""


class BadSettings(ValueError):
    """The host's connection settings cannot work (bad quotes, a port that is not a number)."""


def _templated(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def _ssh_args(hv: Any) -> list[str]:
    text = " ".join(
        str(hv.get(k, "")) for k in ("ansible_ssh_common_args", "ansible_ssh_extra_args", "ansible_ssh_args")
    )
    try:
        return shlex.split(text)
    except ValueError as exc:  # "No closing quotation": ansible's ssh plugin would fail the same way
        raise BadSettings(f"bad ssh arguments ({str(exc).lower()}): {text.strip()}") from None


def _option(args: list[str], i: int) -> str:
    arg = args[i]
    if arg.startswith("-o") and len(arg) > 2:
        return arg[2:]
    return args[i + 1] if arg == "-o" and i + 1 < len(args) else ""


def _ssh_params(host: InventoryHost) -> dict[str, Any] | None:
    """paramiko connection parameters from a host's (untemplated) hostvars; None for a local host.

    NeedsAnsible when only ansible can resolve them; BadSettings when they cannot work."""
    hv = host.hostvars
    connection = hv.get("ansible_connection")
    if connection in ("local", "community.general.chroot") or (
        host.name in ("localhost", "127.0.0.1") and "ansible_host" not in hv
    ):
        return None
    if any(_templated(hv.get(k)) for k in CONNECTION_VARS):
        raise NeedsAnsible("templated connection settings")
    if connection not in SSH_CONNECTIONS or any(hv.get(k) for k in PASSWORD_VARS):
        raise NeedsAnsible(
            f"connection {connection}" if connection not in SSH_CONNECTIONS else "password login"
        )
    args = _ssh_args(hv)
    if "-J" in args or any(a.startswith("-J") for a in args):
        raise NeedsAnsible("ProxyJump")
    for i in range(len(args)):
        key = re.split(r"[=\s]", _option(args, i).strip(), maxsplit=1)[0].lower()  # Key=Value or "Key Value"
        if key in PROXY_OPTIONS:
            raise NeedsAnsible(key)
    port_text = hv.get("ansible_port", hv.get("ansible_ssh_port", 22))
    try:
        port = int(port_text)
    except (TypeError, ValueError):
        raise BadSettings(f"ansible_port is not a port number: {port_text!r}") from None
    if not 0 < port < 65536:
        raise BadSettings(f"ansible_port is not a port number: {port_text!r}")
    known_hosts: list[str] = []
    for i in range(len(args)):
        key, _, value = _option(args, i).partition("=")
        if key.strip().lower() == "userknownhostsfile" and value:
            known_hosts.extend(os.path.expanduser(v) for v in value.split())
    return {
        "hostname": str(hv.get("ansible_host", host.name)),
        "port": port,
        "username": str(hv.get("ansible_user") or getpass.getuser()),
        "key_filename": os.path.expanduser(str(hv["ansible_ssh_private_key_file"]))
        if hv.get("ansible_ssh_private_key_file")
        else None,
        "known_hosts": known_hosts,
    }


def check_ssh(host: InventoryHost, timeout: float = 5.0) -> str | None:
    """None when the host answers ssh with a known host key and lets us log in; else why not.

    NeedsAnsible for a host only ansible can resolve (``preflight`` probes those through ansible)."""
    try:
        params = _ssh_params(host)
    except BadSettings as exc:
        return f"unreachable: {exc}"
    if params is None:
        return None
    import paramiko  # here, not at the top: it costs every fleetops command ~70 ms to import

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


def _direct(host: InventoryHost, timeout: float) -> str | NeedsAnsible | None:
    try:
        return check_ssh(host, timeout)
    except NeedsAnsible as exc:
        return exc
    except Exception as exc:  # a bad key file, an odd answer: the host's reason, never a traceback
        return f"unreachable: {type(exc).__name__}: {exc}"


def preflight(
    hosts: Sequence[InventoryHost],
    timeout: float = 5.0,
    workers: int = 32,
    inventory: Sequence[Path] | None = None,
) -> dict[str, str | None]:
    """Check every host concurrently: {host: None (ok) or the reason it is not reachable}.

    ``inventory``: where ``hosts`` came from, for the hosts probed through ansible (without it those
    are reported as not checkable)."""
    if not hosts:
        return {}
    with ThreadPoolExecutor(max_workers=min(workers, len(hosts))) as pool:
        direct = list(pool.map(lambda h: _direct(h, timeout), hosts))
    reasons: dict[str, str | None] = {}
    via_ansible: list[str] = []
    for host, answer in zip(hosts, direct, strict=True):
        if isinstance(answer, NeedsAnsible):
            via_ansible.append(host.name)
        else:
            reasons[host.name] = answer
    if via_ansible:
        if inventory:
            from fleetops.ansible.probe import probe_hosts

            reasons.update(probe_hosts(inventory, via_ansible, timeout))
        else:
            for name in via_ansible:
                reasons[name] = (
                    "unreachable: its connection settings need ansible to resolve and no inventory was given"
                )
    return {h.name: reasons[h.name] for h in hosts}
