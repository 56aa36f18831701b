"""What to do next about each finding a scan reports (its ``next``), derived from the declarations.

A finding's ``next`` says the remediation that would act on it and the exact dry-run command for its
host (``fleetops remediate disable-unit --unit ecs.service -i INV -l gpu-01``: the command a person
reviews, then runs again with ``--apply``), and, when the policy has a rule for it, the rung of that
rule's ladder that would act. Nothing here names a detector:

- the rung is the policy's (``fleetops.policy.decide`` on the host with this finding alone, against the
  ladders the state directory records, read only: the rung a ``remediate auto`` pass would be at). The
  budgets, storm brakes and capacity floors are the pass's to judge across the fleet, at the time it
  runs; ``remediate auto --from SCAN`` shows them;
- the remediation is the rung's action when it is one and can be given for this finding (its
  parameters: the rung's, the finding's check for a parameter declared ``from_finding="check"``, and
  what the remediation's ``Fixes`` takes from the finding's data); else (a ``human`` rung, no rule, no
  policy, a ladder that ran out) the first remediation, in the auto pass's order, whose ``Fixes`` covers
  the finding;
- the command's values are checked as the remediation checks them (``Remediation.extravars``): a value
  it would refuse is no command; a host whose name fleetops cannot target exactly (``rollout.guards``)
  gets no command but the reason (``refused``); everything else is quoted for a POSIX shell.

A finding that no remediation acts on and no rule takes has no ``next``; one a rule takes but only a
person can act on (a ``human`` rung) has the rung alone. A scan (``ScanSteps``) loads the shipped policy
and the ladders when a finding first needs them: a scan that finds nothing never imports the policy.
"""

from __future__ import annotations

import json
import shlex
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetops.errors import FleetopsError, UsageError
from fleetops.rollout.guards import target_name_problem

if TYPE_CHECKING:  # the policy (pydantic) is loaded when a finding first needs it: a clean scan never does
    from fleetops.policy import LadderState, Policy
    from fleetops.remediations import Remediation  # the catalog, too: imported once a finding needs a step

PROG = "fleetops"
DEFAULT_POLICY = "default"  # how ``next.rung.policy`` names the policy fleetops ships
HUMAN = "human"  # fleetops.policy.HUMAN: a rung that runs nothing (a person acts)
ACTING = ("act", "wait", "budget")  # the decision statuses whose rung's action is the next step


def _order() -> list[Remediation]:
    """Every remediation, in the auto pass's order (those no rung can name last, by name)."""
    from fleetops.remediations import REMEDIATIONS, ladder_order

    ranked = list(ladder_order())
    rest = sorted(n for n in REMEDIATIONS if n not in ranked)
    return [REMEDIATIONS[n] for n in ranked + rest]


def _arg(option: str, value: Any) -> list[str]:
    """One option and its value as argv: ``--opt=VALUE`` when the value starts with '-' (read as an option)."""
    text = str(value)
    return [f"{option}={text}"] if text.startswith("-") else [option, text]


def option_args(remediation: Remediation, params: Mapping[str, Any]) -> list[str]:
    """The options that give ``params`` to ``fleetops remediate NAME``, in declaration order, each left
    out while it is the parameter's default (the inverse of ``cli.rollout_args.add_param``)."""
    defaults = remediation.params
    argv: list[str] = []
    for p in remediation.parameters:
        if p.name not in params:
            continue
        value = params[p.name]
        if value is None or (not p.required and value == defaults.get(p.name)):
            continue
        if p.kind == "flag":
            argv += [p.option] if value else []
        elif p.kind == "repeat":
            items = [f"{k}={v}" for k, v in value.items()] if isinstance(value, Mapping) else list(value)
            for item in items:
                argv += _arg(p.option, item)
        else:
            argv += _arg(p.option, value)
    return argv


# a finding's rung and the remediation chosen with its parameters (None, None: nothing to do)
_Choice = tuple[dict[str, Any] | None, "tuple[Remediation, dict[str, Any]] | None"]


@dataclass(frozen=True)
class NextSteps:
    """The ``next`` of findings: the policy (None: no rung), the state directory's ladders, and the
    inventories as the scan was given them (each an ``-i`` of the command; none: the default one)."""

    policy: Policy | None = None
    policy_name: str = DEFAULT_POLICY
    ladder: LadderState | None = None  # None: no ladder recorded (every one at its first rung)
    inventory: Sequence[str] = ()
    now: float = 0.0
    _cache: dict[tuple[str, str], _Choice] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    # ------------------------------------------------------------------------------ the rung

    def rung(self, host: str, finding: Mapping[str, Any]) -> dict[str, Any] | None:
        """The policy's rung for ``finding`` on ``host`` (its rule's ladder, where the state records it),
        or None: no policy, or no rule takes it."""
        if self.policy is None:
            return None
        from fleetops.policy import BudgetLedger, LadderState, decide

        alone = {"hosts": {host: {"status": "ok", "findings": [dict(finding)]}}}
        ladder = self.ladder if self.ladder is not None else LadderState()
        d = decide(self.policy, alone, ladder, BudgetLedger(), self.now, lambda _h: None)[0]
        if d.rule is None or d.rung is None:
            return None
        rule = self.policy.rule(d.rule)
        rung = rule.ladder[d.rung] if rule is not None else None
        out: dict[str, Any] = {
            "policy": self.policy_name,
            "rule": d.rule,
            "rung": d.rung + 1,  # counted from 1, as every text says it ("rung 1/4")
            "rungs": d.rungs,
            "action": d.rung_action,
            "status": d.status,
            "reason": d.reason,
        }
        if rung is not None and rung.params:
            out["params"] = dict(rung.params)
        if rung is not None and rung.note and rung.action != HUMAN:
            out["note"] = rung.note
        return out

    # ------------------------------------------------------------------------------ the command

    def params(
        self, remediation: Remediation, finding: Mapping[str, Any], given: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        """The parameters with which ``remediation`` acts on ``finding``; None when it cannot be given them
        (a required one unknown, a value it refuses)."""
        params: dict[str, Any] = {}
        for fx in remediation.fixes:
            found = fx.params_for(finding)
            if found is not None:
                params.update(found)
                break
        params.update(given)
        for name, source in remediation.from_finding().items():
            if source == "check" and name not in params:
                params[name] = finding.get("check")
        for name, value in list(params.items()):
            p = remediation.parameters_by_name.get(name)
            if p is not None and p.kind == "repeat" and isinstance(value, str | int | float):
                params[name] = [value]
        try:
            remediation.extravars(remediation.resolve(params))
            for name, value in params.items():
                remediation.parameters_by_name[name].validate(value)
        except (UsageError, ValueError, KeyError):
            return None
        except FleetopsError:  # a check that needs the collection: no command rather than a wrong one
            return None
        return params

    def _declared(self, finding: Mapping[str, Any]) -> tuple[Remediation, dict[str, Any]] | None:
        for remediation in _order():
            if any(fx.params_for(finding) is not None for fx in remediation.fixes):
                params = self.params(remediation, finding, {})
                if params is not None:
                    return remediation, params
        return None

    def argv(self, remediation: Remediation, params: Mapping[str, Any], host: str) -> list[str]:
        """``fleetops remediate NAME [options] [-i INV ...] -l HOST``: a dry run (no --apply)."""
        argv = [PROG, "remediate", remediation.name, *option_args(remediation, params)]
        for inv in self.inventory:
            argv += _arg("-i", inv)
        return argv + _arg("-l", host)

    def _choice(self, host: str, finding: Mapping[str, Any]) -> _Choice:
        """The rung and the remediation with its parameters for ``finding`` on ``host``: the same for every
        host with the same finding and the same ladders (a fault on many hosts is decided once)."""
        ladder = self.ladder.hosts.get(host) if self.ladder is not None else None
        key = (
            json.dumps(finding, sort_keys=True, default=str),
            repr(sorted(ladder.items())) if ladder else "",
        )
        if key not in self._cache:
            self._cache[key] = self._choose(host, finding)
        return self._cache[key]

    def _choose(self, host: str, finding: Mapping[str, Any]) -> _Choice:
        from fleetops.remediations import REMEDIATIONS

        rung = self.rung(host, finding)
        chosen: tuple[Remediation, dict[str, Any]] | None = None
        # the rung's action, while the ladder is on it (to act, waiting for it to clear, held by a budget); a
        # ladder that ran out (exhausted) or reached a person offers what the declarations say, for that person
        action = rung.get("action") if rung is not None and rung.get("status") in ACTING else None
        if action is not None and action != HUMAN and action in REMEDIATIONS:
            remediation = REMEDIATIONS[action]
            params = self.params(remediation, finding, (rung or {}).get("params") or {})
            if params is not None:
                chosen = remediation, params
        if chosen is None:
            chosen = self._declared(finding)
        return rung, chosen

    def finding(self, host: str, finding: Mapping[str, Any]) -> dict[str, Any] | None:
        """``finding``'s ``next`` on ``host``, or None when no remediation acts on it and no rule takes it."""
        rung, chosen = self._choice(host, finding)
        if chosen is None and rung is None:
            return None
        out: dict[str, Any] = {"remediation": None, "command": None}
        if chosen is not None:
            remediation, params = chosen
            out["remediation"] = remediation.name
            problem = target_name_problem(host)
            if problem is None:
                argv = self.argv(remediation, params, host)
                out["command"] = shlex.join(argv)
                out["argv"] = argv
            else:
                out["refused"] = f"host name {host!r} {problem}: fleetops targets hosts by their exact name"
        if rung is not None:
            out["rung"] = dict(rung)
        return out

    def entry(self, host: str, entry: Mapping[str, Any]) -> dict[str, Any]:
        """A scan report's host entry with each finding's ``next`` (a finding without one is unchanged)."""
        findings = []
        for f in entry.get("findings") or []:
            step = self.finding(host, f)
            findings.append({**f, "next": step} if step is not None else f)
        return {**entry, "findings": findings}

    def report(self, report: Mapping[str, Any]) -> dict[str, Any]:
        """``report`` (fleetops.scan/v1) with every finding's ``next``."""
        hosts = {h: self.entry(h, e) for h, e in (report.get("hosts") or {}).items()}
        return {**report, "hosts": hosts}


class ScanSteps:
    """A scan's ``NextSteps``: the policy and the ladders loaded once, when a finding first needs them (a
    given policy at once: a bad one is exit 2 before any host is contacted); ``record``: the report's
    ``next_steps`` (the policy, the ladders read and why not)."""

    def __init__(
        self,
        policy: Path | None,
        state_dir: Path | None,
        inventory: Sequence[str],
        now: float,
        loaded: Any = None,
    ) -> None:
        """``loaded``: ``policy`` (or the default one) already loaded by the caller, not read again."""
        self._policy = policy
        self._loaded = loaded
        self._state_dir = state_dir
        self._inventory = tuple(inventory)
        self._now = now
        self._steps: NextSteps | None = None
        self._checked: Any = None  # the policy, loaded and checked (policy())
        self._lock = threading.RLock()  # policy() within steps()
        self.record: dict[str, Any] = {"policy": str(policy) if policy is not None else DEFAULT_POLICY}
        if state_dir is not None:
            from fleetops.util import LADDER_FILE

            self.record["ladders"] = str(state_dir / LADDER_FILE)
        if policy is not None:
            self.steps()

    def steps(self) -> NextSteps:
        with self._lock:
            if self._steps is None:
                self._steps = self._load()
            return self._steps

    def policy(self) -> Any:
        """The scan's policy (the given one, else the one fleetops ships), loaded and checked once."""
        with self._lock:
            if self._checked is None:
                from fleetops.auto.actions import check_policy_actions
                from fleetops.policy import default_policy_path, load_policy

                path = self._policy if self._policy is not None else default_policy_path()
                policy = self._loaded if self._loaded is not None else load_policy(path)
                check_policy_actions(policy, str(path))
                self._checked = policy
            return self._checked

    def _load(self) -> NextSteps:
        from fleetops.documents import DocumentError
        from fleetops.policy import LadderState

        policy = self.policy()
        ladder = None
        if "ladders" in self.record:
            try:
                ladder = LadderState.load(Path(self.record["ladders"]))
            except (DocumentError, OSError) as exc:
                self.record["ladders_error"] = f"not read, every ladder taken at its first rung: {exc}"
        return NextSteps(policy, self.record["policy"], ladder, self._inventory, self._now)

    def entry(self, host: str, entry: Mapping[str, Any]) -> dict[str, Any]:
        """``NextSteps.entry``; a host without a finding as it is (nothing loaded for it)."""
        return self.steps().entry(host, entry) if entry.get("findings") else dict(entry)

    def report(self, report: Mapping[str, Any]) -> dict[str, Any]:
        hosts = {h: self.entry(h, e) for h, e in (report.get("hosts") or {}).items()}
        return {**report, "hosts": hosts}


def load(
    policy: Path | None, state_dir: Path | None, inventory: Sequence[str], now: float
) -> tuple[NextSteps, dict[str, Any]]:
    """The ``NextSteps`` of ``policy`` (None: the one fleetops ships) and the ladders ``state_dir`` records
    (None: none), loaded now, and their record (``ScanSteps.record``)."""
    scan_steps = ScanSteps(policy, state_dir, inventory, now)
    return scan_steps.steps(), scan_steps.record
