"""The schedulers' view of the fleet, read once per pass: which hosts' nodes take no new work (cordoned,
drained, draining, down) and whose quarantine each is.

A capacity floor that counts only what fleetops did misses what others did: a node an admin drained for
maintenance, one cordoned by another controller, a quarantine nobody released after its ladder reset. So
``remediate auto`` reads each backend's nodes once, before deciding (never once per host):

- ``kubernetes``: ``kubectl get nodes -o json``, when the pass names a cluster (``--kubectl`` other than
  its default, ``--kubeconfig`` or ``$KUBECONFIG``; a kubectl that merely is on PATH may point at no
  cluster at all, and a pod's in-cluster config may not be allowed to list nodes);
  a node is out when it is cordoned (``spec.unschedulable``) or not ready (its Ready condition not True,
  or the node controller's ``node.kubernetes.io/unreachable`` or ``not-ready`` taint), ours when it
  carries fleetops' quarantine taint;
- ``slurm``: ``scontrol show node`` (one call per scontrol and slurm.conf the hosts name, usually one);
  a node is out when it is drained, draining, down or flagged out (``module_utils/slurm.py``'s phase),
  ours when its Comment holds fleetops' record, failed when Slurm itself took it out (not responding, an
  unexpected reboot: the storm brake counts those);
- ``none``: nothing to read.

Hosts whose node the backend does not list are not counted (``missing``). A backend that cannot be read
(kubectl or scontrol missing, refusing, not answering) is one line, and its hosts are ``unknown``: the pass
takes no disruptive action in their groups (their capacity is unknown) and fails.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fleetops.ansible.collection import module_utils
from fleetops.ansible.inventory import InventoryHost
from fleetops.remediations.backends import BACKENDS, QUARANTINE_KEY, backend_of
from fleetops.remediations.catalog import KUBECTL
from fleetops.rollout.killswitch import one_line
from fleetops.util import on_slurm

READ_TIMEOUT_S = 30  # each kubectl or scontrol call (a pass reads each backend once)
# the taints Kubernetes' node controller puts on a node it cannot reach or that is not ready
NOT_READY_TAINTS = frozenset({"node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"})


@dataclass(frozen=True)
class NodeState:
    backend: str  # kubernetes | slurm
    node: str
    phase: str  # in | cordoned | notready (kubernetes) | draining | drained | down | out (slurm) | missing
    ours: bool = False  # fleetops' own quarantine (its taint; its Slurm record)
    reason: str = ""  # Slurm's reason, without its [user@time]
    since: float | None = None  # when fleetops drained it (its Slurm record's time; Unix time)
    failed: bool = False  # the scheduler itself took it out as failing (Slurm: not responding, ...), not ours

    @property
    def out(self) -> bool:
        """The node takes no new work."""
        return self.phase not in ("in", "missing")

    def why(self) -> str:
        who = "fleetops" if self.ours else "someone else"
        said = f", reason: {self.reason}" if self.reason and not self.ours else ""
        return f"{self.backend} {self.phase} by {who}{said}"

    def to_dict(self) -> dict[str, Any]:
        return (
            {
                "backend": self.backend,
                "node": self.node,
                "phase": self.phase,
                "ours": self.ours,
                "reason": self.reason,
            }
            | ({"since": self.since} if self.since is not None else {})
            | ({"failed": True} if self.failed else {})
        )


@dataclass
class NodeReading:
    states: dict[str, NodeState] = field(default_factory=dict)  # host -> its node's state
    failures: list[str] = field(default_factory=list)  # one line per backend that could not be read
    skipped: list[str] = field(default_factory=list)  # one line per backend not read, and why
    unknown: dict[str, str] = field(default_factory=dict)  # host -> why its node could not be read

    def out(self) -> dict[str, NodeState]:
        return {h: s for h, s in self.states.items() if s.out}

    def fail(self, line: str, hosts: Iterable[str]) -> None:
        """A backend could not be read: its one line, and its hosts' state unknown."""
        self.failures.append(line)
        self.unknown.update(dict.fromkeys(hosts, line))


Run = Callable[..., "subprocess.CompletedProcess[str]"]


def read_nodes(
    hosts: Sequence[InventoryHost],
    kube: Mapping[str, str] | None = None,
    run: Run = subprocess.run,
    timeout: float = READ_TIMEOUT_S,
) -> NodeReading:
    """Each host's node state from its backend (``hosts``: the whole fleet, so floors see all of it)."""
    reading = NodeReading()
    kubernetes: dict[str, str] = {}  # node -> host
    slurm: dict[tuple[str, str], dict[str, str]] = {}  # (scontrol, slurm.conf) -> node -> host
    for host in hosts:
        backend = backend_of(host.name, host.hostvars)
        node = str(host.hostvars.get(backend.node_var) or host.name) if backend.node_var else ""
        if backend.name == "kubernetes":
            kubernetes[node] = host.name
        elif backend.name == "slurm":
            key = (
                str(host.hostvars.get("fleetops_scontrol") or "scontrol"),
                str(host.hostvars.get("fleetops_slurm_conf") or ""),
            )
            slurm.setdefault(key, {})[node] = host.name
    if kubernetes:
        _read_kubernetes(kubernetes, dict(kube or {}), run, timeout, reading)
    for (scontrol, conf), nodes in sorted(slurm.items()):
        _read_slurm(nodes, scontrol, conf, run, timeout, reading)
    return reading


def scan_view(
    hosts: Sequence[InventoryHost], run: Run = subprocess.run, timeout: float = READ_TIMEOUT_S
) -> dict[str, dict[str, Any]]:
    """What ``fleetops scan`` reports of the scheduler: each Slurm host's node (``NodeState.to_dict()``; when
    scontrol could not be read, phase ``unknown`` and its one-line ``error``), keyed by host.

    Read once per scan on the controller (one ``scontrol show node`` per scontrol and slurm.conf the hosts
    name), for the hosts whose ``fleetops_quarantine_backend`` is ``slurm``; {} when there are none. Kubernetes
    nodes are read by ``remediate auto``, which is told which cluster (a scan is not)."""
    slurm = [h for h in hosts if on_slurm(h.hostvars)]
    if not slurm:
        return {}
    reading = read_nodes(slurm, run=run, timeout=timeout)
    view = {host: state.to_dict() for host, state in reading.states.items()}
    for host in slurm:
        if host.name in reading.unknown:
            node = str(host.hostvars.get(BACKENDS["slurm"].node_var or "") or host.name)
            view[host.name] = {"backend": "slurm", "node": node, "phase": "unknown", "ours": False,
                               "reason": "", "error": reading.unknown[host.name]}  # fmt: skip
    return view


def _call(argv: list[str], run: Run, timeout: float, env: Mapping[str, str] | None = None) -> str:
    """stdout of ``argv``; RuntimeError (one line) when it is missing, fails or does not answer."""
    try:
        proc = run(
            argv, capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL,
            env={**os.environ, **env} if env else None,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"no answer within {timeout:g} s") from None
    except OSError as exc:
        raise RuntimeError(exc.strerror or str(exc)) from None
    if proc.returncode != 0:
        lines = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        raise RuntimeError(lines[-1] if lines else f"exit {proc.returncode}")
    return str(proc.stdout)


def _read_kubernetes(
    nodes: Mapping[str, str], kube: dict[str, str], run: Run, timeout: float, reading: NodeReading
) -> None:
    kubectl = kube.get("kubectl") or "kubectl"
    # the CLI passes --kubectl's default when none was given: that names no cluster
    named = (
        kube.get("kubectl") not in (None, "", KUBECTL.default)
        or kube.get("kubeconfig")
        or os.environ.get("KUBECONFIG")
    )
    if not named:  # not even in a pod: an AWX job pod has an in-cluster config that may not list nodes
        reading.skipped.append(
            "kubernetes: no cluster named (--kubectl, --kubeconfig or $KUBECONFIG): cordoned nodes are not counted"
        )
        return
    argv = [kubectl, *(["--kubeconfig", kube["kubeconfig"]] if kube.get("kubeconfig") else [])]
    argv += ["get", "nodes", "-o", "json", f"--request-timeout={int(timeout)}s"]
    try:
        listed = json.loads(_call(argv, run, timeout + 5))
        items = listed["items"]
        found = {}
        for item in items:
            spec = item.get("spec") or {}
            taints = spec.get("taints") or []
            found[str(item["metadata"]["name"])] = NodeState(
                "kubernetes",
                str(item["metadata"]["name"]),
                "cordoned" if spec.get("unschedulable") else "notready" if _not_ready(item) else "in",
                ours=any(isinstance(t, Mapping) and t.get("key") == QUARANTINE_KEY for t in taints),
            )
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        reading.fail(f"kubernetes: kubectl get nodes: {_one_line(exc)}", nodes.values())
        return
    for node, host in nodes.items():
        reading.states[host] = found.get(node) or NodeState("kubernetes", node, "missing")


def _not_ready(item: Mapping[str, Any]) -> bool:
    """A node whose Ready condition is there and not True, or that carries a not-ready taint."""
    taints = (item.get("spec") or {}).get("taints") or []
    if any(isinstance(t, Mapping) and t.get("key") in NOT_READY_TAINTS for t in taints):
        return True
    conditions = (item.get("status") or {}).get("conditions") or []
    return any(
        isinstance(c, Mapping) and c.get("type") == "Ready" and str(c.get("status")) != "True"
        for c in conditions
    )


def _read_slurm(
    nodes: Mapping[str, str], scontrol: str, conf: str, run: Run, timeout: float, reading: NodeReading
) -> None:
    slurm = module_utils("slurm")
    try:
        text = _call([scontrol, "show", "node"], run, timeout, {"SLURM_CONF": conf} if conf else None)
        found = slurm.parse_show_nodes(text)
    except RuntimeError as exc:
        reading.fail(f"slurm: {scontrol} show node: {_one_line(exc)}", nodes.values())
        return
    for node, host in nodes.items():
        shown = found.get(node)
        if shown is None:
            reading.states[host] = NodeState("slurm", node, "missing")
            continue
        record = slurm.parse_record(shown["comment"])
        reading.states[host] = NodeState(
            "slurm",
            node,
            str(slurm.phase(shown)),
            ours=record is not None,
            reason=str(shown["reason"]),
            since=_epoch(record.get("time")) if record is not None else None,
            failed=bool(slurm.failed(shown)) and record is None,
        )


def _epoch(text: object) -> float | None:
    """The Unix time of a record's ``%Y-%m-%dT%H:%M:%SZ`` (None: absent or not that)."""
    try:
        return datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def _one_line(exc: BaseException) -> str:
    return one_line(str(exc), 300) or type(exc).__name__
