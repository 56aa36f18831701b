# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The crashloop_container detector: containers that docker keeps re-creating or restarting.

``RestartCount`` counts only Docker's own restart policy. The ECS agent's ``ecs-init`` re-creates the
``ecs-agent`` container on every start, so its RestartCount stays 0: a re-created container shows
as a new Id under the same name between two samples, or, with one sample, as a container created
and started seconds ago. Two docker calls for all containers (``ps -aq``, one ``inspect``).
No docker, or no daemon answering: no finding, no error.

Each container also gets the systemd unit that owns it (``owner_unit``), where that can be told
honestly, with the evidence (``owner_basis``): a ``PODMAN_SYSTEMD_UNIT`` label (podman's own mark on
containers a unit runs); else a container client process (``docker``, ``podman``, ``nerdctl``) whose
command line names the container (``docker run --name NAME``, ``docker start -a NAME``, ...) running
in a system service; else a process of a known creator that talks to the API without naming the
container on its command line (``amazon-ecs-init`` creates ``ecs-agent``) running in a system service.
Docker places the container's own processes in its own cgroup, so the container's cgroup never
names the unit. The owner lookup reads ``/proc/PID/comm`` of every process (a few bytes each), and
``cmdline`` and ``cgroup`` only of client processes; only when there are containers.
``owner_protected`` says the owner is on the protected list (docker.service, containerd.service, ...).

Stdlib only; importable on Python >= 3.9.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import re
import time

from ansible_collections.fleetops.node.plugins.module_utils.findings import (
    RESTART_RATE_THRESHOLDS,
    DetectorError,
    make_finding,
    restart_rate_severity,
)
from ansible_collections.fleetops.node.plugins.module_utils.procs import (
    PROC,
    list_pids,
    parse_cgroup_unit,
    parse_cmdline,
    read_bytes,
)
from ansible_collections.fleetops.node.plugins.module_utils.systemd import is_protected

CHECK = "crashloop_container"
RECENT_SECONDS = 60
DEFAULT_THRESHOLDS = dict(RESTART_RATE_THRESHOLDS)
# podman run --label PODMAN_SYSTEMD_UNIT=%n (podman generate systemd, quadlet; podman auto-update reads it)
OWNER_LABELS = ("PODMAN_SYSTEMD_UNIT",)
CLIENTS = ("docker", "podman", "nerdctl")
# Creators that make a container through the API, without naming it on their command line:
# {comm: container names}. ecs-init (ecs.service) creates and waits on ecs-agent.
KNOWN_CREATORS = {"amazon-ecs-init": ("ecs-agent",)}
_GLOBAL_OPTIONS_WITH_VALUE = (
    "-H",
    "--host",
    "-c",
    "--context",
    "--config",
    "-l",
    "--log-level",
    "--namespace",
    "-n",
)
_TS_RE = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


class ContainerError(DetectorError):
    pass


def parse_timestamp(text):
    """Docker's RFC 3339 timestamps (nanoseconds, Z or offset) to epoch seconds; None for the zero time."""
    if not text or text.startswith("0001-01-01"):
        return None
    match = _TS_RE.match(text)
    if not match:
        raise ValueError("not an RFC 3339 timestamp: %r" % text)
    import calendar  # here: its import (datetime, locale) would cost every host ~1.2 ms on every scan

    base = calendar.timegm(time.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S"))
    frac = float("0" + match.group(2)) if match.group(2) else 0.0
    zone = match.group(3)
    offset = (
        0 if zone == "Z" else (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60) * (1 if zone[0] == "+" else -1)
    )
    return base + frac - offset


def parse_inspect(text, now):
    """{name: container facts} from ``docker inspect`` JSON."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ContainerError("parse", "docker inspect output", str(exc))
    if not isinstance(data, list):
        raise ContainerError("parse", "docker inspect output", "expected a JSON list")
    out = {}
    for item in data:
        try:
            name = item["Name"].lstrip("/")
            state = item.get("State") or {}
            created = parse_timestamp(item.get("Created"))
            started = parse_timestamp(state.get("StartedAt"))
            out[name] = {
                "name": name,
                "id": item["Id"][:12],
                "image": (item.get("Config") or {}).get("Image", ""),
                "status": state.get("Status", ""),
                "restarting": bool(state.get("Restarting")),
                "exit_code": state.get("ExitCode"),
                "restart_count": int(item.get("RestartCount") or 0),
                "restart_policy": ((item.get("HostConfig") or {}).get("RestartPolicy") or {}).get("Name", ""),
                "full_id": item["Id"],
                "labels": _owner_labels((item.get("Config") or {}).get("Labels")),
                "created_age_s": None if created is None else round(now - created, 1),
                "started_age_s": None if started is None else round(now - started, 1),
            }
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ContainerError("parse", "docker inspect output", "container entry: %s" % exc)
    return out


def _owner_labels(labels):
    """The owner labels a container carries (``{}`` when none): all a finding needs of its labels."""
    if not isinstance(labels, dict):
        return {}
    return dict(
        (key, labels[key]) for key in OWNER_LABELS if isinstance(labels.get(key), str) and labels[key]
    )


def _subcommand(args):
    """(subcommand, index of its first argument) of a client's arguments after the client itself."""
    index = 0
    words = []
    while index < len(args) and len(words) < 2:
        arg = args[index]
        index += 1
        if arg in _GLOBAL_OPTIONS_WITH_VALUE:
            index += 1
        elif not arg.startswith("-"):
            words.append(arg)
            if arg not in ("container", "ctr"):
                break
    return (words[-1] if words else ""), index


def referenced_containers(argv, containers):
    """Names of ``containers`` a client command line (argv after the client) refers to.

    Only the subcommands that run the container count: ``run`` / ``create`` with ``--name NAME`` /
    ``--name=NAME`` (a bare word there is the image), and ``start`` (``docker start -a NAME``, the usual
    ExecStart) with a bare NAME or an Id of at least 12 hex digits (a prefix of the container's Id).
    A process following a container (``logs -f``, ``wait``, ``attach``) does not own it.
    """
    sub, first = _subcommand(argv)
    found = []
    if sub not in ("run", "create", "start"):
        return found

    def add(name):
        if name in containers and name not in found:
            found.append(name)

    rest = argv[first:]
    for index, arg in enumerate(rest):
        if arg.startswith("--name="):
            add(arg[len("--name=") :])
        elif arg == "--name" and index + 1 < len(rest):
            add(rest[index + 1])
        elif sub != "start" or arg.startswith("-"):
            continue
        elif arg in containers:
            add(arg)
        elif len(arg) >= 12 and all(c in "0123456789abcdef" for c in arg):
            for name, data in containers.items():
                if data.get("full_id", data["id"]).startswith(arg):
                    add(name)
    return found


def _client_args(argv, comm):
    """The arguments after the client (docker, podman, nerdctl) this process runs, or None when it runs none.

    argv[0] is the client, or an interpreter running it (a client script: argv[1]).
    """
    for index, arg in enumerate(argv[:2]):
        if arg.rsplit("/", 1)[-1] in CLIENTS:
            return argv[index + 1 :]
    return argv[1:] if comm in CLIENTS else None


def _read_text(path, limit=None):
    data = read_bytes(path, limit)
    return None if data is None else data.decode("utf-8", "replace")


def find_owners(containers, proc=PROC):
    """{container name: owner} for the containers a system service runs, with the evidence.

    An owner is ``{"unit", "manager", "basis", "pid"}``: from an owner label, else a client process
    naming the container, else a known creator. A client found outside any system service (a user's
    shell, a user manager) is reported with ``unit`` None or ``manager`` ``user``: not a unit to turn off.
    """
    owners = {}
    for name, data in containers.items():
        for key, unit in sorted((data.get("labels") or {}).items()):
            owners[name] = {
                "unit": unit,
                "manager": "system",
                "basis": "label %s=%s" % (key, unit),
                "pid": None,
            }
    if not containers or len(owners) == len(containers):
        return owners
    creators = {}
    for pid in list_pids(proc):
        base = "%s/%d/" % (proc, pid)
        comm = (_read_text(base + "comm", 64) or "").strip()
        if comm not in CLIENTS and comm not in KNOWN_CREATORS:
            continue
        raw = read_bytes(base + "cmdline", 65536)
        if not raw:
            continue
        argv = raw.rstrip(b"\0").decode("utf-8", "replace").split("\0")
        args = _client_args(argv, comm)
        if args is None and comm not in KNOWN_CREATORS:
            continue
        unit, manager, cgroup = parse_cgroup_unit(_read_text(base + "cgroup") or "")
        where = "%s (%s manager)" % (unit, manager) if unit else "cgroup %s" % (cgroup or "unknown")
        if args is not None:
            for name in referenced_containers(args, containers):
                _prefer(
                    owners,
                    name,
                    {
                        "unit": unit,
                        "manager": manager,
                        "pid": pid,
                        "basis": "pid %d `%s` in %s" % (pid, parse_cmdline(raw), where),
                    },
                )
        else:
            for name in KNOWN_CREATORS[comm]:
                if name in containers:
                    _prefer(
                        creators,
                        name,
                        {
                            "unit": unit,
                            "manager": manager,
                            "pid": pid,
                            "basis": "pid %d %s (creates %s) in %s" % (pid, comm, name, where),
                        },
                    )
    for name, owner in creators.items():
        _prefer(owners, name, owner)
    return owners


def _is_service(owner):
    return owner["manager"] == "system" and (owner["unit"] or "").endswith(".service")


def _prefer(owners, name, owner):
    """Record ``owner`` unless ``name`` already has one; a system service beats anything else."""
    current = owners.get(name)
    if current is None or (_is_service(owner) and not _is_service(current)):
        owners[name] = owner


def attach_owners(containers, owners):
    """Each container's facts with ``owner_unit``, ``owner_basis`` and ``owner_protected`` (None when unowned)."""
    out = {}
    for name, data in containers.items():
        owner = owners.get(name)
        unit = owner["unit"] if owner and _is_service(owner) else None
        out[name] = dict(
            data,
            owner_unit=unit,
            owner_basis=owner["basis"] if owner else None,
            owner_protected=bool(unit) and is_protected(unit),
        )
    return out


def collect(run, docker, proc=PROC):
    """One sample. ``docker``: the docker binary's path, or None when it is not installed."""
    if not docker:
        return {"docker": False, "reason": "docker is not installed", "containers": {}}
    rc, out, err = run([docker, "ps", "-aq", "--no-trunc"])
    if rc != 0:
        return {
            "docker": False,
            "reason": "docker daemon not reachable: %s" % (err or out).strip()[:200],
            "containers": {},
        }
    ids = out.split()
    now = time.time()
    containers = {}
    if ids:
        rc, out, err = run([docker, "inspect"] + ids)
        if rc != 0 and not out.strip():
            raise ContainerError("run", "docker inspect", (err or "exit %d" % rc).strip())
        containers = parse_inspect(out, now)
        containers = attach_owners(containers, find_owners(containers, proc))
    return {"docker": True, "reason": None, "containers": containers, "sampled_at": now, "rate_basis": None}


def add_growth(first, second, seconds):
    """Re-creations (same name, new Id) and restarts (RestartCount delta) per minute between two samples."""
    facts = dict(second)
    if not second.get("docker") or seconds <= 0:
        return facts
    facts["rate_basis"] = "samples"
    facts["window_seconds"] = round(float(seconds), 3)
    containers = {}
    for name, data in second["containers"].items():
        before = first.get("containers", {}).get(name)
        recreated = 1 if before is not None and before["id"] != data["id"] else 0
        if before is None and data["created_age_s"] is not None and data["created_age_s"] <= seconds:
            recreated = 1  # appeared during the window
        restarts = data["restart_count"] - before["restart_count"] if before and not recreated else 0
        events = recreated + max(0, restarts)
        entry = dict(
            data,
            recreated=recreated,
            restarts_in_window=events,
            restarts_per_min=round(events * 60.0 / seconds, 2),
        )
        if before is not None and not entry.get("owner_basis") and before.get("owner_basis"):
            # the client may have exited between the samples (the container crashed): keep what the first saw
            for key in ("owner_unit", "owner_basis", "owner_protected"):
                entry[key] = before.get(key)
        containers[name] = entry
    facts["containers"] = containers
    return facts


def evaluate(facts, thresholds=None):
    limits = dict(DEFAULT_THRESHOLDS)
    limits.update(thresholds or {})
    findings = []
    for name, data in sorted((facts.get("containers") or {}).items()):
        rate = data.get("restarts_per_min")
        severity = None
        if rate is not None:
            severity = restart_rate_severity(rate, limits)
            what = "re-created or restarted %s times in %ss (%s/min)" % (
                data["restarts_in_window"],
                facts.get("window_seconds"),
                rate,
            )
        else:
            young = data["created_age_s"] is not None and data["created_age_s"] < RECENT_SECONDS
            if data["restarting"] or data["restart_count"] >= 3:
                severity = "warning"
                what = "restarting (RestartCount %d, policy %s)" % (
                    data["restart_count"],
                    data["restart_policy"] or "no",
                )
            elif young and data["status"] != "running":
                severity = "warning"
                what = "created %ss ago and already %s (exit %s): a runtime re-creating it?" % (
                    data["created_age_s"],
                    data["status"],
                    data["exit_code"],
                )
        if severity is None:
            continue
        summary = "container %s (%s) crash loops: %s; %s" % (name, data["image"], what, _owner_text(data))
        findings.append(
            make_finding(CHECK, severity, summary, dict(data, rate_basis=facts.get("rate_basis")))
        )
    return findings


def _owner_text(data):
    if data.get("owner_unit"):
        return "owned by %s%s (%s)" % (
            data["owner_unit"],
            ", a protected unit" if data.get("owner_protected") else "",
            data["owner_basis"],
        )
    if data.get("owner_basis"):
        return "no system service owns it (%s)" % data["owner_basis"]
    return "no owning unit found"
