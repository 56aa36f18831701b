# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Whether each node_health check could look: its coverage, from the facts it returned.

A check that finds nothing has two meanings: nothing is wrong, or it could not see (systemd is not PID 1,
the scan's user cannot read other users' processes or the system journal, a cgroup namespace hides the
host's memory cgroups). ``of(check, facts)`` tells them apart: ``findings.make_coverage`` full, partial
(with what it missed, and why) or none (with why), one rule per detector below. The vocabulary (levels,
the host statuses they give) is ``findings.COVERAGE`` / ``findings.ANSWERED_STATUSES``.

What the scan was asked to do is not coverage: one sample (no ``sample_seconds``) gives no rate for
anon_rss_growth or cpu_starvation by request, and a host with nothing to look at (no docker, no ENA
interface, no NVIDIA driver) is fully covered.

Stdlib only; importable on Python >= 3.9.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.fleetops.node.plugins.module_utils.findings import make_coverage

FULL = make_coverage("full")


def _memcg(facts):
    if facts.get("zombies") is not None:
        return FULL
    if facts.get("cgroup_version") is None:
        if facts.get("scope") == "host":
            return FULL  # no memory controller on the host: no memory cgroup to count
        return make_coverage(
            "none", "no memory controller visible in this cgroup namespace: %s" % (facts.get("reason") or "")
        )
    return make_coverage(
        "partial",
        "zombie count unknown in a cgroup namespace (host-wide total and worst-case ID headroom only): %s"
        % (facts.get("scope_reason") or "namespace scope"),
    )


def _crashloop(facts):
    if not facts.get("systemd"):
        return make_coverage("none", "%s: no service to read" % (facts.get("reason") or "no systemd"))
    if facts.get("rate_basis") is None and facts.get("journal_error"):
        return make_coverage(
            "partial",
            "journal unreadable (%s): no restart rate, only units between crashes or at their start limit count"
            % facts["journal_error"],
        )
    if facts.get("rate_basis") == "journal" and facts.get("journal_readable") is False:
        return make_coverage(
            "partial",
            "the system journal is not readable by this user (not root, not in systemd-journal or adm): "
            "restart rates count none of the system's restarts",
        )
    return FULL


def _containers(facts):
    reason = facts.get("reason") or ""
    # docker's own words when the socket refuses this user (not a config file it could not read)
    if not facts.get("docker") and "permission denied while trying to connect" in reason.lower():
        return make_coverage("none", "the docker daemon's socket is not open to this user: %s" % reason)
    return FULL  # docker not installed or no daemon running: no docker container to look at


def _procs(facts):
    unreadable = facts.get("unreadable") or 0
    if not unreadable:
        return FULL
    seen = facts.get("processes") or 0
    level = "partial" if seen else "none"
    return make_coverage(
        level,
        "%d of %d user processes unreadable (another user's, or protected; their memory unseen)"
        % (unreadable, unreadable + seen),
    )


def _ucx(facts):
    unreadable = facts.get("unreadable") or 0
    scanned = facts.get("processes_scanned") or 0
    blind = [p.get("pid") for p in facts.get("processes") or () if p.get("environ_readable") is False]
    if not unreadable and not blind:
        return FULL
    if unreadable and not scanned:
        return make_coverage(
            "none", "no process's memory maps readable (%d tried: another user's, or protected)" % unreadable
        )
    parts = []
    if unreadable:
        parts.append(
            "memory maps of %d of %d processes unreadable (another user's, or protected; UCX there unseen)"
            % (unreadable, unreadable + scanned)
        )
    if blind:
        parts.append(
            "launch environment of pid %s unreadable (judged on its unit's Environment= only)"
            % ", ".join(str(pid) for pid in blind)
        )
    return make_coverage("partial", "; ".join(parts))


def _ec2_events(facts):
    if facts.get("imds") is False:
        return make_coverage("partial", "%s: inventory events only" % (facts.get("imds_error") or "IMDS failed"))
    return FULL


def _units(facts):
    if not facts.get("systemd"):
        return make_coverage("none", "%s: no unit file state to read" % (facts.get("reason") or "no systemd"))
    return FULL


def _ena(facts):
    log_error = (facts.get("kernel_log") or {}).get("error")
    by_log = sorted(
        name for name, iface in (facts.get("interfaces") or {}).items() if iface.get("resets_basis") == "kernel log"
    )
    if log_error and by_log:
        return make_coverage(
            "partial",
            "kernel log unreadable (%s) and the driver of %s counts no reset: resets unseen"
            % (log_error, ", ".join(by_log)),
        )
    return FULL


def _cpu(facts):
    return FULL  # /proc/stat, /proc/softirqs and /proc/interrupts are world-readable


def _gpu(facts):
    parts = []
    log_error = (facts.get("kernel_log") or {}).get("error")
    if log_error and (facts.get("nvidia_smi") or facts.get("nvidia_driver")):
        parts.append("kernel log unreadable (%s): Xid events unseen" % log_error)
    if facts.get("smi_error"):
        parts.append("nvidia-smi failed (%s): ECC and row remaps unseen" % facts["smi_error"])
    return make_coverage("partial", "; ".join(parts)) if parts else FULL


# One rule per detector of health.DETECTORS (a unit test holds them equal).
RULES = {
    "zombie_memcg": _memcg,
    "crashloop_unit": _crashloop,
    "crashloop_container": _containers,
    "anon_rss_growth": _procs,
    "ucx_mmap_hooks": _ucx,
    "ec2_scheduled_event": _ec2_events,
    "unexpected_unit": _units,
    "ena_resets": _ena,
    "cpu_starvation": _cpu,
    "gpu_health": _gpu,
}


def of(check, facts, errors=()):
    """The coverage of ``check`` from its ``facts`` (None: it could not run) and the ``errors`` entries
    ({check, msg}) it raised: none when it has no facts, partial when its second sample failed."""
    msgs = [e["msg"] for e in errors if e.get("check") == check]
    if facts is None:
        return make_coverage("none", "; ".join(msgs) or "the check did not run")
    found = dict(RULES[check](facts))
    if msgs:
        extra = "second sample failed: %s" % "; ".join(msgs)
        if found["level"] == "full":
            return make_coverage("partial", extra)
        found["reason"] = "%s; %s" % (found["reason"], extra)
    return found
