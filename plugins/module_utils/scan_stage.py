# -*- coding: utf-8 -*-

# Copyright: (c) 2026, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""node_health's fast path, the target's side: run the detectors from a staged copy of the runner.

The ``fleetops.node.node_health`` action plugin sends this file's source as ``python3 -I -S -c SOURCE``
over the task's connection, one command per host, with a header line on standard input::

    {"sha": "<sha256 of the runner archive>", "params": {<node_health's validated options>}}

optionally followed by the runner archive itself (``playbooks/files/fleetops-detector.tar``: the
collection's stdlib-only module_utils, what the host timer runs). The runner is kept, per archive, in
``~/.ansible/fleetops/runner-<sha>`` of the user the command runs as; with the archive staged, a scan is one
command on the host that imports a handful of compiled files, instead of an AnsiballZ payload that brings
Ansible's own module_utils and is compiled again on every call.

It prints one JSON object, ``{"fleetops_runner": STATE, ...}``:

- ``ok``: ``result`` is node_health's result (what the module returns, without ``changed``).
- ``missing``: the archive is not staged here; send it (the action sends the header again with the archive).
- ``unusable``: the cache cannot be used (``msg`` says why: a symbolic link or a folder another user can write
  in its place, a home that cannot be written, an archive that does not match its sha): the action runs the
  module as Ansible always does. Nothing here is trusted that a user other than this one could have written.
- ``failed``: the runner itself raised (``msg``, ``exception``); the task fails as a module's crash would.

A new archive is unpacked into a private temporary folder and renamed into place, so a folder named
``runner-<sha>`` is always complete; two first scans at once both unpack and one rename wins. Each use touches
its folder; staging a new runner removes the others unused for 14 days and unpack folders killed runs left.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import stat
import sys
import time

# hashlib, io, shutil, tarfile and tempfile (staging), traceback (a crash) and shlex (the controller's side)
# are imported where they are used: a scan of a host with its runner staged needs none of them, and every
# import here is paid by every host on every scan (about 6 ms of the host's CPU for these); no contextlib
# (0.4 ms) for one suppress

CACHE = "~/.ansible/fleetops"
PREFIX = "runner-"
UNUSED_DAYS = 14  # another runner not used this long is removed when a new one is staged
UNPACK_STALE_S = 3600  # an unpack folder this old was left by a killed run
PACKAGE = "ansible_collections.fleetops.node.plugins.module_utils"


class Unusable(Exception):
    """The staged runner cannot be used here; the caller falls back to the module."""


def _private_dir(path):
    """Refuse ``path`` unless it is a real folder owned by this user that no one else can write in."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise Unusable("%s is a symbolic link: refused" % path)
    if not stat.S_ISDIR(info.st_mode):
        raise Unusable("%s is not a folder: refused" % path)
    if info.st_uid != os.geteuid():
        raise Unusable("%s belongs to uid %d, not to this user (%d): refused" % (path, info.st_uid, os.geteuid()))
    if info.st_mode & 0o022:
        raise Unusable("%s can be written by other users (mode %o): refused" % (path, info.st_mode & 0o777))


def cache_dir():
    """The checked cache folder, created (0700) when missing."""
    base = os.path.expanduser(CACHE)
    if base.startswith("~"):
        raise Unusable("this user has no home folder")
    try:
        os.makedirs(base, 0o700)
    except OSError:
        if not os.path.lexists(base):
            raise Unusable("cannot create %s" % base)
    parent = os.path.dirname(base)
    _private_dir(parent)
    _private_dir(base)
    return base


def _unpack(blob, into):
    """Write the archive's folders and regular files under ``into``; anything else, or a path that leaves
    ``into``, refuses the archive."""
    import io
    import shutil
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:") as archive:
        for member in archive.getmembers():
            name = member.name
            parts = name.split("/")
            if name.startswith("/") or ".." in parts or not name:
                raise Unusable("archive member %r leaves its folder: refused" % name)
            target = os.path.join(into, *[p for p in parts if p])
            if member.isdir():
                os.makedirs(target, 0o700)
            elif member.isfile():
                source = archive.extractfile(member)
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as out:
                    shutil.copyfileobj(source, out)
            else:
                raise Unusable("archive member %r is not a file or a folder: refused" % name)


def stage(base, sha, blob):
    """``base/runner-<sha>``: the staged runner, unpacked from ``blob`` when it is not there yet; None when
    it is not there and no archive came with the request."""
    final = os.path.join(base, PREFIX + sha)
    if os.path.lexists(final):
        _private_dir(final)
        try:  # noqa: SIM105  (no contextlib import on every scan: 0.4 ms of each host)
            os.utime(final)  # in use: prune() keeps it
        except OSError:
            pass
        return final
    if blob is None:
        return None
    import hashlib
    import shutil
    import tarfile
    import tempfile

    if hashlib.sha256(blob).hexdigest() != sha:
        raise Unusable("the runner archive does not match its sha256 (%d bytes): refused" % len(blob))
    work = tempfile.mkdtemp(prefix=".unpack-", dir=base)
    try:
        _unpack(blob, work)
        try:
            os.rename(work, final)
            work = None
        except OSError:
            if not os.path.isdir(final):  # another run's rename won the race: use its copy
                raise
    except (OSError, tarfile.TarError) as err:
        raise Unusable("cannot unpack the runner archive into %s: %s" % (base, err))
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
    _private_dir(final)
    prune(base, final, time.time())
    return final


def prune(base, keep, now):
    """After staging a new runner: remove the other runners unused for ``UNUSED_DAYS`` (each use touches its
    folder) and unpack folders a killed run left. A controller still on an older runner stages it again, and
    one scanned within the window keeps it: two controller versions do not take turns re-sending theirs."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        path = os.path.join(base, name)
        if path == keep:
            continue
        if name.startswith(PREFIX):
            age = UNUSED_DAYS * 86400
        elif name.startswith(".unpack-"):
            age = UNPACK_STALE_S
        else:
            continue
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and now - info.st_mtime > age:
            import shutil

            shutil.rmtree(path, ignore_errors=True)  # a real folder of ours: never a link's target


def run(folder, params):
    """node_health's result for ``params``, from the staged runner in ``folder``."""
    sys.path.insert(0, folder)
    module_utils = __import__(PACKAGE, fromlist=["health", "textfile"])
    health, textfile = module_utils.health, module_utils.textfile
    bus = textfile.systemd_bus()
    params = dict(params, _run=textfile.run_command, _docker=textfile.which("docker"), _open_url=textfile.open_url,
                  _bus=bus)  # fmt: skip
    problem = health.validate(params)
    if problem:
        return {"fleetops_runner": "failed", "msg": "Failed to validate node_health options: %s" % problem}
    try:
        return {"fleetops_runner": "ok", "result": health.run_checks(params)}
    finally:
        bus.close()


def answer(data):
    """The reply (a dict) to one request: the header line, then the archive or nothing."""
    header, _sep, blob = data.partition(b"\n")
    try:
        request = json.loads(header.decode("utf-8"))
        sha, params = str(request["sha"]), dict(request["params"])
    except (ValueError, KeyError, TypeError) as err:
        return {"fleetops_runner": "unusable", "msg": "bad request: %s" % err}
    if len(sha) != 64 or sha.strip("0123456789abcdef"):
        return {"fleetops_runner": "unusable", "msg": "bad request: sha %r" % sha}
    try:
        folder = stage(cache_dir(), sha, blob or None)
    except Unusable as err:
        return {"fleetops_runner": "unusable", "msg": str(err)}
    except OSError as err:
        return {"fleetops_runner": "unusable", "msg": "cannot stage the runner: %s" % err}
    if folder is None:
        return {"fleetops_runner": "missing"}
    try:
        return run(folder, params)
    except Exception as err:  # pylint: disable=broad-except
        import traceback

        return {"fleetops_runner": "failed", "msg": "the runner failed: %s" % err, "exception": traceback.format_exc()}


def command(interpreter, source):
    """The argv that runs this stage: the host's Python (``interpreter``, split as a shell would; empty or
    ``auto*``: ``python3`` on the PATH), isolated and without site-packages, with ``source``."""
    import shlex

    parts = shlex.split(interpreter) if interpreter and not interpreter.startswith("auto") else ["python3"]
    return parts + ["-I", "-S", "-c", source]


def request(sha, params):
    """The header line a caller sends (the archive, when the host asked for it, follows it)."""
    return json.dumps({"sha": sha, "params": dict(params)}).encode("utf-8") + b"\n"


def parse_reply(stdout):
    """The stage's reply in a command's standard output (text): its last line as a dict with
    ``fleetops_runner``, or None (no Python, a Python that cannot run the stage, anything else)."""
    lines = stdout.strip().splitlines()
    try:
        reply = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return reply if isinstance(reply, dict) and "fleetops_runner" in reply else None


def main():
    reply = answer(sys.stdin.buffer.read())
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
