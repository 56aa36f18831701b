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
  **host locks** so two rollouts never act on the same host, and an **audit log** (JSON lines).
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import shlex
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import paramiko
from rich.console import Console

from fleetops.errors import FleetopsError
from fleetops.inventory import InventoryHost
from fleetops.runner import RunnerOptions, TaskResult, run_playbook

STATE_SCHEMA = "fleetops.rollout-state/v1"
HOST_PENDING, HOST_RUNNING, HOST_DONE, HOST_FAILED, HOST_SKIPPED = (
    "pending",
    "running",
    "done",
    "failed",
    "skipped",
)


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

    def acquire(self, hosts: Sequence[str], rollout: Rollout, break_lock: bool = False) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        conflicts: list[str] = []
        for host in hosts:
            path = self._path(host)
            holder = _read_lock(path)
            if holder and holder.get("rollout") != rollout.id:
                if break_lock:
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
                + ". Wait for it, resume it, or pass --break-lock if it is stale"
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


def host_outcome(results: list[TaskResult], actions: tuple[str, ...]) -> dict[str, Any]:
    """One host's outcome in a batch, from its task results (changed when any remediation task changed)."""
    boots = _boot_ids(results)
    for tr in results:
        if tr.status == "unreachable":
            return {"status": "unreachable", "changed": False, "msg": tr.msg, **boots}
    failed = next((tr for tr in results if tr.status == "failed"), None)
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


@dataclass
class Engine:
    """Runs (or resumes) one rollout; ``scan`` and ``run`` are injectable for tests."""

    rollout: Rollout
    playbook: str
    actions: tuple[str, ...]
    gate_check: GateCheck | None
    console: Console
    probe_vars: dict[str, Any] | None = None  # extra vars that make the playbook only probe (resume)
    baseline: dict[str, dict[str, Any]] = field(default_factory=dict)  # host -> scan entry before

    def _scan(self, hosts: Sequence[str]) -> dict[str, dict[str, Any]]:
        from fleetops.scan import ScanOptions, run_scan

        report = run_scan(
            ScanOptions(inventory=[Path(p) for p in self.rollout.inventory], limit=",".join(hosts))
        )
        hosts_out: dict[str, dict[str, Any]] = report["hosts"]
        return hosts_out

    def _run_batch(
        self, hosts: Sequence[str], extravars: dict[str, Any], check: bool | None = None
    ) -> dict[str, dict[str, Any]]:
        run = run_playbook(
            RunnerOptions(
                playbook=self.playbook,
                inventory=[Path(p) for p in self.rollout.inventory],
                limit=",".join(hosts),
                extravars=extravars,
                check=(not self.rollout.apply) if check is None else check,
                diff=True,
            )
        )
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
        for host in caught:
            before = (self.rollout.results.get(host) or {}).get("before") or {}
            now = probed[host].get("before") or {}
            if before.get("boot_id") and now.get("boot_id") and now["boot_id"] != before["boot_id"]:
                self.console.print(f"  {host}: already rebooted (boot id changed): not rebooting again")
                outcome = {"status": "ok", "changed": True, "before": before, "after": now, "result": {}}
                self._gate_one(host, outcome)
                self._record(host, outcome)
            elif probed[host]["status"] != "ok":
                # It may be mid-reboot: never act on it blindly; a later resume re-checks it.
                outcome = {"status": "failed", "changed": False, "before": before,
                           "msg": f"not answering on resume ({probed[host].get('msg')}): it may be mid-reboot"}  # fmt: skip
                self._record(host, outcome)
            else:
                self.rollout.hosts[host] = HOST_PENDING
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
            self._record(host, outcome)
        self.rollout.save()

    def run(self) -> Rollout:
        r = self.rollout
        r.status = "running"
        r.save()
        if r.apply and r.gate:
            self.baseline = self._scan([h for h, s in r.hosts.items() if s != HOST_SKIPPED])
        self.recover()
        self.regate_failed()
        batches = r.plan["batches"]
        try:
            for index, batch in enumerate(batches, start=1):
                if r.failures() > r.max_failures:
                    self._stop(index - 1)
                    return r
                todo = [h for h in batch if r.hosts.get(h) == HOST_PENDING]
                if not todo:
                    continue
                mode = "apply" if r.apply else "dry run"
                self.console.print(f"[bold]batch {index}/{len(batches)}[/] ({mode}): {' '.join(todo)}")
                for host in todo:
                    r.hosts[host] = HOST_RUNNING
                r.batches.append({"index": index, "hosts": todo, "started": time.time(), "finished": None})
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
                if r.apply and r.gate:
                    after = self._scan(todo)
                    for host in todo:
                        if outcomes[host]["status"] == "ok":
                            self._gate_one(host, outcomes[host], after.get(host, {"status": "missing"}))
                for host in todo:
                    self._record(host, outcomes[host])
                r.batches[-1]["finished"] = time.time()
                r.save()
                if r.failures() > r.max_failures:
                    self._stop(index)
                    return r
                if r.apply and r.cooldown and index < len(batches):
                    self.console.print(f"[dim]cooldown {r.cooldown:g}s[/]")
                    time.sleep(r.cooldown)
        except KeyboardInterrupt:
            r.status = "interrupted"
            r.save()
            raise
        r.status = "done"
        r.stopped = None
        r.save()
        return r

    def _stop(self, after_batch: int) -> None:
        r = self.rollout
        pending = r.pending()
        r.status = "stopped"
        r.stopped = {
            "after_batch": after_batch,
            "reason": f"{r.failures()} failed host(s), more than the {r.max_failures} tolerated (--max-failures)",
            "pending": pending,
        }
        r.save()
        self.console.print(
            f"[bold red]circuit breaker: {r.stopped['reason']}; {len(pending)} host(s) untouched[/]"
            f" (resume with: fleetops remediate --resume {r.state_path})"
        )


@contextlib.contextmanager
def locked(rollout: Rollout, hosts: Sequence[str], break_lock: bool) -> Iterator[None]:
    """Hold every host's lock for the rollout's lifetime (apply only: a dry run changes nothing)."""
    if not rollout.apply:
        yield
        return
    locks = HostLocks()
    locks.acquire(hosts, rollout, break_lock)
    try:
        yield
    finally:
        locks.release()
