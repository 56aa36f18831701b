"""The lab's VM image: the cached Debian rootfs plus a kernel, as one ext4 disk and a kernel/initrd pair.

Built once per set of inputs (the rootfs recipe, the packages added here, the bake below) into
``CACHE/vm/<hash>/``: ``root.img`` (a sparse raw ext4 disk made by ``mke2fs -d``; each VM gets a
qcow2 copy-on-write disk over it), ``vmlinuz`` and ``initrd.img`` (for QEMU's direct kernel boot).
The kernel is Debian's ``linux-image-amd64`` installed into a copy of the rootfs with apt in a
chroot (so its modules and an initramfs with virtio and ext4 come with it), plus ``udev`` (device
units, module loading, the ACPI power button) which the nspawn rootfs does not need.

A VM takes its identity (host name, IP, ssh keys) from a small second disk, ``/dev/vdb``, that
holds a tar archive: ``fleetops-vm-config.service`` unpacks it onto ``/`` early at every boot and
brings up ``eth0`` with the address from the kernel command line (``fleetops.ip=``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from fleetops_lab import _system as system
from fleetops_lab import rootfs
from fleetops_lab.errors import LabError

Progress = Callable[[str], None]

VM_PACKAGES = ("linux-image-amd64", "udev", "kmod", "initramfs-tools")
DISK_SIZE = "3G"
IMAGE_VERSION = 2  # bump when bake_vm() changes
# A small initramfs (MODULES=list: about 8 MB instead of 36 MB, which QEMU's firmware loads and the
# kernel unpacks, under TCG slowly): just what mounting /dev/vda needs, and the NIC, so that eth0
# exists when the identity unit runs (before udev's coldplug).
INITRAMFS_MODULES = ("virtio_pci", "virtio_blk", "virtio_net", "ext4", "crc32c_generic")

CONFIG_SCRIPT = """#!/bin/sh
# fleetops lab VM: take this host's identity from /dev/vdb (a tar archive the lab writes per host)
# and its address from the kernel command line (fleetops.ip=ADDR/PREFIX).
set -eu
if [ -b /dev/vdb ]; then
  tar -xf /dev/vdb -C / --no-overwrite-dir
fi
hostname -F /etc/hostname 2>/dev/null || true
ip=$(tr ' ' '\\n' < /proc/cmdline | sed -n 's/^fleetops.ip=//p')
ip link set lo up
if [ -n "$ip" ]; then
  ip link set eth0 up
  ip addr replace "$ip" dev eth0
fi
"""

CONFIG_UNIT = """[Unit]
Description=fleetops lab VM identity and network (from /dev/vdb and the kernel command line)
DefaultDependencies=no
After=local-fs.target
Before=network.target network-pre.target ssh.service sysinit.target
Wants=network-pre.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStartPre=/bin/sh -c 'for i in $(seq 100); do [ -b /dev/vdb ] && [ -e /sys/class/net/eth0 ] && exit 0; sleep 0.1; done'
ExecStart=/usr/local/sbin/fleetops-vm-config

[Install]
WantedBy=sysinit.target
"""

FSTAB = "/dev/vda / ext4 rw,errors=remount-ro 0 1\n"


def recipe() -> dict[str, object]:
    return {
        "rootfs": rootfs.recipe_hash(),
        "packages": list(VM_PACKAGES),
        "disk_size": DISK_SIZE,
        "config_script": CONFIG_SCRIPT,
        "config_unit": CONFIG_UNIT,
        "fstab": FSTAB,
        "initramfs_modules": list(INITRAMFS_MODULES),
        "version": IMAGE_VERSION,
    }


def image_dir(cache_dir: Path) -> Path:
    blob = json.dumps(recipe(), sort_keys=True).encode()
    return cache_dir / "vm" / f"bookworm-{hashlib.sha256(blob).hexdigest()[:12]}"


def ensure_image(cache_dir: Path, progress: Progress | None = None) -> Path:
    """The image directory (root.img, vmlinuz, initrd.img) for the current inputs, built if missing."""
    say = progress or (lambda _line: None)
    final = image_dir(cache_dir)
    if (final / "root.img").is_file():
        return final
    for tool in ("mke2fs", "chroot", "unshare", "qemu-img"):
        if shutil.which(tool) is None:
            raise LabError(
                f"Failed to build the lab VM image: {tool} not found (tools/debian-deps.sh --vm installs what VMs need)"
            )
    base = rootfs.ensure_rootfs(cache_dir, progress)
    final.parent.mkdir(parents=True, exist_ok=True)
    with rootfs._locked(final.parent / ".lock"):
        if (final / "root.img").is_file():
            return final
        for stale in final.parent.glob("*.tmp-*"):
            _remove_tree(stale)
        tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
        log = final.with_name(f"{final.name}.build.log")
        say(f"building the lab VM image (once, about 2-3 min): {final}")
        started = time.monotonic()
        try:
            _build(base, tmp, log, say)
            os.rename(tmp, final)
        except BaseException:
            with contextlib.suppress(Exception):
                _remove_tree(tmp)
            raise
        say(f"VM image built in {time.monotonic() - started:.0f} s")
        in_use = "\n".join(" ".join(system.cmdline(pid)) for pid in system.all_pids())
        for old in final.parent.iterdir():
            if old.is_dir() and old != final and ".tmp-" not in old.name and f"{old}/" not in in_use:
                with contextlib.suppress(OSError):
                    shutil.rmtree(old)
        return final


def _remove_tree(path: Path) -> None:
    # The chroot's mounts live in a private mount namespace that ended with it; check anyway.
    if system.mounts_under(path):
        raise LabError(f"Failed to remove the stale VM image build {path}: something is mounted below it")
    shutil.rmtree(path, ignore_errors=True)


def _build(base: Path, tmp: Path, log: Path, say: Progress) -> None:
    root = tmp / "root"
    tmp.mkdir(parents=True)
    with log.open("w") as out:

        def step(argv: list[str], what: str, timeout: float = 900.0) -> None:
            out.write(f"$ {' '.join(argv)}\n")
            out.flush()
            proc = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
            if proc.returncode != 0:
                raise LabError(
                    f"Failed to {what}: exit {proc.returncode} (log: {log}):\n" + system.tail(log, 10)
                )

        step(["cp", "-a", "--reflink=auto", str(base), str(root)], "copy the lab rootfs")
        resolv = root / "etc/resolv.conf"
        shutil.copyfile("/etc/resolv.conf", resolv)
        policy = root / "usr/sbin/policy-rc.d"
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
        conf_d = root / "etc/initramfs-tools/conf.d"
        conf_d.mkdir(parents=True, exist_ok=True)
        (conf_d / "fleetops-vm").write_text("MODULES=list\n")
        modules_d = root / "usr/share/initramfs-tools/modules.d"
        modules_d.mkdir(parents=True, exist_ok=True)
        (modules_d / "fleetops-vm").write_text("".join(m + "\n" for m in INITRAMFS_MODULES))
        script = (
            f"mount -t proc proc {root}/proc && mount --rbind /sys {root}/sys && mount --rbind /dev {root}/dev"
            f" && DEBIAN_FRONTEND=noninteractive chroot {root} sh -c"
            " 'apt-get update -qq && apt-get install -y -q --no-install-recommends "
            + " ".join(VM_PACKAGES)
            + " && apt-get clean'"
        )
        say("VM image: installing the kernel and udev into a copy of the rootfs (apt, in a chroot)")
        step(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], "install the VM kernel")
        policy.unlink()
        resolv.write_text("")
        bake_vm(root)
        kernels = sorted((root / "boot").glob("vmlinuz-*"))
        initrds = sorted((root / "boot").glob("initrd.img-*"))
        if not kernels or not initrds:
            raise LabError(
                f"Failed to build the lab VM image: no kernel or initrd in {root}/boot (log: {log})"
            )
        shutil.copyfile(kernels[-1], tmp / "vmlinuz")
        shutil.copyfile(initrds[-1], tmp / "initrd.img")
        (tmp / "kernel-release").write_text(kernels[-1].name.removeprefix("vmlinuz-") + "\n")
        say("VM image: writing the ext4 disk (mke2fs -d)")
        step(
            [
                "mke2fs",
                "-q",
                "-F",
                "-t",
                "ext4",
                "-L",
                "fleetops-root",
                "-d",
                str(root),
                str(tmp / "root.img"),
                DISK_SIZE,
            ],
            "write the VM disk",
        )
        shutil.rmtree(root)


def bake_vm(root: Path) -> None:
    """What a VM needs beyond the nspawn rootfs: fstab, a persistent journal, the identity unit."""
    (root / "etc/fstab").write_text(FSTAB)
    journal = root / "var/log/journal"
    journal.mkdir(parents=True, exist_ok=True)
    script = root / "usr/local/sbin/fleetops-vm-config"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(CONFIG_SCRIPT)
    script.chmod(0o755)
    unit = root / "etc/systemd/system/fleetops-vm-config.service"
    unit.write_text(CONFIG_UNIT)
    wants = root / "etc/systemd/system/sysinit.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    link = wants / "fleetops-vm-config.service"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to("/etc/systemd/system/fleetops-vm-config.service")
    # A serial console nobody logs into, and the TCG guest's slow timers: keep what the nspawn
    # rootfs masked masked; the kernel console goes to ttyS0 (the VM's console.log).
