"""Preflight resolves each host's connection settings the way ansible does: hosts with templated
connection vars or a ProxyJump / ProxyCommand are probed through ansible itself (a real ad-hoc ping
on this machine: ssh to 127.0.0.1, where nothing listens on port 1); what cannot work is that host's
reason, never a traceback. (A host reachable only through a ProxyJump over another lab host is the lab's
to show: tests/integration.)"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from fleetops.ansible.inventory import InventoryHost, load_hosts
from fleetops.rollout.preflight import NeedsAnsible, _ssh_params, check_ssh, preflight

INVENTORY = """\
all:
  hosts:
    tpl-local:
      ansible_connection: "{{ 'local' }}"
      ansible_python_interpreter: "{{ ansible_playbook_python }}"
    tpl-port:
      ansible_host: 127.0.0.1
      ansible_port: "{{ 1 }}"
    jump:
      ansible_host: 127.0.0.1
      ansible_port: 1
      ansible_ssh_common_args: "-o ProxyJump=nobody@127.0.0.1:1"
    badquotes:
      ansible_host: 127.0.0.1
      ansible_ssh_common_args: "-o ProxyCommand='ssh -W %h:%p"
    badport:
      ansible_host: 127.0.0.1
      ansible_port: twenty-two
"""


def _host(**hostvars: object) -> InventoryHost:
    return InventoryHost("h", None, hostvars={"ansible_host": "10.0.0.1", **hostvars})


@pytest.mark.parametrize(
    "hostvars",
    [
        {"ansible_port": "{{ 2222 }}"},
        {"ansible_host": "{{ inventory_hostname }}.example"},
        {"ansible_ssh_common_args": "-o ProxyJump=bastion"},
        {"ansible_ssh_common_args": "-J bastion"},
        {"ansible_ssh_extra_args": "-oProxyCommand=ssh -W %h:%p bastion"},
        {"ansible_ssh_common_args": '-o "ProxyCommand ssh -W %h:%p bastion"'},
        {"ansible_password": "x"},
        {"ansible_connection": "community.docker.docker"},
    ],
)
def test_what_only_ansible_resolves_goes_to_ansible(hostvars: dict[str, object]) -> None:
    with pytest.raises(NeedsAnsible):
        _ssh_params(_host(**hostvars))


@pytest.mark.parametrize(
    ("hostvars", "reason"),
    [
        (
            {"ansible_ssh_common_args": "-o ProxyCommand='ssh -W %h:%p"},
            "bad ssh arguments (no closing quotation)",
        ),
        ({"ansible_port": "twenty-two"}, "ansible_port is not a port number: 'twenty-two'"),
        ({"ansible_port": 70000}, "ansible_port is not a port number: 70000"),
    ],
)
def test_settings_that_cannot_work_are_the_hosts_reason(hostvars: dict[str, object], reason: str) -> None:
    answer = check_ssh(_host(**hostvars))
    assert answer is not None and answer.startswith(f"unreachable: {reason}"), answer


def test_plain_hosts_keep_the_direct_check() -> None:
    params = _ssh_params(_host(ansible_port="2222", ansible_ssh_common_args="-o StrictHostKeyChecking=yes"))
    assert params is not None and params["port"] == 2222


def test_preflight_probes_templated_and_proxied_hosts_through_ansible(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(INVENTORY)
    hosts = load_hosts([inventory], None)
    handlers = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    reasons = preflight(hosts, timeout=3, inventory=[inventory])
    assert (
        signal.getsignal(signal.SIGINT),
        signal.getsignal(signal.SIGTERM),
    ) == handlers  # runner's not left
    assert reasons["tpl-local"] is None  # "{{ 'local' }}": ansible resolved it and pinged
    tpl_port = reasons["tpl-port"]
    assert tpl_port is not None and "127.0.0.1 port 1: Connection refused" in tpl_port  # "{{ 1 }}" -> 1
    jump = reasons["jump"]
    assert jump is not None and jump.startswith("unreachable: ") and "Connection refused" not in jump
    assert (
        reasons["badquotes"]
        == "unreachable: bad ssh arguments (no closing quotation): -o ProxyCommand='ssh -W %h:%p"
    )
    assert reasons["badport"] == "unreachable: ansible_port is not a port number: 'twenty-two'"
    # without the inventory ansible cannot probe: said so, per host
    alone = preflight([h for h in hosts if h.name == "tpl-port"], timeout=3)
    assert alone == {
        "tpl-port": "unreachable: its connection settings need ansible to resolve and no inventory was given"
    }
