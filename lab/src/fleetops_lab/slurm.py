"""A real Slurm cluster on the lab (``fleetops-lab up N --slurm``): Debian 12's Slurm 22.05 and munge.

slurmctld runs on the lab host ``lab-01`` (a lab host, not this machine: the lab's daemons come and go
with its hosts, and nothing system-wide is started here); slurmd and munged run on every lab host, so
``lab-01`` is also a compute node. The packages come from a cached layer over the rootfs
(``rootfs.ensure_slurm_layer``), so labs without --slurm are built and booted as before.

Configured for containers: ``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``,
``JobAcctGatherType=jobacct_gather/none`` and no cgroup plugin (they abort inside systemd-nspawn).

The controller (this machine) talks to slurmctld like a site's controller would: ``scontrol`` from
Debian's slurm-client, authenticated by a munged of its own with the lab's key. That munged belongs
to the lab (its socket, key, pid and log under ``<state>/slurm/``), is started by ``up --slurm`` and
stopped by ``down``; ``controller_env`` gives the ``SLURM_CONF`` that points scontrol at it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from fleetops_lab import _system as system
from fleetops_lab.errors import LabError

CONTROLLER_HOST = "lab-01"
CLUSTER = "fleetops-lab"
PARTITION = "lab"
KEY_BYTES = 1024
READY_TIMEOUT_S = 90.0
MUNGED = "munged"

# Short timeouts: the lab's jobs last seconds and its tests wait for nodes to come back.
SLURM_CONF = """\
# Written by 'fleetops-lab up --slurm'. Configured for containers: no cgroup plugins.
ClusterName={cluster}
SlurmctldHost={controller}({controller_ip})
AuthType=auth/munge
{auth_info}CredType=cred/munge
SlurmUser=slurm
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=10
InactiveLimit=0
KillWait=5
MinJobAge=30
{nodes}
PartitionName={partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""

Progress = Callable[[str], None]


def cluster_dir(state_dir: Path) -> Path:
    return state_dir / "slurm"


def controller_conf_path(state_dir: Path) -> Path:
    """The slurm.conf this machine's scontrol reads (``SLURM_CONF``): the hosts' with the lab's munged."""
    return cluster_dir(state_dir) / "slurm.conf"


def controller_env(state_dir: Path) -> dict[str, str]:
    """The environment that points scontrol/sinfo on this machine at the lab's cluster."""
    return {"SLURM_CONF": str(controller_conf_path(state_dir))}


def _socket(state_dir: Path) -> Path:
    return cluster_dir(state_dir) / "munge.socket"


def config(hosts: Sequence[tuple[str, str]], auth_socket: Path | None = None) -> str:
    """slurm.conf for ``hosts`` ((name, ip), the first is the controller host); ``auth_socket``: the
    munged socket this copy's clients use (this machine's), None for the hosts' default."""
    by_name = dict(hosts)
    nodes = "\n".join(f"NodeName={n} NodeAddr={ip} CPUs=1 RealMemory=100 State=UNKNOWN" for n, ip in hosts)
    return SLURM_CONF.format(
        cluster=CLUSTER,
        controller=CONTROLLER_HOST,
        controller_ip=by_name[CONTROLLER_HOST],
        auth_info=f"AuthInfo=socket={auth_socket}\n" if auth_socket else "",
        nodes=nodes,
        partition=PARTITION,
    )


def ensure_key(state_dir: Path) -> bytes:
    """The lab's munge key (made once per state dir, 0400)."""
    path = cluster_dir(state_dir) / "munge.key"
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.is_file() or path.stat().st_size != KEY_BYTES:
        system.write_text_atomic(path, secrets.token_bytes(KEY_BYTES), 0o400)
    return path.read_bytes()


def _guest_ids(root: Path, user: str) -> tuple[int, int]:
    for line in (root / "etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == user:
            return int(fields[2]), int(fields[3])
    raise LabError(f"Failed to configure Slurm in {root}: no user {user!r} in its /etc/passwd")


def personalise(root: Path, name: str, conf: str, key: bytes) -> None:
    """Give a host's root the lab's slurm.conf and munge key; enable slurmctld on the controller host."""
    etc = root / "etc"
    if (etc / "slurm").is_symlink() or (etc / "munge").is_symlink():
        raise LabError(f"Failed to configure Slurm on {name}: /etc/slurm or /etc/munge is a symlink")
    (etc / "slurm").mkdir(exist_ok=True)
    system.write_text_atomic(etc / "slurm/slurm.conf", conf, 0o644)
    key_path = etc / "munge/munge.key"
    system.write_text_atomic(key_path, key, 0o400)
    uid, gid = _guest_ids(root, "munge")
    os.chown(key_path, uid, gid)
    wants = etc / "systemd/system/multi-user.target.wants/slurmctld.service"
    if name == CONTROLLER_HOST:
        if not wants.is_symlink():
            wants.symlink_to("/lib/systemd/system/slurmctld.service")
    elif wants.is_symlink():
        wants.unlink()


def host_conf(root: Path) -> str | None:
    """The slurm.conf a host's root holds (None: none), to tell whether a running host is current."""
    try:
        return (root / "etc/slurm/slurm.conf").read_text()
    except OSError:
        return None


def start_controller(state_dir: Path, hosts: Sequence[tuple[str, str]], key: bytes) -> None:
    """This machine's side: its slurm.conf and a munged with the lab's key (restarted if running)."""
    stop_controller(state_dir)
    d = cluster_dir(state_dir)
    sock = _socket(state_dir)
    system.write_text_atomic(controller_conf_path(state_dir), config(hosts, auth_socket=sock), 0o644)
    argv = [
        MUNGED,
        f"--socket={sock}",
        f"--key-file={d / 'munge.key'}",
        f"--pid-file={d / 'munged.pid'}",
        f"--seed-file={d / 'munged.seed'}",
        f"--log-file={d / 'munged.log'}",
        "--force",  # it runs as root here, beside a system munged (if any) on another socket
    ]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except FileNotFoundError:
        raise LabError(
            "Failed to start the lab's munged: munged not found (tools/debian-deps.sh --slurm)"
        ) from None
    if proc.returncode != 0 or system.read_pid_file(d / "munged.pid") is None:
        raise LabError(
            f"Failed to start the lab's munged: exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()}"
        )


def _munged_pid(state_dir: Path) -> int | None:
    pid = system.read_pid_file(cluster_dir(state_dir) / "munged.pid")
    if pid is None or not system.pid_alive(pid):
        return None
    argv = system.cmdline(pid)
    # Ours only: PIDs are reused; the socket names this lab's state dir.
    if not argv or os.path.basename(argv[0]) != MUNGED or f"--socket={_socket(state_dir)}" not in argv:
        return None
    return pid


def stop_controller(state_dir: Path, forget: bool = False) -> None:
    """Stop this lab's munged on this machine (by its PID file, checked), if it runs. Idempotent.
    ``forget``: also remove this machine's slurm.conf (the lab is no Slurm lab any more)."""
    pid = _munged_pid(state_dir)
    if pid is not None:
        system.send_signal([pid], signal.SIGTERM)
        if not system.wait_until(lambda: _munged_pid(state_dir) is None, 10.0):
            system.send_signal([pid], signal.SIGKILL)
    with contextlib.suppress(FileNotFoundError):
        _socket(state_dir).unlink()
    if forget:
        with contextlib.suppress(FileNotFoundError):
            controller_conf_path(state_dir).unlink()


def wait_ready(
    run: Callable[..., subprocess.CompletedProcess[str]], names: Sequence[str], say: Progress
) -> None:
    """Wait until slurmctld (asked on the controller host) says every node is idle."""
    started = time.monotonic()
    deadline = started + READY_TIMEOUT_S
    last = ""
    while True:
        proc = run(CONTROLLER_HOST, ["sinfo", "--noheader", "--Node", "--format=%N %t"], timeout=20)
        states = dict(line.split(None, 1) for line in proc.stdout.splitlines() if " " in line)
        last = (proc.stdout or proc.stderr).strip().replace("\n", ", ")
        if proc.returncode == 0 and all(states.get(n, "").strip() == "idle" for n in names):
            say(f"lab: Slurm: {len(names)} node(s) idle after {time.monotonic() - started:.1f} s")
            return
        if time.monotonic() >= deadline:
            raise LabError(
                f"Failed to start the lab's Slurm cluster: not every node is idle after {READY_TIMEOUT_S:g} s: "
                f"{last or 'sinfo said nothing'}"
            )
        time.sleep(0.5)


def submit_argv(node: str, seconds: int) -> list[str]:
    """sbatch a job of ``seconds`` of sleep on exactly ``node``; prints the job id."""
    return [
        "sbatch",
        "--parsable",
        f"--nodelist={node}",
        "--job-name=fleetops-lab",
        "--output=/dev/null",
        f"--wrap=sleep {int(seconds)}",
    ]


def submit(run: Callable[..., subprocess.CompletedProcess[str]], node: str, seconds: int) -> str:
    """Submit a job on ``node`` from the controller host; return its job id."""
    proc = run(CONTROLLER_HOST, submit_argv(node, seconds), timeout=30)
    job = proc.stdout.strip().split(";")[0]
    if proc.returncode != 0 or not job.isdigit():
        raise LabError(
            f"Failed to submit a job on {node}: {shlex.join(submit_argv(node, seconds))}: "
            f"{(proc.stderr or proc.stdout).strip() or f'exit {proc.returncode}'}"
        )
    return job
