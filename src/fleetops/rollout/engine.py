"""The rollout engine: every remediation runs through it, batch by batch, safely and resumably.

- **Plan**: the planner's batches (AZ-aware caps, canary first, fewest batches).
- **Preflight** (paramiko): every target's ssh port, host key and login are checked concurrently
  before anything changes; unreachable hosts are left out and the rollout refuses to start when
  more than ``--preflight-max-unreachable`` of them are.
- **One batch = one ansible-runner invocation** limited to the batch's hosts.
- **Gate** after each batch: the batch is scanned again (one node_health call per host): the host
  must answer, the finding the remediation fixed must be gone, and no new critical finding may
  appear; for a reboot the boot id must have changed. Then a cooldown.
- **Circuit breaker**: once failed hosts pass ``--max-failures`` (exactly that many are
  tolerated), the rollout stops; hosts not yet reached stay untouched (``pending``).
- **State** on disk after every step (``--resume STATE`` continues it; a host caught mid-batch by a
  kill is probed, not redone blindly: a reboot whose boot id already changed is not repeated),
  **host locks** so two rollouts never act on the same host (plus an EC2 tag lease, see
  ``fleetops.rollout.lease``, when the targets are EC2 instances), and an **audit log** (JSON lines).
- **Ctrl-C** stops after the current batch (state saved, exit 130); a second Ctrl-C aborts the batch
  now, leaving its hosts ``running`` in the state: ``--resume`` probes them before doing anything.
- **Progress**: a transient line on a terminal (batches done, hosts in flight, failures), plain
  ``progress:`` lines otherwise (CI, AWX); all of it on stderr, so ``--format json`` stays clean.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import shlex
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import paramiko
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from fleetops.ansible.inventory import InventoryHost
from fleetops.ansible.runner import PlaybookRun, RunnerOptions, TaskResult, run_playbook
from fleetops.errors import FleetopsError

STATE_SCHEMA = "fleetops.rollout.engine-state/v1"
HOST_PENDING, HOST_RUNNING, HOST_DONE, HOST_FAILED, HOST_SKIPPED = (
    "pending",
    "running",
    "done",
    "failed",
    "skipped",
)


# What every batch run passes to the remediation playbooks (their `serial` / `max_fail_percentage` knobs).
BATCH_VARS: dict[str, Any] = {"fleetops_serial": "100%", "fleetops_max_fail_percentage": 100}


class RolloutError(FleetopsError):
    """The rollout cannot start or continue (bad state file, preflight refused)."""

    exit_code = 3


class LockError(FleetopsError):
    """Another rollout holds a lock on some of the hosts."""

    exit_code = 4


def state_home() -> Path:
    """Where rollouts keep state, locks and the audit log ($FLEETOPS_STATE_DIR overrides)."""
    env = os.environ.get("FLEETOPS_STATE_DIR")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/fleetops")
    return Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "fleetops"


def operator() -> str:
    """Who is acting: the sudo user behind root when there is one, and the machine."""
    user = os.environ.get("SUDO_USER") or os.environ.get("FLEETOPS_OPERATOR") or getpass.getuser()
    return f"{user}@{socket.gethostname()}"


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------- state


@dataclass
class Rollout:
    """Everything needed to report on a rollout or resume it, saved after every step."""

    id: str
    action: str
    apply: bool
    inventory: list[str]
    extravars: dict[str, Any]
    plan: dict[str, Any]
    max_failures: int
    cooldown: float
    gate: bool
    state_path: str
    operator: str = field(default_factory=operator)
    created: float = field(default_factory=time.time)
    status: str = "running"  # running | done | stopped | interrupted | refused
    hosts: dict[str, str] = field(default_factory=dict)  # host -> pending|running|done|failed|skipped
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # host -> last outcome
    batches: list[dict[str, Any]] = field(default_factory=list)  # {"hosts", "started", "finished"}
    preflight: dict[str, str | None] = field(default_factory=dict)  # host -> None or why unreachable
    stopped: dict[str, Any] | None = None
    # EC2 tag lease: {"ttl": seconds, "instances": {host: {"instance", "region"}}}; None: not EC2
    lease: dict[str, Any] | None = None
    schema: str = STATE_SCHEMA

    def save(self) -> None:
        _atomic_write(Path(self.state_path), json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> Rollout:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise RolloutError(f"Failed to resume: no rollout state at {path}") from None
        except (OSError, ValueError) as exc:
            raise RolloutError(f"Failed to resume: cannot read rollout state {path}: {exc}") from None
        if not isinstance(data, dict) or data.get("schema") != STATE_SCHEMA:
            raise RolloutError(f"Failed to resume: {path} is not a fleetops rollout state ({STATE_SCHEMA})")
        known = set(cls.__dataclass_fields__)
        rollout = cls(**{k: v for k, v in data.items() if k in known})
        rollout.state_path = str(path)
        return rollout

    def failures(self) -> int:
        return sum(1 for s in self.hosts.values() if s == HOST_FAILED)

    def pending(self) -> list[str]:
        return [
            h for b in self.plan["batches"] for h in b if self.hosts.get(h) in (HOST_PENDING, HOST_RUNNING)
        ]

    def summary(self) -> dict[str, int]:
        counts = {"hosts": len(self.hosts), "done": 0, "failed": 0, "pending": 0, "skipped": 0, "changed": 0}
        for host, status in self.hosts.items():
            key = HOST_PENDING if status == HOST_RUNNING else status
            counts[key] = counts.get(key, 0) + 1
            counts["changed"] += bool(self.results.get(host, {}).get("changed"))
        return counts


def new_rollout(
    *,
    action: str,
    apply: bool,
    inventory: Sequence[Path],
    extravars: dict[str, Any],
    plan: dict[str, Any],
    max_failures: int,
    cooldown: float,
    gate: bool,
    state_path: Path | None,
) -> Rollout:
    rid = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:6]
    path = state_path or state_home() / "rollouts" / f"{rid}-{action}.json"
    rollout = Rollout(
        id=rid,
        action=action,
        apply=apply,
        inventory=[str(p.resolve()) for p in inventory],
        extravars=extravars,
        plan=plan,
        max_failures=max_failures,
        cooldown=cooldown,
        gate=gate,
        state_path=str(path),
    )
    rollout.hosts = {h: HOST_PENDING for b in plan["batches"] for h in b}
    return rollout


# --------------------------------------------------------------------------------------- locks


class HostLocks:
    """One lock file per host: a rollout takes all its hosts' locks before it acts, or none.

    A lock names the rollout, its operator and PID. The same rollout (on --resume) takes its own
    locks back; another rollout is refused, even when the holder looks dead — breaking a stale lock
    is an explicit operator decision (``--break-lock``).
    """

    def __init__(self, directory: Path | None = None) -> None:
        self.dir = directory or state_home() / "locks"
        self.held: list[Path] = []

    def _path(self, host: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in host)
        return self.dir / f"{safe}.lock"

    def acquire(self, hosts: Sequence[str], rollout: Rollout, break_lock: bool | str = False) -> None:
        """Take every host's lock or none; ``break_lock``: True breaks any other holder, a rollout id only that one."""
        self.dir.mkdir(parents=True, exist_ok=True)
        conflicts: list[str] = []
        for host in hosts:
            path = self._path(host)
            holder = _read_lock(path)
            if holder and holder.get("rollout") != rollout.id:
                if break_lock is True or (break_lock and break_lock == holder.get("rollout")):
                    path.unlink(missing_ok=True)
                    continue
                alive = (
                    _pid_alive(int(holder.get("pid", 0))) and holder.get("machine") == socket.gethostname()
                )
                conflicts.append(
                    f"{host} (rollout {holder.get('rollout')} by {holder.get('operator')}, pid {holder.get('pid')}"
                    f"{'' if alive else ', not running: stale?'}, state {holder.get('state')})"
                )
        if conflicts:
            raise LockError(
                f"Failed to lock {len(conflicts)} host(s) held by another rollout: {'; '.join(conflicts[:5])}"
                + (f" and {len(conflicts) - 5} more" if len(conflicts) > 5 else "")
                + ". Wait for it, resume it, or pass --break-lock [ROLLOUT] if it is stale"
            )
        record = {
            "rollout": rollout.id,
            "operator": rollout.operator,
            "pid": os.getpid(),
            "machine": socket.gethostname(),
            "state": rollout.state_path,
            "since": time.time(),
        }
        for host in hosts:
            path = self._path(host)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                holder = _read_lock(path)
                if holder and holder.get("rollout") != rollout.id:
                    self.release()
                    raise LockError(
                        f"Failed to lock {host}: rollout {holder.get('rollout')} took it just now"
                    ) from None
                _atomic_write(path, json.dumps(record) + "\n")  # our own lock from before a kill
            else:
                with os.fdopen(fd, "w") as handle:
                    handle.write(json.dumps(record) + "\n")
            self.held.append(path)

    def release(self) -> None:
        for path in self.held:
            path.unlink(missing_ok=True)
        self.held = []


def _read_lock(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"rollout": "unknown (unreadable lock file)", "pid": 0}
    return data if isinstance(data, dict) else {"rollout": "unknown", "pid": 0}


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --------------------------------------------------------------------------------------- audit


def audit_path() -> Path:
    return Path(os.environ.get("FLEETOPS_AUDIT_LOG") or state_home() / "audit.jsonl")


def audit(rollout: Rollout, host: str, outcome: dict[str, Any]) -> None:
    """Append one line per host change: time, operator, host, action, before, after, result."""
    result = outcome.get("result") or {}
    entry = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "ts": time.time(),
        "operator": rollout.operator,
        "rollout": rollout.id,
        "host": host,
        "action": rollout.action,
        "apply": rollout.apply,
        "before": outcome.get("before", result.get("before")),
        "after": outcome.get("after", result.get("after")),
        "result": {
            k: outcome.get(k) for k in ("status", "changed", "msg", "gate") if outcome.get(k) is not None
        },
    }
    path = audit_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(json.dumps(entry, default=str) + "\n")


# --------------------------------------------------------------------------------------- preflight


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


# --------------------------------------------------------------------------------------- outcomes


def _slim(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if not k.startswith("_ansible") and k != "invocation"}


def _boot_ids(results: list[TaskResult]) -> dict[str, Any]:
    """before/after boot ids when the playbook read them (rolling_reboot.yml slurps the boot id)."""
    import base64

    ids = [
        base64.b64decode(tr.result["content"]).decode().strip()
        for tr in results
        if tr.action == "ansible.builtin.slurp"
        and tr.status == "ok"
        and isinstance(tr.result.get("content"), str)
    ]
    if not ids:
        return {}
    return {"before": {"boot_id": ids[0]}, "after": {"boot_id": ids[-1]} if len(ids) > 1 else None}


def _notes(results: list[TaskResult]) -> list[str]:
    """What the playbook said for the operator: ``debug`` messages that start with ``fleetops:``."""
    return [
        str(tr.result["msg"]).removeprefix("fleetops:").strip()
        for tr in results
        if tr.action in ("ansible.builtin.debug", "debug")
        and tr.status == "ok"
        and str(tr.result.get("msg", "")).startswith("fleetops:")
    ]


def host_outcome(results: list[TaskResult], actions: tuple[str, ...]) -> dict[str, Any]:
    """One host's outcome in a batch, from its task results (changed when any remediation task changed).

    A failure's message is the last failed task's: a block's rescue that fails the host explains why.
    """
    boots = _boot_ids(results)
    notes = _notes(results)
    if notes:
        boots = {**boots, "notes": notes}
    for tr in results:
        if tr.status == "unreachable":
            return {"status": "unreachable", "changed": False, "msg": tr.msg, **boots}
    failed = next((tr for tr in reversed(results) if tr.status == "failed"), None)
    if failed is not None:
        return {
            "status": "failed",
            "changed": False,
            "msg": failed.msg,
            "result": _slim(failed.result),
            **boots,
        }
    done = [tr for tr in results if tr.action in actions and tr.status == "ok"]
    if not done and not any(tr.action in actions for tr in results):
        return {"status": "failed", "changed": False, "msg": "the remediation task did not run", **boots}
    return {
        "status": "ok",
        "changed": any(bool(tr.result.get("changed")) for tr in done),
        "result": _slim(done[0].result) if len(done) == 1 else {"tasks": [_slim(tr.result) for tr in done]},
        **boots,
    }


# --------------------------------------------------------------------------------------- engine

GateCheck = Callable[[str, dict[str, Any], dict[str, Any] | None, dict[str, Any], dict[str, Any]], str | None]


def _finding_key(f: dict[str, Any]) -> tuple[str, str]:
    data = f.get("data") or {}
    return (str(f.get("check")), str(data.get("unit") or data.get("pid") or ""))


def generic_gate(before: dict[str, Any] | None, after: dict[str, Any]) -> str | None:
    """The host answers the scan, and no critical finding appeared that was not there before."""
    if after.get("status") != "ok":
        return f"gate: host {after.get('status', 'missing')} after the batch: {after.get('msg', '')}".rstrip(
            ": "
        )
    old = {_finding_key(f) for f in (before or {}).get("findings", []) if f.get("severity") == "critical"}
    new = [
        f for f in after.get("findings", []) if f.get("severity") == "critical" and _finding_key(f) not in old
    ]
    if new:
        return "gate: new critical finding: " + "; ".join(f.get("summary", "") for f in new)
    return None


class RolloutProgress:
    """Live progress: batches done / total, hosts in flight, failures.

    On a terminal a transient rich progress line (it disappears when the rollout ends); otherwise
    (CI, AWX, a pipe) one plain ``progress:`` line per batch start and end. Always on the engine's
    console (stderr): stdout stays the JSON report's.
    """

    def __init__(self, console: Console, rollout: Rollout, live: bool | None = None) -> None:
        self.console, self.rollout = console, rollout
        self.total = len(rollout.plan["batches"])
        self.live = console.is_terminal if live is None else live
        self.in_flight: list[str] = []
        self.batch = 0
        self._bar: Progress | None = None
        self._task: Any = None

    def _counts(self) -> tuple[int, int, int]:
        s = self.rollout.summary()
        return s["done"] + s["failed"] + s["skipped"], s["failed"], s["hosts"]

    def _batches_done(self) -> int:
        return sum(1 for b in self.rollout.batches if b.get("finished"))

    def _describe(self) -> str:
        _, failed, _ = self._counts()
        done_batches = self._batches_done()
        flight = " ".join(self.in_flight[:6]) + (" ..." if len(self.in_flight) > 6 else "")
        return (
            f"batches {done_batches}/{self.total} · in flight {len(self.in_flight)}"
            + (f" ({flight})" if flight else "")
            + f" · failed {failed}"
        )

    def __enter__(self) -> RolloutProgress:
        if self.live:
            self._bar = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("hosts"),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
            self._bar.start()
            finished, _, hosts = self._counts()
            self._task = self._bar.add_task(self._describe(), total=hosts, completed=finished)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def _update(self) -> None:
        if self._bar is not None:
            finished, _, hosts = self._counts()
            self._bar.update(self._task, description=self._describe(), completed=finished, total=hosts)

    def batch_started(self, index: int, hosts: Sequence[str]) -> None:
        self.batch, self.in_flight = index, list(hosts)
        if self._bar is None:
            finished, failed, total = self._counts()
            self.console.print(
                f"progress: batch {index}/{self.total} started: {len(hosts)} host(s) in flight; "
                f"hosts finished {finished}/{total}, failed {failed}"
            )
        self._update()

    def host_finished(self, host: str) -> None:
        if host in self.in_flight:
            self.in_flight.remove(host)
            self._update()

    def batch_finished(self, index: int) -> None:
        self.in_flight = []
        if self._bar is None:
            finished, failed, total = self._counts()
            self.console.print(
                f"progress: batch {index}/{self.total} finished: batches done {self._batches_done()}/{self.total}, "
                f"hosts finished {finished}/{total}, failed {failed}"
            )
        self._update()


STOP_MESSAGE = "stopping after the current batch; Ctrl-C again to abort now"


@dataclass
class Engine:
    """Runs (or resumes) one rollout; ``scan`` and ``run`` are injectable for tests."""

    rollout: Rollout
    playbook: str
    actions: tuple[str, ...]
    gate_check: GateCheck | None
    console: Console
    probe_vars: dict[str, Any] | None = None  # extra vars that make the playbook only probe (resume)
    # extra vars for a second pass over the hosts that passed their gate (reboot: uncordon, post hook)
    post_vars: dict[str, Any] | None = None
    guard: Callable[[], str | None] | None = None  # why no further batch may start (EC2 lease lost)
    baseline: dict[str, dict[str, Any]] = field(default_factory=dict)  # host -> scan entry before
    stop_requested: threading.Event = field(default_factory=threading.Event)  # first Ctrl-C
    progress: RolloutProgress | None = None

    def _scan(self, hosts: Sequence[str]) -> dict[str, dict[str, Any]]:
        from fleetops.scan import ScanOptions, run_scan

        report = run_scan(
            ScanOptions(inventory=[Path(p) for p in self.rollout.inventory], limit=",".join(hosts))
        )
        hosts_out: dict[str, dict[str, Any]] = report["hosts"]
        return hosts_out

    def _run(self, hosts: Sequence[str], extravars: dict[str, Any], check: bool | None = None) -> PlaybookRun:
        progress = self.progress

        def seen(tr: TaskResult) -> None:
            if progress is not None and (tr.action in self.actions or tr.status in ("failed", "unreachable")):
                progress.host_finished(tr.host)

        return run_playbook(
            RunnerOptions(
                playbook=self.playbook,
                inventory=[Path(p) for p in self.rollout.inventory],
                limit=",".join(hosts),
                # the batch is the plan's: all of it at once, failures judged by the breaker (the
                # playbooks default to one host at a time, stop at the first failure, for plain runs)
                extravars={**BATCH_VARS, **extravars},
                check=(not self.rollout.apply) if check is None else check,
                diff=True,
            ),
            on_result=seen,
        )

    def _run_batch(
        self, hosts: Sequence[str], extravars: dict[str, Any], check: bool | None = None
    ) -> dict[str, dict[str, Any]]:
        run = self._run(hosts, extravars, check)
        return {h: host_outcome(run.results_for(h), self.actions) for h in hosts}

    def _print(self, host: str, outcome: dict[str, Any]) -> None:
        ok = outcome["status"] == "ok" and not outcome.get("gate")
        style = "green" if ok else "bold red"
        if outcome["status"] != "ok":
            what = outcome["status"]
        elif outcome.get("gate"):
            what = "failed its gate"
        elif outcome["changed"]:
            what = "changed" if self.rollout.apply else "would change"
        else:
            what = "ok (no change)"
        detail = (
            outcome.get("gate")
            or outcome.get("msg")
            or ", ".join((outcome.get("result") or {}).get("actions") or [])
        )
        self.console.print(f"  [{style}]{host}: {what}[/] {detail}")

    def _record(self, host: str, outcome: dict[str, Any]) -> None:
        failed = outcome["status"] != "ok" or bool(outcome.get("gate"))
        self.rollout.hosts[host] = HOST_FAILED if failed else HOST_DONE
        self.rollout.results[host] = outcome
        if self.rollout.apply:
            audit(self.rollout, host, outcome)
        self._print(host, outcome)
        if self.progress is not None:
            self.progress.host_finished(host)

    def _post(self, outcomes: dict[str, dict[str, Any]]) -> None:
        """After the gate: the second pass (uncordon, post hook) for the hosts that passed it.

        A host that failed its gate gets none: a node that came back broken stays cordoned.
        """
        if self.post_vars is None or not self.rollout.apply:
            return
        passed = [h for h, o in outcomes.items() if o["status"] == "ok" and not o.get("gate")]
        for host, outcome in outcomes.items():
            if host not in passed and outcome.get("gate"):
                outcome["gate"] += " (post-reboot hooks not run: a cordoned node stays cordoned)"
        if not passed:
            return
        run = self._run(passed, {**self.rollout.extravars, **self.post_vars}, check=False)
        for host in passed:
            results = run.results_for(host)
            bad = next((tr for tr in reversed(results) if tr.status in ("failed", "unreachable")), None)
            if bad is not None:
                outcomes[host]["status"] = "failed"
                outcomes[host]["msg"] = f"post-reboot hook failed ({bad.task}): {bad.msg}"
            elif not results:
                outcomes[host]["status"] = "failed"
                outcomes[host]["msg"] = "post-reboot hooks did not run"
            notes = _notes(results)
            if notes:
                outcomes[host]["notes"] = [*outcomes[host].get("notes", []), *notes]

    def _say_notes(self, outcomes: dict[str, dict[str, Any]]) -> None:
        notes = dict.fromkeys(n for o in outcomes.values() for n in o.get("notes", []))
        for note in notes:
            self.console.print(f"[cyan]note: {note}[/]")

    def recover(self) -> None:
        """After a kill: hosts caught mid-batch are probed — finished ones are not redone."""
        caught = [h for h, s in self.rollout.hosts.items() if s == HOST_RUNNING]
        if not caught:
            return
        self.console.print(
            f"resume: {len(caught)} host(s) were mid-batch when the rollout stopped: {' '.join(caught)}"
        )
        if self.probe_vars is None:
            for host in caught:  # idempotent remediations: simply run them again
                self.rollout.hosts[host] = HOST_PENDING
            self.rollout.save()
            return
        probed = self._run_batch(caught, {**self.rollout.extravars, **self.probe_vars}, check=False)
        rebooted: dict[str, dict[str, Any]] = {}
        for host in caught:
            before = (self.rollout.results.get(host) or {}).get("before") or {}
            now = probed[host].get("before") or {}
            if before.get("boot_id") and now.get("boot_id") and now["boot_id"] != before["boot_id"]:
                self.console.print(f"  {host}: already rebooted (boot id changed): not rebooting again")
                outcome = {"status": "ok", "changed": True, "before": before, "after": now, "result": {}}
                self._gate_one(host, outcome)
                rebooted[host] = outcome
            elif probed[host]["status"] != "ok":
                # It may be mid-reboot: never act on it blindly; a later resume re-checks it.
                outcome = {"status": "failed", "changed": False, "before": before,
                           "msg": f"not answering on resume ({probed[host].get('msg')}): it may be mid-reboot"}  # fmt: skip
                self._record(host, outcome)
            else:
                self.rollout.hosts[host] = HOST_PENDING
        self._post(rebooted)
        for host, outcome in rebooted.items():
            self._record(host, outcome)
        self.rollout.save()

    def _gate_one(self, host: str, outcome: dict[str, Any], after: dict[str, Any] | None = None) -> None:
        if after is None:
            after = self._scan([host]).get(host, {"status": "missing"})
        reason = generic_gate(self.baseline.get(host), after)
        if reason is None and self.gate_check is not None:
            reason = self.gate_check(host, outcome, self.baseline.get(host), after, self.rollout.extravars)
        if reason:
            outcome["gate"] = reason

    def regate_failed(self) -> None:
        """On resume, a host that failed earlier (and may have been repaired) is checked again."""
        failed = [h for h, s in self.rollout.hosts.items() if s == HOST_FAILED]
        if not failed or not self.rollout.apply:
            return
        self.console.print(
            f"resume: re-checking {len(failed)} host(s) that failed before: {' '.join(failed)}"
        )
        after = self._scan(failed)
        outcomes: dict[str, dict[str, Any]] = {}
        for host in failed:
            outcome = dict(self.rollout.results.get(host) or {"status": "ok", "changed": False})
            if outcome.get("status") != "ok":
                # it failed in the playbook (e.g. it did not come back): judge it by the gate alone now
                outcome = {**outcome, "status": "ok", "msg": None}
                if outcome.get("before") and self.probe_vars is not None:
                    probed = self._run_batch(
                        [host], {**self.rollout.extravars, **self.probe_vars}, check=False
                    )[host]
                    outcome["after"] = probed.get("before")
            outcome.pop("gate", None)
            self._gate_one(host, outcome, after.get(host, {"status": "missing"}))
            outcomes[host] = outcome
        self._post(outcomes)
        for host, outcome in outcomes.items():
            self._record(host, outcome)
        self.rollout.save()

    @contextlib.contextmanager
    def _ctrl_c(self) -> Iterator[None]:
        """First Ctrl-C: finish the running batch, then stop (state saved). Second: abort the batch now."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.getsignal(signal.SIGINT)
        aborting = False

        def handler(signum: int, frame: object) -> None:
            nonlocal aborting
            if aborting:
                return  # already aborting: let the state be saved
            if self.stop_requested.is_set():
                aborting = True
                raise KeyboardInterrupt
            self.stop_requested.set()
            self.console.print(f"[yellow]{STOP_MESSAGE}[/]")

        signal.signal(signal.SIGINT, handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def run(self) -> Rollout:
        r = self.rollout
        r.status = "running"
        r.stopped = None
        r.save()
        if self.progress is None:
            self.progress = RolloutProgress(self.console, r)
        with self._ctrl_c(), self.progress:
            try:
                return self._run_all()
            except KeyboardInterrupt:
                self._interrupted(aborted=True)
                return r

    def _run_all(self) -> Rollout:
        r = self.rollout
        if r.apply and r.gate:
            self.baseline = self._scan([h for h, s in r.hosts.items() if s != HOST_SKIPPED])
        self.recover()
        self.regate_failed()
        batches = r.plan["batches"]
        for index, batch in enumerate(batches, start=1):
            if r.failures() > r.max_failures:
                self._stop(index - 1)
                return r
            todo = [h for h in batch if r.hosts.get(h) == HOST_PENDING]
            if not todo:
                continue
            if self.stop_requested.is_set():
                self._interrupted(aborted=False)
                return r
            reason = self.guard() if self.guard is not None else None
            if reason:
                self._stop(index - 1, reason)
                return r
            self._batch(index, len(batches), todo)
            if r.failures() > r.max_failures:
                self._stop(index)
                return r
            more = any(r.hosts.get(h) == HOST_PENDING for b in batches[index:] for h in b)
            if more and self.stop_requested.is_set():
                self._interrupted(aborted=False)
                return r
            if r.apply and r.cooldown and more:
                self.console.print(f"[dim]cooldown {r.cooldown:g}s[/]")
                self.stop_requested.wait(r.cooldown)  # a Ctrl-C ends the cooldown at once
        r.status = "done"
        r.stopped = None
        r.save()
        return r

    def _batch(self, index: int, total: int, todo: list[str]) -> None:
        r = self.rollout
        mode = "apply" if r.apply else "dry run"
        self.console.print(f"[bold]batch {index}/{total}[/] ({mode}): {' '.join(todo)}")
        for host in todo:
            r.hosts[host] = HOST_RUNNING
        r.batches.append({"index": index, "hosts": todo, "started": time.time(), "finished": None})
        if self.progress is not None:
            self.progress.batch_started(index, todo)
        if r.apply and self.probe_vars is not None:
            # Record what "before" looks like (e.g. the boot id) before acting, so a resume after
            # a kill mid-batch can tell a host that already rebooted from one that did not.
            probed = self._run_batch(todo, {**r.extravars, **self.probe_vars}, check=False)
            for host in todo:
                r.results[host] = {
                    "status": "running",
                    "changed": False,
                    "before": probed[host].get("before"),
                }
        r.save()
        outcomes = self._run_batch(todo, r.extravars)
        for host in todo:  # the pre-reboot boot id is saved before the gate (resume needs it)
            r.results[host] = outcomes[host]
        r.save()
        self._say_notes(outcomes)
        if r.apply and r.gate:
            after = self._scan(todo)
            for host in todo:
                if outcomes[host]["status"] == "ok":
                    self._gate_one(host, outcomes[host], after.get(host, {"status": "missing"}))
        self._post(outcomes)
        for host in todo:
            self._record(host, outcomes[host])
        r.batches[-1]["finished"] = time.time()
        r.save()
        if self.progress is not None:
            self.progress.batch_finished(index)

    def _interrupted(self, aborted: bool) -> None:
        """Ctrl-C: save the state and say how to go on. Aborted mid-batch: its hosts stay ``running``
        (in doubt): ``--resume`` probes them first, as after a kill."""
        r = self.rollout
        in_doubt = [h for h, s in r.hosts.items() if s == HOST_RUNNING]
        pending = r.pending()
        done_batches = sum(1 for b in r.batches if b.get("finished"))
        r.status = "interrupted"
        r.stopped = {
            "after_batch": done_batches,
            "reason": "aborted mid-batch (Ctrl-C twice)" if aborted else "stopped after the batch (Ctrl-C)",
            "pending": pending,
            "in_doubt": in_doubt,
        }
        r.save()
        doubt = f"; {len(in_doubt)} in doubt (probed on resume): {' '.join(in_doubt)}" if in_doubt else ""
        self.console.print(
            f"[bold yellow]interrupted[/] after {done_batches} batch(es), state saved: {len(pending)} host(s) "
            f"pending{doubt}\n  resume with: fleetops remediate --resume {r.state_path}"
        )

    def _stop(self, after_batch: int, reason: str | None = None) -> None:
        r = self.rollout
        pending = r.pending()
        r.status = "stopped"
        r.stopped = {
            "after_batch": after_batch,
            "reason": reason
            or f"{r.failures()} failed host(s), more than the {r.max_failures} tolerated (--max-failures)",
            "pending": pending,
        }
        r.save()
        self.console.print(
            f"[bold red]{'stopped' if reason else 'circuit breaker'}: {r.stopped['reason']}; "
            f"{len(pending)} host(s) untouched[/] (resume with: fleetops remediate --resume {r.state_path})"
        )


@contextlib.contextmanager
def locked(
    rollout: Rollout, hosts: Sequence[str], break_lock: bool | str, console: Console | None = None
) -> Iterator[Callable[[], str | None] | None]:
    """Hold every host's lock (and the EC2 lease, when the hosts are EC2 instances) for the rollout's
    lifetime; yields the guard the engine asks before each batch (None: nothing to ask).

    Apply only: a dry run changes nothing.
    """
    if not rollout.apply:
        yield None
        return
    locks = HostLocks()
    locks.acquire(hosts, rollout, break_lock)
    lease = None
    try:
        lease = _ec2_lease(rollout, hosts, console)
        if lease is not None:
            lease.acquire(break_lock)
            lease.start()
        yield lease.check if lease is not None else None
    finally:
        try:
            if lease is not None:
                lease.release()
        finally:
            locks.release()


def _ec2_lease(rollout: Rollout, hosts: Sequence[str], console: Console | None) -> Any:
    """The rollout's EC2 lease (fleetops.rollout.lease.Ec2Lease), or None when its hosts are not EC2 instances."""
    if not rollout.lease or not rollout.lease.get("instances"):
        return None
    from fleetops.rollout.lease import DEFAULT_SETTLE_S, Ec2Lease, connection_for

    wanted = set(hosts)
    instances = {h: t for h, t in rollout.lease["instances"].items() if h in wanted}
    if not instances:
        return None
    connection = connection_for([Path(p) for p in rollout.inventory])

    def say(line: str) -> None:
        if console is not None:
            console.print(f"[dim]{line}[/]")

    if connection is None:
        say("lease: no fleetops.node.ec2 inventory source found: no EC2 lease (the local lock still holds)")
        return None
    return Ec2Lease(
        connection=connection,
        instances=instances,
        rollout=rollout.id,
        operator=rollout.operator,
        ttl=float(rollout.lease.get("ttl") or 900),
        settle=float(rollout.lease.get("settle", DEFAULT_SETTLE_S)),
        say=say,
    )
