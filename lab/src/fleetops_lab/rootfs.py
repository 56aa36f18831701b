"""The lab's shared Debian rootfs: debootstrapped once per recipe into a cache, then read-only lower layer.

A build goes to ``<name>.tmp-<pid>`` next to the final directory and is renamed into place only when
complete, so a killed build never leaves a rootfs that looks finished; the next build removes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from fleetops_lab import _system as system
from fleetops_lab.errors import LabError

Progress = Callable[[str], None]

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
VARIANT = "minbase"
PACKAGES = ("systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "iproute2", "procps", "sudo")

# Useless or slow in a container: consoles nobody reads, and timers that would touch the network or
# disks at random times during a test. Masked only when the unit exists in the rootfs.
MASKED_UNITS = (
    "console-getty.service",
    "container-getty@.service",
    "getty@.service",
    "serial-getty@.service",
    "getty-static.service",
    "apt-daily.timer",
    "apt-daily.service",
    "apt-daily-upgrade.timer",
    "apt-daily-upgrade.service",
    "dpkg-db-backup.timer",
    "dpkg-db-backup.service",
    "e2scrub_all.timer",
    "e2scrub_all.service",
    "e2scrub_reap.service",
    "fstrim.timer",
    "fstrim.service",
    "systemd-pstore.service",
)

SSHD_CONFIG = """\
# fleetops lab: key-only root login, no DNS lookups (the lab has no resolver).
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
HostKey /etc/ssh/ssh_host_ed25519_key
"""

HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"

# Bump when bake() changes in a way the recipe below does not capture.
BAKE_VERSION = 1


def recipe() -> dict[str, object]:
    return {
        "suite": SUITE,
        "mirror": MIRROR,
        "variant": VARIANT,
        "packages": list(PACKAGES),
        "masked_units": list(MASKED_UNITS),
        "sshd_config": SSHD_CONFIG,
        "hosts": HOSTS,
        "bake_version": BAKE_VERSION,
    }


def recipe_hash() -> str:
    blob = json.dumps(recipe(), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def rootfs_dir(cache_dir: Path) -> Path:
    """Where the rootfs for the current recipe lives (complete when it exists)."""
    return cache_dir / "rootfs" / f"{SUITE}-{recipe_hash()}"


def debootstrap_argv(target: Path) -> list[str]:
    return [
        "debootstrap",
        f"--variant={VARIANT}",
        f"--include={','.join(PACKAGES)}",
        SUITE,
        str(target),
        MIRROR,
    ]


@contextlib.contextmanager
def _locked(path: Path, *, blocking: bool = True) -> Iterator[bool]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _stale_builds(cache_dir: Path) -> list[Path]:
    base = cache_dir / "rootfs"
    if not base.is_dir():
        return []
    return sorted(p for p in base.iterdir() if ".tmp-" in p.name and p.is_dir() and not p.is_symlink())


def _build_processes(path: Path) -> list[int]:
    """Processes still working on a build: debootstrap (its argv names the target) and whatever
    runs chrooted into it (dpkg, maintainer scripts)."""
    target = str(path)
    found = []
    for pid in system.all_pids():
        if pid == os.getpid():
            continue
        try:
            root = Path(os.readlink(f"/proc/{pid}/root"))
        except OSError:
            root = Path("/")
        works_on_it = system.is_under(root, path) or any(target in arg for arg in system.cmdline(pid))
        if works_on_it and system.pid_alive(pid):
            found.append(pid)
    return found


def _remove_build(path: Path) -> None:
    # A debootstrap whose parent was killed may still run: stop it (by PID, after checking what it
    # works on). It also leaves /proc and /sys mounted inside its target: unmount before deleting.
    for _ in range(50):
        pids = _build_processes(path)
        if not pids:
            break
        system.send_signal(pids, signal.SIGKILL)
        system.wait_until(lambda: not _build_processes(path), 1.0)
    system.unmount_under(path, what=f"unmount the stale rootfs build {path}")
    if system.mounts_under(path):  # never delete through a mount
        raise LabError(f"Failed to remove the stale rootfs build {path}: still mounted")
    shutil.rmtree(path)


def _unused_rootfs(cache_dir: Path, keep: Path) -> list[Path]:
    """Complete rootfs trees of older recipes that no overlay uses any more."""
    base = cache_dir / "rootfs"
    in_use = "\n".join(m.super_options for m in system.mounts() if m.fstype == "overlay")
    return sorted(
        p
        for p in base.glob(f"{SUITE}-*")
        if p != keep and ".tmp-" not in p.name and p.is_dir() and f"lowerdir={p}" not in in_use
    )


def cleanup_stale_builds(cache_dir: Path) -> None:
    """Remove what killed builds left (mounts, half-built trees) unless a build is running now."""
    if not (cache_dir / "rootfs").is_dir():
        return
    with _locked(cache_dir / "rootfs" / ".lock", blocking=False) as got:
        if got:
            for path in _stale_builds(cache_dir):
                _remove_build(path)


def ensure_rootfs(cache_dir: Path, progress: Progress | None = None) -> Path:
    """The complete rootfs for the current recipe, building it first if it is not cached."""
    final = rootfs_dir(cache_dir)
    if final.is_dir():
        return final
    if shutil.which("debootstrap") is None:
        raise LabError(
            "Failed to build the lab rootfs: debootstrap not found (apt-get install -y debootstrap)"
        )
    with _locked(final.parent / ".lock"):
        if final.is_dir():  # built by someone else while we waited
            return final
        for path in _stale_builds(cache_dir):
            if progress:
                progress(f"removing an incomplete rootfs build: {path}")
            _remove_build(path)
        tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
        log = final.with_name(f"{final.name}.build.log")
        if progress:
            progress(f"building the lab rootfs with debootstrap (once, about 1-2 min): {final}")
        started = time.monotonic()
        with log.open("w") as out:
            try:
                rc = _run_logged(debootstrap_argv(tmp), out)
            except BaseException:
                with contextlib.suppress(Exception):
                    _remove_build(tmp)
                raise
        if rc != 0:
            with contextlib.suppress(Exception):
                _remove_build(tmp)
            raise LabError(
                f"Failed to build the lab rootfs: debootstrap exited with {rc} (log: {log}):\n"
                + system.tail(log, 10)
            )
        try:
            bake(tmp)
            os.rename(tmp, final)
        except BaseException:
            with contextlib.suppress(Exception):
                _remove_build(tmp)
            raise
        if progress:
            progress(f"rootfs built in {time.monotonic() - started:.0f} s")
        for old in _unused_rootfs(cache_dir, final):
            if progress:
                progress(f"removing the rootfs of an older recipe: {old}")
            with contextlib.suppress(OSError):
                shutil.rmtree(old)
                old.with_name(f"{old.name}.build.log").unlink()
        return final


def _run_logged(argv: list[str], out: IO[str]) -> int:
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    try:
        return proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise


def bake(root: Path) -> None:
    """Turn a fresh debootstrap tree into a lab image (paths are joined under root, never followed out)."""
    etc = root / "etc"
    # One machine-id per host, not one per image: empty file here (systemd fills it at boot, or the
    # lab writes one per host); dbus's copy must follow it, not keep the build's id.
    (etc / "machine-id").write_text("")
    dbus_id = root / "var/lib/dbus/machine-id"
    if dbus_id.is_symlink() or dbus_id.exists():
        dbus_id.unlink()
    dbus_id.parent.mkdir(parents=True, exist_ok=True)
    dbus_id.symlink_to("/etc/machine-id")
    # No resolver and no default route: anything that tries DNS fails at once instead of hanging.
    resolv = etc / "resolv.conf"
    if resolv.is_symlink():
        resolv.unlink()
    resolv.write_text("")
    resolv.chmod(0o644)
    (etc / "hostname").write_text("localhost\n")
    (etc / "hosts").write_text(HOSTS)
    # sshd: each host gets its own host key from the lab; the build's keys would be shared by all.
    for key in (etc / "ssh").glob("ssh_host_*"):
        key.unlink()
    conf_d = etc / "ssh/sshd_config.d"
    conf_d.mkdir(parents=True, exist_ok=True)
    (conf_d / "00-fleetops-lab.conf").write_text(SSHD_CONFIG)
    # Mask units that make no sense in a container.
    units = root / "usr/lib/systemd/system"
    local = etc / "systemd/system"
    for unit in MASKED_UNITS:
        if not (units / unit).exists():
            continue
        link = local / unit
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to("/dev/null")
        for wants in local.glob(f"*.wants/{unit}"):
            wants.unlink()
        for wants in local.glob(f"*.wants/{unit.replace('@.', '@*.')}"):
            wants.unlink()
    root_ssh = root / "root/.ssh"
    root_ssh.mkdir(mode=0o700, exist_ok=True)
    # Nothing from the build host's package cache or logs.
    for leftover in (root / "var/cache/apt/archives").glob("*.deb"):
        leftover.unlink()
