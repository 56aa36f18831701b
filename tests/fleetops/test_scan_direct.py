"""``fleetops scan``'s default transport, auto (``--transport ssh``: its alias; fleetops.ansible.direct): how a
host is reached comes from ansible's own configuration, the module's options from the same knobs, and the
report is the ansible transport's. Real scans of this machine over the local connection (the ssh side:
tests/integration/test_scan_lab.py, on lab hosts); an unreachable host is a closed port on loopback."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetops import schemas
from fleetops.ansible import direct
from fleetops.ansible.inventory import InventoryHost
from tests.helpers import fleetops

PYTHON = sys.executable


def _resolver(**extravars: Any) -> direct.Resolver:
    return direct.Resolver(extravars, connect_timeout=None)


def _host(name: str = "h1", **hostvars: Any) -> InventoryHost:
    return InventoryHost(name=name, group=None, hostvars=hostvars)


def test_the_ssh_command_is_the_ssh_plugins_without_connection_sharing() -> None:
    host = _host(
        ansible_host="10.0.0.5",
        ansible_user="ops",
        ansible_port=2222,
        ansible_ssh_private_key_file="/keys/fleet",
        ansible_ssh_common_args="-o ProxyJump=bastion -o ControlPath=/tmp/x",
    )
    target = _resolver().target(host, 120)
    argv = list(target.argv)
    assert target.ssh and argv[0] == "ssh"
    assert argv[1:5] == ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
    options = [argv[i + 1] for i, a in enumerate(argv[:-3]) if a == "-o"]
    assert not any(o.lower().startswith(("controlpersist", "controlpath=/tmp")) for o in options), options
    for wanted in ("Port=2222", "IdentityFile=/keys/fleet", "User=ops", "ProxyJump=bastion", "BatchMode=yes",
                   "ConnectTimeout=10", "PasswordAuthentication=no"):  # fmt: skip
        assert wanted in options, (wanted, options)
    assert argv[-4:-1] == ["-T", "--", "10.0.0.5"]
    assert argv[-1].startswith("python3 -I -S -c ")  # the stage's source, quoted for the remote shell
    assert target.timeout == 120


def test_the_scans_connect_timeout_and_the_hosts_interpreter_apply() -> None:
    resolver = direct.Resolver({}, connect_timeout=4)
    target = resolver.target(_host(ansible_python_interpreter="/opt/py/bin/python3 -X utf8"), 60)
    assert "ConnectTimeout=4" in target.argv
    assert target.argv[-1].startswith("/opt/py/bin/python3 -X utf8 -I -S -c ")


@pytest.mark.parametrize(
    ("hostvars", "why"),
    [
        ({"ansible_become": True, "ansible_connection": "local"}, "become on the local connection"),
        ({"ansible_become": True, "ansible_become_method": "su"}, "become method su"),
        ({"ansible_become": "yes", "ansible_become_password": "hunter2"}, "become with a password"),
        ({"ansible_become": "{{ elevate }}"}, "ansible_become is a template"),
        ({"ansible_connection": "community.docker.docker"}, "connection community.docker.docker"),
        ({"ansible_password": "hunter2"}, "a password, a key given as text or a PKCS#11 provider"),
        ({"ansible_host": "{{ private_ip }}"}, "a connection setting is a template"),
        ({"ansible_python_interpreter": "{{ py }}"}, "ansible_python_interpreter is a template"),
        ({"fleetops_zombie_warning": "{{ warn }}"}, "fleetops_zombie_warning is a template"),
    ],
)
def test_what_the_transport_cannot_serve_is_named(hostvars: dict[str, Any], why: str) -> None:
    with pytest.raises(direct.Unsupported) as raised:
        _resolver().target(_host(**hostvars), 60)
    assert str(raised.value) == why
    assert "hunter2" not in str(raised.value)


def test_become_is_sudos_never_interactive_with_the_plugins_user_and_flags() -> None:
    target = _resolver().target(_host(ansible_user="ubuntu", ansible_become=True), 60)
    assert target.argv[-1].startswith("sudo -H -S -n -u root python3 -I -S -c ")
    target = _resolver().target(
        _host(ansible_become="true", ansible_become_user="gpu", ansible_become_flags="-H -S"), 60
    )
    assert target.argv[-1].startswith("sudo -H -S -n -u gpu python3 -I -S -c ")  # -n added: never a prompt
    assert _resolver().target(_host(ansible_become=False), 60).argv[-1].startswith("python3 -I -S -c ")
    # root to root: ansible skips become (BECOME_ALLOW_SAME_USER is off), and so does this
    assert (
        _resolver()
        .target(_host(ansible_user="root", ansible_become=True), 60)
        .argv[-1]
        .startswith("python3 ")
    )


def test_a_hosts_ansible_become_false_wins_over_ansible_cfgs_become(monkeypatch: pytest.MonkeyPatch) -> None:
    """ansible.cfg's ``become = true`` (here its environment variable, the same setting, which ansible reads
    on each lookup) is every host's default, and a host's own ``ansible_become: false`` wins over it, as in
    ansible (the configuration is the lowest layer of a become plugin's options)."""
    monkeypatch.setenv("ANSIBLE_BECOME", "true")
    resolver = _resolver()

    def remote(**hostvars: Any) -> str:
        return resolver.target(_host(ansible_user="ops", **hostvars), 60).argv[-1]

    assert remote().startswith("sudo -H -S -n -u root python3 ")
    for no in (False, "no", "false"):
        assert remote(ansible_become=no).startswith("python3 -I -S -c "), no


def test_a_host_timeout_of_zero_is_no_timeout_as_the_tasks_keyword_takes_it() -> None:
    """``--host-timeout 0`` (no limit) reaches each host as ``fleetops_host_timeout: 0``: no limit, never an
    immediate timeout; a host's own value is its limit."""
    assert _resolver(fleetops_host_timeout=0).target(_host(), None).timeout is None
    assert _resolver(fleetops_host_timeout=0).target(_host(), 120).timeout is None
    assert _resolver().target(_host(fleetops_host_timeout=30), 120).timeout == 30
    assert _resolver().target(_host(), 120).timeout == 120


def test_the_options_come_from_the_knobs_extra_vars_first_and_are_typed() -> None:
    resolver = _resolver(fleetops_zombie_warning="700", fleetops_checks="zombie_memcg,crashloop_unit")
    events = [{"Code": "system-reboot", "EventId": "e-1"}]
    target = resolver.target(_host(fleetops_zombie_warning=5, ec2_scheduled_events=events), 60)
    assert target.problem is None and target.params is not None
    assert target.params["zombie_warning"] == 700  # the extra var wins over the host's, typed as the module
    assert target.params["checks"] == ["zombie_memcg", "crashloop_unit"]
    assert (
        target.params["inventory_events"] == events
    )  # fleetops_inventory_events' fallback, as the playbook's
    assert target.params["zombie_critical"] == 20000  # the module's default


@pytest.mark.parametrize(
    ("knobs", "msg"),
    [
        ({"fleetops_zombie_warning": 900, "fleetops_zombie_critical": 800},
         "Failed to validate node_health options: zombie_warning (900) must not be greater than zombie_critical (800)"),
        ({"fleetops_zombie_warning": "many"}, "argument 'zombie_warning' is of type str and we were unable to "
         "convert to int"),
        ({"fleetops_checks": ["no_such"]}, "value of checks must be one or more of"),
    ],
)  # fmt: skip
def test_bad_options_fail_the_host_with_the_modules_words(knobs: dict[str, Any], msg: str) -> None:
    target = _resolver(**knobs).target(_host(), 60)
    assert target.params is None and target.problem is not None
    assert target.problem.startswith(msg), target.problem


# ------------------------------------------------------------------------------- whole scans, local


def _inventory(tmp_path: Path, hosts: dict[str, dict[str, Any]]) -> Path:
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    return path


def _scan(inventory: Path, transport: str | None, *extra: str) -> tuple[int, dict[str, Any]]:
    """``fleetops scan --transport TRANSPORT`` (None: no --transport, the default)."""
    chosen = ("--transport", transport) if transport is not None else ()
    result = fleetops("scan", "-i", str(inventory), *chosen, "--format", "json", "-q",
                      "--checks", "zombie_memcg,unexpected_unit", "-e", "fleetops_imds=never", *extra)  # fmt: skip
    assert result.stdout, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return result.rc, report


# The status of a local host that answered these checks (zombie_memcg, unexpected_unit): partial where systemd
# is not PID 1 (unexpected_unit cannot look), ok on a machine that boots with systemd and sees its cgroups.
ANSWERED = "ok" if os.path.isdir("/run/systemd/system") else "partial"


def _shape(value: Any) -> Any:
    return json.loads(re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "0", json.dumps(value, sort_keys=True)))


def test_a_local_scan_reports_what_the_ansible_transport_reports(tmp_path: Path) -> None:
    """The default transport (auto) scans a host it can serve itself and the other through ansible-playbook,
    named once with why; ``ssh`` is its alias; the results are ansible-playbook's for every host."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": PYTHON}
    inventory = _inventory(tmp_path, {"here": local, "elevated": {**local, "ansible_become": True}})
    rc_auto, ours = _scan(inventory, None)
    rc_ssh, alias = _scan(inventory, "ssh")
    rc_ansible, theirs = _scan(inventory, "ansible")
    assert rc_auto == rc_ssh == rc_ansible
    by_ansible = {"elevated": "become on the local connection"}
    assert ours["transport"] == {"name": "auto", "by_ansible": by_ansible}
    assert alias["transport"] == {"name": "ssh", "by_ansible": by_ansible}
    assert theirs["transport"] == {"name": "ansible"}  # every host by ansible-playbook
    for report, what in ((ours, "the default transport's"), (alias, "ssh's"), (theirs, "ansible's")):
        schemas.validate_scan_report(report, f"{what} report")  # its documented schema
    assert set(ours["hosts"]) == set(alias["hosts"]) == set(theirs["hosts"]) == {"here", "elevated"}
    for host in ("here", "elevated"):
        a, b, c = ours["hosts"][host], theirs["hosts"][host], alias["hosts"][host]
        # answered, ok or partial alike: each check's coverage comes back the same way on every path
        assert a["status"] == b["status"] == c["status"] == ANSWERED, (a, b, c)
        assert a["coverage"] == b["coverage"] == c["coverage"] and list(a["coverage"]) == a["checks"], (a, b)
        assert _shape(a["findings"]) == _shape(b["findings"]) == _shape(c["findings"])
        assert a["checks"] == b["checks"] == c["checks"] == ["zombie_memcg", "unexpected_unit"]
        assert _shape(a["facts"]) == _shape(b["facts"]) == _shape(c["facts"])
    assert ours["summary"] == theirs["summary"] == alias["summary"]


def test_host_timeout_zero_scans_with_no_limit(tmp_path: Path) -> None:
    """``fleetops scan --host-timeout 0`` (no limit) answers on the default transport: the direct path timed
    every host out (0.1 s: the knob's 0 taken as the limit), and its stand-in for no limit (365 days) overflowed
    the wait for the host's command."""
    slow = tmp_path / "slow-python"  # a host that takes a second to answer
    slow.write_text(f'#!/bin/sh\nsleep 1\nexec {PYTHON} "$@"\n')
    slow.chmod(0o755)
    local = {"ansible_connection": "local", "ansible_python_interpreter": str(slow)}
    rc, report = _scan(_inventory(tmp_path, {"here": local}), None, "--host-timeout", "0")
    assert report["transport"] == {"name": "auto", "by_ansible": {}}, report["transport"]  # the direct path
    assert report["hosts"]["here"]["status"] == ANSWERED, report["hosts"]["here"]
    assert rc in (0, 1), rc


def test_a_closed_port_is_unreachable_and_the_other_hosts_are_scanned(tmp_path: Path) -> None:
    inventory = _inventory(
        tmp_path,
        {
            "here": {"ansible_connection": "local", "ansible_python_interpreter": PYTHON},
            "gone": {"ansible_host": "127.0.0.1", "ansible_port": 1},
        },
    )
    rc, report = _scan(inventory, None, "--host-timeout", "20")
    assert rc == 3
    gone = report["hosts"]["gone"]
    assert gone["status"] == "unreachable"
    assert gone["msg"].startswith(
        "Failed to connect to the host via ssh: ssh: connect to host 127.0.0.1 port 1"
    )
    assert report["hosts"]["here"]["status"] == ANSWERED
    assert report["transport"]["by_ansible"] == {}


def test_a_host_past_its_timeout_is_reported_timed_out(tmp_path: Path) -> None:
    """The host's command and everything it started (here a shell's child holding the pipes, as a
    ProxyCommand would) end at the timeout: the scan does not wait for them (it waited 60 s once)."""
    slow, pid = tmp_path / "slow-python", tmp_path / "child.pid"
    slow.write_text(f"#!/bin/sh\nsleep 600 &\necho $! > {pid}\nwait\n")
    slow.chmod(0o755)
    started = time.monotonic()
    inventory = _inventory(
        tmp_path, {"stuck": {"ansible_connection": "local", "ansible_python_interpreter": str(slow)}}
    )
    rc, report = _scan(inventory, None, "--host-timeout", "2")
    stuck = report["hosts"]["stuck"]
    assert rc == 3
    assert stuck["status"] == "unreachable" and stuck.get("timed_out") is True, stuck
    assert "no answer within the per-host timeout" in stuck["msg"]
    assert time.monotonic() - started < 300  # not the child's 600 s
    child = int(pid.read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)  # killed: gone once its parent, init, reaps it
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]


def test_a_python_that_gives_no_answer_is_scanned_by_ansible(tmp_path: Path) -> None:
    """A host Python that cannot run the stage (a wrapper without -I, an old one): that host goes through
    ansible-playbook in the same scan, and the report says so."""
    wrapper = tmp_path / "python"
    wrapper.write_text(
        f'#!/bin/sh\ncase "$1" in -I) echo "no isolated mode" >&2; exit 2;; esac\nexec {PYTHON} "$@"\n'
    )
    wrapper.chmod(0o755)
    inventory = _inventory(
        tmp_path, {"odd": {"ansible_connection": "local", "ansible_python_interpreter": str(wrapper)}}
    )
    rc, report = _scan(inventory, None)
    assert rc in (0, 1)
    assert report["hosts"]["odd"]["status"] == ANSWERED
    assert report["transport"]["by_ansible"] == {"odd": "the runner gave no answer (rc 2): no isolated mode"}


def test_the_runner_cache_is_used_as_the_action_uses_it(tmp_path: Path) -> None:
    """Both transports stage the same archive in the same place: a host scanned by either needs it once."""
    home = Path(os.path.expanduser("~/.ansible/fleetops"))
    inventory = _inventory(
        tmp_path, {"here": {"ansible_connection": "local", "ansible_python_interpreter": PYTHON}}
    )
    _scan(inventory, None)
    resolver = _resolver()
    assert (home / f"runner-{resolver.sha}").is_dir()


def test_a_host_address_that_looks_like_an_option_stays_the_destination() -> None:
    """A hostile inventory's ``ansible_host: -oProxyCommand=...``: after ``--`` ssh takes it as the host to
    reach (and fails to), never as an option."""
    argv = list(_resolver().target(_host(ansible_host="-oProxyCommand=touch /tmp/owned"), 60).argv)
    assert argv[argv.index("--") + 1] == "-oProxyCommand=touch /tmp/owned"
    assert argv.index("--") == len(argv) - 3


def test_an_unknown_transport_is_refused_before_anything_runs(tmp_path: Path) -> None:
    from fleetops import api
    from fleetops.errors import UsageError

    inventory = _inventory(tmp_path, {"here": {"ansible_connection": "local"}})
    out = tmp_path / "r.json"
    with pytest.raises(UsageError, match=r"^--transport: 'paramiko' is not one of auto, ansible, ssh$"):
        api.scan(api.ScanRequest(inventory=[inventory], output=out, transport="paramiko"))
    assert not out.exists() and not out.with_name("r.json.partial").exists()
    result = fleetops("scan", "-i", str(inventory), "--transport", "paramiko")
    assert result.rc == 2 and "invalid choice: 'paramiko'" in result.stderr and not result.stdout


def test_ctrl_c_without_a_cancel_event_ends_the_ssh_commands_at_once(tmp_path: Path) -> None:
    """A pass's or a gate's scan has no ``cancel``: a KeyboardInterrupt (or a signal's exception) in the
    scanning thread kills the running commands (each in a session of its own, out of the terminal's reach)
    and starts no more, instead of waiting for every host."""
    import signal
    import threading

    pids = tmp_path / "pids"
    slow = tmp_path / "slow-python"
    slow.write_text(f"#!/bin/sh\necho $$ >> {pids}\nexec sleep 60\n")
    slow.chmod(0o755)
    hosts = [
        _host(f"h{i}", ansible_connection="local", ansible_python_interpreter=str(slow)) for i in range(3)
    ]

    def interrupt() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(pids.read_text().split() if pids.exists() else []) < 2:
            time.sleep(0.05)
        os.kill(
            os.getpid(), signal.SIGINT
        )  # a real Ctrl-C: Python raises KeyboardInterrupt in the main thread

    # Python's own Ctrl-C handler, whatever this process inherited: a suite started in a non-interactive
    # shell's background (`nohup ... &`, as CI may be) inherits SIGINT ignored, and a real Ctrl-C then
    # raises nothing (the product rightly leaves an ignored SIGINT ignored)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=interrupt, daemon=True).start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            direct.run(hosts, {}, forks=2, host_timeout=60, connect_timeout=None)
    finally:
        signal.signal(signal.SIGINT, inherited)
    assert time.monotonic() - started < 20
    running = [int(p) for p in pids.read_text().split()]
    assert len(running) == 2  # forks 2: the third host never started
    for pid in running:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # killed and reaped
