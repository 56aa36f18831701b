"""Real faults on the local kernel, for tests, the demo and benchmarks (root only).

``create_zombie_memcgs(n)`` makes ``n`` real zombie memory cgroups on this kernel: for each one it
creates a memory cgroup, moves this process into it, writes one page of a file on disk (the page
cache charged to that cgroup pins it after rmdir), moves the process back and removes the
directory. ``/proc/cgroups`` then counts ``n`` more memory cgroups than there are directories.

``memory_hierarchy()`` finds where the memory controller is mounted: cgroup v1
(``/sys/fs/cgroup/memory``) or cgroup v2 (the unified ``/sys/fs/cgroup``, with ``memory`` in its
``cgroup.controllers``; the controller is switched on in ``cgroup.subtree_control`` down to the
zombies' parent), and says plainly when neither is usable. On v2 the root ``cgroup.stat`` counts
them too (``nr_dying_descendants``). ``ZombieBatch.release()`` deletes the pinning file so the kernel frees them
(asynchronously; ``wait_memcg_total`` waits, with ``sync; echo 1 > /proc/sys/vm/drop_caches``).

All pages live in one file, created before the first cgroup: page ``i`` is written from inside
cgroup ``i``. A file (and its directory entry) created from inside a cgroup would also charge
filesystem metadata to it (directory and inode-table blocks in the block device's page cache),
which deleting the file does not free: those zombies linger until the metadata is written back
and dropped. With one pre-created file, deleting it frees every zombie within milliseconds.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from fleetops.errors import FleetopsError

MEMORY_ROOT = Path("/sys/fs/cgroup/memory")  # cgroup v1
UNIFIED_ROOT = Path("/sys/fs/cgroup")  # cgroup v2
PROC_CGROUPS = Path("/proc/cgroups")
DEFAULT_WORKDIR_PARENT = Path("/var/tmp")
_PAGE = b"z" * 4096
# Filesystems whose pages cannot be dropped (shmem): a zombie pinned there never goes away.
_MEMORY_BACKED_FS = frozenset({"tmpfs", "ramfs", "hugetlbfs", "devtmpfs"})


@dataclass
class ZombieBatch:
    """Zombie memory cgroups created by ``create_zombie_memcgs``, pinned by ``pin_file``."""

    count: int
    cgroup: Path
    workdir: Path
    pin_file: Path
    baseline_total: int
    created_seconds: float
    owns_workdir: bool = True
    owns_cgroup: bool = True
    released: bool = field(default=False)

    def release(self) -> None:
        """Delete the pinning file, and the parent cgroup and work directory if this batch made them.

        The kernel frees the zombies asynchronously once their pages are gone; see
        ``wait_memcg_total``. Safe to call twice.
        """
        if self.released:
            return
        self.pin_file.unlink(missing_ok=True)
        if self.owns_cgroup:
            _rmdir_cgroup(self.cgroup)
        if self.owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        self.released = True

    def __enter__(self) -> ZombieBatch:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def memory_num_cgroups(proc_cgroups: Path = PROC_CGROUPS) -> int:
    """``num_cgroups`` of the memory line of /proc/cgroups (live + dying memory cgroups)."""
    try:
        text = proc_cgroups.read_text()
    except OSError as err:
        raise FleetopsError(f"Failed to read {proc_cgroups}: {err.strerror}") from err
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[0] == "memory":
            return int(fields[2])
    raise FleetopsError(f"Failed to read {proc_cgroups}: no memory line (no cgroup memory controller)")


def drop_page_cache() -> None:
    """``sync; echo 1 > /proc/sys/vm/drop_caches``: frees clean page cache, and the zombies it pins."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("1\n")


def wait_memcg_total(at_most: int, *, timeout: float = 30.0, drop_caches: bool = True) -> int:
    """Poll /proc/cgroups until the memory total is <= ``at_most``; return the last total.

    Freeing a zombie is asynchronous (RCU work after its last page is gone). Returns the last
    total seen when ``timeout`` passes (the caller decides whether that is a failure).
    """
    started = time.monotonic()
    last_drop = started
    while True:
        total = memory_num_cgroups()
        now = time.monotonic()
        if total <= at_most or now - started >= timeout:
            return total
        # Give the kernel a moment first; then drop clean page cache every second (metadata
        # written back since the last drop becomes clean and droppable).
        if drop_caches and now - last_drop >= 1.0:
            drop_page_cache()
            last_drop = now
        time.sleep(0.02)


@dataclass(frozen=True)
class MemoryHierarchy:
    """Where the memory controller is: cgroup ``version`` 1 or 2, mounted at ``root``."""

    version: int
    root: Path


def memory_hierarchy(v1_root: Path = MEMORY_ROOT, v2_root: Path = UNIFIED_ROOT) -> MemoryHierarchy:
    """The mounted memory controller: cgroup v1 at ``v1_root``, else cgroup v2 at ``v2_root``.

    v1: ``v1_root`` has cgroup.procs and memory.usage_in_bytes. v2: ``v2_root`` has cgroup.controllers
    listing ``memory``. Neither: a FleetopsError that says what was looked for.
    """
    if (v1_root / "cgroup.procs").exists() and (v1_root / "memory.usage_in_bytes").exists():
        return MemoryHierarchy(1, v1_root)
    controllers = v2_root / "cgroup.controllers"
    try:
        available = controllers.read_text().split()
    except OSError:
        available = None
    if available is not None and "memory" in available:
        return MemoryHierarchy(2, v2_root)
    found = (
        f"{controllers} lists {' '.join(available) or 'no controller'}"
        if available is not None
        else f"no {controllers}"
    )
    raise FleetopsError(
        "Failed to create zombie memory cgroups: no usable memory cgroup controller: neither a cgroup v1 "
        f"memory hierarchy at {v1_root} nor cgroup v2 at {v2_root} with memory in cgroup.controllers ({found})"
    )


def _enable_memory(cgroup: Path) -> None:
    """cgroup v2: give ``cgroup``'s children the memory controller (``+memory`` in its subtree_control)."""
    control = cgroup / "cgroup.subtree_control"
    if "memory" not in control.read_text().split():
        control.write_text("+memory\n")


def _own_memory_cgroup(root: Path, version: int = 1) -> Path:
    """This process's memory cgroup directory, from /proc/self/cgroup (v1: the line with memory;
    v2: the ``0::`` line)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if (version == 1 and "memory" in parts[1].split(",")) or (
            version == 2 and parts[0] == "0" and parts[1] == ""
        ):
            path = root / parts[2].lstrip("/")
            if not (path / "cgroup.procs").exists():
                raise FleetopsError(
                    f"Failed to find this process's memory cgroup: {path} does not exist "
                    "(a cgroup namespace or another mount of the hierarchy?)"
                )
            return path
    what = "memory line" if version == 1 else "cgroup v2 (0::) line"
    raise FleetopsError(f"Failed to find this process's memory cgroup: no {what} in /proc/self/cgroup")


def _fstype_of(path: Path) -> str:
    """The filesystem type of the mount holding ``path`` (longest mount-point prefix)."""
    target = str(path.resolve())
    best, fstype = "", ""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        mount_point = fields[4].replace("\\040", " ")
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best):
            best, fstype = mount_point, right.split()[0]
    return fstype


def _check_environment(root: Path | None) -> MemoryHierarchy:
    if os.geteuid() != 0:
        raise FleetopsError("Failed to create zombie memory cgroups: needs root (cgroup mkdir and migration)")
    if root is None:
        return memory_hierarchy()
    if (root / "cgroup.procs").exists() and (root / "memory.usage_in_bytes").exists():
        return MemoryHierarchy(1, root)
    with contextlib.suppress(OSError):
        if "memory" in (root / "cgroup.controllers").read_text().split():
            return MemoryHierarchy(2, root)
    raise FleetopsError(
        f"Failed to create zombie memory cgroups: no memory cgroup hierarchy at {root} "
        "(neither cgroup v1 memory.usage_in_bytes nor cgroup v2 memory in cgroup.controllers)"
    )


def _write_pid(procs: Path, pid: bytes) -> None:
    fd = os.open(procs, os.O_WRONLY)
    try:
        os.write(fd, pid)
    finally:
        os.close(fd)


def _rmdir_cgroup(path: Path) -> None:
    """rmdir a cgroup; a missing one is fine, EBUSY is retried briefly (a racing migration)."""
    for attempt in range(50):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as err:
            if err.errno != errno.EBUSY or attempt == 49:
                raise
            time.sleep(0.01)


def create_zombie_memcgs(
    count: int,
    *,
    parent: str = "fleetops-faults",
    workdir: Path | None = None,
    root: Path | None = None,
) -> ZombieBatch:
    """Create ``count`` real zombie memory cgroups under ``<root>/<parent>`` (root).

    ``root``: the memory hierarchy (default: found by ``memory_hierarchy()``, cgroup v1 or v2).

    Each is pinned by one page of the file ``workdir/pins`` (default workdir: a new directory under
    /var/tmp; never tmpfs, whose pages cannot be dropped). This process always ends in the
    memory cgroup it started in, even on error; on error the zombies made so far are released.
    """
    if count < 0:
        raise FleetopsError(f"Failed to create zombie memory cgroups: count must be >= 0, got {count}")
    if "/" in parent or parent in ("", ".", ".."):
        raise FleetopsError(f"Failed to create zombie memory cgroups: bad parent name {parent!r}")
    hierarchy = _check_environment(root)
    root = hierarchy.root
    origin_procs = _own_memory_cgroup(root, hierarchy.version) / "cgroup.procs"

    owns_workdir = workdir is None
    work = (
        Path(tempfile.mkdtemp(prefix="fleetops-faults-", dir=DEFAULT_WORKDIR_PARENT))
        if workdir is None
        else workdir
    )
    work.mkdir(parents=True, exist_ok=True)
    fstype = _fstype_of(work)
    if fstype in _MEMORY_BACKED_FS:
        if owns_workdir:
            shutil.rmtree(work, ignore_errors=True)
        raise FleetopsError(
            f"Failed to create zombie memory cgroups: {work} is on {fstype}, whose pages cannot be "
            "dropped; use a directory on disk"
        )

    cgroup = root / parent
    owns_cgroup = not cgroup.exists()
    cgroup.mkdir(exist_ok=True)
    if hierarchy.version == 2:
        try:
            _enable_memory(root)
            _enable_memory(cgroup)
        except OSError as err:
            if owns_cgroup:
                _rmdir_cgroup(cgroup)
            if owns_workdir:
                shutil.rmtree(work, ignore_errors=True)
            raise FleetopsError(
                f"Failed to create zombie memory cgroups: cannot give {cgroup}'s children the memory "
                f"controller: {err.filename}: {err.strerror}"
            ) from err
    batch = ZombieBatch(
        count=0,
        cgroup=cgroup,
        workdir=work,
        pin_file=work / "pins",
        baseline_total=memory_num_cgroups(),
        created_seconds=0.0,
        owns_workdir=owns_workdir,
        owns_cgroup=owns_cgroup,
    )
    pid = str(os.getpid()).encode()
    started = time.monotonic()
    try:
        pin_fd = os.open(batch.pin_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for i in range(count):
                child = cgroup / f"z{i}"
                child.mkdir()
                try:
                    _write_pid(child / "cgroup.procs", pid)
                    try:
                        os.pwrite(pin_fd, _PAGE, i * len(_PAGE))
                    finally:
                        _write_pid(origin_procs, pid)
                finally:
                    _rmdir_cgroup(child)
                batch.count += 1
        finally:
            os.close(pin_fd)
    except OSError as err:
        with contextlib.suppress(OSError):  # the first error is the one to report
            batch.release()
        raise FleetopsError(
            f"Failed to create zombie memory cgroups: {err.filename or cgroup}: {err.strerror} "
            f"(after {batch.count} of {count})"
        ) from err
    except BaseException:
        with contextlib.suppress(OSError):
            batch.release()
        raise
    batch.created_seconds = time.monotonic() - started
    return batch
