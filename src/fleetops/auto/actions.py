"""The actions a pass runs: the policy checked against the remediations that exist, each decision's
parameters, and the batches (one rollout per action and parameter set)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fleetops.errors import UsageError
from fleetops.policy import (
    HUMAN,
    Decision,
    Policy,
)
from fleetops.remediations import REMEDIATIONS, ladder_order
from fleetops.values import QUARANTINE_REASON_MAX, printable_line, quarantine_reason

REASON_MAX = QUARANTINE_REASON_MAX  # the quarantine reason kept in the node's annotation


def check_policy_actions(policy: Policy, source: str) -> None:
    """UsageError unless every rung's action is a remediation (or ``human``) and its params are that
    remediation's parameters (``quarantine``'s ``finding`` and ``reason`` come from the finding)."""
    for rule in policy.rules:
        for i, rung in enumerate(rule.ladder):
            if rung.action == HUMAN:
                continue
            remediation = REMEDIATIONS.get(rung.action)
            where = f"{source}: rule {rule.name} rung {i + 1} ({rung.action})"
            if remediation is None:
                raise UsageError(
                    f"{where}: fleetops has no such remediation (one of {', '.join(REMEDIATIONS)})"
                )
            unknown = sorted(set(rung.params) - set(remediation.params) - set(remediation.from_finding()))
            if unknown:
                raise UsageError(
                    f"{where}: unknown parameter(s) {', '.join(unknown)} "
                    f"(remediate {rung.action} takes {', '.join(sorted(remediation.params)) or 'none'})"
                )


def action_params(d: Decision, extra: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The parameters of ``d``'s action: the rung's, the operator's per-action ones (``extra``: kubectl,
    kubeconfig...), and what the finding gives (quarantine's check and reason)."""
    assert d.action is not None
    remediation = REMEDIATIONS[d.action]
    params: dict[str, Any] = {k: v for k, v in extra.get(d.action, {}).items() if k in remediation.params}
    params.update(d.params)
    for name, source in remediation.from_finding().items():  # what the finding supplies (Param.from_finding)
        if source == "reason":
            # the summary is the host's text: one printable line, as every reason fleetops writes (the node's
            # annotation, Slurm's drain reason, the audit log) must be
            reason = printable_line(
                f"fleetops remediate auto: rule {d.rule} rung {(d.rung or 0) + 1}: {d.summary or d.check}",
                REASON_MAX,
            )
            params[name] = quarantine_reason(reason)
        elif d.check:
            params[name] = d.check
    return {k: v for k, v in params.items() if k in remediation.params}


def freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((k, freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def batches(
    decisions: Sequence[Decision], extra: Mapping[str, Mapping[str, Any]]
) -> list[tuple[str, dict[str, Any], list[str]]]:
    """The rollouts a pass runs: one per action and parameter set, in ``ladder_order()``, hosts sorted."""
    grouped: dict[tuple[str, Any], tuple[dict[str, Any], list[str]]] = {}
    for d in decisions:
        if d.status != "act" or d.action is None or d.action == HUMAN:
            continue
        params = action_params(d, extra)
        key = (d.action, freeze(params))
        grouped.setdefault(key, (params, []))[1].append(d.host)
    order = {a: i for i, a in enumerate(ladder_order())}
    out = [(action, params, sorted(hosts)) for (action, _k), (params, hosts) in grouped.items()]
    out.sort(key=lambda t: (order.get(t[0], len(order)), t[2]))
    return out


def disruptive(action: str | None) -> bool:
    """The action takes its host out of service (reboot, quarantine, stop-start, replace)."""
    return action is not None and action in REMEDIATIONS and REMEDIATIONS[action].disruptive
