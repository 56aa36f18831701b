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

# Written into every lab host at boot (nspawn and VM; not part of the cached rootfs): what would otherwise measure
# the lab instead of fleetops.
# - sshd offers curve25519 only. OpenSSH 9.2 prefers the post-quantum hybrid sntrup761x25519, whose key pair the
#   connecting client makes: about 90 ms of client CPU a connection here against 15 ms for curve25519-sha256
#   (measured 2026-12-03, 20 connections each). The lab's clients are the controller and the tests on the same 2
#   cores as the hosts, so every connection a test or a benchmark opened paid it. A real fleet keeps its own.
# - MaxStartups (default 10:30:100 unauthenticated connections, dropped at random past 10) is raised: a host of a
#   simulated fleet (fleetops_lab.aliases) takes the connections of many inventory hosts at once.
SSHD_DROPIN = (
    "etc/ssh/sshd_config.d/10-fleetops-lab.conf",
    "# fleetops lab: see fleetops_lab.rootfs.SSHD_DROPIN\n"
    "KexAlgorithms curve25519-sha256,curve25519-sha256@libssh.org\n"
    "MaxStartups 1000\n",
)

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
    in_use = {
        layer
        for m in system.mounts()
        if m.fstype == "overlay"
        for option in m.super_options.split(",")
        if option.startswith("lowerdir=")
        for layer in option.removeprefix("lowerdir=").split(":")
    }
    return sorted(
        p
        for p in base.glob(f"{SUITE}-*")
        if p != keep and ".tmp-" not in p.name and p.is_dir() and str(p) not in in_use
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


# --------------------------------------------------------------------------- the Slurm layer

# Debian 12's Slurm 22.05 and munge, for `fleetops-lab up --slurm` only: installed on demand into a
# layer over the rootfs (an overlay's upper tree, cached like the rootfs), so the rootfs every lab and
# every CI run builds stays as it is. Measured on this machine: see docs/development/lab.md ("A Slurm lab").
SLURM_PACKAGES = ("slurmd", "slurmctld", "slurm-client", "munge")
# Bump when build_slurm_layer() changes in a way the packages do not capture.
SLURM_LAYER_VERSION = 1
SLURM_INSTALL_TIMEOUT_S = 900.0


def slurm_layer_dir(cache_dir: Path) -> Path:
    """Where the Slurm layer for the current rootfs recipe lives (complete when it exists)."""
    blob = json.dumps(
        {"rootfs": recipe_hash(), "packages": list(SLURM_PACKAGES), "version": SLURM_LAYER_VERSION},
        sort_keys=True,
    ).encode()
    return cache_dir / "rootfs" / f"slurm-{hashlib.sha256(blob).hexdigest()[:12]}"


def ensure_slurm_layer(cache_dir: Path, base: Path, progress: Progress | None = None) -> Path:
    """The Slurm layer over ``base`` (the current rootfs), building it first if it is not cached.

    Built as an overlay's upper tree: ``base`` below, apt-get install of SLURM_PACKAGES chrooted into the
    merged view (with a policy-rc.d that keeps every daemon from starting), then the upper tree alone is
    kept. Its daemons stay enabled (munge, slurmd: a slurm lab host starts them at boot once the lab has
    written its key and slurm.conf) except slurmctld, which the lab enables on its controller host only.
    """
    final = slurm_layer_dir(cache_dir)
    if final.is_dir():
        return final
    with _locked(final.parent / ".lock"):
        if final.is_dir():
            return final
        for path in _stale_builds(cache_dir):
            _remove_build(path)
        tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
        log = final.with_name(f"{final.name}.build.log")
        if progress:
            progress(f"installing Slurm into a lab layer (once, about 1 min): {final}")
        started = time.monotonic()
        try:
            _build_slurm_layer(tmp, base, log)
            os.rename(tmp / "upper", final)
            shutil.rmtree(tmp)
        except BaseException:
            with contextlib.suppress(Exception):
                _remove_build(tmp)
            raise
        if progress:
            progress(f"Slurm layer built in {time.monotonic() - started:.0f} s")
        return final


def _build_slurm_layer(tmp: Path, base: Path, log: Path) -> None:
    upper, work, merged = tmp / "upper", tmp / "work", tmp / "merged"
    for path in (upper, work, merged):
        path.mkdir(parents=True)
    system.run_cmd(
        [
            "mount",
            "-t",
            "overlay",
            "fleetops-slurm-build",
            "-o",
            f"lowerdir={base},upperdir={upper},workdir={work}",
            str(merged),
        ],
        what="mount the Slurm layer's build",
    )
    try:
        guard = merged / "usr/sbin/policy-rc.d"
        guard.write_text("#!/bin/sh\nexit 101\n")
        guard.chmod(0o755)
        resolv = merged / "etc/resolv.conf"
        resolv.write_text(Path("/etc/resolv.conf").read_text())
        system.run_cmd(["mount", "-t", "proc", "proc", str(merged / "proc")], what="mount /proc for apt")
        try:
            env = {
                "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                "DEBIAN_FRONTEND": "noninteractive",
                "LC_ALL": "C",
            }
            with log.open("w") as out:
                for argv in (
                    ["apt-get", "update"],
                    ["apt-get", "install", "-y", "--no-install-recommends", *SLURM_PACKAGES],
                    ["apt-get", "clean"],
                ):
                    proc = subprocess.run(
                        ["chroot", str(merged), *argv],
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        env=env,
                        timeout=SLURM_INSTALL_TIMEOUT_S,
                        check=False,
                    )
                    if proc.returncode != 0:
                        raise LabError(
                            f"Failed to build the lab's Slurm layer: {' '.join(argv)} exited with "
                            f"{proc.returncode} (log: {log}):\n" + system.tail(log, 10)
                        )
        finally:
            system.run_cmd(["umount", str(merged / "proc")], what="unmount the build's /proc", check=False)
        guard.unlink()
        resolv.write_text("")
        for lists in (merged / "var/lib/apt/lists").glob("*_*"):
            lists.unlink()
        # One key per lab (the lab writes it), not the build's.
        with contextlib.suppress(FileNotFoundError):
            (merged / "etc/munge/munge.key").unlink()
        # slurmctld runs on the lab's controller host only: the lab enables it there.
        for wants in (merged / "etc/systemd/system").glob("*.wants/slurmctld.service"):
            wants.unlink()
    finally:
        system.run_cmd(["umount", str(merged)], what="unmount the Slurm layer's build", check=False)
