# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""One cheap read of the kernel log, shared by the detectors that need it (ena_resets, gpu_health).

Sources, in order:

1. ``/dev/kmsg``, read non-blocking from its start to its end: the kernel's ring buffer, the same
   records ``dmesg`` prints. Its size is fixed at boot (``log_buf_len``, 128 KiB to a few MiB), so
   the cost is O(1) per scan (about 3 ms for 2,000 records) and no process is started. It needs
   CAP_SYSLOG when ``kernel.dmesg_restrict`` is 1 (the default on Ubuntu and Debian), so a scan
   that runs without become usually gets EPERM here and moves on.
2. ``journalctl -k -b -q -o short-unix --grep PATTERN``: the current boot's kernel messages kept by
   journald, readable by members of the ``adm`` / ``systemd-journal`` groups without root; the
   pattern is matched inside journalctl, so only the matching lines cross the pipe.
3. Neither: ``source`` is null and ``error`` says why. That is not a detector error: the
   detectors still report what they can read elsewhere (ethtool, nvidia-smi).

Both sources cover the current boot only (a wrapped ring buffer keeps the newest records). Only
lines that match ``PATTERN`` (the NVIDIA driver's ``NVRM:`` lines, the ena driver's lines, the
netdev TX watchdog) are kept.

Stdlib only; importable on Python >= 3.9.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import os
import re
import time

# What any detector here wants from the kernel log; journalctl gets it as its --grep (PCRE2).
PATTERN = r"NVRM: |^ena |NETDEV WATCHDOG"
_MATCH = re.compile(PATTERN)
KMSG = "/dev/kmsg"
_RECORD_HEAD = re.compile(r"^(\d+),(\d+),(\d+),[^;]*;(.*)$")


class LazyPattern(object):
    """``re.compile(pattern, flags)`` on first use, for a detector's patterns of kernel-log lines: most hosts
    have no such line (no ena driver, no NVIDIA GPU), and compiling them at import cost every host ~1 ms on
    every scan. Its methods are the compiled pattern's."""

    __slots__ = ("_args", "_compiled")

    def __init__(self, pattern, flags=0):
        self._args = (pattern, flags)
        self._compiled = None

    def __getattr__(self, name):
        if self._compiled is None:
            self._compiled = re.compile(*self._args)
        return getattr(self._compiled, name)


def parse_kmsg(text):
    """``[(seconds_since_boot, message)]`` from ``/dev/kmsg`` records (``prio,seq,usec,flags;msg``).

    Continuation lines (``" KEY=VALUE"`` dictionary entries) belong to the record above and are
    skipped; lines that are not records are skipped too (the format is the kernel's ABI, documented
    in Documentation/ABI/testing/dev-kmsg).
    """
    records = []
    for line in text.splitlines():
        if not line or line.startswith(" "):
            continue
        match = _RECORD_HEAD.match(line)
        if match:
            records.append((int(match.group(3)) / 1e6, match.group(4)))
    return records


def parse_short_unix(text):
    """``[(epoch_seconds, message)]`` from ``journalctl -o short-unix`` lines ``EPOCH HOST kernel: MSG``."""
    records = []
    for line in text.splitlines():
        fields = line.split(None, 2)
        if len(fields) < 3:
            continue
        try:
            stamp = float(fields[0])
        except ValueError:
            continue  # "-- No entries --", "-- Boot ... --" and the like
        message = fields[2]
        if message.startswith("kernel: "):
            message = message[len("kernel: ") :]
        records.append((stamp, message))
    return records


def _read_kmsg(path):
    """The whole ring buffer as text; raises OSError (EPERM under dmesg_restrict, ENOENT)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    chunks = []
    try:
        while True:
            try:
                record = os.read(fd, 16384)  # one record per read
            except OSError as err:
                if err.errno == errno.EAGAIN:
                    break  # the end of the buffer
                if err.errno == errno.EPIPE:
                    continue  # records overwritten while reading: the next read resumes after them
                raise
            if not record:
                break
            chunks.append(record)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


def _journalctl():
    for folder in os.environ.get("PATH", "").split(os.pathsep) + ["/usr/bin", "/bin"]:
        path = os.path.join(folder or ".", "journalctl")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def read(run=None, kmsg=KMSG):
    """The kernel log's matching lines: ``{source, error, lines: [(epoch, message)], read_at, read_ms}``.

    ``run(argv) -> (rc, stdout, stderr)`` runs journalctl when ``/dev/kmsg`` cannot be read.
    """
    started = time.monotonic()
    now = time.time()
    errors = []
    try:
        text = _read_kmsg(kmsg)
    except OSError as err:
        errors.append("%s: %s" % (kmsg, os.strerror(err.errno) if err.errno else err))
    else:
        # kmsg stamps are seconds since boot on the monotonic clock: map them to wall time
        boot = now - time.monotonic()
        lines = [(round(boot + stamp, 6), msg) for stamp, msg in parse_kmsg(text) if _MATCH.search(msg)]
        return _result("kmsg", None, lines, now, started)
    journalctl = _journalctl() if run is not None else None
    if journalctl is None:
        errors.append("journalctl: not installed" if run is not None else "journalctl: no command runner")
        return _result(None, "; ".join(errors), [], now, started)
    rc, out, err = run([journalctl, "-k", "-b", "-q", "--no-pager", "-o", "short-unix", "--grep", PATTERN])
    # journalctl exits 1 when --grep matched nothing ("-- No entries --" without -q): not a failure
    if rc not in (0, 1) or (rc == 1 and (err or "").strip()):
        errors.append("journalctl: %s" % ((err or out).strip().splitlines() or ["exit %d" % rc])[-1][:200])
        return _result(None, "; ".join(errors), [], now, started)
    lines = [(stamp, msg) for stamp, msg in parse_short_unix(out) if _MATCH.search(msg)]
    return _result("journal", None, lines, now, started)


def _result(source, error, lines, now, started):
    return {
        "source": source,
        "error": error,
        "lines": lines,
        "read_at": now,
        "read_ms": round((time.monotonic() - started) * 1000.0, 3),
    }


def cached(cache, run=None):
    """``read(run)`` once per ``cache`` dict (one sampling round of node_health shares one read)."""
    if cache is None:
        return read(run)
    if "log" not in cache:
        cache["log"] = read(run)
    return cache["log"]


def summary(log):
    """The facts' view of a read: where it came from and what it cost, without the lines."""
    return {"source": log["source"], "error": log["error"], "read_ms": log["read_ms"]}
