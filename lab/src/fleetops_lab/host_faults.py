"""Faults to inject into lab hosts, reproducing the incidents on real systemd hosts.

``install_crashloop_unit`` is the Pinterest incident: a unit named like ``ecs.service``, shipped
in a vendor directory (as a package in the base image would) and enabled, ``Restart=always``,
whose every start charges a few MB of page cache to a fresh memory cgroup of its own — as a
container runtime does for each new container — and then exits 1. Every crash leaves a zombie.

``install_worker_service`` is the Mistral incident: a service running the real UCX (the
``libucx-cu12`` wheel from PyPI, UCX 1.22, unpacked into the lab host as pip would) with a UCP
context initialised under the default configuration (mmap hooks on, unbounded registration
cache), optionally leaking anonymous memory at a known rate with raw mmap calls.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from fleetops_lab import Lab, rootfs
from fleetops_lab.errors import LabError

UNIT_DIR = "/usr/lib/systemd/system"
SCRIPT = "/usr/local/libexec/fleetops-lab/{name}-crash"

_SCRIPT = """#!/bin/bash
# fleetops lab fault: start a "container" in a fresh memory cgroup, write its state to disk
# (page cache charged to that cgroup), then crash. The cgroup is removed; its page cache keeps
# it alive as a zombie. Bash builtins only, but for one mkdir and one rmdir: on a VM lab host
# (TCG, no KVM) every exec costs tens of milliseconds, and the loop restarts as fast as it can.
set -eu
own=
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  # cgroup v2 (a VM lab host): the memory controller must be on in each parent's subtree_control.
  mem=/sys/fs/cgroup
  while IFS=: read -r hid _ path; do
    if [ "$hid" = 0 ]; then own=$path; fi
  done < /proc/self/cgroup
  if [ ! -d "$mem/{name}-tasks" ]; then mkdir -p "$mem/{name}-tasks"; fi
  for cg in "$mem" "$mem/{name}-tasks"; do
    if [[ " $(< "$cg/cgroup.subtree_control") " != *" memory "* ]]; then echo +memory > "$cg/cgroup.subtree_control"; fi
  done
else
  mem=/sys/fs/cgroup/memory
  # The memory hierarchy is read-only inside an nspawn guest until remounted (a real host has it rw).
  while read -r _ _ _ _ point opts _; do
    if [ "$point" = "$mem" ] && [[ ",$opts," == *",ro,"* ]]; then mount -o remount,bind,rw "$mem"; fi
  done < /proc/self/mountinfo
  while IFS=: read -r _ ctrl path; do
    if [[ ",$ctrl," == *",memory,"* ]]; then own=$path; fi
  done < /proc/self/cgroup
fi
task=task-${{EPOCHREALTIME/./}}
mkdir -p {data_dir} "$mem/{name}-tasks/$task"
echo $$ > "$mem/{name}-tasks/$task/cgroup.procs"
printf '%*s' $(( {mb} * 1048576 )) '' > "{data_dir}/$task"
if [ -f "$mem/cgroup.controllers" ]; then
  echo $$ > "$mem$own/cgroup.procs"
else
  echo $$ > "$mem/cgroup.procs" 2>/dev/null || echo $$ > "$mem$own/cgroup.procs"
fi
rmdir "$mem/{name}-tasks/$task"
echo "{name}: agent exited: unable to reach the ECS endpoint" >&2
exit 1
"""

_UNIT = """[Unit]
Description=Amazon Elastic Container Service - container agent (fleetops lab fault)
After=network.target
StartLimitIntervalSec=0

[Service]
Type=simple
Restart=always
RestartSec={restart_sec}
ExecStart={script}

[Install]
WantedBy=multi-user.target
"""


def install_crashloop_unit(
    lab: Lab, host: str, *, name: str = "ecs", restart_sec: float = 1.0, mb: int = 2, start: bool = True
) -> str:
    """Install and enable the crash-looping unit on a lab host; returns the unit name."""
    unit = f"{name}.service"
    script = SCRIPT.format(name=name)
    data_dir = f"/var/lib/{name}/data"
    files = {
        script: (_SCRIPT.format(name=name, data_dir=data_dir, mb=mb), "0755"),
        f"{UNIT_DIR}/{unit}": (_UNIT.format(restart_sec=restart_sec, script=script), "0644"),
    }
    return _install_unit(lab, host, files, unit, start)


def remove_crashloop_unit(lab: Lab, host: str, *, name: str = "ecs") -> None:
    """Undo install_crashloop_unit (unmask, remove the unit, its script and its data)."""
    unit = f"{name}.service"
    lab.run(
        host,
        f"systemctl unmask {unit}; systemctl disable --now {unit}; rm -f {UNIT_DIR}/{unit} "
        f"{SCRIPT.format(name=name)}; rm -rf /var/lib/{name}; systemctl daemon-reload; systemctl reset-failed",
        check=False,
    )


# ------------------------------------------------------------------------------------------------
# The Mistral incident: a real UCX (PyPI libucx-cu12, UCX 1.22) process run by a systemd unit, and
# a process that leaks anonymous memory at a known rate.
# ------------------------------------------------------------------------------------------------

UCX_WHEEL_PROJECT = "libucx-cu12"
UCX_WHEEL_VERSION = "1.22.0"  # has the upstream fix (openucx/ucx#11248, UCX >= 1.21)
UCX_UNFIXED_VERSION = "1.19.0"  # the same wheel before the fix: the Mistral setup leaks on it
WHEEL_CACHE = Path(os.environ.get("FLEETOPS_WHEEL_CACHE", "/var/cache/fleetops/wheels"))
# Inside a lab host: laid out as pip installs the wheel (site-packages/libucx/lib/libucs.so.0 ...),
# one site directory per UCX version.
UCX_SITE = "/opt/fleetops-lab/ucx-{version}/site-packages"
WORKER_SCRIPT = "/usr/local/libexec/fleetops-lab/worker.py"
WORKER_STATE = "/run/fleetops-lab/{name}"

_WORKER = r'''#!/usr/bin/python3
"""fleetops lab worker: a real UCP context (like a vLLM/NIXL decode worker), optionally leaking.

--ucx-libdir DIR      load UCX from DIR (libucs, libuct, libucp), read its config, ucp_init()
--leak-mb-per-min R   mmap(MAP_PRIVATE|MAP_ANONYMOUS) and touch R MiB a minute, never unmapped
It writes UCX's own view of its configuration (ucs_config_parser_print_all_opts) to
STATE/ucx-config.txt, the UCX version to STATE/ucx-version, and its pid to STATE/ready.
"""
import argparse
import ctypes
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--state", required=True)
parser.add_argument("--ucx-libdir")
parser.add_argument("--leak-mb-per-min", type=float, default=0.0)
parser.add_argument("--chunk-kb", type=int, default=1024)
args = parser.parse_args()
os.makedirs(args.state, exist_ok=True)
libc = ctypes.CDLL(None, use_errno=True)

if args.ucx_libdir:
    for name in ("libucs.so.0", "libuct.so.0", "libucp.so.0"):
        ctypes.CDLL(os.path.join(args.ucx_libdir, name), mode=os.RTLD_GLOBAL)
    ucs = ctypes.CDLL(os.path.join(args.ucx_libdir, "libucs.so.0"))
    ucp = ctypes.CDLL(os.path.join(args.ucx_libdir, "libucp.so.0"))
    major, minor, release = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint()
    ucp.ucp_get_version(ctypes.byref(major), ctypes.byref(minor), ctypes.byref(release))
    config = ctypes.c_void_p()
    status = ucp.ucp_config_read(None, None, ctypes.byref(config))
    if status != 0:
        raise SystemExit("ucp_config_read failed: %d" % status)
    params = (ctypes.c_uint64 * 64)()  # ucp_params_t, zeroed
    params[0] = 1  # field_mask = UCP_PARAM_FIELD_FEATURES
    params[1] = 1 | 2  # features = UCP_FEATURE_TAG | UCP_FEATURE_RMA
    context = ctypes.c_void_p()
    ucp.ucp_init_version.argtypes = [ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    status = ucp.ucp_init_version(major.value, minor.value, ctypes.byref(params), config, ctypes.byref(context))
    if status != 0:
        raise SystemExit("ucp_init failed: %d" % status)
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    stream = libc.fopen(os.path.join(args.state, "ucx-config.txt").encode(), b"w")
    ucs.ucs_config_parser_print_all_opts.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p]
    config_list = ctypes.c_char.in_dll(ucs, "ucs_config_global_list")
    ucs.ucs_config_parser_print_all_opts(stream, b"UCX_", 1, ctypes.addressof(config_list))  # PRINT_CONFIG
    libc.fclose(stream)
    with open(os.path.join(args.state, "ucx-version"), "w") as f:
        f.write("%d.%d.%d\n" % (major.value, minor.value, release.value))

with open(os.path.join(args.state, "ready.tmp"), "w") as f:
    f.write("%d\n" % os.getpid())
os.rename(os.path.join(args.state, "ready.tmp"), os.path.join(args.state, "ready"))

if args.leak_mb_per_min <= 0:
    while True:
        time.sleep(3600)

libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
PROT_READ, PROT_WRITE, MAP_PRIVATE, MAP_ANONYMOUS = 1, 2, 0x02, 0x20
chunk = args.chunk_kb * 1024
rate = args.leak_mb_per_min * 1024 * 1024 / 60.0  # bytes per second
started = time.monotonic()
leaked = 0
while True:
    # Time-based: after t seconds exactly rate * t bytes are mapped and touched, whatever the jitter.
    while leaked + chunk <= rate * (time.monotonic() - started):
        addr = libc.mmap(None, chunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise SystemExit("mmap failed: errno %d" % ctypes.get_errno())
        ctypes.memset(addr, 1, chunk)  # touch every page: anonymous RSS
        libc.mprotect(addr, 4096, PROT_READ)  # a read-only first page keeps each chunk its own mapping
        leaked += chunk
    time.sleep(0.05)
'''

_WORKER_UNIT = """[Unit]
Description=fleetops lab worker {name} (a UCX process, like a vLLM/NIXL decode worker)
After=network.target

[Service]
Type=simple
ExecStart=/usr/bin/python3 {script} --state {state}{extra}
Restart=on-failure
RestartSec=1
{environment}
[Install]
WantedBy=multi-user.target
"""


def ucx_libdir(version: str = UCX_WHEEL_VERSION) -> str:
    """Where install_ucx puts UCX's libraries inside a lab host."""
    return UCX_SITE.format(version=version) + "/libucx/lib"


def ensure_ucx_wheel(version: str = UCX_WHEEL_VERSION, cache_dir: Path | None = None) -> Path:
    """The libucx-cu12 wheel of that UCX version, pip-downloaded into the cache on first use. Two callers
    at once (labs side by side, CI's background build): one downloads, under the cache's lock, into a
    temporary directory first, so no caller ever sees half a wheel."""
    cache = cache_dir or WHEEL_CACHE
    pattern = f"{UCX_WHEEL_PROJECT.replace('-', '_')}-{version}-*.whl"
    found = sorted(cache.glob(pattern))
    if found:
        return found[-1]
    cache.mkdir(parents=True, exist_ok=True)
    with rootfs._locked(cache / ".lock"):
        found = sorted(cache.glob(pattern))
        if found:
            return found[-1]
        with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
            argv = [
                sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                "--disable-pip-version-check", "-q", "-d", tmp, f"{UCX_WHEEL_PROJECT}=={version}",
            ]  # fmt: skip
            proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)
            for wheel in Path(tmp).glob(pattern):
                os.replace(wheel, cache / wheel.name)
    found = sorted(cache.glob(pattern))
    if proc.returncode != 0 or not found:
        detail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        raise LabError(
            f"Failed to download {UCX_WHEEL_PROJECT}=={version} into {cache}: "
            + (detail[-1] if detail else f"pip exit {proc.returncode}")
        )
    return found[-1]


def install_ucx(lab: Lab, host: str, version: str = UCX_WHEEL_VERSION) -> str:
    """Unpack the UCX wheel into a lab host as pip would (no static libraries); returns its lib dir.

    An nspawn host gets the files through its root on this machine; a VM host through ssh (tar).
    """
    site_path = UCX_SITE.format(version=version)
    if lab.is_vm(host):
        if lab.run(host, f"test -e {site_path}/libucx/lib/libucs.so.0").returncode == 0:
            return ucx_libdir(version)
        with tempfile.TemporaryDirectory() as tmp:
            staging = Path(tmp) / "site-packages"
            _unpack_wheel(ensure_ucx_wheel(version), staging)
            remote = (
                f"rm -rf {site_path}.tmp && mkdir -p {site_path}.tmp && tar -xf - -C {site_path}.tmp "
                f"&& chmod 755 {site_path.rsplit('/', 1)[0]} && mv {site_path}.tmp {site_path}"
            )
            tar = subprocess.Popen(["tar", "-C", str(staging), "-cf", "-", "."], stdout=subprocess.PIPE)
            proc = subprocess.run(
                lab.ssh_argv(host, remote),
                stdin=tar.stdout,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            if tar.stdout is not None:
                tar.stdout.close()
            if tar.wait() != 0 or proc.returncode != 0:
                raise LabError(
                    f"Failed to copy UCX {version} to {host}: {proc.stderr.strip() or 'tar failed'}"
                )
        return ucx_libdir(version)
    root = lab.host_root(host)
    site = root / site_path.lstrip("/")
    if (site / "libucx/lib/libucs.so.0").exists():
        return ucx_libdir(version)
    staging = site.parent / ".site-packages.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    _unpack_wheel(ensure_ucx_wheel(version), staging)
    os.chmod(site.parent, 0o755)
    staging.rename(site)
    return ucx_libdir(version)


def _unpack_wheel(wheel: Path, staging: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.is_dir() or info.filename.endswith((".a", ".la")):
                continue
            target = staging / info.filename
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            mode = (info.external_attr >> 16) & 0o777
            os.chmod(target, mode or 0o644)
    for path in [staging, *staging.rglob("*")]:
        if path.is_dir():
            os.chmod(path, 0o755)


def install_worker_service(
    lab: Lab,
    host: str,
    *,
    name: str = "ucx-worker",
    ucx: bool = True,
    ucx_version: str = UCX_WHEEL_VERSION,
    leak_mb_per_min: float = 0.0,
    environment: dict[str, str] | None = None,
    start: bool = True,
) -> str:
    """Install (and start) a worker service on a lab host; returns the unit name.

    With ``ucx`` it loads the real UCX (the ``ucx_version`` wheel) and initialises a UCP context, with the
    default UCX configuration unless ``environment`` sets some. With ``leak_mb_per_min`` it maps
    and touches that much anonymous memory a minute.
    """
    unit = f"{name}.service"
    extra = ""
    if ucx:
        extra += f" --ucx-libdir {install_ucx(lab, host, ucx_version)}"
    if leak_mb_per_min:
        extra += f" --leak-mb-per-min {leak_mb_per_min:g}"
    env_lines = "".join(f'Environment="{k}={v}"\n' for k, v in (environment or {}).items())
    files = {
        WORKER_SCRIPT: (_WORKER, "0755"),
        f"{UNIT_DIR}/{unit}": (
            _WORKER_UNIT.format(
                name=name, script=WORKER_SCRIPT, state=WORKER_STATE.format(name=name), extra=extra,
                environment=env_lines,
            ),
            "0644",
        ),
    }  # fmt: skip
    return _install_unit(lab, host, files, unit, start)


def worker_pid(lab: Lab, host: str, *, name: str = "ucx-worker", timeout: float = 30.0) -> int:
    """The pid of the running worker, once it is ready (its UCP context initialised)."""
    unit = f"{name}.service"
    state = WORKER_STATE.format(name=name)
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        proc = lab.run(host, f"systemctl show -p MainPID --value {unit}; cat {state}/ready 2>/dev/null")
        lines = proc.stdout.split()
        last = proc.stdout.strip()
        if len(lines) == 2 and lines[0] == lines[1] and lines[0] != "0":
            return int(lines[0])
        time.sleep(0.2)
    status = lab.run(host, f"systemctl status --no-pager -n 20 {unit}").stdout
    raise LabError(f"Failed to start {unit} on {host}: not ready in {timeout:g} s ({last!r})\n{status}")


def worker_ucx_config(lab: Lab, host: str, *, name: str = "ucx-worker") -> dict[str, str]:
    """UCX's own view of the worker's configuration ({UCX_NAME: value}), as the worker printed it."""
    text = lab.run(host, f"cat {WORKER_STATE.format(name=name)}/ucx-config.txt", check=True).stdout
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.startswith("UCX_"):
            values[key] = value
    return values


def remove_worker_service(lab: Lab, host: str, *, name: str = "ucx-worker") -> None:
    """Undo install_worker_service (the unit, its drop-ins, its state); the UCX files stay."""
    unit = f"{name}.service"
    lab.run(
        host,
        f"systemctl disable --now {unit}; rm -rf {UNIT_DIR}/{unit} /etc/systemd/system/{unit}.d "
        f"{WORKER_STATE.format(name=name)}; systemctl daemon-reload; systemctl reset-failed",
        check=False,
    )


ENV_DROP_IN = "/etc/systemd/system/{unit}.d/40-fleetops-lab-env.conf"


def install_env_dropin(lab: Lab, host: str, unit: str, environment: dict[str, str]) -> str:
    """Drift: give one host's ``unit`` a different environment (a drop-in, then daemon-reload; no restart).

    Returns the drop-in's path. Values must not need quoting beyond systemd's double quotes.
    """
    path = ENV_DROP_IN.format(unit=unit)
    text = "[Service]\n" + "".join(f'Environment="{k}={v}"\n' for k, v in environment.items())
    lab.run(
        host,
        f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0])} && cat > {shlex.quote(path)} && systemctl daemon-reload",
        input=text,
        check=True,
    )
    return path


def remove_env_dropin(lab: Lab, host: str, unit: str) -> None:
    """Undo install_env_dropin."""
    lab.run(host, f"rm -f {shlex.quote(ENV_DROP_IN.format(unit=unit))}; systemctl daemon-reload", check=False)


def _install_unit(lab: Lab, host: str, files: dict[str, tuple[str, str]], unit: str, start: bool) -> str:
    """Write ``files`` ({path: (text, mode)}) on a lab host, then daemon-reload and enable (and start) ``unit``."""
    for path, (text, mode) in files.items():
        lab.run(
            host,
            f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0])} && cat > {shlex.quote(path)} && chmod {mode} {shlex.quote(path)}",
            input=text,
            check=True,
        )
    lab.run(
        host, f"systemctl daemon-reload && systemctl enable {'--now ' if start else ''}{unit}", check=True
    )
    return unit


# ------------------------------------------------------------------------------------------------
# Zombie memory cgroups and kernel-log lines made inside one lab host (real on a VM host, whose
# kernel is its own; on an nspawn host they are this machine's kernel's, seen by every host).
# ------------------------------------------------------------------------------------------------

_ZOMBIES = r"""
import os, sys
n, tag, rel = int(sys.argv[1]), sys.argv[2], sys.argv[3]
v2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
root = "/sys/fs/cgroup" if v2 else "/sys/fs/cgroup/memory"
if not v2 and not os.access(root + "/cgroup.procs", os.W_OK):
    os.system("mount -o remount,bind,rw " + root)
own = ""
for line in open("/proc/self/cgroup"):
    hid, ctrl, path = line.rstrip("\n").split(":", 2)
    if (v2 and hid == "0") or (not v2 and "memory" in ctrl.split(",")):
        own = path
parent = "%s/%s" % (root, rel)
os.makedirs(parent, exist_ok=True)
if v2:  # the memory controller on for each level down to the zombies' parent
    parts = rel.split("/")
    for cg in [root] + ["%s/%s" % (root, "/".join(parts[: i + 1])) for i in range(len(parts))]:
        with open(cg + "/cgroup.subtree_control") as f:
            on = "memory" in f.read().split()
        if not on:
            with open(cg + "/cgroup.subtree_control", "w") as f:
                f.write("+memory")
home = root + own if v2 else root
workdir = "/var/tmp/fleetops-zombies-" + tag
os.makedirs(workdir, exist_ok=True)
pin = os.open(workdir + "/pin", os.O_RDWR | os.O_CREAT, 0o600)  # created before the first cgroup
page = b"z" * 4096
pid = str(os.getpid()).encode()
for i in range(n):
    cg = "%s/fleetops-%s-z%d" % (parent, tag, i)
    os.mkdir(cg)
    fd = os.open(cg + "/cgroup.procs", os.O_WRONLY); os.write(fd, pid); os.close(fd)
    os.pwrite(pin, page, i * 4096)  # one new page of page cache, charged to cgroup i
    fd = os.open(home + "/cgroup.procs", os.O_WRONLY); os.write(fd, pid); os.close(fd)
    os.rmdir(cg)
os.close(pin)
print(workdir + "/pin")
"""


def make_zombie_memcgs(
    lab: Lab, host: str, count: int, *, tag: str = "fault", parent: str | None = None
) -> str:
    """Make ``count`` real zombie memory cgroups on one lab host (cgroup v2 or v1), from inside it.

    Each: mkdir a memory cgroup under ``parent`` (relative to the memory hierarchy's root; default
    ``fleetops-zombies-TAG``, made for them; ``system.slice`` puts them beside the host's services),
    move a process in, write one page of a file on disk
    (page cache charged to it), move out, rmdir. Returns the pinning file's path in the host:
    ``release_zombie_memcgs`` deletes it and the kernel frees them. On a VM host only that host's
    kernel has them; on an nspawn host this machine's kernel has them (every nspawn host sees them).
    """
    proc = lab.run(
        host,
        f"python3 - {int(count)} {shlex.quote(tag)} {shlex.quote(parent or f'fleetops-zombies-{tag}')}",
        input=_ZOMBIES,
        check=True,
        timeout=60 + count / 10,
    )
    return proc.stdout.strip().splitlines()[-1]


def release_zombie_memcgs(lab: Lab, host: str, *, tag: str = "fault") -> None:
    """Undo make_zombie_memcgs: delete the pinning file and the (empty) parent cgroup; drop caches."""
    lab.run(
        host,
        f"rm -rf /var/tmp/fleetops-zombies-{shlex.quote(tag)}; sync; echo 1 > /proc/sys/vm/drop_caches; "
        f"rmdir /sys/fs/cgroup/fleetops-zombies-{shlex.quote(tag)} "
        f"/sys/fs/cgroup/memory/fleetops-zombies-{shlex.quote(tag)} 2>/dev/null; true",
        check=True,
    )


XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
ENA_RESET = "ena 0000:00:05.0 eth0: Trigger reset is on"


def write_kernel_log(lab: Lab, host: str, line: str, *, priority: int = 3) -> None:
    """Write one record into a lab host's kernel log (``/dev/kmsg``, as a driver's printk would).

    On a VM host it is that host's own kernel log: only it reports the line. On an nspawn host it
    goes to this machine's kernel log, which every nspawn host (and this machine) reads.
    """
    if "\n" in line:
        raise LabError("Failed to write to the kernel log: one line at a time")
    lab.run(host, "cat > /dev/kmsg", input=f"<{int(priority)}>{line}\n", check=True)
