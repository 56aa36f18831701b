# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The host timer's runner: node_health's detectors, once, on this host, written as Prometheus gauges into
node_exporter's textfile directory.

``playbooks/detector_timer.yml`` copies this file and what it imports (``health``, ``gauges`` and the
detectors' module_utils: stdlib only, no Ansible on the host) to ``/usr/local/lib/fleetops`` and runs
``main`` from a systemd service every interval::

    python3 -I -S /usr/local/lib/fleetops/fleetops-detector /etc/fleetops/detector.json

The configuration (JSON, written by the playbook) names the host and its identity labels, the textfile and
node_health's options, as the module itself validated them at install::

    {"host": "lab-01", "instance_id": "i-0abc", "az": "us-east-1a",
     "textfile": "/var/lib/prometheus/node-exporter/fleetops.prom", "params": {"checks": null, ...}}

The textfile is written atomically: a temporary file in the same directory (a name node_exporter does not
read: it ends in ``.tmp``), mode 0644, flushed to disk, then renamed over the old one. A directory that is
a symbolic link is refused, and so is anything but a regular file in the textfile's place.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import json
import os
import stat
import sys
import time

from ansible_collections.fleetops.node.plugins.module_utils import findings, gauges, health, sdbus

TEXTFILE_MODE = 0o644
# A command a detector runs may take this long (systemctl, journalctl, docker, ethtool, nvidia-smi).
COMMAND_TIMEOUT_S = 30
PROG = "fleetops-detector"


class ConfigError(Exception):
    """The configuration file is missing, unreadable or wrong (exit 2, one line)."""


class TextfileError(Exception):
    """The textfile's place is refused: a symbolic link for a folder, something not a file (exit 1)."""


def load_config(path):
    """The checked configuration at ``path``: host, instance_id, az, textfile, params."""
    try:
        with open(path) as handle:
            config = json.load(handle)
    except (OSError, ValueError) as err:
        raise ConfigError("Failed to read %s: %s" % (path, err))
    if not isinstance(config, dict):
        raise ConfigError("Failed to read %s: expected a JSON object" % path)
    host = config.get("host")
    if not isinstance(host, str) or not host:
        raise ConfigError("Failed to read %s: host must be a non-empty string" % path)
    for key in gauges.IDENTITY_LABELS:
        if config.get(key) is not None and not isinstance(config[key], str):
            raise ConfigError("Failed to read %s: %s must be a string or null" % (path, key))
    textfile = config.get("textfile")
    if not isinstance(textfile, str) or not os.path.isabs(textfile) or not textfile.endswith(".prom"):
        raise ConfigError(
            "Failed to read %s: textfile must be an absolute path ending in .prom, got %r" % (path, textfile)
        )
    params = config.get("params")
    if not isinstance(params, dict):
        raise ConfigError("Failed to read %s: params must be an object (node_health's options)" % path)
    unknown = sorted(set(params) - set(health.ARGUMENT_SPEC))
    if unknown:
        raise ConfigError(
            "Failed to read %s: params: unknown node_health option(s) %s" % (path, ", ".join(unknown))
        )
    try:
        problem = health.validate(_given(params))
    except (TypeError, ValueError) as err:  # a hand-edited value of the wrong type
        problem = "%s: %s" % (type(err).__name__, err)
    if problem:
        raise ConfigError("Failed to read %s: params: %s" % (path, problem))
    return config


def _given(params):
    """The options that have a value (null means the option's default)."""
    return dict((k, v) for k, v in params.items() if v is not None)


def run_command(argv):
    """``argv`` -> ``(rc, stdout, stderr)``, as AnsibleModule.run_command gives the detectors: the C locale, no
    standard input, signals Python ignores restored, at most ``COMMAND_TIMEOUT_S`` (then killed: 124); 127 when
    it cannot start.

    ``os.posix_spawnp`` and a poll loop, not ``subprocess``: importing subprocess (threading, selectors,
    warnings) costs every host ~3.5 ms of CPU on every scan, more than one detector's whole command.
    Python < 3.8 has no posix_spawn and takes subprocess.
    """
    env = dict(os.environ, LC_ALL="C", LANG="C")
    if not hasattr(os, "posix_spawnp"):
        return _run_subprocess(argv, env)
    # No AnsibleModule here (no Ansible on the host): this is the runner's run_command.
    signal = _signals()

    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        # subprocess' close_fds: an inheritable descriptor this process was given does not reach the command
        inherited = [fd for fd in _open_fds() if fd > 2 and _inheritable(fd)]
        actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0), (os.POSIX_SPAWN_DUP2, out_w, 1),
                   (os.POSIX_SPAWN_DUP2, err_w, 2)] + [(os.POSIX_SPAWN_CLOSE, fd) for fd in inherited]  # fmt: skip
        # SIGPIPE and SIGXFSZ: Python ignores them, and an ignored signal stays ignored across exec
        restore = (signal.SIGPIPE, signal.SIGXFSZ)
        try:
            pid = os.posix_spawnp(  # pylint: disable=ansible-bad-function
                argv[0], argv, env, file_actions=actions, setsigdef=restore
            )
        except OSError as err:
            os.close(out_r)
            os.close(err_r)
            if err.filename is None:  # the text subprocess gives: "[Errno 2] No such file or directory: 'x'"
                err = OSError(err.errno, err.strerror or os.strerror(err.errno), argv[0])
            return 127, "", "%s: %s" % (argv[0], err)
    finally:
        os.close(out_w)
        os.close(err_w)
    out, err, status = _collect(pid, out_r, err_r, time.monotonic() + COMMAND_TIMEOUT_S, signal.SIGKILL)
    if status is None:
        return 124, "", "%s: timed out after %ss" % (argv[0], COMMAND_TIMEOUT_S)
    rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    return rc, out.decode("utf-8", "surrogateescape"), err.decode("utf-8", "surrogateescape")


def _signals():
    """The signal numbers: ``_signal``'s, the C module ``signal`` wraps (whose import turns them into enums:
    0.4 ms of every host's CPU on every scan), else ``signal``."""
    try:
        import _signal as signals  # pylint: disable=import-outside-toplevel
    except ImportError:
        import signal as signals
    return signals


def _open_fds():
    try:
        return [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return []


def _inheritable(fd):
    try:
        return os.get_inheritable(fd)
    except OSError:  # the listing's own descriptor, closed since
        return False


def _collect(pid, out_r, err_r, deadline, kill):
    """(stdout, stderr, wait status) of the spawned ``pid``, reading both pipes to their end (then closing
    them); the wait status is None when the command outlived ``deadline`` (it is killed and reaped)."""
    import select

    chunks = {out_r: [], err_r: []}
    poller = select.poll()
    for fd in chunks:
        poller.register(fd, select.POLLIN)
    reading = set(chunks)
    status = None
    try:
        while reading and time.monotonic() < deadline:
            for fd, _event in poller.poll(max(1, int((deadline - time.monotonic()) * 1000))):
                data = os.read(fd, 65536)
                if data:
                    chunks[fd].append(data)
                else:
                    poller.unregister(fd)
                    reading.discard(fd)
        pause = 0.0005
        while not reading and time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            status = None
            time.sleep(pause)  # it closed its output and has not exited yet
            pause = min(pause * 2, 0.05)
    finally:
        os.close(out_r)
        os.close(err_r)
        if status is None:
            try:  # noqa: SIM105  (no contextlib import on every scan: 0.4 ms of each host)
                os.kill(pid, kill)  # as subprocess.run does at its timeout
            except OSError:
                pass  # gone already
            os.waitpid(pid, 0)
    return b"".join(chunks[out_r]), b"".join(chunks[err_r]), status


def _run_subprocess(argv, env):
    import subprocess

    try:
        proc = subprocess.run(  # pylint: disable=ansible-bad-function
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return 124, "", "%s: timed out after %ss" % (argv[0], COMMAND_TIMEOUT_S)
    except OSError as err:
        return 127, "", "%s: %s" % (argv[0], err)
    return (
        proc.returncode,
        proc.stdout.decode("utf-8", "surrogateescape"),
        proc.stderr.decode("utf-8", "surrogateescape"),
    )


def open_url(url, method="GET", timeout=0.5, headers=None):
    """An IMDS request without proxies (the metadata service is link-local), for ec2events."""
    from urllib import request  # only on an EC2 instance, when IMDS is asked

    opener = request.build_opener(request.ProxyHandler({}))
    return opener.open(request.Request(url, method=method, headers=headers or {}), timeout=timeout)


def systemd_bus():
    """The runner's connection to systemd (opened on first use): what crashloop_unit and unexpected_unit would
    ask two ``systemctl`` processes (about 10 ms of the host's CPU a scan), asked over D-Bus (sdbus)."""
    return sdbus.Systemd()


def which(name):
    """A program's path, searching the system folders a service's PATH may leave out (get_bin_path's way):
    ``findings.which``, which imports nothing (shutil.which would cost every host's every scan its import)."""
    return findings.which(name)


def series(config, result, started):
    """The host's gauges for one node_health ``result``: its "host" gauges and the run's own."""
    status = findings.answered_status(result.get("coverage"))  # ok, or partial: a check could not look fully
    out = gauges.host_series(config["host"], dict(result, status=status))
    out.append(("scan_duration_seconds", (), float(result["duration_ms"]) / 1000.0))
    out.append(("scan_timestamp_seconds", (), float(started)))
    return out


def identity(config):
    """``[("host", ...), ("instance_id", ...), ("az", ...)]``: the labels on every series."""
    return [("host", config["host"])] + [(key, config.get(key)) for key in gauges.IDENTITY_LABELS]


def write_textfile(path, text):
    """Replace ``path`` with ``text`` atomically, mode 0644, never following a symbolic link."""
    folder, name = os.path.split(path)
    try:
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(folder):
            raise TextfileError("%s is a symbolic link: refused" % folder)
        raise
    tmp = ".%s.%d.tmp" % (name, os.getpid())
    try:
        try:
            current = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            current = None
        if current is not None and not (stat.S_ISREG(current.st_mode) or stat.S_ISLNK(current.st_mode)):
            raise TextfileError("%s exists and is not a regular file: refused" % path)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, TEXTFILE_MODE, dir_fd=dir_fd)
        try:
            os.fchmod(fd, TEXTFILE_MODE)  # whatever the umask
            data = text.encode("utf-8")
            while data:
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        tmp = None
        os.fsync(dir_fd)
    finally:
        if tmp is not None:
            try:  # noqa: SIM105  (no contextlib import on every scan)
                os.unlink(tmp, dir_fd=dir_fd)
            except OSError:
                pass
        os.close(dir_fd)


def run(config):
    """Run the detectors, write the textfile; return (result, text)."""
    started = time.time()
    params = _given(config["params"])
    bus = systemd_bus()
    params.update(_run=run_command, _docker=which("docker"), _open_url=open_url, _bus=bus)
    try:
        result = health.run_checks(params)
    finally:
        bus.close()
    text = gauges.render(series(config, result, started), identity(config))
    write_textfile(config["textfile"], text)
    return result, text


def main(argv=None):
    """``fleetops-detector CONFIG``: one run. Exit 0 (detector errors are gauges, and lines on stderr), 2 on a
    bad configuration, 1 when the textfile cannot be written."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        sys.stderr.write("usage: %s CONFIG.json\n" % PROG)
        return 2
    try:
        config = load_config(argv[0])
        result, text = run(config)
    except ConfigError as err:
        sys.stderr.write("%s: %s\n" % (PROG, err))
        return 2
    except (OSError, TextfileError) as err:
        sys.stderr.write("%s: Failed to write the textfile: %s\n" % (PROG, err))
        return 1
    for error in result["errors"]:
        sys.stderr.write("%s: %s: %s\n" % (PROG, error["check"], error["msg"]))
    counts = dict((sev, 0) for sev in gauges.severities())
    for finding in result["findings"]:
        counts[finding["severity"]] = counts.get(finding["severity"], 0) + 1
    sys.stdout.write(
        "%s: %d detectors in %.0f ms, findings %s, %d errors; wrote %d lines to %s; cpu_ms=%.1f\n"
        % (
            PROG,
            len(result["checks"]),
            result["duration_ms"],
            " ".join("%s=%d" % item for item in counts.items()),
            len(result["errors"]),
            text.count("\n"),
            config["textfile"],
            cpu_seconds() * 1000.0,
        )
    )
    return 0


def cpu_seconds():
    """CPU time (user + system) of this run so far: this process, start-up included, and the commands it
    ran and waited for (what the service's cgroup counts, where systemd's CPUUsageNSec is not available)."""
    import resource  # only the timer's runner reports it: not every scan's import

    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total
