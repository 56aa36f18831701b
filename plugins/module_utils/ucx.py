# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The ucx_mmap_hooks detector: processes running UCX with the memory-hook setup that leaks.

The Mistral / vLLM incident: UCX hooks mmap/munmap (``UCX_MEM_MMAP_HOOK_MODE``, default
``bistro``) and queues unmapped regions for its registration cache; with
``UCX_RCACHE_MAX_UNRELEASED=inf`` (the default since UCX 1.16) the queue never drained and
decode workers grew by ~400 MB/min of anonymous mappings. UCX 1.21 fixed the cause
(openucx/ucx#11248); a bounded ``UCX_RCACHE_MAX_UNRELEASED`` (the default fix, see DEFAULT_FIX) or
``UCX_MEM_MMAP_HOOK_MODE=none`` avoids it on any version.

What it reads, and what it costs:

- ``/proc/PID/maps`` of every process, once, looking for ``libucm`` / ``libucs`` (also the copies
  wheels rename, ``libucm-e091ff91.so.0.0.0``); reading stops at the first UCX library.
  ~75 us for a process of 80 mappings, so ~80 ms for 1,000 processes (bench/ucx_process_scan_cost.py).
  Kernel threads have no mappings: an empty read.
- Only for the processes with UCX: ``environ`` (the launch environment; ``os.environ`` writes
  made later inside the process are invisible there), ``cgroup`` (the owning unit), ``comm``,
  ``cmdline``, the UCX config files UCX itself reads (``ucx.conf`` beside the library, in
  ``$HOME`` and in the working directory; ``/etc/ucx/ucx.conf`` for a distribution's UCX), one
  ``systemctl show -p Id,Environment`` for all the owning units together, and the UCX version
  once per library directory: the ``ucx.pc`` pkg-config file beside the library, the libucx
  wheel's version file or dist-info, else ``ucx_info -v`` beside the library (only when it and the
  library directory are root's and not writable by others: the scan runs as root; an exec that
  loads UCX costs 0.1 s to 0.4 s), else a version in the library path.

Stdlib only; importable on Python >= 3.9.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import stat
import time

from ansible_collections.fleetops.node.plugins.module_utils.findings import (
    DetectorError,
    make_finding,
)
from ansible_collections.fleetops.node.plugins.module_utils.procs import (
    PROC,
    list_pids,
    parse_cgroup_unit,
    parse_cmdline,
    read_bytes,
)
from ansible_collections.fleetops.node.plugins.module_utils.systemd import is_systemd_host, parse_show
from ansible_collections.fleetops.node.plugins.module_utils.systemd import (
    parse_environment as parse_unit_environment,
)

CHECK = "ucx_mmap_hooks"
HOOK_VAR = "UCX_MEM_MMAP_HOOK_MODE"
RCACHE_VAR = "UCX_RCACHE_MAX_UNRELEASED"
VARIABLES = (HOOK_VAR, RCACHE_VAR)
# `ucx_info -c` of UCX 1.22 (libucx-cu12): UCX_MEM_MMAP_HOOK_MODE=bistro, UCX_RCACHE_MAX_UNRELEASED=inf.
UCX_DEFAULTS = {HOOK_VAR: "bistro", RCACHE_VAR: "inf"}
FIXED_IN = (1, 21)
UPSTREAM_FIX = "openucx/ucx#11248"
HOOKS_OFF = "none"
# The environment fixes, the one place they are defined, the default one first (the finding's text,
# `fleetops remediate fix --ucx-fix`).
#
# Why the bounded registration cache is the default (README, "The UCX fix"): it is what nixl sets
# itself (ai-dynamo/nixl#1210: RCACHE_MAX_UNRELEASED=1024) and what vLLM's ROCm path moved to after
# hooks off crashed its NIXL tests (vllm-project/vllm#32570, replacing #32181's hook mode none). It
# keeps the hooks and the cache and only bounds the queue that leaked. Hooks off makes UCX fail to
# create the registration cache (RCACHE_ENABLE=try carries on without one): every transfer then
# registers its memory again, and on UCX releases without openucx/ucx#11485 a rendezvous aborted by a
# peer failure (a NIC flap during a large transfer) crashes the process in
# ucs_rcache_region_invalidate (openucx/ucx#11467, UCX 1.18). It applies to UCX < 1.21 only: from
# 1.21 (openucx/ucx#11248) the finding is info and nothing is changed.
DEFAULT_FIX = "rcache-bound"
FIXES = {
    "rcache-bound": {RCACHE_VAR: "1024"},
    "hooks-off": {HOOK_VAR: HOOKS_OFF},
}
# What the finding says about the alternative (hooks off), after the default fix.
HOOKS_OFF_CAVEAT = (
    "hooks off also turns the registration cache off (slower transfers; a crash on a peer failure "
    "during a large transfer, openucx/ucx#11467)"
)

_NEEDLES = (b"/libucm", b"/libucs")
# The path column of a maps line naming a UCX core library (renamed wheel copies included).
_LIB_RE = re.compile(
    rb"(/[^\n]*?/lib(?:ucm|ucs)(?:-[0-9a-f]{6,})?\.so(?:\.[0-9]+)*)(?: \(deleted\))?$", re.MULTILINE
)
_PATH_VERSION_RE = re.compile(r"(?i)(?:^|[/_-])ucx[-_/]?v?(\d+\.\d+(?:\.\d+)?)(?=[/_.-]|$)")
_UCX_INFO_VERSION_RE = re.compile(r"Library version:\s*(\d+\.\d+(?:\.\d+)?)")
_PC_VERSION_RE = re.compile(r"^Version:\s*(\d+\.\d+(?:\.\d+)?)", re.MULTILINE)
_DIST_INFO_RE = re.compile(r"^libucx(?:[-_]cu\d+)?-(\d+\.\d+(?:\.\d+)?)[^/]*\.dist-info$")
_VERSION_RE = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")
_BOUND_RE = re.compile(r"^\d+[kmgt]?b?$")
_UNBOUNDED = ("inf", "infinity", "auto", "")
_SOURCE_TEXT = {
    "environ": "from the process environment",
    "unit": "set by the unit",
    "file": "from a UCX config file",
    "default": "UCX default",
}


class UcxError(DetectorError):
    pass


# ------------------------------------------------------------------------------------- parsers


def find_ucx_libraries(maps):
    """The distinct UCX core library paths (libucm / libucs) in /proc/PID/maps bytes, in order."""
    if not any(needle in maps for needle in _NEEDLES):
        return []
    found = []
    for match in _LIB_RE.finditer(maps):
        path = match.group(1).decode("utf-8", "replace").lstrip()
        path = path[path.find("/") :]
        if path not in found:
            found.append(path)
    return found


def parse_environ(data, names=None):
    """{NAME: value} of the ``UCX_*`` variables (and ``HOME``) in /proc/PID/environ bytes."""
    values = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if not sep:
            continue
        name = key.decode("utf-8", "replace")
        if name.startswith("UCX_") or name == "HOME" or (names and name in names):
            values[name] = value.decode("utf-8", "replace")
    return values


def parse_ucx_conf(text):
    """{NAME: value} of the global (section-less) ``UCX_*`` settings of a ucx.conf.

    Settings under a ``[section]`` apply only on matching hardware (``CPU model=Grace``); they are
    not taken.
    """
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            break
        key, sep, value = line.partition("=")
        key = key.strip()
        if sep and key.startswith("UCX_"):
            values[key] = value.strip()
    return values


def parse_version(text):
    """``(major, minor, patch)`` from a version string, or None."""
    match = _VERSION_RE.match((text or "").strip())
    if not match:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def version_from_path(path):
    """A UCX version named in a library path (``/opt/ucx-1.19.0/lib/libucs.so.0``), or None."""
    match = _PATH_VERSION_RE.search(path)
    return match.group(1) if match else None


def parse_ucx_info_version(text):
    """The library version from ``ucx_info -v`` output (``# Library version: 1.22.0``), or None."""
    match = _UCX_INFO_VERSION_RE.search(text or "")
    return match.group(1) if match else None


def parse_pkgconfig_version(text):
    match = _PC_VERSION_RE.search(text or "")
    return match.group(1) if match else None


def rcache_is_bounded(value):
    """True when UCX_RCACHE_MAX_UNRELEASED bounds the queue (a count, optionally with a unit)."""
    return bool(_BOUND_RE.match(value.strip().lower())) and value.strip().lower() not in _UNBOUNDED


def fix_text():
    """The fixes of FIXES as a finding says them: ``A=x (or B=y: caveat)``, DEFAULT_FIX first."""
    names = [DEFAULT_FIX] + [name for name in FIXES if name != DEFAULT_FIX]
    texts = []
    for name in names:
        text = " ".join("%s=%s" % item for item in sorted(FIXES[name].items()))
        if name == "hooks-off" and name != DEFAULT_FIX:
            text += ": " + HOOKS_OFF_CAVEAT
        texts.append(text)
    return texts[0] + "".join(" (or %s)" % text for text in texts[1:])


def hooks_are_on(value):
    return value.strip().lower() != HOOKS_OFF


def effective_values(environ, unit_env, file_env, file_paths=None):
    """The value UCX uses for each variable, and where it comes from.

    ``environ`` is the process's launch environment (None when unreadable: the unit's
    Environment= stands in for it), ``unit_env`` the owning unit's Environment=, ``file_env`` the
    merged ucx.conf settings. The environment wins over config files; config files over UCX's
    defaults. ``source`` is ``unit`` when the process got the value from its unit's Environment=,
    ``environ`` when it has it from elsewhere (a wrapper, EnvironmentFile=), ``file`` or ``default``.
    """
    result = {}
    for name in VARIABLES:
        unit_value = (unit_env or {}).get(name)
        env_value = None if environ is None else environ.get(name)
        if environ is None and unit_value is not None:
            env_value = unit_value
        if env_value is not None:
            source = "unit" if unit_value is not None and unit_value == env_value else "environ"
            value = env_value
        elif name in (file_env or {}):
            value, source = file_env[name], "file"
        else:
            value, source = UCX_DEFAULTS[name], "default"
        entry = {
            "value": value,
            "source": source,
            "environ": None if environ is None else environ.get(name),
            "unit": unit_value,
        }
        if source == "file":
            entry["file"] = (file_paths or {}).get(name)
        result[name] = entry
    return result


def classify(version, variables, growing=None):
    """``(severity or None, reason)`` of one UCX process by the version-aware policy."""
    hooks = hooks_are_on(variables[HOOK_VAR]["value"])
    bounded = rcache_is_bounded(variables[RCACHE_VAR]["value"])
    if not hooks:
        return None, "mmap hooks off"
    if bounded:
        return None, "registration cache bounded"
    parsed = parse_version(version)
    if parsed is not None and parsed[:2] >= FIXED_IN:
        return "info", "fixed upstream"
    if growing:
        return "critical", "leaking"
    return "warning", "unknown version" if parsed is None else "unfixed version"


# ------------------------------------------------------------------------------------- collect


def _scan_maps(path):
    """``(maps, hit)``: one process's maps, read until the chunk holding the first UCX library.

    ``(None, False)`` when it cannot be read.

    maps is a seq_file: every read returns whole lines, so the line of a hit is complete in its
    chunk. Each chunk is searched once (a needle split across chunks is caught by the overlap).
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None, False
    try:
        chunks = []
        tail = b""
        hit = False
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            window = tail + chunk if tail else chunk
            if _NEEDLES[0] in window or _NEEDLES[1] in window:
                hit = True
                break
            tail = chunk[-8:]
        return b"".join(chunks), hit
    except OSError:
        return None, False
    finally:
        os.close(fd)


def scan_processes(proc=PROC):
    """``(hits, counts)``: {pid: [library paths]} of processes with UCX loaded, and scan counts."""
    started = time.monotonic()
    hits = {}
    scanned = no_mm = unreadable = 0
    own = os.getpid()
    for pid in list_pids(proc):
        if pid == own:
            continue
        data, hit = _scan_maps("%s/%d/maps" % (proc, pid))
        if data is None:
            if os.path.exists("%s/%d" % (proc, pid)):
                unreadable += 1
            continue
        if not data:
            no_mm += 1  # a kernel thread (or a zombie): no address space
            continue
        scanned += 1
        libraries = find_ucx_libraries(data) if hit else None
        if libraries:
            hits[pid] = libraries
    counts = {
        "processes_scanned": scanned,
        "kernel_threads": no_mm,
        "unreadable": unreadable,
        "scan_ms": round((time.monotonic() - started) * 1000.0, 3),
    }
    return hits, counts


def _read_text(path, limit=None):
    data = read_bytes(path, limit)
    return None if data is None else data.decode("utf-8", "replace")


def _root_owned_not_writable(path):
    try:
        st = os.stat(path)
    except OSError:
        return False
    return st.st_uid == 0 and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _safe_to_run(binary, libdir):
    """Only a root-owned ucx_info in root-owned directories, with root-owned libraries, is run."""
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        return False
    return all(_root_owned_not_writable(p) for p in (binary, os.path.dirname(binary), libdir))


class _VersionProbe(object):
    """The UCX version of each library directory, probed once per scan."""

    def __init__(self, run):
        self.run = run
        self.cache = {}

    def version(self, libdir, root, same_ns):
        key = ("/" if same_ns else root, libdir)
        if key not in self.cache:
            self.cache[key] = self._probe(libdir, root, same_ns)
        return self.cache[key]

    def _probe(self, libdir, root, same_ns):
        """Files first (cheap); ``ucx_info -v`` only when no file names the version (an exec
        that loads UCX: 0.1 s to 0.4 s)."""
        inside = (lambda p: p) if same_ns else (lambda p: root + p)
        pc = os.path.join(libdir, "pkgconfig", "ucx.pc")
        version = parse_pkgconfig_version(_read_text(inside(pc), 8192))
        if version:
            return version, "pkg-config file %s" % pc
        package = os.path.normpath(os.path.join(libdir, ".."))
        for name in ("UCX_WHEEL_VERSION.txt", "VERSION"):  # libucx wheels >= 1.20 / <= 1.19
            wheel_file = os.path.join(package, name)
            text = _read_text(inside(wheel_file), 256)
            if text and parse_version(text):
                return text.strip(), "wheel version file %s" % wheel_file
        site = os.path.dirname(package)
        try:
            names = os.listdir(inside(site))
        except OSError:
            names = []
        for name in sorted(names):
            match = _DIST_INFO_RE.match(name)
            if match:
                return match.group(1), "wheel dist-info %s" % os.path.join(site, name)
        candidates = [os.path.normpath(os.path.join(libdir, "..", "bin", "ucx_info"))]
        if libdir.startswith(("/usr/lib", "/lib")):
            candidates.append("/usr/bin/ucx_info")
        if same_ns and self.run is not None:
            for binary in candidates:
                if not _safe_to_run(binary, libdir):
                    continue
                rc, out, _err = self.run(["timeout", "10", "env", "LD_LIBRARY_PATH=" + libdir, binary, "-v"])
                version = parse_ucx_info_version(out) if rc == 0 else None
                if version:
                    return version, "ucx_info -v (%s)" % binary
        version = version_from_path(libdir)
        if version:
            return version, "library path"
        return None, None


def _config_files(libdir, environ):
    """The ucx.conf files UCX reads for a process, in UCX's order (a later file wins), but for the
    one in its working directory, which comes last."""
    files = []
    if libdir.startswith(("/usr/lib", "/lib")):
        files.append("/etc/ucx/ucx.conf")  # a distribution's UCX: sysconfdir /etc
    files.append(os.path.normpath(os.path.join(libdir, "..", "etc", "ucx", "ucx.conf")))
    home = (environ or {}).get("HOME")
    if home:
        files.append(os.path.join(home, "ucx.conf"))
    return files


def _unit_environments(run, units):
    """{unit: {NAME: value}} from one ``systemctl show -p Id,Environment`` for all units."""
    if not units:
        return {}
    rc, out, err = run(["systemctl", "show", "-p", "Id,Environment", "--"] + sorted(units))
    if rc != 0:
        raise UcxError("run", "systemctl show", (err or out).strip() or "exit %d" % rc)
    try:
        blocks = parse_show(out)
    except ValueError as exc:
        raise UcxError("parse", "systemctl show output", str(exc))
    result = {}
    for props in blocks:
        if props.get("Id"):
            result[props["Id"]] = parse_unit_environment(props.get("Environment", ""))
    return result


def collect(run, proc=PROC, systemd_dir="/run/systemd/system"):
    """One sample: every process with UCX loaded, its effective settings, unit and UCX version."""
    hits, counts = scan_processes(proc)
    own_ns = _readlink("%s/self/ns/mnt" % proc)
    processes = []
    for pid in sorted(hits):
        base = "%s/%d/" % (proc, pid)
        environ_data = read_bytes(base + "environ")
        cgroup = _read_text(base + "cgroup")
        if cgroup is None:
            continue  # exited
        unit, manager, cgroup_path = parse_cgroup_unit(cgroup)
        ns = _readlink(base + "ns/mnt")
        library = hits[pid][0]
        processes.append(
            {
                "pid": pid,
                "comm": (_read_text(base + "comm") or "").strip(),
                "cmdline": parse_cmdline(read_bytes(base + "cmdline", 4096) or b""),
                "libraries": hits[pid],
                "libdir": os.path.dirname(library),
                "unit": unit,
                "unit_manager": manager,
                "cgroup": cgroup_path,
                "environ_readable": environ_data is not None,
                "_environ": None if environ_data is None else parse_environ(environ_data),
                "_cwd": _readlink(base + "cwd"),
                "_cwd_conf": base + "cwd/ucx.conf",
                "same_mount_ns": ns is not None and ns == own_ns,
                "_root": base + "root",
            }
        )
    systemd = is_systemd_host(systemd_dir)
    unit_envs = {}
    units = set(p["unit"] for p in processes if p["unit"] and p["unit_manager"] == "system")
    if systemd and units:
        unit_envs = _unit_environments(run, units)
    probe = _VersionProbe(run)
    files = {}
    for entry in processes:
        environ = entry.pop("_environ")
        root = entry.pop("_root")
        cwd = entry.pop("_cwd")
        cwd_conf = entry.pop("_cwd_conf")
        inside = (lambda p: p) if entry["same_mount_ns"] else (lambda p, r=root: r + p)
        version, source = probe.version(entry["libdir"], root, entry["same_mount_ns"])
        entry["version"], entry["version_source"] = version, source
        file_env, file_paths = {}, {}
        for path in _config_files(entry["libdir"], environ):
            key = ("/" if entry["same_mount_ns"] else root, path)
            if key not in files:
                text = _read_text(inside(path), 65536)
                files[key] = parse_ucx_conf(text) if text else {}
            for name, value in files[key].items():
                if name in VARIABLES:
                    file_env[name], file_paths[name] = value, path
        text = _read_text(cwd_conf, 65536)  # /proc/PID/cwd resolves in the process's own namespace
        for name, value in (parse_ucx_conf(text) if text else {}).items():
            if name in VARIABLES:
                file_env[name], file_paths[name] = value, os.path.join(cwd or "<cwd>", "ucx.conf")
        unit_env = unit_envs.get(entry["unit"]) if entry["unit_manager"] == "system" else None
        variables = effective_values(environ, unit_env, file_env, file_paths)
        entry["variables"] = variables
        entry["hooks_on"] = hooks_are_on(variables[HOOK_VAR]["value"])
        entry["rcache_bounded"] = rcache_is_bounded(variables[RCACHE_VAR]["value"])
        entry["restart_pending"] = any(
            v["unit"] is not None and environ is not None and v["environ"] != v["unit"]
            for v in variables.values()
        )
        entry["fixable_unit"] = bool(
            entry["unit"] and entry["unit_manager"] == "system" and entry["unit"].endswith(".service")
        )
    facts = dict(counts)
    facts.update(systemd=systemd, processes=processes, sampled_at=time.time())
    return facts


def _readlink(path):
    try:
        return os.readlink(path)
    except OSError:
        return None


def add_growth(first, second, seconds):
    """The settings of the second sample (a unit restarted in between has new PIDs)."""
    return second


# ------------------------------------------------------------------------------------- evaluate


def _describe(name, entry):
    where = _SOURCE_TEXT[entry["source"]]
    if entry["source"] == "file" and entry.get("file"):
        where = "from " + entry["file"]
    return "%s=%s, %s" % (name, entry["value"], where)


def evaluate(facts, growing=None):
    """One finding per UCX process with the leaking setup; ``growing`` is {pid: growth entry}."""
    findings = []
    for entry in facts.get("processes", []):
        grow = (growing or {}).get(entry["pid"])
        severity, reason = classify(entry["version"], entry["variables"], grow)
        if severity is None:
            continue
        variables = entry["variables"]
        who = "pid %d (%s)" % (entry["pid"], entry["comm"] or "?")
        if entry["unit"]:
            who += " in %s" % entry["unit"]
        version = "UCX %s" % entry["version"] if entry["version"] else "UCX of unknown version"
        text = "%s runs %s with mmap hooks on (%s) and an unbounded registration cache (%s)" % (
            who,
            version,
            _describe(HOOK_VAR, variables[HOOK_VAR]),
            _describe(RCACHE_VAR, variables[RCACHE_VAR]),
        )
        if grow:
            text += "; anonymous memory growing at %s MB/min" % grow["anon_mb_per_min"]
        if reason == "fixed upstream":
            text += "; it no longer leaks on %s, which has the upstream fix (%s, UCX >= 1.21)" % (
                version,
                UPSTREAM_FIX,
            )
            if grow:
                text += ": the growth has another cause"
        else:
            text += (
                "; the setup that leaks anonymous memory on UCX < 1.21"
                + (" (cannot rule it out: version unknown)" if reason == "unknown version" else "")
                + "; fix: "
                + fix_text()
            )
            if entry["fixable_unit"]:
                text += " in %s's environment, then restart it" % entry["unit"]
        pending = [n for n, v in variables.items() if v["unit"] is not None and v["environ"] != v["unit"]]
        if entry["restart_pending"] and pending:
            text += "; %s already sets %s but the process predates it: restart the unit" % (
                entry["unit"],
                ", ".join("%s=%s" % (n, variables[n]["unit"]) for n in pending),
            )
        data = dict(entry)
        data.update(
            fixed_upstream=reason == "fixed upstream",
            policy=reason,
            growth=grow,
            upstream_fix=UPSTREAM_FIX,
        )
        findings.append(make_finding(CHECK, severity, text, data))
    return findings
