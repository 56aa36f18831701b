"""The lab: real test hosts on this machine (systemd-nspawn guests with systemd as PID 1, sshd, own IPs).

Each host ``lab-NN`` is an overlayfs over one cached Debian rootfs, a network namespace
``fleetops-lab-NN`` joined to the bridge ``fleetops0`` (10.213.0.1/24) by a veth pair, its own
cgroups (``fleetops-lab/lab-NN`` in the systemd, unified, memory and pids hierarchies), and a
detached supervisor that runs ``systemd-nspawn --boot`` and restarts it when the guest reboots.
Those are the default lab's names; a named lab (``FLEETOPS_LAB=NAME``, ``Lab(name=NAME)``) has its
own of each (``fleetops_lab.names``), so several labs run side by side.

Every name is derived from the lab's name and the host's number, so ``up`` and ``down`` find what a
killed run left (mounts, namespaces, links, cgroups, processes) by name and state directory, not from
a state file. A lock per lab serialises its up and down; labs of other names are never touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fleetops_lab import _system as system
from fleetops_lab import aliases as lab_aliases
from fleetops_lab import ec2 as lab_ec2
from fleetops_lab import image as lab_image
from fleetops_lab import rootfs
from fleetops_lab import slurm as lab_slurm
from fleetops_lab import vm as lab_vm
from fleetops_lab.errors import LabError
from fleetops_lab.names import AZS, LabNames, lab_names

Progress = Callable[[str], None]

DEFAULT_CACHE_DIR = Path("/var/cache/fleetops")
DEFAULT_HOSTS = 3
MAX_HOSTS = 64
GROUP = "fleetops_lab"

SUPERVISOR_MODULE = "fleetops_lab.supervisor"
NSPAWN_LOCKS = Path("/run/systemd/nspawn/locks")
STOP_TIMEOUT_S = 10.0
VM_SSH_TIMEOUT_S = 300.0  # a VM under TCG takes about a minute to boot to sshd (measured: see vm.py)
VM_POWEROFF_TIMEOUT_S = 120.0
KILL_TIMEOUT_S = 10.0

_NAME_RE = re.compile(r"^lab-(\d{2,3})$")
REQUIRED_TOOLS = ("systemd-nspawn", "ip", "ssh", "ssh-keygen", "mount", "umount")


@dataclass(frozen=True)
class LabHost:
    name: str
    ip: str
    az: str
    running: bool
    ssh_ok: bool
    pid: int | None  # systemd-nspawn's PID (changes when the guest reboots)
    supervisor_pid: int | None = None  # stays the same across guest reboots
    kind: str = "nspawn"  # or "vm" (a QEMU virtual machine; pid is QEMU's, the same across reboots)


# --------------------------------------------------------------------------- names


INOTIFY_INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")
INOTIFY_PER_HOST = 8  # measured: a guest's systemd takes 5, dbus-daemon 1, systemd-logind 1


def _ensure_inotify(hosts: int, say: Progress, machine_prefix: str) -> None:
    """Let ``hosts`` guests boot: each systemd needs inotify instances, and the kernel's default
    per-user limit (128; every guest runs as root) stops a lab at about 18 hosts ("Failed to allocate
    manager object: Too many open files"). The limit is machine-wide, so the other labs' running guests
    count too. Raised for this boot only (not persisted), and said so."""
    others = 0
    for pid in system.all_pids():
        argv = system.cmdline(pid)
        if argv and os.path.basename(argv[0]) == "systemd-nspawn":
            machine = _arg_value(argv, "--machine") or ""
            others += not machine.startswith(machine_prefix)
    hosts += others
    current = int(INOTIFY_INSTANCES.read_text())
    wanted = 128 + INOTIFY_PER_HOST * hosts
    if current < wanted:
        INOTIFY_INSTANCES.write_text(f"{wanted}\n")
        say(f"lab: raised fs.inotify.max_user_instances from {current} to {wanted} for {hosts} hosts")


def host_name(index: int) -> str:
    return f"lab-{index:02d}"


def host_index(name: str) -> int:
    match = _NAME_RE.match(name)
    if not match or not 1 <= int(match.group(1)) <= MAX_HOSTS:
        raise LabError(f"Failed to find lab host {name!r}: lab hosts are named lab-01 .. lab-{MAX_HOSTS:02d}")
    return int(match.group(1))


def host_az(name: str) -> str:
    return AZS[(host_index(name) - 1) % len(AZS)]


def _name_from_number(number: str) -> str | None:
    name = f"lab-{number}"
    return name if _NAME_RE.match(name) else None


def _arg_value(argv: list[str], option: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == option and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(option + "="):
            return arg[len(option) + 1 :]
    return None


@dataclass
class _Procs:
    supervisors: list[int]
    nspawns: list[int]
    directories: list[str]  # the --directory of each systemd-nspawn found
    vms: list[int] = field(default_factory=list)  # QEMU processes (VM hosts)


def _lab_processes(machine_prefix: str) -> dict[str, _Procs]:
    """Supervisors and systemd-nspawn processes of one lab's hosts (by its machine prefix), by host name,
    from one /proc scan."""
    found: dict[str, _Procs] = {}
    for pid in system.all_pids():
        argv = system.cmdline(pid)
        if not argv:
            continue
        if SUPERVISOR_MODULE in argv:
            machine, kind = _arg_value(argv, "--machine"), "supervisor"
        elif os.path.basename(argv[0]) == "systemd-nspawn":
            machine, kind = _arg_value(argv, "--machine"), "nspawn"
        else:
            continue
        if not machine or not machine.startswith(machine_prefix) or not system.pid_alive(pid):
            continue
        name = _name_from_number(machine.removeprefix(machine_prefix))
        if name is None:
            continue
        procs = found.setdefault(name, _Procs([], [], []))
        if kind == "supervisor":
            procs.supervisors.append(pid)
        else:
            procs.nspawns.append(pid)
            directory = _arg_value(argv, "--directory")
            if directory:
                procs.directories.append(directory)
    for machine, pids in lab_vm.qemu_processes(machine_prefix).items():
        vm_name = _name_from_number(machine.removeprefix(machine_prefix))
        if vm_name is not None:
            found.setdefault(vm_name, _Procs([], [], [])).vms.extend(pids)
    return found


# --------------------------------------------------------------------------- the lab


class Lab:
    """A fleet of lab hosts on this machine. Needs root for everything but the path helpers.

    ``name``: which lab (``fleetops_lab.names``); default ``$FLEETOPS_LAB``, else the default lab.
    The state dir defaults to ``$FLEETOPS_LAB_DIR``, else the lab's own under /var/lib/fleetops.
    """

    def __init__(
        self, state_dir: Path | None = None, cache_dir: Path | None = None, name: str | None = None
    ) -> None:
        self.names: LabNames = lab_names(name)
        env_state, env_cache = os.environ.get("FLEETOPS_LAB_DIR"), os.environ.get("FLEETOPS_CACHE_DIR")
        self.state_dir = Path(state_dir or env_state or self.names.default_state_dir).absolute()
        self.cache_dir = Path(cache_dir or env_cache or DEFAULT_CACHE_DIR).absolute()

    @property
    def name(self) -> str:
        return self.names.name

    # ------------------------------------------------------------------ names

    def host_ip(self, name: str) -> str:
        """The address of lab host ``name`` in this lab (see ``LabNames.host_ip``)."""
        return self.names.host_ip(host_index(name))

    @property
    def unused_ip(self) -> str:
        """An address in this lab's subnet that no host ever has (.250): ssh to it fails, no route to host."""
        return str(self.names.network.network_address + 250)

    def link(self, name: str) -> str:
        """This machine's end of host ``name``'s veth pair (on the lab's bridge)."""
        return self._veth_host(name)

    def _number(self, name: str) -> str:
        return name.removeprefix("lab-")

    def _machine(self, name: str) -> str:
        return self.names.machine_prefix + self._number(name)

    def _netns(self, name: str) -> str:
        return self.names.netns_prefix + self._number(name)

    def _cgroup(self, name: str) -> str:
        return f"{self.names.cgroup_parent}/{name}"

    def _veth_host(self, name: str) -> str:
        return f"{self.names.link_prefix}v{self._number(name)}"

    def _veth_peer(self, name: str) -> str:
        return f"{self.names.link_prefix}p{self._number(name)}"

    def _tap(self, name: str) -> str:
        return f"{self.names.link_prefix}t{self._number(name)}"

    def _guest_mac(self, name: str) -> str:
        return f"{self.names.mac_prefix}:00:{10 + host_index(name):02x}"

    def _veth_mac(self, name: str) -> str:
        return f"{self.names.mac_prefix}:01:{10 + host_index(name):02x}"

    def _procs(self) -> dict[str, _Procs]:
        return _lab_processes(self.names.machine_prefix)

    # ------------------------------------------------------------------ paths

    def inventory_path(self) -> Path:
        return self.state_dir / "inventory.yml"

    @property
    def key_path(self) -> Path:
        return self.state_dir / "id_ed25519"

    @property
    def known_hosts_path(self) -> Path:
        return self.state_dir / "known_hosts"

    @property
    def hosts_dir(self) -> Path:
        return self.state_dir / "hosts"

    def _host_dir(self, name: str) -> Path:
        return self.hosts_dir / name

    def is_vm(self, name: str) -> bool:
        """Whether lab host ``name`` is a VM (fleetops_lab.vm) rather than an nspawn container."""
        host_index(name)
        return (self._host_dir(name) / "vm.json").exists()

    def host_root(self, name: str) -> Path:
        """The host's merged overlay root, as this machine sees it (files written here appear in the guest).

        nspawn hosts only: a VM host's disk is its own (reach it with ``run``/ssh).
        """
        merged = self._host_dir(name) / "merged"
        if self.is_vm(name):
            raise LabError(f"Failed to find the root of {name}: it is a VM, whose disk is its own (use ssh)")
        if not any(m.mountpoint == merged for m in system.mounts()):
            raise LabError(f"Failed to find the root of {name}: it is not up (run 'fleetops-lab up')")
        return merged

    # ------------------------------------------------------------------ up

    def up(
        self,
        count: int = DEFAULT_HOSTS,
        progress: Progress | None = None,
        timeout: float = 120.0,
        ec2: bool = False,
        vm: int = 0,
        vm_memory_mib: int = lab_vm.DEFAULT_MEMORY_MIB,
        vm_cgroup: Sequence[int] = (2,),
        slurm: bool = False,
        addresses: int = 0,
        dead: int = 0,
    ) -> list[LabHost]:
        """Ensure exactly hosts lab-01 .. lab-<count> run and answer ssh; return them. Idempotent.

        ``addresses``: a simulated fleet (fleetops_lab.aliases): each host answers on that many addresses of
        its own and the inventory lists those (``lab-01-a001`` ..) instead of the hosts; ``dead`` more
        addresses (``lab-dead-001`` ..) answer nothing. Container hosts and the static inventory only.

        ``slurm``: the hosts form a Slurm cluster (fleetops_lab.slurm): slurmctld on lab-01, slurmd and
        munged on every host, a munged of the lab's on this machine for its scontrol; ready when every
        node is idle.
        ``ec2``: also run a local EC2 endpoint whose instances are these hosts (see fleetops_lab.ec2).
        ``vm``: the last ``vm`` hosts are QEMU virtual machines (fleetops_lab.vm) with ``vm_memory_mib``
        of RAM each; ``vm_cgroup`` gives each VM in turn its cgroup version (the last one repeats).
        """
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_HOSTS:
            raise LabError(
                f"Failed to start the lab: the number of hosts must be 1 .. {MAX_HOSTS}, not {count!r}"
            )
        if not 0 <= vm <= min(count, lab_vm.MAX_VMS):
            raise LabError(
                f"Failed to start the lab: the number of VM hosts must be 0 .. {min(count, lab_vm.MAX_VMS)} "
                f"(at most the number of hosts, and at most {lab_vm.MAX_VMS}), not {vm}"
            )
        if vm and not 256 <= vm_memory_mib <= 65536:
            raise LabError(
                f"Failed to start the lab: VM memory must be 256 .. 65536 MiB, not {vm_memory_mib}"
            )
        if vm and (not vm_cgroup or any(v not in (1, 2) for v in vm_cgroup)):
            raise LabError(
                f"Failed to start the lab: VM cgroup versions must be 1 or 2, not {list(vm_cgroup)}"
            )
        if slurm and vm:
            raise LabError("Failed to start the lab: --slurm runs on container hosts only, not with --vm")
        wanted = [host_name(i) for i in range(1, count + 1)]
        fleet = lab_aliases.plan(self.names.alias_network, wanted, addresses, dead)
        if addresses and (vm or slurm or ec2):
            raise LabError(
                "Failed to start the lab: --addresses simulates a fleet on container hosts with the static "
                "inventory: not with --vm, --slurm or --ec2"
            )
        self._preflight("start the lab")
        say = progress or (lambda _line: None)
        started = time.monotonic()
        with self._locked():
            self._check_subnet("start the lab", with_aliases=bool(addresses))  # before anything is written
            self._claim("start the lab")
            base = rootfs.ensure_rootfs(self.cache_dir, say)
            lower = str(base)
            cluster: tuple[str, bytes] | None = None  # slurm.conf and munge key of a Slurm lab
            if slurm:
                lower = f"{rootfs.ensure_slurm_layer(self.cache_dir, base, say)}:{base}"
            _ensure_inotify(count, say, self.names.machine_prefix)
            self.state_dir.mkdir(parents=True, exist_ok=True)
            self.hosts_dir.mkdir(exist_ok=True)
            self._ensure_key()
            if slurm:
                hosts = [(n, self.host_ip(n)) for n in wanted]
                cluster = (lab_slurm.config(hosts), lab_slurm.ensure_key(self.state_dir))
            specs: dict[str, lab_vm.VmSpec] = {}
            if vm:
                img = lab_image.ensure_image(self.cache_dir, say)
                accel = lab_vm.choose_accel(img, self.state_dir, say)
                for i, n in enumerate(wanted[count - vm :]):
                    cg = vm_cgroup[min(i, len(vm_cgroup) - 1)]
                    specs[n] = lab_vm.VmSpec(str(img), vm_memory_mib, cg, accel)
            procs = self._procs()
            keep = [n for n in wanted if self._healthy(n, lower, procs, specs.get(n), cluster)]
            stale = sorted((self._discover(procs) | set(wanted)) - set(keep))
            # Refuse before anything is stopped: what the VMs to start need, less what stopping VMs frees.
            freeing = 0
            for n in stale:
                old_spec = lab_vm.recorded_spec(self._host_dir(n))
                if old_spec is not None and n in procs and procs[n].vms:
                    freeing += old_spec.memory_mib + lab_vm.QEMU_OVERHEAD_MIB
            lab_vm.check_memory(
                len([n for n in wanted if n in specs and n not in keep]), vm_memory_mib, freeing
            )
            if stale:  # the fleet changes: no inventory until it is ready again
                with contextlib.suppress(FileNotFoundError):
                    self.inventory_path().unlink()
            self._teardown(stale, procs, say, only_existing=True)
            self._ensure_bridge()
            start = [n for n in wanted if n not in keep]
            if keep:
                say(f"lab: {len(keep)} host(s) already running: {', '.join(keep)}")
            if start:
                vms = [n for n in start if n in specs]
                say(
                    f"lab: booting {len(start)} host(s): {', '.join(start)}"
                    + (
                        f" ({len(vms)} VM(s), {specs[vms[0]].accel.upper()}, {vm_memory_mib} MiB each)"
                        if vms
                        else ""
                    )
                )
                self._parallel(lambda n: self._start_host(n, lower, specs.get(n), cluster), start)
            self._write_known_hosts(wanted, fleet)
            self._parallel(
                lambda n: self._wait_ssh(n, max(timeout, VM_SSH_TIMEOUT_S) if n in specs else timeout, say),
                wanted,
            )
            if cluster is not None:
                lab_slurm.start_controller(self.state_dir, hosts, cluster[1])
                lab_slurm.wait_ready(self.run, wanted, say)
            else:
                lab_slurm.stop_controller(self.state_dir, forget=True)
            self._apply_aliases(fleet)
            self._write_inventory(wanted, slurm=cluster is not None, fleet=fleet)
            if ec2:
                lab_ec2.up(
                    self.state_dir,
                    [(n, self.host_ip(n), host_az(n)) for n in wanted],
                    self.ssh_vars(),
                    say,
                    self.names,
                )
            elif lab_ec2.running(self.state_dir):
                lab_ec2.down(self.state_dir)
        say(
            f"lab: {count} host(s) ready in {time.monotonic() - started:.1f} s; inventory: {self.inventory_path()}"
        )
        return [h for h in self.status() if h.name in wanted]

    # ------------------------------------------------------------------ down

    def down(self, progress: Progress | None = None) -> None:
        """Stop every lab host and remove all it used (also what a killed run left). Idempotent."""
        self._preflight("stop the lab", need_tools=False)
        say = progress or (lambda _line: None)
        started = time.monotonic()
        with self._locked():
            procs = self._procs()
            names = sorted(self._discover(procs))
            if names:
                say(f"lab: stopping {len(names)} host(s): {', '.join(names)}")
            self._teardown(names, procs, say, only_existing=False)
            state_dirs = self._known_state_dirs(procs)
            for state_dir in state_dirs:
                lab_ec2.down(state_dir)
                lab_slurm.stop_controller(state_dir, forget=True)
                system.unmount_under(state_dir / "hosts", what="unmount the lab's overlays")
            for link in system.link_names():
                if self.names.link_re.match(link) or link == self.names.bridge:
                    system.run_cmd(["ip", "link", "delete", link], what=f"delete link {link}", check=False)
            left = system.cgroup_prune(self.names.cgroup_parent, keep_top=False)
            if left:
                raise LabError(f"Failed to remove the lab's cgroups: still in use: {left[0]}")
            rootfs.cleanup_stale_builds(self.cache_dir)
            for state_dir in state_dirs:
                # the alias routes went with the bridge and the namespaces
                for path in (
                    state_dir / "inventory.yml",
                    state_dir / "known_hosts",
                    state_dir / "aliases.json",
                ):
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                with contextlib.suppress(OSError):
                    (state_dir / "hosts").rmdir()
            with contextlib.suppress(FileNotFoundError):
                self.names.owner_file.unlink()
        say(f"lab: down in {time.monotonic() - started:.1f} s")

    # ------------------------------------------------------------------ power

    def power(
        self, name: str, on: bool, progress: Progress | None = None, timeout: float | None = None
    ) -> None:
        """Power a lab host off (orderly: ACPI power button for a VM, guest poweroff for nspawn) or on.

        Its disk (VM) or overlay (nspawn), network and identity stay, so power on boots the same host
        again with a new boot id; this is what the lab's EC2 stop/start does. Idempotent.
        """
        self._preflight(f"power {'on' if on else 'off'} {name}")
        say = progress or (lambda _line: None)
        host_index(name)
        host_dir = self._host_dir(name)
        started = time.monotonic()
        with self._locked():
            if not host_dir.is_dir():
                raise LabError(
                    f"Failed to power {'on' if on else 'off'} {name}: it is not up (run 'fleetops-lab up')"
                )
            p = self._procs().get(name, _Procs([], [], []))
            spec = lab_vm.recorded_spec(host_dir)
            if not on:
                if spec is not None:
                    orderly = lab_vm.power_off(host_dir, p.vms, timeout or VM_POWEROFF_TIMEOUT_S)
                    if not orderly:
                        say(
                            f"lab: {name} did not power off within {timeout or VM_POWEROFF_TIMEOUT_S:g} s: QEMU quit"
                        )
                    self._stop_processes(name, self._procs().get(name, _Procs([], [], [])))
                else:
                    self._stop_processes(name, p)
                say(f"lab: {name} powered off in {time.monotonic() - started:.1f} s")
                return
            if p.vms or p.supervisors:
                say(f"lab: {name} is already on")
                return
            if spec is not None:
                lab_vm.check_memory(1, spec.memory_mib)
                self._boot_vm(name, spec)
            else:
                merged = host_dir / "merged"
                if not any(m.mountpoint == merged for m in system.mounts()):
                    raise LabError(
                        f"Failed to power on {name}: its root is not mounted (run 'fleetops-lab up')"
                    )
                _remove_nspawn_lock(merged)
                system.cgroup_create(self._cgroup(name))
                self._spawn_supervisor(name, merged)
            wait = timeout or (VM_SSH_TIMEOUT_S if spec is not None else 120.0)
            self._wait_ssh(name, wait, say)
        say(f"lab: {name} powered on and answers ssh in {time.monotonic() - started:.1f} s")

    # ------------------------------------------------------------------ status

    def status(self, probe_ssh: bool = True) -> list[LabHost]:
        """Every lab host this machine has (running or leftover), sorted by name."""
        procs = self._procs()
        names = sorted(self._discover(procs))

        def one(name: str) -> LabHost:
            p = procs.get(name, _Procs([], [], []))
            running = bool(p.supervisors and p.nspawns) or bool(p.vms)
            ssh_ok = running and probe_ssh and self._probe_ssh(name)
            is_vm = bool(p.vms) or (self._host_dir(name) / "vm.json").exists()
            return LabHost(
                name=name,
                ip=self.host_ip(name),
                az=host_az(name),
                running=running,
                ssh_ok=ssh_ok,
                pid=p.vms[0] if p.vms else (p.nspawns[0] if p.nspawns else None),
                supervisor_pid=p.supervisors[0] if p.supervisors else None,
                kind="vm" if is_vm else "nspawn",
            )

        return self._parallel(one, names)

    # ------------------------------------------------------------------ ssh

    def ssh_argv(
        self,
        name: str,
        command: str | Sequence[str] | None = None,
        tty: bool = False,
        connect_timeout: int = 10,
    ) -> list[str]:
        """The ssh command line that reaches a lab host as root with the lab's key and known_hosts."""
        argv = [
            "ssh",
            "-F",
            "none",
            "-i",
            str(self.key_path),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            f"UserKnownHostsFile={self.known_hosts_path}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"ConnectTimeout={connect_timeout}",
            "-o",
            "ControlMaster=no",
            "-o",
            "ControlPath=none",
            "-o",
            "LogLevel=ERROR",
        ]
        argv.append("-t" if tty else "-T")
        argv.append(f"root@{self.host_ip(name)}")
        if command is not None:
            argv.append(command if isinstance(command, str) else shlex.join(command))
        return argv

    def run(
        self,
        name: str,
        command: str | Sequence[str],
        check: bool = False,
        timeout: float = 60.0,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command on a lab host over ssh (a string goes to the remote shell as is)."""
        text = command if isinstance(command, str) else shlex.join(command)
        try:
            proc = subprocess.run(
                self.ssh_argv(name, text),
                input=input,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
                stdin=None if input is not None else subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise LabError(f"Failed to run {text!r} on {name}: no answer within {timeout:g} s") from None
        if check and proc.returncode != 0:
            detail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
            cause = detail[-1] if detail else "no output"
            what = "ssh could not connect" if proc.returncode == 255 else f"exit status {proc.returncode}"
            raise LabError(f"Failed to run {text!r} on {name}: {what}: {cause}")
        return proc

    # ------------------------------------------------------------------ internals: checks, lock, owner

    def _preflight(self, verb: str, need_tools: bool = True) -> None:
        if os.geteuid() != 0:
            raise LabError(f"Failed to {verb}: the lab needs root (it mounts overlays and boots containers)")
        if need_tools:
            missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
            if missing:
                raise LabError(
                    f"Failed to {verb}: missing {', '.join(missing)} "
                    "(apt-get install -y systemd-container debootstrap iproute2 openssh-client)"
                )
            hierarchies = system.missing_hierarchies()
            if hierarchies:
                raise LabError(
                    f"Failed to {verb}: cgroup hierarchies not mounted under {system.CGROUP_ROOT}: "
                    + ", ".join(hierarchies)
                )
            for path in (self.state_dir, self.cache_dir):
                if re.search(r"[\s,:=\\]", str(path)):
                    raise LabError(
                        f"Failed to {verb}: {path} cannot hold overlay layers "
                        "(no spaces, commas, colons, '=' or backslashes in the path)"
                    )
            if "overlay" not in Path("/proc/filesystems").read_text():
                raise LabError(f"Failed to {verb}: the kernel has no overlayfs")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.names.lock_file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.names.lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _owner(self) -> Path | None:
        try:
            data = json.loads(self.names.owner_file.read_text())
        except (OSError, ValueError):
            return None
        value = data.get("state_dir") if isinstance(data, dict) else None
        return Path(value) if isinstance(value, str) else None

    def _claim(self, verb: str) -> None:
        """Record this state dir as the lab's; refuse when another state dir's lab still runs."""
        owner = self._owner()
        if owner is not None and owner != self.state_dir and self._procs():
            raise LabError(
                f"Failed to {verb}: a lab from {owner} is running on this machine; "
                f"stop it first (FLEETOPS_LAB_DIR={owner} fleetops-lab down)"
            )
        system.write_text_atomic(self.names.owner_file, json.dumps({"state_dir": str(self.state_dir)}) + "\n")

    def _known_state_dirs(self, procs: dict[str, _Procs]) -> list[Path]:
        """This lab's state dir, and that of whoever ran the lab last (found by record or process)."""
        dirs = {self.state_dir}
        owner = self._owner()
        if owner is not None:
            dirs.add(owner)
        for p in procs.values():
            for directory in map(Path, p.directories):  # STATE/hosts/lab-NN/merged
                host_dir = directory.parent
                if (
                    directory.name == "merged"
                    and _NAME_RE.match(host_dir.name)
                    and host_dir.parent.name == "hosts"
                ):
                    dirs.add(host_dir.parent.parent)
        return sorted(dirs)

    def _discover(self, procs: dict[str, _Procs]) -> set[str]:
        """Every lab host something of is left on this machine: processes, dirs, netns, links, cgroups."""
        names: set[str] = set(procs)
        for state_dir in self._known_state_dirs(procs):
            hosts = state_dir / "hosts"
            if hosts.is_dir():
                names.update(n for n in os.listdir(hosts) if _NAME_RE.match(n))
        for ns in system.netns_names():
            if ns.startswith(self.names.netns_prefix):
                name = _name_from_number(ns.removeprefix(self.names.netns_prefix))
                if name:
                    names.add(name)
        for link in system.link_names():
            match = self.names.link_re.match(link)
            if match:
                name = _name_from_number(match.group(1))
                if name:
                    names.add(name)
        for top in system.cgroup_paths(self.names.cgroup_parent):
            if top.is_dir():
                names.update(n for n in os.listdir(top) if _NAME_RE.match(n) and (top / n).is_dir())
        return {n for n in names if 1 <= int(n.removeprefix("lab-")) <= MAX_HOSTS}

    def _healthy(
        self,
        name: str,
        lower: str,
        procs: dict[str, _Procs],
        spec: lab_vm.VmSpec | None,
        cluster: tuple[str, bytes] | None = None,
    ) -> bool:
        """Running from this state dir, on the current rootfs (``lower``: the overlay's lower layers; or VM
        image and settings), with its network (and a Slurm lab's current slurm.conf)."""
        p = procs.get(name)
        if spec is not None:
            if p is None or p.supervisors or p.nspawns or len(p.vms) != 1:
                return False
            host_dir = self._host_dir(name)
            return (
                lab_vm.recorded_spec(host_dir) == spec
                and (host_dir / "disk.qcow2").is_file()
                and system.link_exists(self._tap(name))
            )
        if p is None or p.vms or len(p.supervisors) != 1 or len(p.nspawns) > 1:
            return False
        merged = self._host_dir(name) / "merged"
        overlay = [m for m in system.mounts() if m.mountpoint == merged and m.fstype == "overlay"]
        if len(overlay) != 1 or f"lowerdir={lower}," not in overlay[0].super_options + ",":
            return False
        if cluster is not None and lab_slurm.host_conf(merged) != cluster[0]:
            return False
        return (system.NETNS_DIR / self._netns(name)).exists() and system.link_exists(self._veth_host(name))

    # ------------------------------------------------------------------ internals: start

    def _ensure_key(self) -> None:
        if self.key_path.exists() and self.key_path.with_suffix(".pub").exists():
            return
        for path in (self.key_path, self.key_path.with_suffix(".pub")):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        system.run_cmd(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "fleetops-lab", "-f", str(self.key_path)],
            what="create the lab's ssh key",
        )

    def _check_subnet(self, verb: str, with_aliases: bool = False) -> None:
        """Refuse a subnet that overlaps an address or route this machine has on another link (another
        lab, or a network of the machine's own): two bridges with one subnet would split its hosts."""
        networks = [self.names.network] + ([self.names.alias_network] if with_aliases else [])
        for network in networks:
            clash = system.subnet_clash(network, self.names.bridge)
            if clash:
                raise LabError(
                    f"Failed to {verb}: the lab {self.names.name!r} needs {network}, which clashes with "
                    f"{clash}; choose another lab name (FLEETOPS_LAB / --lab)"
                )

    @property
    def _aliases_record(self) -> Path:
        return self.state_dir / "aliases.json"

    def _apply_aliases(self, fleet: lab_aliases.AliasPlan) -> None:
        """Route the simulated fleet's addresses (fleetops_lab.aliases), replacing what an earlier ``up`` routed.

        Recorded before the first route is added, so an ``up`` after a killed one clears what it left."""
        net, record = str(fleet.network), self._aliases_record
        if record.exists() or fleet.addresses:
            system.run_cmd(["ip", "route", "flush", "root", net], what="clear the alias routes", check=False)
            for host in fleet.hosts:
                ns = self._netns(host)
                for table in ("local", "main"):
                    system.run_cmd(["ip", "-n", ns, "route", "flush", "table", table, "root", net],
                                   what=f"clear the alias routes of {host}", check=False)  # fmt: skip
        if not fleet.addresses:
            record.unlink(missing_ok=True)
            return
        system.write_text_atomic(
            record, json.dumps({"addresses": fleet.addresses, "dead": fleet.dead}) + "\n"
        )
        bridge = self.names.bridge
        for i, host in enumerate(fleet.hosts):
            for prefix in fleet.host_prefixes(i):
                system.run_cmd(["ip", "-n", self._netns(host), "route", "replace", "local", str(prefix), "dev", "lo"],
                               what=f"give {host} its addresses")  # fmt: skip
                system.run_cmd(["ip", "route", "replace", str(prefix), "via", self.host_ip(host), "dev", bridge],
                               what=f"route the addresses of {host}")  # fmt: skip
        sink = fleet.hosts[0]
        for prefix in fleet.dead_prefixes():
            system.run_cmd(["ip", "-n", self._netns(sink), "route", "replace", "blackhole", str(prefix)],
                           what="blackhole the dead addresses")  # fmt: skip
            system.run_cmd(["ip", "route", "replace", str(prefix), "via", self.host_ip(sink), "dev", bridge],
                           what="route the dead addresses")  # fmt: skip

    def _ensure_bridge(self) -> None:
        bridge = self.names.bridge
        if not system.link_exists(bridge):
            system.run_cmd(
                ["ip", "link", "add", bridge, "type", "bridge", "forward_delay", "0"],
                what=f"create the bridge {bridge}",
            )
        system.run_cmd(
            ["ip", "link", "set", bridge, "address", self.names.bridge_mac],
            what=f"address the bridge {bridge}",
        )
        system.run_cmd(
            ["ip", "addr", "replace", self.names.bridge_cidr, "dev", bridge],
            what=f"address the bridge {bridge}",
        )
        system.run_cmd(["ip", "link", "set", bridge, "up"], what=f"bring up the bridge {bridge}")

    def _start_host(
        self,
        name: str,
        lower: str,
        spec: lab_vm.VmSpec | None = None,
        cluster: tuple[str, bytes] | None = None,
    ) -> None:
        if spec is not None:
            self._start_vm(name, spec)
            return
        host_dir = self._host_dir(name)
        upper, work, merged = host_dir / "upper", host_dir / "work", host_dir / "merged"
        for path in (upper, work, merged):
            path.mkdir(parents=True, exist_ok=True)
        system.run_cmd(
            [
                "mount",
                "-t",
                "overlay",
                f"fleetops-{name}",
                "-o",
                f"lowerdir={lower},upperdir={upper},workdir={work}",
                str(merged),
            ],
            what=f"mount the root of {name}",
        )
        self._personalise(name, merged)
        if cluster is not None:
            lab_slurm.personalise(merged, name, *cluster)
        self._setup_network(name)
        system.cgroup_create(self._cgroup(name))
        self._spawn_supervisor(name, merged)

    def _start_vm(self, name: str, spec: lab_vm.VmSpec) -> None:
        """A fresh VM host: its own host key, a copy-on-write disk, its identity disk, a tap, QEMU."""
        host_dir = self._host_dir(name)
        host_dir.mkdir(parents=True, exist_ok=True)
        key = host_dir / "ssh_host_ed25519_key"
        for path in (key, key.with_suffix(".pub")):
            path.unlink(missing_ok=True)
        system.run_cmd(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{name}", "-f", str(key)],
            what=f"create the ssh host key of {name}",
        )
        lab_vm.create_disk(host_dir, Path(spec.image))
        ip = self.host_ip(name)
        lab_vm.write_config_disk(
            host_dir / "config.tar",
            {
                "etc/hostname": (f"{name}\n", 0o644),
                "etc/hosts": (rootfs.HOSTS + f"{ip}\t{name}\n", 0o644),
                "root/.ssh/authorized_keys": (self.key_path.with_suffix(".pub").read_text(), 0o600),
                "etc/ssh/ssh_host_ed25519_key": (key.read_text(), 0o600),
                "etc/ssh/ssh_host_ed25519_key.pub": (key.with_suffix(".pub").read_text(), 0o644),
                rootfs.SSHD_DROPIN[0]: (rootfs.SSHD_DROPIN[1], 0o644),
            },
        )
        self._boot_vm(name, spec)

    def _boot_vm(self, name: str, spec: lab_vm.VmSpec) -> None:
        lab_vm.setup_tap(self._tap(name), self.names.bridge)
        system.run_cmd(
            ["ip", "neigh", "flush", "to", self.host_ip(name), "dev", self.names.bridge],
            what="flush a neighbour",
            check=False,
        )
        lab_vm.start(
            self._machine(name),
            name,
            self._host_dir(name),
            spec,
            self.host_ip(name),
            self._guest_mac(name),
            self._tap(name),
        )

    def _personalise(self, name: str, root: Path) -> None:
        ip = self.host_ip(name)
        _guest_write(root, "etc/hostname", f"{name}\n")
        _guest_write(root, "etc/hosts", rootfs.HOSTS + f"{ip}\t{name}\n")
        _guest_write(root, "etc/machine-id", uuid.uuid4().hex + "\n", 0o444)
        pub = self.key_path.with_suffix(".pub").read_text()
        _guest_write(root, "root/.ssh/authorized_keys", pub, 0o600)
        _guest_write(root, *rootfs.SSHD_DROPIN)
        key = root / "etc/ssh/ssh_host_ed25519_key"
        for path in (key, key.with_suffix(".pub")):
            if path.is_symlink() or path.exists():
                path.unlink()
        system.run_cmd(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{name}", "-f", str(key)],
            what=f"create the ssh host key of {name}",
        )

    def _setup_network(self, name: str) -> None:
        ns, veth, peer = self._netns(name), self._veth_host(name), self._veth_peer(name)
        pair = ["type", "veth", "peer", "name", peer, "address", self._guest_mac(name), "netns", ns]
        steps = [
            ["ip", "netns", "add", ns],
            ["ip", "link", "add", veth, "address", self._veth_mac(name), *pair],
            ["ip", "-n", ns, "link", "set", peer, "name", "eth0"],
            ["ip", "-n", ns, "addr", "add", f"{self.host_ip(name)}/24", "dev", "eth0"],
            ["ip", "-n", ns, "link", "set", "eth0", "up"],
            ["ip", "-n", ns, "link", "set", "lo", "up"],
            ["ip", "link", "set", veth, "master", self.names.bridge, "up"],
        ]
        for argv in steps:
            system.run_cmd(argv, what=f"set up the network of {name}")
        # Forget what this machine knew about the address (a crashed run's link had another MAC).
        system.run_cmd(
            ["ip", "neigh", "flush", "to", self.host_ip(name), "dev", self.names.bridge],
            what="flush a neighbour",
            check=False,
        )

    def _spawn_supervisor(self, name: str, merged: Path) -> None:
        host_dir = self._host_dir(name)
        pid_file = host_dir / "supervisor.pid"
        argv = [
            sys.executable,
            "-m",
            SUPERVISOR_MODULE,
            "--machine",
            self._machine(name),
            "--directory",
            str(merged),
            "--netns-path",
            str(system.NETNS_DIR / self._netns(name)),
            "--cgroup",
            self._cgroup(name),
            "--pid-file",
            str(pid_file),
            "--nspawn-pid-file",
            str(host_dir / "nspawn.pid"),
            "--console-log",
            str(host_dir / "console.log"),
        ]
        env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
        package_parent = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
        log_path = host_dir / "supervisor.log"
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd="/",
                env=env,
                start_new_session=True,
            )
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise LabError(
                f"Failed to start the supervisor of {name}: it did not detach within 30 s"
            ) from None
        if rc != 0 or system.read_pid_file(pid_file) is None:
            raise LabError(
                f"Failed to start the supervisor of {name}: exit {rc}:\n{system.tail(log_path, 10)}"
            )

    def _write_known_hosts(self, names: Sequence[str], fleet: lab_aliases.AliasPlan | None = None) -> None:
        extra = fleet.by_host() if fleet is not None else {}
        lines = []
        for name in names:
            pub_path = self._host_dir(name) / "merged/etc/ssh/ssh_host_ed25519_key.pub"
            if (self._host_dir(name) / "vm.json").exists():
                pub_path = self._host_dir(name) / "ssh_host_ed25519_key.pub"
            pub = pub_path.read_text().split()
            patterns = ",".join([name, self.host_ip(name), *extra.get(name, ())])
            lines.append(f"{patterns} {pub[0]} {pub[1]}\n")
        system.write_text_atomic(self.known_hosts_path, "".join(lines))

    def _probe_ssh(self, name: str) -> bool:
        try:
            proc = subprocess.run(
                self.ssh_argv(name, "true", connect_timeout=2),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=10,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return False
        return proc.returncode == 0

    def _wait_ssh(self, name: str, timeout: float, say: Progress) -> None:
        started = time.monotonic()
        deadline = started + timeout
        is_vm = (self._host_dir(name) / "vm.json").exists()
        pid_file = self._host_dir(name) / ("qemu.pid" if is_vm else "supervisor.pid")
        while True:
            if self._probe_ssh(name):
                say(
                    f"lab: {name} ({self.host_ip(name)}) answers ssh after {time.monotonic() - started:.1f} s"
                )
                return
            supervisor = system.read_pid_file(pid_file)
            alive = supervisor is not None and system.pid_alive(supervisor)
            if alive and is_vm:
                time.sleep(0.8)  # a VM boots for a minute: probe less often
            if not alive or time.monotonic() >= deadline:
                why = (
                    f"its {'QEMU' if is_vm else 'supervisor'} exited"
                    if not alive
                    else f"no ssh answer within {timeout:g} s"
                )
                host_dir = self._host_dir(name)
                raise LabError(
                    f"Failed to boot {name}: {why} (logs in {host_dir}; 'fleetops-lab down' cleans up)\n"
                    + system.tail(host_dir / "supervisor.log", 5)
                    + "\n"
                    + system.tail(host_dir / "console.log", 10)
                )
            time.sleep(0.2)

    def ssh_vars(self) -> dict[str, str]:
        """The connection variables every lab inventory (static or EC2) gives its hosts."""
        return {
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.key_path),
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={self.known_hosts_path} -o StrictHostKeyChecking=yes",
            "ansible_python_interpreter": "/usr/bin/python3",
        }

    def ec2_inventory_path(self) -> Path:
        """The lab's EC2 inventory (``fleetops.node.ec2`` over the local moto endpoint), after ``up(ec2=True)``."""
        return lab_ec2.inventory_path(self.state_dir)

    def _write_inventory(
        self, names: Sequence[str], slurm: bool = False, fleet: lab_aliases.AliasPlan | None = None
    ) -> None:
        hosts = {n: {"ansible_host": self.host_ip(n), "fleetops_az": host_az(n)} for n in names}
        members_of = {az: [n for n in names if host_az(n) == az] for az in AZS}
        if fleet is not None and fleet.addresses:  # the simulated fleet's hosts instead of the lab's
            listed = fleet.aliases()
            hosts = {}
            members_of = {az: [] for az in AZS}
            for j, alias in enumerate(listed):
                az = host_az(alias.host) if alias.host else AZS[j % len(AZS)]
                hosts[alias.name] = {"ansible_host": alias.ip, "fleetops_az": az}
                members_of[az].append(alias.name)
        group_vars: dict[str, str] = dict(self.ssh_vars())
        if slurm:  # where this machine's scontrol finds the lab's cluster (quarantine's Slurm backend)
            group_vars["fleetops_slurm_conf"] = str(lab_slurm.controller_conf_path(self.state_dir))
        children: dict[str, object] = {GROUP: {"hosts": hosts, "vars": group_vars}}
        for az in AZS:
            members = members_of[az]
            if members:
                children["az_" + az.replace("-", "_")] = {"hosts": {n: {} for n in members}}
        text = "# Written by 'fleetops-lab up'; removed by 'fleetops-lab down'.\n" + yaml.safe_dump(
            {"all": {"children": children}}, sort_keys=False, default_flow_style=False, width=1000
        )
        system.write_text_atomic(self.inventory_path(), text)

    # ------------------------------------------------------------------ internals: stop

    def _teardown(
        self, names: Sequence[str], procs: dict[str, _Procs], say: Progress, only_existing: bool
    ) -> None:
        todo = [n for n in names if not only_existing or self._has_leftovers(n, procs)]
        if only_existing and todo:
            say(f"lab: removing unwanted or stale host(s): {', '.join(todo)}")
        state_dirs = self._known_state_dirs(procs)
        self._parallel(lambda n: self._teardown_host(n, procs.get(n, _Procs([], [], [])), state_dirs), todo)

    def _has_leftovers(self, name: str, procs: dict[str, _Procs]) -> bool:
        return (
            name in procs
            or self._host_dir(name).exists()
            or (system.NETNS_DIR / self._netns(name)).exists()
            or system.link_exists(self._veth_host(name))
            or system.link_exists(self._veth_peer(name))
            or system.link_exists(self._tap(name))
            or any(p.exists() for p in system.cgroup_paths(self._cgroup(name)))
        )

    def _teardown_host(self, name: str, procs: _Procs, state_dirs: Sequence[Path]) -> None:
        self._stop_processes(name, procs)
        host_dirs = [state_dir / "hosts" / name for state_dir in state_dirs]
        for host_dir in host_dirs:
            _remove_nspawn_lock(host_dir / "merged")
            system.unmount_under(host_dir, what=f"unmount the root of {name}")
        for directory in procs.directories:
            system.unmount_under(Path(directory), what=f"unmount the root of {name}")
        for link in (self._veth_host(name), self._veth_peer(name), self._tap(name)):
            if system.link_exists(link):
                system.run_cmd(["ip", "link", "delete", link], what=f"delete the link {link}")
        ns = self._netns(name)
        if os.path.lexists(system.NETNS_DIR / ns):
            system.run_cmd(["ip", "netns", "delete", ns], what=f"delete the network namespace {ns}")
        left = system.cgroup_prune(self._cgroup(name), keep_top=False)
        if left:
            raise LabError(f"Failed to remove the cgroups of {name}: still in use: {left[0]}")
        with contextlib.suppress(OSError):  # nspawn leaves this behind when /run is not a tmpfs
            Path("/run/systemd/nspawn/propagate", self._machine(name)).rmdir()
        for host_dir in host_dirs:
            if host_dir.is_dir() and not host_dir.is_symlink():
                if system.mounts_under(host_dir):  # never delete through a mount
                    raise LabError(f"Failed to remove {host_dir}: something is still mounted below it")
                shutil.rmtree(host_dir)

    def _stop_processes(self, name: str, procs: _Procs) -> None:
        """SIGTERM (orderly guest poweroff), then SIGKILL whatever is left in the host's cgroups."""
        rel = self._cgroup(name)

        def ours() -> list[int]:
            # Re-check what each PID is at every step: PIDs are reused.
            fresh = self._procs().get(name, _Procs([], [], []))
            return sorted(
                set(fresh.supervisors) | set(fresh.nspawns) | set(fresh.vms) | system.cgroup_pids(rel)
            )

        leaders = procs.supervisors or procs.nspawns or procs.vms  # SIGTERM ends QEMU at once
        if leaders:
            system.send_signal(leaders, signal.SIGTERM)
            system.wait_until(lambda: not ours(), STOP_TIMEOUT_S)
        deadline = time.monotonic() + KILL_TIMEOUT_S
        while True:
            pids = ours()
            if not pids:
                return
            if time.monotonic() >= deadline:
                raise LabError(f"Failed to stop {name}: processes survive SIGKILL: {pids[:10]}")
            system.send_signal(pids, signal.SIGKILL)
            system.wait_until(lambda: not ours(), 1.0, interval=0.05)

    # ------------------------------------------------------------------ internals: helpers

    @staticmethod
    def _parallel[T, R](fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        if not items:
            return []
        if len(items) == 1:
            return [fn(items[0])]
        with ThreadPoolExecutor(max_workers=min(16, len(items))) as pool:
            return list(pool.map(fn, items))


def _guest_write(root: Path, rel: str, text: str, mode: int = 0o644) -> None:
    """Write a file inside a guest root without following a symlink out of it."""
    path = root / rel
    parent = path.parent
    for p in [parent, *parent.parents]:
        if p == root:
            break
        if p.is_symlink():
            raise LabError(f"Failed to write {rel} in {root}: {p} is a symlink")
    parent.mkdir(parents=True, exist_ok=True, mode=0o700 if rel.startswith("root/") else 0o755)
    if path.is_symlink():
        path.unlink()
    system.write_text_atomic(path, text, mode)


def _remove_nspawn_lock(merged: Path) -> None:
    """Remove the image lock a killed systemd-nspawn left (it names the lock after the root's inode)."""
    if not any(m.mountpoint == merged for m in system.mounts()):
        return
    try:
        st = os.stat(merged)
    except OSError:
        return
    with contextlib.suppress(OSError):
        Path(NSPAWN_LOCKS, f"inode-{st.st_dev}:{st.st_ino}").unlink()
