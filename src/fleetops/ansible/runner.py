"""The one place that builds ansible-runner invocations and reads their results.

Results come from runner's events, status and rc — never from parsing stdout.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fleetops import paths
from fleetops.ansible import control_path
from fleetops.ansible.collection import module_utils
from fleetops.errors import FleetopsError

HOST_EVENTS = {
    "runner_on_ok": "ok",
    "runner_on_failed": "failed",
    "runner_on_unreachable": "unreachable",
    "runner_on_skipped": "skipped",
}


CANCEL_POLL_S = 0.5  # how often runner asks the cancel callback (runner's default, 5 s, feels dead)
CANCEL_GRACE_S = 5.0  # after SIGINT, how long ansible-playbook gets to stop its workers itself
RUN_MARKER = "FLEETOPS_RUN_DIR"  # in every process of one run's tree: finds leftovers after a cancel
EC2_PLUGINS = ("fleetops.node.ec2",)
# The environment variables boto3 reads credentials from (module_utils/aws.py leaves credentials to
# boto3's chain when a module is given none); the secret ones are scrubbed from runner's artifacts.
CREDENTIAL_ENV = {
    "aws_access_key": "AWS_ACCESS_KEY_ID",
    "aws_secret_key": "AWS_SECRET_ACCESS_KEY",
    "aws_session_token": "AWS_SESSION_TOKEN",
    "aws_profile": "AWS_PROFILE",
}
SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


class RunnerError(FleetopsError):
    """ansible-runner could not run the playbook at all (not a per-host failure)."""

    exit_code = 3


@dataclass
class TaskResult:
    """One host's result for one task, as ansible-runner reported it."""

    host: str
    status: str  # ok | failed | unreachable | skipped
    task: str
    action: str
    result: dict[str, Any]
    duration: float | None = None

    @property
    def msg(self) -> str:
        """The task's message; for a loop whose items failed, the failed items' messages."""
        items = [r for r in self.result.get("results") or [] if isinstance(r, dict) and r.get("failed")]
        if items:
            return "; ".join(str(r.get("msg") or r.get("stderr") or "failed").strip() for r in items)
        msg = self.result.get("msg") or self.result.get("stderr") or ""
        return str(msg).strip()


@dataclass
class PlaybookRun:
    """What a playbook run produced, per host, in event order."""

    status: str
    rc: int
    tasks: dict[str, list[TaskResult]] = field(default_factory=dict)
    stats: dict[str, dict[str, int]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    interrupted: bool = False

    def hosts(self) -> list[str]:
        """Every host that the run touched, in the order they first answered."""
        seen = dict.fromkeys(self.tasks)
        for counts in self.stats.values():
            seen.update(dict.fromkeys(counts))
        return list(seen)

    def results_for(self, host: str, action: str | None = None) -> list[TaskResult]:
        results = self.tasks.get(host, [])
        if action is None:
            return results
        return [r for r in results if r.action == action or r.status == "unreachable"]


EventCallback = Callable[[TaskResult], None]


@dataclass
class RunnerOptions:
    """Everything that shapes one ansible-runner invocation (one batch = one invocation)."""

    playbook: str
    inventory: Sequence[Path] = ()
    limit: str | None = None
    extravars: Mapping[str, Any] = field(default_factory=dict)
    forks: int | None = None
    check: bool = False
    diff: bool = False
    verbosity: int = 0
    # the whole run (ansible-runner's job timeout): past it runner ends ansible-playbook and the run's
    # status is "timeout" (its leftover workers are stopped too); hosts without a result timed out
    timeout: int | None = None
    # ssh's connect timeout, banner exchange included (ansible-playbook --timeout); None: ansible.cfg's
    connect_timeout: int | None = None
    # what ansible-playbook reads instead of ``inventory`` (``batch_inventory.write``: a rollout batch's hosts
    # as ``inventory`` lists them); ``inventory`` still gives the EC2 connection (``ec2_env``)
    batch_inventory: Path | None = None
    keep_artifacts: bool = bool(os.environ.get("FLEETOPS_KEEP_ARTIFACTS"))


def ansible_env() -> dict[str, str]:
    """Environment for every ansible command we start (playbooks via runner, ansible-inventory)."""
    env: dict[str, str] = {
        # runner resolves ansible-playbook on PATH: use the one beside this interpreter first.
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "ANSIBLE_NOCOWS": "1",
    }
    if os.environ.get("ORIGINAL_STDOUT_CALLBACK"):
        # run from inside an ansible-runner job (AWX runs `fleetops remediate auto` this way): its
        # awx_display callback and callback path must not leak into our own runner, which would wrap
        # that callback in itself (ansible-playbook exits 250); use the job's original callback
        env["ANSIBLE_STDOUT_CALLBACK"] = os.environ["ORIGINAL_STDOUT_CALLBACK"]
        env["ANSIBLE_CALLBACK_PLUGINS"] = ""
    short = control_path.control_path_dir()  # a home too long for ssh's ControlMaster sockets
    if short is not None:
        env["ANSIBLE_SSH_CONTROL_PATH_DIR"] = short
    root = paths.collection_root()
    if root is not None:
        env.setdefault("ANSIBLE_CONFIG", os.environ.get("ANSIBLE_CONFIG", str(root / "ansible.cfg")))
        cpath = [str(root / "collections")]
        if os.environ.get("ANSIBLE_COLLECTIONS_PATH"):
            cpath += os.environ["ANSIBLE_COLLECTIONS_PATH"].split(os.pathsep)
        # once each: this environment, set in os.environ (prepare_env), gives the same value again
        env["ANSIBLE_COLLECTIONS_PATH"] = os.pathsep.join(dict.fromkeys(cpath))
    return env


def prepare_env() -> None:
    """This checkout's ``ANSIBLE_*`` settings (``ansible_env``) in this process's environment, which
    ansible's configuration reads once, when ``ansible.constants`` is first imported: ansible in this
    process (the inventory listing, the ssh transport) reads the configuration every command we start gets."""
    os.environ.update({k: v for k, v in ansible_env().items() if k.startswith("ANSIBLE_")})


def ec2_sources(inventories: Iterable[Path]) -> Iterator[tuple[Path, dict[str, Any]]]:
    """The fleetops.node.ec2 inventory sources among ``inventories`` (files, or files in a folder), in
    order, each read when the caller asks for it.

    A file that does not name the plugin is not parsed: a source names it in its ``plugin`` key, and every
    batch of a rollout asks (``ec2_env``), where a 7,500-host YAML inventory took 2.2 CPU s to parse."""
    for inv in inventories:
        files = sorted(p for p in inv.iterdir() if p.suffix in (".yml", ".yaml")) if inv.is_dir() else [inv]
        for path in files:
            try:
                raw = path.read_bytes()
                if not any(name.encode() in raw for name in EC2_PLUGINS):
                    continue
                data = yaml.safe_load(raw.decode())
            except (OSError, UnicodeDecodeError, yaml.YAMLError):
                continue
            if isinstance(data, dict) and data.get("plugin") in EC2_PLUGINS:
                yield path, data


def ec2_env(inventories: Sequence[Path]) -> dict[str, str]:
    """The EC2 connection of the (first) fleetops.node.ec2 inventory source, as the environment variables
    the collection's AWS code reads: its endpoint as module_utils/aws.py's ``OPTIONS["endpoint_url"]["env"]``
    (``AWS_ENDPOINT_URL_EC2``), its credentials or profile as boto3's (``AWS_ACCESS_KEY_ID``, ...).

    So the modules a playbook runs on the controller (``fleetops.node.ec2_stop_start``) talk to exactly
    the endpoint the inventory listed, with its credentials, without them on a command line or in extra
    vars. Resolved as the inventory plugin resolves them (the source's values, else the environment's);
    empty when no source is an EC2 one. FleetopsError when the connection cannot work.
    """
    found = next(ec2_sources(inventories), None)
    if found is None:
        return {}
    path, config = found
    aws = module_utils("aws")
    try:
        settings = aws.ConnectionSettings.from_options(config, environ=os.environ)
    except aws.AwsSettingsError as exc:
        raise FleetopsError(f"Failed to read the EC2 connection of {path}: {exc}") from None
    env: dict[str, str] = {}
    if settings.endpoint_url:
        env[aws.OPTIONS["endpoint_url"]["env"][0]] = str(settings.endpoint_url)
    for option, name in CREDENTIAL_ENV.items():
        value = getattr(settings, option)
        if value:
            env[name] = str(value)
    return env


def _scrub_artifacts(private: Path, secrets: Sequence[str]) -> None:
    """ansible-runner writes the job's whole environment into ``artifacts/<id>/command``: replace the
    secret variables' values (and any of ``secrets`` anywhere in it) by ``***``."""
    hidden = [s for s in secrets if s]
    for command in private.glob("artifacts/*/command"):
        try:
            data = json.loads(command.read_text())
        except (OSError, ValueError):
            continue
        env = data.get("env") if isinstance(data, dict) else None
        if isinstance(env, dict):
            hidden += [str(env[k]) for k in SECRET_ENV if env.get(k)]
            for key in SECRET_ENV:
                if env.get(key):
                    env[key] = "***"
        text = json.dumps(data, ensure_ascii=False)
        for secret in hidden:
            text = text.replace(secret, "***")
        tmp = command.with_name(".command.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, command)


def _inventory_env(opts: RunnerOptions) -> dict[str, str]:
    """A batch inventory is YAML: read by ansible's own YAML plugin whatever ``enable_plugins`` says."""
    return {"ANSIBLE_INVENTORY_ENABLED": "ansible.builtin.yaml"} if opts.batch_inventory is not None else {}


def _cmdline(opts: RunnerOptions) -> str:
    args: list[str] = []
    if opts.check:
        args.append("--check")
    if opts.diff:
        args.append("--diff")
    if opts.connect_timeout:
        args.append(f"--timeout={int(opts.connect_timeout)}")
    return " ".join(args)


def run_playbook(
    opts: RunnerOptions,
    on_result: EventCallback | None = None,
    cancel: threading.Event | None = None,
) -> PlaybookRun:
    """Run one playbook through ansible-runner and collect per-host task results from its events."""
    import ansible_runner  # here, not at the top: the CLI's --help does not pay for it

    for inv in opts.inventory:
        if not inv.exists():
            raise FleetopsError(f"Failed to read inventory {inv}: no such file or directory")
    aws_env = ec2_env(opts.inventory)
    secrets = [aws_env[k] for k in SECRET_ENV if k in aws_env]
    private = Path(tempfile.mkdtemp(prefix="fleetops-runner-"))
    run = PlaybookRun(status="unstarted", rc=-1)

    def handle(event: dict[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        if kind in HOST_EVENTS and data.get("host"):
            res = data.get("res") or {}
            if not isinstance(res, dict):
                res = {"msg": str(res)}
            # a loop or delegated task reports per item first; we only keep the task's final event.
            tr = TaskResult(
                host=str(data["host"]),
                status=HOST_EVENTS[kind],
                task=str(data.get("task", "")),
                action=str(data.get("task_action") or data.get("resolved_action") or ""),
                result=res,
                duration=data.get("duration"),
            )
            run.tasks.setdefault(tr.host, []).append(tr)
            if on_result is not None:
                on_result(tr)
        elif kind == "playbook_on_stats":
            for key in ("ok", "failures", "dark", "skipped", "changed", "rescued", "ignored"):
                run.stats[key] = {str(h): int(n) for h, n in (data.get(key) or {}).items()}
        elif kind == "warning" or (kind == "verbose" and "WARNING" in str(event.get("stdout", ""))):
            run.warnings.append(str(event.get("stdout", "")).strip())
        return False  # runner need not keep event files on disk beyond what it writes anyway

    def status(data: dict[str, Any], runner_config: Any = None) -> None:
        if data.get("status") != "starting":  # runner wrote the command file just after "starting"
            _scrub_artifacts(private, secrets)

    kwargs: dict[str, Any] = {
        "private_data_dir": str(private),
        "playbook": opts.playbook,
        "inventory": [str(opts.batch_inventory)]
        if opts.batch_inventory is not None
        else [str(p.resolve()) for p in opts.inventory] or None,
        "limit": opts.limit,
        "extravars": dict(opts.extravars),
        # the inventory's EC2 connection in the environment (never on the command line); runner's copy
        # of it in the artifacts is scrubbed (status), suppress_env_files keeps it out of env/envvars
        "envvars": {**ansible_env(), **aws_env, RUN_MARKER: str(private), **_inventory_env(opts)},
        "event_handler": handle,
        "status_handler": status,
        # Never None: without a callback runner installs SIGINT/SIGTERM handlers of its own, for good,
        # and swallows Ctrl-C (the caller's KeyboardInterrupt never comes, later Ctrl-Cs are lost).
        "cancel_callback": _Canceller(cancel, str(private)) if cancel is not None else _never,
        "quiet": True,
        "suppress_env_files": True,
        "verbosity": opts.verbosity or None,
        "cmdline": _cmdline(opts) or None,
        "settings": {"pexpect_timeout": CANCEL_POLL_S},
    }
    if opts.forks:
        kwargs["forks"] = opts.forks
    if opts.timeout:
        kwargs["timeout"] = opts.timeout
    try:
        r = ansible_runner.run(**{k: v for k, v in kwargs.items() if v is not None})
        run.status = str(r.status)
        run.rc = int(r.rc) if r.rc is not None else -1
        run.interrupted = r.status == "canceled" or (cancel is not None and cancel.is_set())
        # a run ended at its time limit (``timeout``) is the caller's to judge: its hosts timed out
        if not run.tasks and run.status not in ("successful", "canceled", "timeout") and not run.interrupted:
            detail = "; ".join(w for w in run.warnings if w) or _tail(r.stdout.read() if r.stdout else "")
            raise RunnerError(f"Failed to run {opts.playbook}: ansible-playbook exited {run.rc}: {detail}")
    finally:
        # Whatever of this run is still running once runner returns is a leftover: after a cancel or
        # the run's time limit, and after a task past its `timeout:` (ansible abandons the module but
        # does not end it: on a local connection its command runs on, carrying our marker).
        _stop_leftovers(str(private))
        if opts.keep_artifacts:
            _scrub_artifacts(private, secrets)
            print(f"fleetops: runner artifacts kept in {private}", file=sys.stderr)
        else:
            shutil.rmtree(private, ignore_errors=True)
    return run


def _never() -> bool:
    return False


class _Canceller:
    """runner's cancel callback, stopping the run the way ansible-playbook needs to be stopped.

    runner cancels by SIGKILL to ansible-playbook's process group, but ansible-core (2.21) starts
    each worker in a session of its own: those workers, and their ssh, would run on. So on cancel
    ansible-playbook first gets SIGINT (what Ctrl-C in its terminal sends), which it forwards to
    every worker (each kills its own process group) before it exits; runner's SIGKILL follows
    only if it has not exited within CANCEL_GRACE_S.
    """

    def __init__(self, cancel: threading.Event, marker: str) -> None:
        self.cancel, self.marker = cancel, marker
        self.deadline: float | None = None

    def __call__(self) -> bool:
        if not self.cancel.is_set():
            return False
        if self.deadline is None:
            self.deadline = time.monotonic() + CANCEL_GRACE_S
            me = os.getpid()
            for pid, ppid, _argv in _run_processes(self.marker):
                if ppid == me:  # ansible-playbook itself
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGINT)
            return False
        return time.monotonic() >= self.deadline


def _run_processes(marker: str) -> list[tuple[int, int, str]]:
    """(pid, ppid, argv) of this machine's processes that carry ``RUN_MARKER=marker`` (one run's tree)."""
    needle = f"{RUN_MARKER}={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if needle not in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                continue
            stat = Path(f"/proc/{entry}/stat").read_text()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        found.append((int(entry), int(stat[stat.rindex(")") + 2 :].split()[1]), argv))
    return found


def _stop_leftovers(marker: str) -> None:
    """Stop what a stopped or abandoned run left running: ansible-playbook's processes (its main
    process when an exception such as KeyboardInterrupt left runner's loop: in a session of its own,
    the terminal's Ctrl-C never reached it; workers that runner's SIGKILL missed) get SIGINT, and
    each stops its own children; whatever is still there after CANCEL_GRACE_S, SIGKILL.

    ssh ControlPersist masters (``[mux]``) are left to expire: another run may share them.
    """
    me = os.getpid()

    def left() -> list[tuple[int, int, str]]:
        return [p for p in _run_processes(marker) if "[mux]" not in p[2] and p[0] != me]

    procs = left()
    for pid, _ppid, argv in procs:
        if "ansible-playbook" in argv:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + CANCEL_GRACE_S
    while procs and time.monotonic() < deadline:
        time.sleep(0.1)
        procs = left()
    for pid, _ppid, _argv in procs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _tail(text: str, lines: int = 3) -> str:
    """Last non-empty lines of ansible's own error text, for a run that produced no events at all."""
    kept = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " | ".join(kept[-lines:]) or "no output"
