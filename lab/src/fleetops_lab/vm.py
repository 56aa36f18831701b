"""Lab hosts as QEMU virtual machines: their own kernel, systemd, sshd, kernel log and real reboots.

A VM host ``lab-NN`` has the same name, IP, MAC, AZ and inventory entry as an nspawn host would;
its NIC is a tap device ``fleetops-tNN`` on the bridge ``fleetops0`` (the default lab's names: a named
lab's are its own, ``fleetops_lab.names``). Its disk is a qcow2 overlay
(``STATE/hosts/lab-NN/disk.qcow2``) over the cached image (fleetops_lab.image); QEMU boots the
image's kernel directly (``-kernel -initrd -append root=/dev/vda``). QEMU runs daemonized, found
by its ``-name guest=fleetops-lab-NN`` argument; a guest reboot is a reset inside the same QEMU
(a new kernel, a new boot id: no ``-no-reboot``), a guest poweroff ends QEMU.

KVM is used when a short probe boots a kernel under it; otherwise TCG (on nested machines KVM
guests can hang right after the kernel decompresses). ``FLEETOPS_LAB_VM_ACCEL=kvm|tcg`` forces one.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from fleetops_lab import _system as system
from fleetops_lab.errors import LabError

Progress = Callable[[str], None]

QEMU = "qemu-system-x86_64"
DEFAULT_MEMORY_MIB = 512
QEMU_OVERHEAD_MIB = 160  # measured RSS above guest RAM under TCG (tb-size=128), rounded up
HOST_RESERVE_MIB = 512  # what the machine keeps for itself and the nspawn hosts
MAX_VMS = 16
PROBE_TIMEOUT_S = 10.0
ACCEL_CACHE = Path("/run/fleetops/vm-accel.json")
_PROBE_OK = re.compile(r"VFS: Unable to mount root|Kernel panic|Run /init|Freeing unused kernel")


@dataclass(frozen=True)
class VmSpec:
    """What a VM boots with; recorded in its host dir (a host whose record differs is re-created)."""

    image: str
    memory_mib: int = DEFAULT_MEMORY_MIB
    cgroup: int = 2  # 1: systemd.unified_cgroup_hierarchy=0 (cgroup v1, for comparison)
    accel: str = "tcg"


def guest_name(machine: str) -> str:
    return f"guest={machine}"


def qemu_processes(machine_prefix: str) -> dict[str, list[int]]:
    """QEMU processes of lab VMs by machine name (``fleetops-lab-NN``), from one /proc scan."""
    found: dict[str, list[int]] = {}
    for pid in system.all_pids():
        argv = system.cmdline(pid)
        if not argv or os.path.basename(argv[0]) != QEMU or "-name" not in argv:
            continue
        value = argv[argv.index("-name") + 1] if argv.index("-name") + 1 < len(argv) else ""
        machine = value.removeprefix("guest=").split(",")[0]
        if machine.startswith(machine_prefix) and system.pid_alive(pid):
            found.setdefault(machine, []).append(pid)
    return found


# --------------------------------------------------------------------------- memory


def mem_available_mib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    raise LabError("Failed to read MemAvailable from /proc/meminfo")


def check_memory(count: int, memory_mib: int, freeing_mib: int = 0) -> None:
    """Refuse to start ``count`` more VMs when MemAvailable (plus what VMs about to stop free)
    cannot hold them and a reserve."""
    if count <= 0:
        return
    need = count * (memory_mib + QEMU_OVERHEAD_MIB) + HOST_RESERVE_MIB
    have = mem_available_mib() + freeing_mib
    if need > have:
        raise LabError(
            f"Failed to start {count} VM(s): they need about {need} MiB ({memory_mib} MiB of guest RAM + "
            f"{QEMU_OVERHEAD_MIB} MiB QEMU each, {HOST_RESERVE_MIB} MiB reserve) but MemAvailable is {have} MiB"
            + (f" (with {freeing_mib} MiB of VMs to be replaced)" if freeing_mib else "")
            + "; "
            "boot fewer VMs (--vm K) or smaller ones (--vm-memory MIB)"
        )


# --------------------------------------------------------------------------- accelerator


def choose_accel(image: Path, work: Path, say: Progress) -> str:
    """'kvm' when a kernel boots under KVM within a few seconds here, else 'tcg' (cached per boot)."""
    forced = os.environ.get("FLEETOPS_LAB_VM_ACCEL")
    if forced:
        if forced not in ("kvm", "tcg"):
            raise LabError(
                f"Failed to choose the VM accelerator: FLEETOPS_LAB_VM_ACCEL={forced!r} (kvm or tcg)"
            )
        return forced
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "tcg"
    key = f"{image}"
    with contextlib.suppress(OSError, ValueError):
        cached = json.loads(ACCEL_CACHE.read_text())
        if cached.get("image") == key and cached.get("accel") in ("kvm", "tcg"):
            return str(cached["accel"])
    work.mkdir(parents=True, exist_ok=True)
    log = work / "kvm-probe.log"
    log.unlink(missing_ok=True)
    argv = [
        QEMU, "-accel", "kvm", "-nodefaults", "-no-user-config", "-display", "none", "-m", "256",
        "-kernel", str(image / "vmlinuz"), "-append", "console=ttyS0 panic=-1", "-no-reboot",
        "-serial", f"file:{log}",
    ]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    ok = False
    try:
        while time.monotonic() - started < PROBE_TIMEOUT_S:
            with contextlib.suppress(OSError):
                if _PROBE_OK.search(log.read_text(errors="replace")):
                    ok = True
                    break
            if proc.poll() is not None:
                break
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    accel = "kvm" if ok else "tcg"
    say(
        "lab: KVM boots a kernel here: VMs use KVM"
        if ok
        else f"lab: a kernel under KVM did not reach its init within {PROBE_TIMEOUT_S:g} s here "
        "(nested virtualisation?): VMs use TCG (emulation, slower)"
    )
    ACCEL_CACHE.parent.mkdir(parents=True, exist_ok=True)
    system.write_text_atomic(ACCEL_CACHE, json.dumps({"image": key, "accel": accel}) + "\n")
    return accel


# --------------------------------------------------------------------------- one VM


def write_config_disk(path: Path, files: dict[str, tuple[str, int]]) -> None:
    """The identity disk: a tar archive of {relative path: (text, mode)}, owned by root."""
    tmp = path.with_suffix(".tmp")
    with tarfile.open(tmp, "w", format=tarfile.GNU_FORMAT) as tar:
        for rel, (text, mode) in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.uid, info.gid, info.mtime = len(data), mode, 0, 0, int(time.time())
            with tempfile.TemporaryFile() as fh:
                fh.write(data)
                fh.seek(0)
                tar.addfile(info, fh)
    size = tmp.stat().st_size
    with tmp.open("ab") as fh:  # a whole number of 512-byte sectors
        fh.write(b"\0" * (-size % 512 + 512 * 16))
    os.replace(tmp, path)


def create_disk(host_dir: Path, image: Path) -> Path:
    disk = host_dir / "disk.qcow2"
    disk.unlink(missing_ok=True)
    system.run_cmd(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(image / "root.img"), str(disk)],
        what=f"create the disk of {host_dir.name}",
    )
    return disk


def setup_tap(tap: str, bridge: str) -> None:
    if not system.link_exists(tap):
        system.run_cmd(
            ["ip", "tuntap", "add", "dev", tap, "mode", "tap"], what=f"create the tap device {tap}"
        )
    system.run_cmd(["ip", "link", "set", tap, "master", bridge, "up"], what=f"attach {tap} to {bridge}")


def qemu_argv(
    machine: str, name: str, host_dir: Path, spec: VmSpec, ip: str, mac: str, tap: str
) -> list[str]:
    image = Path(spec.image)
    append = [
        "root=/dev/vda", "rw", "console=ttyS0", "net.ifnames=0", "panic=10", "quiet", "loglevel=4",
        f"systemd.hostname={name}", f"fleetops.ip={ip}/24",
    ]  # fmt: skip
    if spec.cgroup == 1:
        append.append("systemd.unified_cgroup_hierarchy=0")
    accel = ["-accel", "kvm"] if spec.accel == "kvm" else ["-accel", "tcg,thread=multi,tb-size=128"]
    return [
        QEMU, "-name", guest_name(machine), *accel, "-machine", "q35", "-smp", "1", "-m", str(spec.memory_mib),
        "-nodefaults", "-no-user-config", "-display", "none", "-vga", "none",
        "-kernel", str(image / "vmlinuz"), "-initrd", str(image / "initrd.img"), "-append", " ".join(append),
        "-drive", f"file={host_dir / 'disk.qcow2'},if=virtio,format=qcow2",
        "-drive", f"file={host_dir / 'config.tar'},if=virtio,format=raw,readonly=on",
        "-netdev", f"tap,id=n0,ifname={tap},script=no,downscript=no",
        "-device", f"virtio-net-pci,netdev=n0,mac={mac}",
        "-device", "virtio-rng-pci",
        "-chardev", f"file,id=con0,path={host_dir / 'console.log'},append=on", "-serial", "chardev:con0",
        "-qmp", f"unix:{host_dir / 'qmp.sock'},server=on,wait=off",
        "-pidfile", str(host_dir / "qemu.pid"), "-daemonize",
    ]  # fmt: skip


def start(machine: str, name: str, host_dir: Path, spec: VmSpec, ip: str, mac: str, tap: str) -> int:
    """Start the VM's QEMU (daemonized); returns its PID."""
    system.write_text_atomic(host_dir / "vm.json", json.dumps(asdict(spec)) + "\n")
    (host_dir / "qemu.pid").unlink(missing_ok=True)
    (host_dir / "qmp.sock").unlink(missing_ok=True)
    with (host_dir / "console.log").open("a") as fh:
        fh.write(f"\n==== fleetops-lab: QEMU start {time.strftime('%Y-%m-%dT%H:%M:%S')} ({spec.accel})\n")
    system.run_cmd(
        qemu_argv(machine, name, host_dir, spec, ip, mac, tap), what=f"start the VM {name}", timeout=30
    )
    pid = system.read_pid_file(host_dir / "qemu.pid")
    if pid is None:
        raise LabError(f"Failed to start the VM {name}: QEMU wrote no pid file")
    return pid


def recorded_spec(host_dir: Path) -> VmSpec | None:
    try:
        data = json.loads((host_dir / "vm.json").read_text())
        return VmSpec(**data)
    except (OSError, ValueError, TypeError):
        return None


def qmp(host_dir: Path, command: str, timeout: float = 5.0) -> dict[str, object]:
    """Send one QMP command to a VM's QEMU and return its answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(host_dir / "qmp.sock"))
        reader = sock.makefile("r")

        def answer() -> dict[str, object]:
            while True:
                line = reader.readline()
                if not line:
                    raise LabError(f"Failed to talk to QEMU of {host_dir.name}: QMP closed the connection")
                msg = json.loads(line)
                if isinstance(msg, dict) and "event" not in msg:
                    return msg

        answer()  # the greeting
        for cmd in ("qmp_capabilities", command):
            sock.sendall(json.dumps({"execute": cmd}).encode() + b"\n")
            reply = answer()
            if "error" in reply:
                raise LabError(f"Failed to run {cmd} on QEMU of {host_dir.name}: {reply['error']}")
        return reply


def power_off(host_dir: Path, pids: list[int], timeout: float) -> bool:
    """ACPI power button (QMP system_powerdown), wait for QEMU to end; then QMP quit. True when orderly."""
    if not pids:
        return True
    with contextlib.suppress(OSError, LabError, ValueError):
        qmp(host_dir, "system_powerdown")
    if system.wait_until(lambda: not any(system.pid_alive(p) for p in pids), timeout, interval=0.5):
        return True
    with contextlib.suppress(OSError, LabError, ValueError):
        qmp(host_dir, "quit")
    system.wait_until(lambda: not any(system.pid_alive(p) for p in pids), 10.0)
    return False
