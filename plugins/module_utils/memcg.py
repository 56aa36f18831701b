# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The zombie_memcg detector: count dying ("zombie") memory cgroups and memcg ID headroom.

Pure parsers (text in, data out), a ``collect()`` that reads the real files (every path
injectable for tests) and an ``evaluate()`` that turns facts into findings.

Cost is O(1) in the number of zombies: one read of /proc/cgroups, /proc/self/mountinfo,
/proc/swaps and (v2) the root cgroup.stat, plus a directory walk that is O(live cgroups). It never
reads memory.stat of any cgroup (that walk is the kubelet problem this detector looks for).

Which memcgs hold one of the 65,535 memcg IDs (facts ``id_used`` and ``id_headroom_basis``):
every memcg gets an ID when it is created, and before Linux 4.7 kept it until it was freed,
dying or not. Commit 73f576c04b94 ("mm: memcontrol: fix cgroup creation failure after many small
jobs", first in 4.7, marked for stable 3.19+) made the ID private to the memcg and gives it back
at offline: mm/memcontrol.c mem_cgroup_css_offline() ends with mem_cgroup_id_put(), and the last
put calls mem_cgroup_id_remove() (and drops the css reference the ID held). Its message: "there
are only two instances that actually need an ID after a cgroup is deleted: cache shadow entries
and swapout records"; shadow entries reference it weakly. Swap-outs pin it: mem_cgroup_swapout()
(memcg1_swapout() in newer v1 code) and __mem_cgroup_try_charge_swap() take ID references
(mem_cgroup_id_get_many()) and store the ID with swap_cgroup_record(); mem_cgroup_uncharge_swap()
puts them when the swap entry is freed. A dying memcg whose ID is gone never gets one back
(1f47b61fb407 charges a later swap-out to the first ancestor that still has its ID). So on a
>= 4.7 host with no page in swap (/proc/swaps: no area, or every area's Used 0) dying memcgs hold
no ID and the IDs in use are the live memcgs: Pinterest counted 68,680 memcgs, more than the
65,535 IDs, and this machine's 6.18 kernel still created memcgs with 66,051 counted. Otherwise
(swap in use, a cgroup namespace that cannot count the host's live memcgs, an older or unknown
kernel, an unreadable /proc/swaps) the headroom is against every memcg, dying included: the
worst case. Older kernels that carry a stable backport are treated as the worst case too.

Stdlib only; importable on Python >= 3.9.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import os

from ansible_collections.fleetops.node.plugins.module_utils.findings import (
    DetectorError,
    fmt_int,
    fmt_rate,
    make_finding,
)

CHECK = "zombie_memcg"

# include/linux/memcontrol.h: ((1U << MEM_CGROUP_ID_SHIFT) - 1) with MEM_CGROUP_ID_SHIFT 16.
# At the limit, mkdir of a memory cgroup fails with ENOSPC. Since 4.7 (73f576c04b94)
# mem_cgroup_css_offline() puts the ID unless swap entries hold it, so page-cache zombies alone do
# not use IDs up (measured on 6.18: mkdir still succeeds with 66,051 memcgs counted). Headroom is
# against the live memcgs when that holds and against every memcg otherwise (the module
# docstring, _ids_in_use).
MEM_CGROUP_ID_MAX = 65535
# The first mainline release whose mem_cgroup_css_offline() gives the memcg ID back (73f576c04b94).
ID_RELEASED_AT_OFFLINE_SINCE = (4, 7)
# include/linux/proc_ns.h: the inode of the initial cgroup namespace.
PROC_CGROUP_INIT_INO = 0xEFFFFFFB

PROC_CGROUPS = "/proc/cgroups"
MOUNTINFO = "/proc/self/mountinfo"
CGROUP_NS = "/proc/self/ns/cgroup"
PROC_SWAPS = "/proc/swaps"

DEFAULT_THRESHOLDS = {
    "zombie_warning": 1000,
    "zombie_critical": 20000,
    "headroom_critical_pct": 20.0,
}

BASIS_V1 = (
    "cgroup v1: num_cgroups of the memory line of /proc/cgroups (live + dying memcgs) "
    "minus the directories under the memory hierarchy"
)
BASIS_V1_NAMESPACE = (
    "cgroup v1: num_cgroups of the memory line of /proc/cgroups is host-wide; the directories "
    "under the memory hierarchy are only this namespace's subtree, so zombies are not counted"
)
BASIS_V2_SUBSYS = (
    "cgroup v2: nr_dying_subsys_memory and nr_subsys_memory of the root cgroup.stat (kernel >= 6.12)"
)
BASIS_V2_DESCENDANTS = (
    "cgroup v2: nr_dying_descendants of the root cgroup.stat counts dying cgroups of all "
    "controllers, not only memory (no per-controller count before kernel 6.12); live is "
    "nr_descendants + 1"
)
BASIS_V2_NAMESPACE = (
    "cgroup v2: the root cgroup.stat of this cgroup namespace covers only its subtree, so "
    "zombies are not counted"
)
BASIS_TOTAL_PROC = "; total is num_cgroups of the memory line of /proc/cgroups (host-wide)"
BASIS_TOTAL_STAT = "; total is live + dying from cgroup.stat (/proc/cgroups has no memory line)"

# id_headroom_basis: which memcgs the headroom counts as holding an ID, and why those.
ID_BASIS_LIVE_NO_SWAP = (
    "live memcgs: no swap is active, so dying memcgs hold no ID (released at offline since Linux 4.7)"
)
ID_BASIS_LIVE_SWAP_EMPTY = (
    "live memcgs: swap is on but holds no page (Used 0 in /proc/swaps), so dying memcgs hold no ID "
    "(released at offline since Linux 4.7)"
)
ID_BASIS_SWAP_USED = (
    "every memcg, dying included: swap is in use, and swapped-out pages keep a dying memcg's ID"
)
ID_BASIS_NAMESPACE = (
    "every memcg, dying included: worst case, live memcgs host-wide are unknown in a cgroup namespace"
)
ID_BASIS_SWAP_UNKNOWN = "every memcg, dying included: worst case, swap state unknown (%s)"
ID_BASIS_OLD_KERNEL = (
    "every memcg, dying included: before Linux 4.7 (this is %s) a dying memcg keeps its ID until it is freed"
)
ID_BASIS_KERNEL_UNKNOWN = "every memcg, dying included: worst case, kernel release %r not understood"

_PROC_CGROUPS_FIELDS = ("subsys_name", "hierarchy", "num_cgroups", "enabled")
# mm/swapfile.c swap_show(): the header, then one line per area, "%*s%s\t%lu\t%s%lu\t%s%d\n"
# (the path padded to 40 columns, "partition" or "file\t", Size and Used in KiB, Priority).
_PROC_SWAPS_FIELDS = ("Filename", "Type", "Size", "Used", "Priority")
_MOUNTINFO_ESCAPES = {"\\040": " ", "\\011": "\t", "\\012": "\n", "\\134": "\\"}


class MemcgError(DetectorError):
    """The zombie_memcg detector could not read or parse its input."""


# --------------------------------------------------------------------------------------------
# Pure parsers
# --------------------------------------------------------------------------------------------


def _int_field(value, name, source, lineno):
    try:
        number = int(value, 10)
    except ValueError:
        raise MemcgError("parse", source, "line %d: %s %r is not an integer" % (lineno, name, value))
    if number < 0:
        raise MemcgError("parse", source, "line %d: %s %d is negative" % (lineno, name, number))
    return number


def _require_complete(text, source):
    """Kernel seq_files always end with a newline: a missing one means a truncated read."""
    if not text.strip():
        raise MemcgError("parse", source, "file is empty")
    if not text.endswith("\n"):
        lines = text.split("\n")
        raise MemcgError(
            "parse", source, "line %d: truncated (no trailing newline): %r" % (len(lines), lines[-1][:80])
        )


def parse_proc_cgroups(text, source=PROC_CGROUPS):
    """Parse /proc/cgroups.

    Returns ``{subsys_name: {"hierarchy": int, "num_cgroups": int, "enabled": bool}}``.
    Raises MemcgError on a missing header, a truncated file, a wrong field count, a
    non-integer field or a duplicate controller.
    """
    _require_complete(text, source)
    lines = text.split("\n")[:-1]
    header = lines[0].lstrip("#").split()
    if not lines[0].startswith("#") or tuple(header) != _PROC_CGROUPS_FIELDS:
        raise MemcgError(
            "parse",
            source,
            "line 1: expected the header '#%s', got %r" % ("\t".join(_PROC_CGROUPS_FIELDS), lines[0][:80]),
        )
    controllers = {}
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) != len(_PROC_CGROUPS_FIELDS):
            raise MemcgError(
                "parse",
                source,
                "line %d: expected %d fields (%s), got %d: %r"
                % (lineno, len(_PROC_CGROUPS_FIELDS), " ".join(_PROC_CGROUPS_FIELDS), len(fields), line[:80]),
            )
        name = fields[0]
        if name in controllers:
            raise MemcgError("parse", source, "line %d: controller %r listed twice" % (lineno, name))
        enabled = _int_field(fields[3], "enabled", source, lineno)
        if enabled not in (0, 1):
            raise MemcgError("parse", source, "line %d: enabled %d is not 0 or 1" % (lineno, enabled))
        controllers[name] = {
            "hierarchy": _int_field(fields[1], "hierarchy", source, lineno),
            "num_cgroups": _int_field(fields[2], "num_cgroups", source, lineno),
            "enabled": enabled == 1,
        }
    return controllers


def _unescape_mountinfo(field):
    if "\\" not in field:
        return field
    for escaped, plain in _MOUNTINFO_ESCAPES.items():
        field = field.replace(escaped, plain)
    return field


def parse_mountinfo(text, source=MOUNTINFO):
    """Parse /proc/PID/mountinfo (proc(5)) into a list of mounts, in file order.

    Each mount is a dict: mount_id, parent_id (int), major_minor, root, mount_point,
    mount_options, optional (list), fstype, source, super_options (list of str). Octal
    escapes (``\\040`` for a space) are decoded in root and mount_point.
    """
    _require_complete(text, source)
    mounts = []
    for lineno, line in enumerate(text.split("\n")[:-1], start=1):
        if not line.strip():
            continue
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)
        except ValueError:
            raise MemcgError(
                "parse", source, "line %d: no ' - ' separator after 6 fields: %r" % (lineno, line[:120])
            )
        tail = fields[sep + 1 :]
        if len(tail) < 2:
            raise MemcgError(
                "parse",
                source,
                "line %d: expected fstype, source, super options after ' - ': %r" % (lineno, line[:120]),
            )
        mounts.append(
            {
                "mount_id": _int_field(fields[0], "mount ID", source, lineno),
                "parent_id": _int_field(fields[1], "parent ID", source, lineno),
                "major_minor": fields[2],
                "root": _unescape_mountinfo(fields[3]),
                "mount_point": _unescape_mountinfo(fields[4]),
                "mount_options": fields[5],
                "optional": fields[6:sep],
                "fstype": tail[0],
                "source": _unescape_mountinfo(tail[1]),
                "super_options": tail[2].split(",") if len(tail) > 2 else [],
            }
        )
    return mounts


def visible_mounts(mounts):
    """The mounts not covered by another mount on the same mount point.

    A bind mount over a mount point (``mount --bind SUBTREE /sys/fs/cgroup/memory``, as a
    container runtime does) hides the mount below it; the covering mount names the covered
    one as its parent.
    """
    covered = set()
    by_id = dict((m["mount_id"], m) for m in mounts)
    for mount in mounts:
        parent = by_id.get(mount["parent_id"])
        if parent is not None and parent is not mount and parent["mount_point"] == mount["mount_point"]:
            covered.add(parent["mount_id"])
    return [m for m in mounts if m["mount_id"] not in covered]


def _prefer_full_tree(mounts):
    """The first mount of the whole hierarchy (root '/'), else the first one."""
    for mount in mounts:
        if mount["root"] == "/":
            return mount
    return mounts[0] if mounts else None


def find_memory_mount_v1(mounts):
    """The visible cgroup v1 mount that carries the memory controller, or None.

    Prefers a mount of the whole hierarchy (root '/') over a bind-mounted subtree.
    """
    return _prefer_full_tree(
        [m for m in visible_mounts(mounts) if m["fstype"] == "cgroup" and "memory" in m["super_options"]]
    )


def find_cgroup2_mount(mounts):
    """The visible cgroup2 (unified) mount, or None. Prefers a mount of root '/'."""
    return _prefer_full_tree([m for m in visible_mounts(mounts) if m["fstype"] == "cgroup2"])


def parse_cgroup_stat(text, source="cgroup.stat"):
    """Parse a cgroup v2 ``cgroup.stat`` ("key value" lines) into ``{key: int}``."""
    _require_complete(text, source)
    stat = {}
    for lineno, line in enumerate(text.split("\n")[:-1], start=1):
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) != 2:
            raise MemcgError("parse", source, "line %d: expected 'key value', got %r" % (lineno, line[:80]))
        stat[fields[0]] = _int_field(fields[1], fields[0], source, lineno)
    return stat


def parse_cgroup_controllers(text, source="cgroup.controllers"):
    """Parse a cgroup v2 ``cgroup.controllers`` (one space-separated line) into a list."""
    if text and not text.endswith("\n"):
        raise MemcgError("parse", source, "truncated (no trailing newline): %r" % text[:80])
    return text.split()


def parse_ns_link(link, kind="cgroup", source=CGROUP_NS):
    """The inode number of a namespace link such as ``cgroup:[4026531835]``."""
    prefix = kind + ":["
    if not (link.startswith(prefix) and link.endswith("]")):
        raise MemcgError("parse", source, "expected '%s<inode>]', got %r" % (prefix, link[:80]))
    return _int_field(link[len(prefix) : -1], "inode", source, 1)


def parse_proc_swaps(text, source=PROC_SWAPS):
    """Parse /proc/swaps into a list of active swap areas, in file order.

    Each area is a dict: filename, type, size_kib, used_kib, priority (int). The header alone
    means no swap area is active. Raises MemcgError on a missing header, a truncated file, a
    wrong field count or a non-integer Size / Used / Priority.
    """
    _require_complete(text, source)
    lines = text.split("\n")[:-1]
    if tuple(lines[0].split()) != _PROC_SWAPS_FIELDS:
        raise MemcgError(
            "parse",
            source,
            "line 1: expected the header '%s', got %r" % (" ".join(_PROC_SWAPS_FIELDS), lines[0][:80]),
        )
    areas = []
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split()  # seq_file_path() escapes blanks in the path: always 5 fields
        if len(fields) != len(_PROC_SWAPS_FIELDS):
            raise MemcgError(
                "parse",
                source,
                "line %d: expected %d fields (%s), got %d: %r"
                % (lineno, len(_PROC_SWAPS_FIELDS), " ".join(_PROC_SWAPS_FIELDS), len(fields), line[:80]),
            )
        try:
            priority = int(fields[4], 10)
        except ValueError:
            raise MemcgError("parse", source, "line %d: Priority %r is not an integer" % (lineno, fields[4]))
        areas.append(
            {
                "filename": _unescape_mountinfo(fields[0]),
                "type": fields[1],
                "size_kib": _int_field(fields[2], "Size", source, lineno),
                "used_kib": _int_field(fields[3], "Used", source, lineno),
                "priority": priority,
            }
        )
    return areas


def parse_kernel_release(release):
    """(major, minor) of a kernel release such as ``6.18.44-fc-v595``, or None."""
    parts = release.split(".", 2)
    if len(parts) < 2 or not parts[0].isdigit():
        return None
    digits = 0
    while digits < len(parts[1]) and parts[1][digits] in "0123456789":
        digits += 1
    if not digits:
        return None
    return int(parts[0]), int(parts[1][:digits])


def id_headroom(used):
    """(free memcg IDs, free %) for ``used`` memcg IDs, against MEM_CGROUP_ID_MAX.

    The percentage is rounded down to 2 decimals in integer arithmetic, so it is under a
    threshold exactly when the true share is (52,429 used: 19.99, not 20.0).
    """
    free = max(0, MEM_CGROUP_ID_MAX - used)
    return free, (free * 10000 // MEM_CGROUP_ID_MAX) / 100.0


# --------------------------------------------------------------------------------------------
# Reading the real files
# --------------------------------------------------------------------------------------------


def _read(path):
    with open(path, "rb") as handle:
        return handle.read().decode("utf-8", "replace")


def _read_or_fail(path, label=None):
    try:
        return _read(path)
    except (IOError, OSError) as err:
        raise MemcgError("read", label or path, err.strerror or str(err))


def _host_path(fs_root, path):
    """``path`` (as the kernel names it) under ``fs_root`` (``/`` in production)."""
    return os.path.join(fs_root, path.lstrip("/"))


def count_cgroup_dirs(path, label=None):
    """Directories at and beneath ``path`` (root included): O(live cgroups).

    Uses os.scandir's d_type (no stat per entry) and never opens a cgroup's files. A cgroup
    removed while the walk runs is skipped; any other error raises MemcgError.
    """
    label = label or path
    count = 0
    stack = [path]
    while stack:
        current = stack.pop()
        try:
            entries = os.scandir(current)
        except (IOError, OSError) as err:
            if current != path and err.errno in (errno.ENOENT, errno.ENOTDIR):
                continue  # removed during the walk
            cause = err.strerror or str(err)
            raise MemcgError("walk", label, cause if current == path else "%s: %s" % (current, cause))
        count += 1
        with entries:
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                except (IOError, OSError):
                    continue  # vanished between readdir and the type check
    return count


def _cgroup_namespace(path):
    """(inode or None, text for scope_reason)."""
    try:
        link = os.readlink(path)
    except (IOError, OSError) as err:
        return None, "cgroup namespace unknown (%s: %s)" % (path, err.strerror or err)
    inode = parse_ns_link(link, source=path)
    return inode, link


def _scope(ns_inode, ns_text, mount):
    """("host" | "namespace", reason) from the cgroup namespace and the mount's root field."""
    reasons = []
    if ns_inode is not None and ns_inode != PROC_CGROUP_INIT_INO:
        reasons.append(
            "not in the initial cgroup namespace (%s, initial is cgroup:[%d])"
            % (ns_text, PROC_CGROUP_INIT_INO)
        )
    if mount is not None and mount["root"] != "/":
        reasons.append(
            "the hierarchy mounted at %s is the subtree %s, not the root"
            % (mount["mount_point"], mount["root"])
        )
    if reasons:
        return "namespace", "; ".join(reasons)
    where = " and the hierarchy is mounted at its root" if mount is not None else ""
    if ns_inode is None:
        return "host", ns_text + where + ": treated as the host's view"
    return "host", "initial cgroup namespace (%s)%s" % (ns_text, where)


def _swap_state(path):
    """(KiB in swap or None when unknown, number of active areas, why unknown)."""
    try:
        areas = parse_proc_swaps(_read(path), path)
    except (IOError, OSError) as err:
        return None, 0, "%s: %s" % (path, err.strerror or err)
    except MemcgError as err:
        return None, 0, str(err)
    return sum(area["used_kib"] for area in areas), len(areas), ""


def _kernel_state(release):
    """(release, (major, minor) or None); ``release`` None: this kernel's."""
    if release is None:
        release = os.uname()[2]
    return release, parse_kernel_release(release)


def _ids_in_use(scope, live, total, ids):
    """(id_used, id_headroom_basis): how many memcgs hold an ID, and which ones and why.

    ``ids`` is (_swap_state(), _kernel_state()). The live memcgs when the scope is the host,
    the kernel gives IDs back at offline and no page is in swap; every memcg (the worst case)
    otherwise. Live is capped at the total: on cgroup v2 before 6.12 it counts the cgroups of
    all controllers, and the IDs in use never exceed the memcgs.
    """
    (swap_kib, swap_areas, swap_error), (release, version) = ids
    if scope != "host" or live is None:
        return total, ID_BASIS_NAMESPACE
    if version is None:
        return total, ID_BASIS_KERNEL_UNKNOWN % release
    if version < ID_RELEASED_AT_OFFLINE_SINCE:
        return total, ID_BASIS_OLD_KERNEL % release
    if swap_kib is None:
        return total, ID_BASIS_SWAP_UNKNOWN % swap_error
    if swap_kib > 0:
        return total, ID_BASIS_SWAP_USED
    return min(live, total), ID_BASIS_LIVE_SWAP_EMPTY if swap_areas else ID_BASIS_LIVE_NO_SWAP


def _empty_facts(scope, scope_reason, reason):
    return {
        "cgroup_version": None,
        "scope": scope,
        "total": None,
        "live": None,
        "zombies": None,
        "id_used": None,
        "id_headroom": None,
        "id_headroom_pct": None,
        "id_headroom_basis": "",
        "basis": "",
        "scope_reason": scope_reason,
        "hierarchy": None,
        "reason": reason,
    }


def _facts(version, scope, total, live, zombies, basis, scope_reason, hierarchy, ids):
    used, id_basis = _ids_in_use(scope, live, total, ids)
    free, free_pct = id_headroom(used)
    return {
        "cgroup_version": version,
        "scope": scope,
        "total": total,
        "live": live,
        "zombies": zombies,
        "id_used": used,
        "id_headroom": free,
        "id_headroom_pct": free_pct,
        "id_headroom_basis": id_basis,
        "basis": basis,
        "scope_reason": scope_reason,
        "hierarchy": hierarchy,
        "reason": None,
    }


def _collect_v1(memory_line, mount, ns_inode, ns_text, fs_root, ids):
    total = memory_line["num_cgroups"]
    if mount is None:
        reason = (
            "the cgroup v1 memory hierarchy (hierarchy %d in /proc/cgroups) is not mounted in this "
            "mount namespace; only the host-wide total is known" % memory_line["hierarchy"]
        )
        return _facts(1, "namespace", total, None, None, BASIS_V1_NAMESPACE, reason, None, ids)
    scope, scope_reason = _scope(ns_inode, ns_text, mount)
    hierarchy = mount["mount_point"]
    live = count_cgroup_dirs(_host_path(fs_root, hierarchy), label=hierarchy)
    if scope == "namespace":
        return _facts(1, scope, total, live, None, BASIS_V1_NAMESPACE, scope_reason, hierarchy, ids)
    return _facts(1, scope, total, live, max(0, total - live), BASIS_V1, scope_reason, hierarchy, ids)


def _collect_v2(memory_line, mount, ns_inode, ns_text, fs_root, ids):
    hierarchy = mount["mount_point"]
    stat_label = hierarchy.rstrip("/") + "/cgroup.stat"
    stat = parse_cgroup_stat(_read_or_fail(_host_path(fs_root, stat_label), stat_label), stat_label)
    if "nr_dying_subsys_memory" in stat:
        if "nr_subsys_memory" not in stat:
            raise MemcgError("parse", stat_label, "nr_dying_subsys_memory without nr_subsys_memory")
        live, dying, basis = stat["nr_subsys_memory"], stat["nr_dying_subsys_memory"], BASIS_V2_SUBSYS
    else:
        for key in ("nr_descendants", "nr_dying_descendants"):
            if key not in stat:
                raise MemcgError("parse", stat_label, "no %s (and no nr_dying_subsys_memory)" % key)
        live, dying, basis = stat["nr_descendants"] + 1, stat["nr_dying_descendants"], BASIS_V2_DESCENDANTS
    if memory_line is not None:
        total = memory_line["num_cgroups"]
        basis += BASIS_TOTAL_PROC
    else:
        total = live + dying
        basis += BASIS_TOTAL_STAT
    scope, scope_reason = _scope(ns_inode, ns_text, mount)
    if scope == "namespace":
        if memory_line is None:
            scope_reason += (
                "; /proc/cgroups has no memory line, so total and headroom cover only this subtree"
            )
        return _facts(2, scope, total, live, None, BASIS_V2_NAMESPACE, scope_reason, hierarchy, ids)
    return _facts(2, scope, total, live, dying, basis, scope_reason, hierarchy, ids)


def collect(
    proc_cgroups=PROC_CGROUPS,
    mountinfo=MOUNTINFO,
    cgroupns=CGROUP_NS,
    fs_root="/",
    proc_swaps=PROC_SWAPS,
    kernel_release=None,
):
    """Measure zombie memcgs on this host: the ``memcg`` facts (without growth).

    ``fs_root`` prefixes the mount points found in mountinfo (tests point it at a temporary
    tree). ``proc_swaps`` and ``kernel_release`` (default ``os.uname().release``) decide which
    memcgs hold an ID; an unreadable or malformed /proc/swaps is no error (the headroom is then
    the worst case). Raises MemcgError when another input cannot be read or parsed.
    """
    try:
        cgroups = parse_proc_cgroups(_read(proc_cgroups), proc_cgroups)
    except (IOError, OSError) as err:
        if err.errno != errno.ENOENT:
            raise MemcgError("read", proc_cgroups, err.strerror or str(err))
        cgroups = {}
    memory_line = cgroups.get("memory")
    mounts = parse_mountinfo(_read_or_fail(mountinfo), mountinfo)
    ns_inode, ns_text = _cgroup_namespace(cgroupns)

    if memory_line is not None and not memory_line["enabled"]:
        scope, scope_reason = _scope(ns_inode, ns_text, None)
        return _empty_facts(
            scope,
            scope_reason,
            "the memory controller is disabled (enabled 0 in /proc/cgroups: cgroup_disable=memory)",
        )

    ids = (_swap_state(proc_swaps), _kernel_state(kernel_release))
    v1_mount = find_memory_mount_v1(mounts)
    if v1_mount is not None or (memory_line is not None and memory_line["hierarchy"] != 0):
        if memory_line is None:
            raise MemcgError(
                "parse",
                proc_cgroups,
                "no memory line although a cgroup v1 memory hierarchy is mounted at %s"
                % v1_mount["mount_point"],
            )
        return _collect_v1(memory_line, v1_mount, ns_inode, ns_text, fs_root, ids)

    v2_mount = find_cgroup2_mount(mounts)
    if v2_mount is not None:
        label = v2_mount["mount_point"].rstrip("/") + "/cgroup.controllers"
        controllers = parse_cgroup_controllers(_read_or_fail(_host_path(fs_root, label), label), label)
        if "memory" in controllers:
            return _collect_v2(memory_line, v2_mount, ns_inode, ns_text, fs_root, ids)

    scope, scope_reason = _scope(ns_inode, ns_text, None)
    if memory_line is None:
        why = "/proc/cgroups has no memory line"
    else:
        why = "/proc/cgroups lists memory on the unified hierarchy"
    if v2_mount is None:
        why += " and no cgroup2 hierarchy is mounted"
    else:
        why += " and memory is not in %s/cgroup.controllers" % v2_mount["mount_point"].rstrip("/")
    return _empty_facts(scope, scope_reason, "no memory cgroup controller here: " + why)


# --------------------------------------------------------------------------------------------
# Where the zombies hang (cgroup v2): the targets of a memory.reclaim narrower than the root
# --------------------------------------------------------------------------------------------

MEMORY_RECLAIM = "memory.reclaim"  # cgroup v2, Linux >= 5.19 (94968384dde1)
MEMORY_RECLAIM_SINCE = (5, 19)


def dying_parents(dying):
    """{cgroup: its own dying children} from {live cgroup: nr_dying_descendants}, read in one walk.

    Keys are paths relative to the hierarchy (``""`` the root, ``"system.slice"``,
    ``"system.slice/x.service"``). A cgroup's nr_dying_descendants counts every dying cgroup beneath
    it; less its live children's counts, what is left are dying cgroups whose first live ancestor
    it is (a dying cgroup's dying children count there too). Only cgroups with some are returned;
    counts read a moment apart can disagree, so a negative remainder counts as none.
    """
    own = dict(dying)
    for path, count in dying.items():
        if not path:
            continue
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        if parent in own:
            own[parent] -= count
    return dict((path, count) for path, count in own.items() if count > 0)


def pinned_file_bytes(parent_stat, children_stats):
    """Page cache charged beneath a cgroup but to none of its live children, in bytes.

    ``parent_stat`` and each of ``children_stats`` are parsed ``memory.stat`` files (the ``file``
    key is hierarchical on cgroup v2): the parent's file pages less its live children's are those
    of its dying children (they have no directory, so no memory.stat of their own) plus any
    charged to the parent itself. Never negative.
    """
    total = parent_stat.get("file", 0)
    for stat in children_stats:
        total -= stat.get("file", 0)
    return max(0, total)


def _dying_descendants(path, label):
    try:
        return parse_cgroup_stat(_read(os.path.join(path, "cgroup.stat")), label).get(
            "nr_dying_descendants", 0
        )
    except (IOError, OSError) as err:
        if err.errno in (errno.ENOENT, errno.ENODEV):
            return None  # removed during the walk
        raise MemcgError("read", label, err.strerror or str(err))


def _memory_stat(path, label):
    """A cgroup's parsed memory.stat, or {} when it has none (memory not enabled for it) or is gone."""
    try:
        return parse_cgroup_stat(_read(os.path.join(path, "memory.stat")), label)
    except (IOError, OSError) as err:
        if err.errno in (errno.ENOENT, errno.ENODEV):
            return {}
        raise MemcgError("read", label, err.strerror or str(err))


def find_dying(hierarchy="/sys/fs/cgroup"):
    """{cgroup path relative to ``hierarchy``: nr_dying_descendants} of the live cgroups on the way
    to every dying one (cgroup v2).

    Descends only into cgroups that have dying descendants, so it reads one ``cgroup.stat`` per
    cgroup on those paths and their direct children, not the whole tree.
    """
    found = {}
    root_count = _dying_descendants(hierarchy, hierarchy + "/cgroup.stat")
    if root_count is None:
        raise MemcgError("read", hierarchy + "/cgroup.stat", "no such file")
    found[""] = root_count
    stack = [""] if root_count else []
    while stack:
        rel = stack.pop()
        path = os.path.join(hierarchy, rel) if rel else hierarchy
        try:
            entries = [e.name for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
        except (IOError, OSError) as err:
            if rel and err.errno in (errno.ENOENT, errno.ENOTDIR):
                continue
            raise MemcgError("walk", path, err.strerror or str(err))
        for name in entries:
            child = rel + "/" + name if rel else name
            count = _dying_descendants(os.path.join(hierarchy, child), child + "/cgroup.stat")
            if count is None:
                continue
            found[child] = count
            if count:
                stack.append(child)
    return found


def pick_targets(targets, zombies, min_zombies):
    """The fewest of ``targets`` (most dying first, as reclaim_targets orders them) whose zombies, freed,
    bring ``zombies`` under ``min_zombies``; all of them when that cannot be reached. Parents holding a few
    dying cgroups beside live services (system.slice's own) are left alone when the big one is enough."""
    picked = []
    left = zombies
    for target in targets:
        if picked and left < min_zombies:
            break
        picked.append(target)
        left -= target["dying"]
    return picked


def reclaim_targets(hierarchy="/sys/fs/cgroup"):
    """Where a memory.reclaim frees the zombies and little else (cgroup v2).

    One target per live cgroup that has dying memory cgroups as its own children (dying_parents,
    its ``cgroup.subtree_control`` giving its children the memory controller): ``{"cgroup": path
    as the kernel names it ("/" the root), "dying": count, "bytes": page cache charged beneath it
    but to no live child (pinned_file_bytes), at least a page per dying child}``, most dying first.
    """
    parents = dying_parents(find_dying(hierarchy))
    targets = []
    for rel, count in parents.items():
        path = os.path.join(hierarchy, rel) if rel else hierarchy
        try:
            controllers = _read(os.path.join(path, "cgroup.subtree_control")).split()
        except (IOError, OSError):
            continue  # removed since the walk
        if "memory" not in controllers:
            continue  # its children have no memory cgroup of their own: not zombie memcgs
        try:
            live = [e.path for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
        except (IOError, OSError):
            live = []  # removed since the walk
        label = "/" + rel
        pinned = pinned_file_bytes(
            _memory_stat(path, label.rstrip("/") + "/memory.stat"),
            [_memory_stat(child, child + "/memory.stat") for child in live],
        )
        targets.append({"cgroup": label, "dying": count, "bytes": max(pinned, count * 4096)})
    targets.sort(key=lambda t: (-t["dying"], t["cgroup"]))
    return targets


def add_growth(first, second, seconds):
    """``second`` plus ``growth``: per-minute change of total, live and zombies since ``first``."""
    facts = dict(second)
    if second.get("cgroup_version") is None:
        return facts

    def per_min(key):
        a, b = first.get(key), second.get(key)
        if a is None or b is None or seconds <= 0 or first.get("cgroup_version") != second["cgroup_version"]:
            return None
        return round((b - a) * 60.0 / seconds, 2)

    facts["growth"] = {
        "seconds": round(float(seconds), 3),
        "total_per_min": per_min("total"),
        "live_per_min": per_min("live"),
        "zombies_per_min": per_min("zombies"),
    }
    return facts


# --------------------------------------------------------------------------------------------
# Findings
# --------------------------------------------------------------------------------------------


def evaluate(facts, thresholds=None):
    """Findings for the memcg facts: at most one, of the worst severity.

    warning: zombies >= zombie_warning; critical: zombies >= zombie_critical or
    id_headroom_pct < headroom_critical_pct. The headroom is against ``id_used`` (live memcgs
    or every memcg, see _ids_in_use) and a critical headroom says which, from
    ``id_headroom_basis``. In namespace scope (zombies unknown) an info finding explains the
    scope unless the host-wide headroom is critical.
    """
    limits = dict(DEFAULT_THRESHOLDS)
    limits.update(thresholds or {})
    if facts.get("cgroup_version") is None:
        return []
    zombies, total, live = facts["zombies"], facts["total"], facts["live"]
    free, free_pct = facts["id_headroom"], facts["id_headroom_pct"]
    id_basis = facts.get("id_headroom_basis") or ""
    growth = facts.get("growth")

    noun = (
        "dying cgroups (all controllers)"
        if facts["basis"].startswith(BASIS_V2_DESCENDANTS)
        else "zombie memory cgroups"
    )
    # exact: free / MAX < pct / 100, without float division (13,107 free is exactly 20%)
    headroom_low = free * 100.0 < limits["headroom_critical_pct"] * MEM_CGROUP_ID_MAX
    headroom_text = "%s of %s memcg IDs free" % (fmt_int(free), fmt_int(MEM_CGROUP_ID_MAX))
    if headroom_low:
        headroom_text = "only %s (%s%%, critical under %s%%)" % (
            headroom_text,
            _fmt_pct(free_pct),
            _fmt_pct(limits["headroom_critical_pct"]),
        )

    if headroom_low and id_basis:
        headroom_text += "; counted against " + id_basis

    severity = None
    parts = []
    if zombies is None:
        if headroom_low:
            severity = "critical"
            parts = [
                headroom_text,
                "host-wide memcg total %s" % fmt_int(total),
                "zombie count unknown in a cgroup namespace",
            ]
        else:
            severity = "info"
            parts = [
                "zombie count unknown in a cgroup namespace",
                "host-wide memcg total %s, headroom %s" % (fmt_int(total), fmt_int(free)),
            ]
    else:
        if zombies >= limits["zombie_critical"]:
            severity = "critical"
            parts.append(
                "%s %s (critical at %s)" % (fmt_int(zombies), noun, fmt_int(limits["zombie_critical"]))
            )
        elif zombies >= limits["zombie_warning"]:
            severity = "warning"
            parts.append(
                "%s %s (warning at %s)" % (fmt_int(zombies), noun, fmt_int(limits["zombie_warning"]))
            )
        if headroom_low:
            severity = "critical"
        if severity is None:
            return []
        if not parts:
            parts = [headroom_text, "%s %s, %s live" % (fmt_int(zombies), noun, fmt_int(live))]
        else:
            parts.append(headroom_text)
    if growth:
        rate = growth.get("zombies_per_min")
        label = "zombies"
        if rate is None:
            rate, label = growth.get("total_per_min"), "total"
        if rate is not None:
            parts.append(
                "%s %s/min over %ss" % (label, fmt_rate(rate), _fmt_num(round(growth["seconds"], 1)))
            )

    data = {
        "zombies": zombies,
        "total": total,
        "live": live,
        "id_used": facts.get("id_used"),
        "id_headroom": free,
        "id_headroom_pct": free_pct,
        "id_headroom_basis": id_basis,
        "id_max": MEM_CGROUP_ID_MAX,
        "cgroup_version": facts["cgroup_version"],
        "scope": facts["scope"],
        "thresholds": {
            "zombie_warning": limits["zombie_warning"],
            "zombie_critical": limits["zombie_critical"],
            "headroom_critical_pct": limits["headroom_critical_pct"],
        },
    }
    if growth:
        data["growth"] = dict(growth)
    return [make_finding(CHECK, severity, "; ".join(parts), data)]


def _fmt_num(value):
    return ("%d" % value) if value == int(value) else ("%g" % value)


def _fmt_pct(value):
    return ("%.2f" % value).rstrip("0").rstrip(".")
