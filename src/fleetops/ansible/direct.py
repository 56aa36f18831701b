"""``fleetops scan --transport ssh``: node_health's runner over one OpenSSH command per host, without
ansible-playbook.

A scan through ansible-playbook costs the controller about 0.115 CPU s a host beyond ssh itself (a worker
forked per host, the task's knobs templated in each, the ssh plugin; docs/fleet-scale.md). This transport runs
the same thing the ``fleetops.node.node_health`` action runs on a host — ``module_utils/scan_stage.py`` as
``python3 -I -S -c``, the runner archive staged once in ``~/.ansible/fleetops`` — straight from the CLI: one
``ssh`` process a host, as many at once as the scan's forks, each host's answer turned into the task result
ansible-runner would have reported (``TaskResult``), so the report, the partial file, the progress, ndjson
and the Prometheus file are the ansible path's.

Everything that decides how a host is reached comes from ansible's own configuration manager with the
host's variables (``ansible.cfg``, ``ANSIBLE_*``, ``ansible_host``, ``ansible_user``, ``ansible_port``, the
private key, ``ssh_args``, ``ssh_common_args``, ``ssh_extra_args``, ``host_key_checking``, ``timeout``,
``ansible_python_interpreter``), and the ssh command line is the ssh plugin's, without connection sharing (a
scan opens one connection a host). The module's options come from the same knobs as the playbook's
(``fleetops_<option>`` from the extra vars, then the host's variables; ``ec2_scheduled_events`` for
``inventory_events``) and are validated with the module's own argument spec.

Become is sudo's, as the sudo become plugin's options say, never interactive. A host this transport cannot
serve is scanned by ansible-playbook in the same scan (``fallback``): another connection type than ssh or
local, become on the local connection or by another method than sudo or with a password, a password or a
key given as text, a value that is a template (``ansible-inventory`` prints host variables untemplated), or
a host whose runner is refused (the cache) or gives no answer (no Python where the inventory says, a sudo
that wants a password). AWX, and every remediation, run through ansible.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fleetops.ansible.collection import install_ansible_loader, load, module_utils
from fleetops.ansible.inventory import InventoryHost
from fleetops.ansible.parse_cache import ansible_constants
from fleetops.ansible.runner import PlaybookRun, TaskResult, prepare_env

ACTION = "fleetops.node.node_health"
TASK = "Run all detectors in one module call"  # playbooks/scan.yml's task: the same name in the results
SSH_CONNECTIONS = frozenset({"ssh", "smart", "ansible.builtin.ssh", "ansible.legacy.ssh"})
LOCAL_CONNECTIONS = frozenset({"local", "ansible.builtin.local", "ansible.legacy.local"})
SHARING = ("controlmaster", "controlpath", "controlpersist")
# what this checkout's localhost inventory (and ansible's implicit localhost) names as the interpreter
PLAYBOOK_PYTHON = "{{ ansible_playbook_python }}"
UNREACHABLE_RC = 255  # ssh's own failure: it never reached the host's shell
STDERR_TAIL = 500


class Unsupported(Exception):
    """This host needs ansible-playbook (the reason is the message)."""


@dataclass(frozen=True)
class Target:
    """How to reach one host and what to ask it."""

    host: str
    argv: tuple[str, ...]  # the command that runs the stage (ssh ... HOST CMD, or the local Python)
    ssh: bool  # over ssh (its exit 255 is its own failure: unreachable), or a local Python
    params: Mapping[str, Any] | None  # node_health's validated options (None: ``problem`` says why not)
    timeout: float | None  # seconds the host may take (None: no limit)
    problem: str | None = None


@dataclass
class DirectRun:
    run: PlaybookRun
    fallback: dict[str, str] = field(default_factory=dict)  # host -> why ansible-playbook must scan it


def _template(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def _without_sharing(args: Sequence[str]) -> list[str]:
    """ssh options less those that share connections (ControlMaster, ControlPath, ControlPersist)."""
    out: list[str] = []
    it = iter(args)
    for arg in it:
        if arg == "-o":
            opt = next(it, "")
            if opt.split("=", 1)[0].strip().lower() not in SHARING:
                out += ["-o", opt]
        elif arg.startswith("-o") and arg[2:].split("=", 1)[0].strip().lower() in SHARING:
            continue
        else:
            out.append(arg)
    return out


_LOADING = threading.Lock()


def _load_ansible() -> None:
    """What a Resolver needs of ansible, loaded once (under a lock: Resolvers of several threads):
    the configuration, the ssh and sudo plugins (their option definitions, for get_plugin_options), the
    action plugin's runner archive."""
    with _LOADING:
        ansible_constants()  # reads the configuration (its definitions from their kept copy)
        from ansible.module_utils.common.arg_spec import ArgumentSpecValidator  # noqa: F401
        from ansible.plugins.loader import become_loader, connection_loader

        install_ansible_loader()  # ansible's collection finder, as the in-process inventory listing uses

        with warnings.catch_warnings():
            # ansible's ssh-agent support imports cryptography's DSA, which newer cryptography (51.0.1 here)
            # deprecates with a warning on stderr: ansible-playbook's own, not this scan's to print
            warnings.filterwarnings("ignore", message="DSA is deprecated", module=r"ansible\._internal\._ssh")
            connection_loader.get("ssh", class_only=True)
        become_loader.get("sudo", class_only=True)
        load("plugins.action.node_health")


class Resolver:
    """Ansible's configuration, read once per scan: each host's connection and the module's options."""

    def __init__(self, extravars: Mapping[str, Any], connect_timeout: int | None) -> None:
        prepare_env()
        _load_ansible()
        from ansible import constants as C
        from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
        from ansible.module_utils.parsing.convert_bool import boolean

        self.config = C.config
        self.boolean: Callable[[Any], bool] = lambda value: bool(boolean(value, strict=False))
        self.extravars = dict(extravars)
        self.connect_timeout = connect_timeout
        self.health = module_utils("health")
        self.stage = module_utils("scan_stage")
        self.validator = ArgumentSpecValidator(self.health.ARGUMENT_SPEC)
        action = load("plugins.action.node_health")
        if action.PAYLOAD is None:
            raise Unsupported("the runner archive is not in the collection")
        self.archive, self.sha, self.source = action.PAYLOAD

    def variables(self, host: InventoryHost) -> dict[str, Any]:
        """What a task on ``host`` sees: its variables, the extra vars over them."""
        return {**host.hostvars, "inventory_hostname": host.name, **self.extravars}

    def target(self, host: InventoryHost, default_timeout: float | None) -> Target:
        """``host``'s command and options; ``Unsupported`` when ansible-playbook must scan it. Its time:
        ``fleetops_host_timeout``, else ``default_timeout`` (None, or the knob's 0: no limit)."""
        variables = self.variables(host)
        get = self.config.get_config_value
        connection = str(variables.get("ansible_connection") or get("DEFAULT_TRANSPORT", variables=variables))
        if connection not in SSH_CONNECTIONS | LOCAL_CONNECTIONS:
            raise Unsupported(f"connection {connection}")
        local = connection in LOCAL_CONNECTIONS
        ssh_options = (
            {} if local else self.config.get_plugin_options("connection", "ssh", variables=dict(variables))
        )
        become = self.become(variables, local, ssh_options.get("remote_user"))
        interpreter = variables.get("ansible_python_interpreter") or get(
            "INTERPRETER_PYTHON", variables=variables
        )
        if interpreter == PLAYBOOK_PYTHON and connection in LOCAL_CONNECTIONS:
            interpreter = sys.executable  # ansible-playbook's own Python: this environment's
        if _template(interpreter):
            raise Unsupported("ansible_python_interpreter is a template")
        stage = self.stage.command(str(interpreter or ""), self.source)
        if local:
            argv: tuple[str, ...] = tuple(stage)
        else:
            remote = " ".join(shlex.quote(p) for p in [*become, *stage])
            argv = (*self.ssh_argv(host.name, variables, ssh_options), remote)
        timeout = variables.get("fleetops_host_timeout", default_timeout)
        if _template(timeout):
            raise Unsupported("fleetops_host_timeout is a template")
        # 0: no limit, as the task's timeout keyword takes it (it timed every host out at once)
        limit = float(timeout) if timeout is not None else 0.0
        params, problem = self.params(variables)
        return Target(host.name, argv, not local, params, limit or None, problem)

    def become(self, variables: Mapping[str, Any], local: bool, remote_user: Any) -> list[str]:
        """The sudo command line before the host's Python ([]: no become), as the sudo become plugin's
        options say (user, flags), always non-interactive (``-n``: a sudo that wants a password gives no
        answer, and ansible-playbook scans that host)."""
        asked = variables.get("ansible_become")
        if _template(asked):
            raise Unsupported("ansible_become is a template")
        if asked is None:  # the configuration (ansible.cfg's become) only where the host says nothing
            asked = self.config.get_config_value("DEFAULT_BECOME", variables=dict(variables))
        if not self.boolean(asked):
            return []
        if local:
            raise Unsupported("become on the local connection")
        method = str(variables.get("ansible_become_method") or
                     self.config.get_config_value("DEFAULT_BECOME_METHOD", variables=dict(variables)))  # fmt: skip
        if method not in ("sudo", "ansible.builtin.sudo"):
            raise Unsupported(f"become method {method}")
        o = self.config.get_plugin_options("become", "sudo", variables=dict(variables))
        if o.get("become_pass"):
            raise Unsupported("become with a password")
        if any(_template(o.get(k)) for k in ("become_exe", "become_flags", "become_user")):
            raise Unsupported("a become setting is a template")
        user = str(o.get("become_user") or "root")
        if user == remote_user and not self.config.get_config_value("BECOME_ALLOW_SAME_USER"):
            return []  # ansible skips become to the user it already is (root to root), unless told not to
        flags = shlex.split(str(o.get("become_flags") or ""))
        return [str(o.get("become_exe") or "sudo"), *flags, *([] if "-n" in flags else ["-n"]), "-u", user]

    def ssh_argv(self, name: str, variables: Mapping[str, Any], o: Mapping[str, Any]) -> list[str]:
        """The ssh plugin's command line for this host (``_build_command``) from its options ``o``
        (``get_plugin_options``), connection sharing off."""
        if o.get("password") or o.get("private_key") or o.get("pkcs11_provider"):
            raise Unsupported("a password, a key given as text or a PKCS#11 provider")
        if any(_template(o.get(k)) for k in ("host", "remote_user", "port", "private_key_file", "ssh_args",
                                             "ssh_common_args", "ssh_extra_args", "ssh_executable")):  # fmt: skip
            raise Unsupported("a connection setting is a template")
        argv = [str(o.get("ssh_executable") or "ssh"), "-o", "ControlMaster=no", "-o", "ControlPath=none"]
        argv += _without_sharing(shlex.split(str(o.get("ssh_args") or "")))
        if not o.get("host_key_checking", True):
            argv += ["-o", "StrictHostKeyChecking=no"]
        if o.get("port"):
            argv += ["-o", f"Port={o['port']}"]
        if o.get("private_key_file"):
            argv += ["-o", f"IdentityFile={o['private_key_file']}"]
        argv += ["-o", "KbdInteractiveAuthentication=no",
                 "-o", "PreferredAuthentications=gssapi-with-mic,gssapi-keyex,hostbased,publickey",
                 "-o", "PasswordAuthentication=no"]  # fmt: skip
        if o.get("remote_user"):
            argv += ["-o", f"User={o['remote_user']}"]
        argv += ["-o", f"ConnectTimeout={self.connect_timeout or o.get('timeout') or 10}"]
        for key in ("ssh_common_args", "ssh_extra_args"):
            argv += _without_sharing(shlex.split(str(o.get(key) or "")))
        argv += ["-T", "--", str(o.get("host") or variables.get("ansible_host") or name)]
        return argv

    def params(self, variables: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
        """node_health's options from the knobs, validated as the module validates them: (options, None) or
        (None, the module's message)."""
        given: dict[str, Any] = {}
        for option in self.health.ARGUMENT_SPEC:
            names = [f"fleetops_{option}"] + (
                ["ec2_scheduled_events"] if option == "inventory_events" else []
            )
            for name in names:
                if variables.get(name) is not None:
                    if _template(variables[name]):
                        raise Unsupported(f"{name} is a template")
                    given[option] = variables[name]
                    break
        result = self.validator.validate(given)
        if result.errors.errors:  # the module says the same: AnsibleModule runs this validator
            return None, str(result.errors.msg)
        params = dict(result.validated_parameters)
        problem = self.health.validate(params)
        if problem:
            return None, f"Failed to validate node_health options: {problem}"
        return params, None


class _Calls:
    """The running commands, so that a cancel ends them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.procs: set[subprocess.Popen[bytes]] = set()
        self.cancelled = False

    def run(self, argv: Sequence[str], data: bytes, timeout: float | None) -> tuple[int, bytes, bytes] | None:
        """(rc, stdout, stderr), or None when it ran past ``timeout`` (then killed; None: no limit)."""
        with self.lock:
            if self.cancelled:
                return (-1, b"", b"cancelled")
            proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
            self.procs.add(proc)
        try:
            out, err = proc.communicate(data, timeout=None if timeout is None else max(0.1, timeout))
            return proc.returncode, out, err
        except subprocess.TimeoutExpired:
            _kill(proc)
            proc.communicate()
            return None
        finally:
            with self.lock:
                self.procs.discard(proc)

    def cancel(self) -> None:
        with self.lock:
            self.cancelled = True
            for proc in self.procs:
                _kill(proc)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the command's whole session (ssh and a ProxyCommand, a local shell and its children):
    one of them left alive holds the pipes open, and the scan would wait for it past the timeout."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # start_new_session: its group is its pid
    except OSError:  # gone already
        proc.kill()


def scan_host(target: Target, calls: _Calls, sha: str, archive: bytes) -> TaskResult | str:
    """One host's task result, or why ansible-playbook must scan it (a string)."""

    def result(status: str, res: dict[str, Any]) -> TaskResult:
        return TaskResult(host=target.host, status=status, task=TASK, action=ACTION, result=res,
                          duration=time.monotonic() - started)  # fmt: skip

    started = time.monotonic()
    health, stage = module_utils("health"), module_utils("scan_stage")
    if target.params is None:
        return result("failed", {"failed": True, "msg": target.problem})
    header = stage.request(sha, target.params)
    reply = None
    for data in (header, header + archive):
        left = None if target.timeout is None else target.timeout - (time.monotonic() - started)
        done = calls.run(target.argv, data, left)
        if done is None:
            msg = f"The node_health task timed out after {target.timeout:g} seconds"
            return result("failed", {"failed": True, "timedout": {"period": target.timeout}, "msg": msg})
        rc, out, err = done
        stderr = err.decode("utf-8", "replace").strip()
        if calls.cancelled:
            return "cancelled"
        if rc == UNREACHABLE_RC and target.ssh:
            msg = f"Failed to connect to the host via ssh: {stderr[-STDERR_TAIL:]}"
            return result("unreachable", {"unreachable": True, "msg": msg})
        reply = stage.parse_reply(out.decode("utf-8", "replace"))
        if reply is None:
            return f"the runner gave no answer (rc {rc}): {stderr[-STDERR_TAIL:]}"
        if reply["fleetops_runner"] != "missing":
            break
    assert reply is not None
    state = reply["fleetops_runner"]
    if state == "ok":
        return result("ok", {**health.module_result(reply["result"]), "fleetops_path": "runner"})
    if state == "failed":
        return result("failed", {"failed": True, "msg": reply.get("msg", "the runner failed")})
    return f"the runner answered {state}: {reply.get('msg', '')}"


def run(
    hosts: Sequence[InventoryHost],
    extravars: Mapping[str, Any],
    forks: int,
    host_timeout: float | None,
    connect_timeout: int | None,
    on_result: Callable[[TaskResult], None] | None = None,
    cancel: threading.Event | None = None,
) -> DirectRun:
    """Scan ``hosts`` over ssh (see the module's docstring); the hosts it cannot serve are in ``fallback``."""
    resolver = Resolver(extravars, connect_timeout)
    outcome = DirectRun(PlaybookRun(status="running", rc=0))
    targets: list[Target] = []
    for host in hosts:
        try:
            targets.append(resolver.target(host, host_timeout))
        except Unsupported as why:
            outcome.fallback[host.name] = str(why)
    calls = _Calls()
    lock = threading.Lock()
    stop = threading.Event()

    def watch() -> None:
        if cancel is not None:
            while not stop.wait(0.1):
                if cancel.is_set():
                    calls.cancel()
                    return

    def one(target: Target) -> None:
        if calls.cancelled:
            return
        got = scan_host(target, calls, resolver.sha, resolver.archive)
        with lock:
            if isinstance(got, str):
                if got != "cancelled":
                    outcome.fallback[target.host] = got
                return
            outcome.run.tasks.setdefault(target.host, []).append(got)
        if on_result is not None:
            on_result(got)

    watcher = threading.Thread(target=watch, name="fleetops-direct-cancel", daemon=True)
    watcher.start()
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(forks, len(targets) or 1))) as pool:
            try:
                list(pool.map(one, targets))
            except BaseException:
                # Ctrl-C or a signal's exception in this thread (a pass's or a rollout's scan has no
                # ``cancel``): end the running ssh commands (each in a session of its own, out of the
                # terminal's reach) and start no more, so the pool's shutdown does not wait for every host
                calls.cancel()
                raise
    finally:
        stop.set()
        watcher.join()
    run_ = outcome.run
    run_.interrupted = calls.cancelled
    if calls.cancelled:
        outcome.fallback.clear()  # an interrupted scan scans nothing more
    failed = any(t.status != "ok" for results in run_.tasks.values() for t in results)
    run_.status = "failed" if failed else "successful"
    run_.rc = 2 if failed else 0
    return outcome
