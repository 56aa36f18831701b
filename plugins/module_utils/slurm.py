# -*- coding: utf-8 -*-

# Copyright: (c) 2026, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Slurm nodes as fleetops quarantines them: names and reasons checked, ``scontrol show node`` parsed,
who drained a node recorded, and what to do decided.

Shared by the module ``fleetops.node.slurm_node`` (the quarantine playbooks' Slurm backend) and the
controller's checks before a run (``fleetops.remediations.behaviour``), so both refuse the same names.

- A node is drained with ``scontrol update NodeName=<node> State=DRAIN Reason=fleetops: <check>: <finding>``
  and resumed with ``State=RESUME``, each an argument vector (never a shell).
- Who drained it is recorded by fleetops itself, in the node's ``Comment`` (``fleetops:`` + compact JSON,
  ``RECORD_PREFIX``), written before the drain (a fresh one, time and check, whenever the node is in
  service: an old record left there is replaced, never reused): Slurm appends ``[user@time]`` to reasons, and a node
  that reboots unexpectedly gets Slurm's own reason instead of ours, so the reason alone cannot say
  whose drain it is. The record stays on the node, kept by slurmctld with the node's own state (it
  survives a reboot, slurmctld's restart and the loss of a controller; no second copy can disagree), as
  the Kubernetes backend keeps its record on the node in an annotation.
- A node drained, down or failed by anyone else is left alone (never resumed, never re-reasoned), and
  so is a comment someone else wrote.

Pure functions on text; importable on Python >= 3.9 with the standard library only.
"""

from __future__ import absolute_import, division, print_function

import json
import re

__metaclass__ = type

# One node, by name: no hostlist expression (``lab-[01-10]``, ``a,b`` name many nodes), no space or
# ``=`` (scontrol would read another key), no leading ``-`` (an option).
NODE_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
REASON_MAX = 200
RECORD_PREFIX = "fleetops:"
REASON_PREFIX = "fleetops: "
# Flags under which a node takes no new work: whoever set them, the node is out of scheduling.
OUT_FLAGS = frozenset(["DRAIN", "FAIL", "MAINTENANCE", "REBOOT_REQUESTED", "REBOOT_ISSUED", "POWER_DOWN"])
OUT_STATES = frozenset(["DOWN", "FUTURE", "POWERED_DOWN"])
BUSY = frozenset(["ALLOCATED", "MIXED", "COMPLETING"])
# Reasons Slurm writes itself; a node fleetops drained that then got one of these is still ours.
SLURM_REASONS = (
    "Node unexpectedly rebooted",
    "Not responding",
    "Kill task failed",
    "batch job complete failure",
)
_REASON_STAMP = re.compile(r"\s*\[[^\[\]@]*@[^\[\]]*\]$")


class SlurmError(Exception):
    """A Slurm node name, reason or answer fleetops will not act on (one line)."""


def node_name_problem(name):
    """Why ``name`` is not one Slurm node name fleetops may pass to scontrol (None: it is)."""
    if not isinstance(name, str) or not name:
        return "is empty"
    if NODE_NAME_RE.match(name):
        return None
    if name.startswith("-"):
        return "starts with '-'"
    bad = sorted(set(c for c in name if not (c.isalnum() or c in "._-")))
    if bad:
        return "has %s (a node name is letters, digits, '.', '_' and '-': one node, no hostlist)" % ", ".join(
            repr(c) for c in bad
        )
    return "is longer than 128 characters"


def check_node_name(name):
    why = node_name_problem(name)
    if why is not None:
        raise SlurmError("Slurm node name %r %s" % (name, why))
    return name


def reason_text(check, finding=""):
    """Our drain reason, ``fleetops: <check>: <finding>``: one line of printable text, at most REASON_MAX."""
    if not check or not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", check):
        raise SlurmError("the quarantine check %r is not a check name" % (check,))
    finding = " ".join((finding or "").split())  # newlines, tabs: one line
    if any(ord(c) < 32 or ord(c) == 127 for c in finding):
        raise SlurmError("the quarantine reason has control characters")
    text = REASON_PREFIX + check + (": " + finding if finding else "")
    if len(text) > REASON_MAX:
        text = text[: REASON_MAX - 3] + "..."
    return text


def parse_show_node(text):
    """``scontrol show node NAME`` (the multi-line form) as a dict: ``State`` split into ``state`` (the
    base) and ``flags``, ``Reason`` (without Slurm's ``[user@time]``) and ``Comment`` whole; None when
    the text holds no node."""
    node = {}
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        # Reason and Comment are free text to the end of their line; everything else is key=value words.
        for whole in ("Reason", "Comment", "Extra", "OS"):
            if stripped.startswith(whole + "="):
                node[whole] = stripped[len(whole) + 1 :]
                break
        else:
            for word in stripped.split():
                key, sep, value = word.partition("=")
                if sep:
                    node.setdefault(key, value)
    if "NodeName" not in node or "State" not in node:
        return None
    parts = node["State"].split("+")
    node["state"] = parts[0].rstrip("*").upper()
    node["flags"] = sorted(p.upper() for p in parts[1:])
    node["reason"] = _REASON_STAMP.sub("", node.get("Reason", "")).strip()
    if node["reason"] == "(null)" or node["reason"] == "none":
        node["reason"] = ""
    node["comment"] = node.get("Comment", "")
    if node["comment"] == "(null)":
        node["comment"] = ""
    return node


def parse_show_nodes(text):
    """``scontrol show node`` (every node, the multi-line form: one block per node, each starting with
    ``NodeName=``) as {name: node} (each as ``parse_show_node``'s)."""
    nodes = {}
    block = []
    for line in text.splitlines() + ["NodeName="]:
        if line.strip().startswith("NodeName=") and block:
            node = parse_show_node("\n".join(block))
            if node is not None:
                nodes[node["NodeName"]] = node
            block = []
        block.append(line)
    return nodes


def phase(node):
    """drained | draining | down | out (another flag) | in (takes work)."""
    if node["state"] in OUT_STATES:
        return "down"
    if "DRAIN" in node["flags"]:
        return "draining" if node["state"] in BUSY or "COMPLETING" in node["flags"] else "drained"
    if OUT_FLAGS.intersection(node["flags"]):
        return "out"
    return "in"


def failed(node):
    """Whether Slurm itself took the node out as failing: DOWN, or flagged FAIL, with a reason Slurm writes
    itself (``SLURM_REASONS``: not responding, an unexpected reboot, a kill that failed). An admin's down or
    drain (another reason), a drain, power saving (POWERED_DOWN, FUTURE) are not failures."""
    return (node["state"] == "DOWN" or "FAIL" in node["flags"]) and node["reason"].startswith(SLURM_REASONS)


# The jobs a requeue moves off a node: running (or starting, or suspended) there now.
REQUEUE_STATES = "RUNNING,CONFIGURING,SUSPENDED"
_JOB_ID_RE = re.compile(r"^[0-9]+$")


def squeue_args(node):
    """squeue's arguments listing the job ids (``%A``: an array task's own id) of the jobs a requeue moves
    off ``node`` (a checked node name), one a line."""
    return ["--noheader", "--nodelist=" + check_node_name(node), "--states=" + REQUEUE_STATES, "--format=%A"]


def parse_job_ids(text):
    """The job ids in squeue's ``%A`` listing (sorted, each once); SlurmError for a line that is not one."""
    ids = set()
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if not _JOB_ID_RE.match(line):
            raise SlurmError("squeue listed %r, not a job id" % line[:40])
        ids.add(int(line))
    return [str(i) for i in sorted(ids)]


def encode_record(check, rollout, time):
    """Our record for the node's Comment."""
    body = {"check": check, "rollout": rollout, "time": time}
    return RECORD_PREFIX + json.dumps(body, sort_keys=True, separators=(",", ":"))


def parse_record(comment):
    """Our record from a node's Comment (a dict), or None when the comment is not ours."""
    if not comment.startswith(RECORD_PREFIX):
        return None
    try:
        body = json.loads(comment[len(RECORD_PREFIX) :])
    except ValueError:
        return None
    return body if isinstance(body, dict) and isinstance(body.get("check"), str) else None


def reason_ours(reason):
    return reason.startswith(REASON_PREFIX)


def plan_drain(node, reason):
    """What quarantine does to ``node``: a tuple (steps, note). Steps: ``comment`` (write our record),
    ``drain``; none with a note when the node is left as it is."""
    record = parse_record(node["comment"])
    where = phase(node)
    if record is not None and where in ("drained", "draining"):
        return [], "already drained by fleetops (%s)" % where
    if record is None and (where != "in" or node["reason"]):
        return [], "left alone: %s by someone else%s" % (
            "drained" if where in ("drained", "draining") else where,
            " (reason: %s)" % node["reason"] if node["reason"] else "",
        )
    if record is None and node["comment"]:
        raise SlurmError(
            "its Comment is someone else's (%s): fleetops records its drain there" % node["comment"][:80]
        )
    if record is not None and node["reason"] and not reason_ours(node["reason"]) and where != "in":
        return [], "left alone: %s, reason by someone else (%s)" % (where, node["reason"])
    # A node in service always gets a fresh record: one left there (an admin resumed our drain, an
    # unquarantine stopped between its resume and its uncomment, a quarantine stopped before its drain)
    # carries an old time, and the ladder's drain_wait counts from it: a reused one would be "past" at
    # once and the next rung would act on jobs that still run. A node still out of service under our
    # record (down under our reason) keeps it: its drain has gone on since then.
    steps = ["comment"] if record is None or where == "in" else []
    return steps + ["drain"], "drain: %s" % reason


def plan_resume(node):
    """What unquarantine does: (steps, note). Steps: ``resume``, ``uncomment`` (remove our record)."""
    record = parse_record(node["comment"])
    where = phase(node)
    if record is None:
        if where != "in" or node["reason"]:
            return [], "left alone: %s by someone else%s" % (
                "drained" if where in ("drained", "draining") else where,
                " (reason: %s)" % node["reason"] if node["reason"] else "",
            )
        return [], "not quarantined"
    if where == "in":
        return ["uncomment"], "not drained any more: remove the record"
    reason = node["reason"]
    if reason and not reason_ours(reason) and not reason.startswith(SLURM_REASONS):
        return [], "left alone: drained by fleetops, then %s by someone else (reason: %s)" % (where, reason)
    if where == "out":  # maintenance, a reboot or power action of someone else's
        return [], "left alone: %s (flags: %s)" % (where, "+".join(node["flags"]))
    return ["resume", "uncomment"], "resume (%s)" % where
