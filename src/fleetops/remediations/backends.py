"""Quarantine backends, declared once: what ``quarantine`` / ``unquarantine`` (and the policy's quarantine
rung, and the AWX templates that run them) do to a host depends on its scheduler.

Each host picks its backend with the inventory variable ``fleetops_quarantine_backend``:

- ``kubernetes`` (the default): kubectl cordon + taint + annotation on the node named by ``k8s_node_name``
  (else the inventory name), run on the controller;
- ``slurm``: ``scontrol update State=DRAIN`` / ``State=RESUME`` of the node named by ``fleetops_slurm_node``
  (else the inventory name), run on the controller (module ``fleetops.node.slurm_node``; the name rules are
  its ``module_utils/slurm.py``'s); ``--evict`` requeues the jobs running on a node fleetops drained;
- ``none``: no scheduler to take the host out of; quarantine and unquarantine do nothing and say so.

The playbooks branch on the same variable; ``check_targets`` refuses, before anything runs, a host whose
backend is unknown or whose node name its backend must not be given (one line, exit 2).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from fleetops.ansible.collection import module_utils
from fleetops.errors import UsageError
from fleetops.rollout import guards
from fleetops.util import BACKEND_VAR, SLURM_BACKEND

DEFAULT_BACKEND = "kubernetes"
# the taint (and annotation) key of fleetops' Kubernetes quarantine (the quarantine playbooks' fleetops_q_key)
QUARANTINE_KEY = "fleetops.io/quarantine"


class _Target(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def hostvars(self) -> Mapping[str, Any]: ...


def _check_k8s(node: str, host: str) -> None:
    guards.check_k8s_node_name(node, host)


def _check_slurm(node: str, host: str) -> None:
    why = module_utils("slurm").node_name_problem(node)
    if why is None:
        return
    of = f" (of host {host!r})" if host != node else ""
    raise UsageError(
        f"Slurm node name {node!r}{of} {why}: set the host's fleetops_slurm_node hostvar to its node's name"
    )


@dataclass(frozen=True)
class Backend:
    name: str
    node_var: str | None  # the hostvar naming the host's node (None: no node)
    check_node: Callable[[str, str], None] | None
    evicts: bool  # whether quarantine's --evict means something here (kubernetes: drain; slurm: requeue)


BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("kubernetes", "k8s_node_name", _check_k8s, evicts=True),
        Backend(SLURM_BACKEND, "fleetops_slurm_node", _check_slurm, evicts=True),  # --evict: requeue its jobs
        Backend("none", None, None, evicts=False),
    )
}


def backend_of(host: str, hostvars: Mapping[str, Any]) -> Backend:
    """The host's backend; UsageError (one line) for a value that names none."""
    value = hostvars.get(BACKEND_VAR, DEFAULT_BACKEND)
    backend = BACKENDS.get(value) if isinstance(value, str) else None
    if backend is None:
        raise UsageError(
            f"host {host!r}: {BACKEND_VAR} {value!r} is not a quarantine backend ({', '.join(BACKENDS)})"
        )
    return backend


def check_targets(targets: Iterable[_Target], evict: bool = False) -> None:
    """Refuse (UsageError, one line, nothing run) a host whose backend is unknown, whose node name its
    backend must not be given, or that ``--evict`` cannot apply to."""
    for target in targets:
        backend = backend_of(target.name, target.hostvars)
        if evict and not backend.evicts:
            raise UsageError(
                f"host {target.name!r}: --evict moves a node's work off (Kubernetes: drain; Slurm: requeue); "
                f"its {backend.name} quarantine does nothing"
            )
        if backend.node_var is not None and backend.check_node is not None:
            backend.check_node(str(target.hostvars.get(backend.node_var) or target.name), target.name)
