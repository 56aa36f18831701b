"""What a remediation is, declared once: its playbook, its parameters and everything derived from them.

A ``Remediation`` and each of its ``Param``s carry what every other place needs: the CLI builds one
sub-command per remediation and one option per parameter from them (``fleetops.cli.remediate``); the
policy's action names, its JSON Schema and the auto pass's order come from ``ladder_order()``; the extra
vars a rollout passes come from ``Remediation.extravars``; the host-timeout check from the parameters
that are waits (``host_waits``); the docs site's option tables and the AWX surveys are checked against them
by tests. Adding a remediation is one ``register(Remediation(...))`` (``catalog.py``) plus its playbook.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fleetops.errors import UsageError
from fleetops.rollout.gate import GateCheck
from fleetops.util import DAY_S, nearest

REQUIRED: Any = object()  # a parameter without a default: it must be given
DEFAULT_HOST_TIMEOUT_S = 600  # a task on a host (a unit disabled, a cache dropped, a service restarted)
MAX_HOST_TIMEOUT_S = DAY_S
Say = Callable[[str, str], None]  # (text, style) for the operator
# (params, inventory, limit, say) -> (extra vars to add to the parameters', the hosts to target or None:
# every selected host)
Prepare = Callable[[Mapping[str, Any], list[Path], str | None, Say], tuple[dict[str, Any], list[str] | None]]
Kind = Literal["value", "flag", "repeat"]


def _is_none(value: Any) -> bool:
    return value is None


def falsy(value: Any) -> bool:
    """``Param.omit``: left out of the extra vars when empty or false, not only when unset."""
    return not value


def resolved_path(value: Any) -> str:
    """``Param.convert`` of a file on the controller: absolute, ``~`` expanded, links resolved."""
    return str(Path(str(value)).expanduser().resolve())


def as_true(_value: Any) -> bool:
    """``Param.convert`` of a flag passed only when set."""
    return True


@dataclass(frozen=True)
class Param:
    """One parameter of a remediation: its value, its command-line option and the extra vars it becomes.

    ``help`` may name ``{default}`` (the default as the operator sees it) and ``{module}`` (", N" when
    the module's own default can be read from the collection, else "")."""

    name: str  # the key in ``params`` and the CLI's dest; the option is --name-with-dashes unless ``flag``
    help: str
    # REQUIRED, a value, a callable (called when needed: a default the collection owns), or None: unset,
    # the module's own default applies (the playbooks pass ``default(omit)``)
    default: Any = None
    kind: Kind = "value"  # "flag": store_true; "repeat": the option may be given again (a list)
    parse: Callable[[str], Any] | None = None  # text -> value, ValueError otherwise (fleetops.values)
    metavar: str | None = None
    choices: tuple[str, ...] | Callable[[], Iterable[str]] | None = None  # a callable: from the collection
    flag: str | None = None
    extravars: tuple[str, ...] = ()  # the extra vars it becomes, each with the same value
    convert: Callable[[Any], Any] | None = None  # the value as an extra var (list, dict, a path)
    omit: Callable[[Any], bool] = _is_none  # left out of the extra vars when this holds
    when: str | None = None  # passed only while this other parameter is set (true)
    check: Callable[[str, Any], None] | None = None  # (remediation, value): UsageError when unusable
    # a wait the host's time limit must exceed: True (the option's name) or one label per extra var
    waits: bool | tuple[str, ...] = False
    from_finding: Literal["check", "reason"] | None = None  # an auto pass fills it in from the finding
    module_default: Callable[[], Any] | None = None  # the module's default, for the help ({module})

    @property
    def option(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def validate(self, value: Any) -> None:
        """A value given as data (a policy rung's ``params``): ValueError, one line, when the option would
        refuse it or it is not of the parameter's type (``"false"`` for a flag, ``"10m"`` for seconds)."""
        if self.kind == "flag":
            if not isinstance(value, bool):
                raise ValueError(f"must be true or false, got {value!r}")
            return
        if self.kind != "repeat":
            self._validate_one(value)
        elif isinstance(value, Mapping):
            if self.convert is not dict:
                raise ValueError(f"must be a list, got an object: {value!r}")
            for k, v in value.items():
                if not isinstance(k, str) or not k or not isinstance(v, str):
                    raise ValueError(f"names and values must be strings, got {k!r}: {v!r}")
        elif isinstance(value, list | tuple):
            for item in value:
                self._validate_one(item)
        else:
            raise ValueError(f"must be a list, got {value!r}")

    def _validate_one(self, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ValueError(f"must be a {'number' if self.parse else 'string'}, got {value!r}")
        if self.parse is not None:
            parsed = self.parse(str(value))
            if isinstance(parsed, int | float) and isinstance(value, str):
                raise ValueError(f"must be a number, got the string {value!r}")
        elif not isinstance(value, str):
            raise ValueError(f"must be a string, got {value!r}")
        choices = self.choices() if callable(self.choices) else self.choices
        if choices is not None and value not in tuple(choices):
            raise ValueError(f"must be one of {', '.join(choices)}, got {value!r}")

    def wait_labels(self) -> tuple[tuple[str, str], ...]:
        """(label, extra var) for each extra var that is a wait."""
        if self.waits is False:
            return ()
        labels = (self.option,) * len(self.extravars) if self.waits is True else tuple(self.waits)
        return tuple(zip(labels, self.extravars, strict=True))


_UNSET: Any = object()


@dataclass(frozen=True)
class Fixes:
    """A finding a remediation acts on (``Remediation.fixes``): what ``fleetops scan`` offers as the finding's
    next step (``fleetops.next_steps``) when the policy's rung names no remediation that can act.

    ``check``: the finding's check (warning or critical: an info finding needs nothing done); ``params``:
    parameter -> the top-level key of the finding's ``data`` that gives its value (a repeatable parameter
    gets it as a one-item list; a finding without it is not one this remediation acts on); ``when``: key of
    ``data`` -> True (set and true), False (unset, null or false) or the value it must equal; ``acts``: what
    the keys cannot say (the finding -> whether the remediation would act on it: ``fix``'s own plan)."""

    check: str
    params: Mapping[str, str] = field(default_factory=dict)
    when: Mapping[str, Any] = field(default_factory=dict)
    acts: Callable[[Mapping[str, Any]], bool] | None = None
    severities: tuple[str, ...] = ("warning", "critical")

    def params_for(self, finding: Mapping[str, Any]) -> dict[str, Any] | None:
        """The parameters this finding gives, or None when it is not one this declaration covers."""
        if finding.get("check") != self.check or finding.get("severity") not in self.severities:
            return None
        data = finding.get("data") or {}
        if not isinstance(data, Mapping):
            return None
        for key, want in self.when.items():
            value = data.get(key)
            if want is True or want is False:
                if bool(value) is not want:
                    return None
            elif value != want:
                return None
        out: dict[str, Any] = {}
        for param, key in self.params.items():
            value = data.get(key, _UNSET)
            if value is _UNSET or value is None or value == "":
                return None
            out[param] = value
        if self.acts is not None and not self.acts(finding):
            return None
        return out


def check_host_timeout(seconds: int) -> int:
    """``--host-timeout``: whole seconds, at least 1, at most a day; UsageError otherwise."""
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise UsageError(f"--host-timeout must be whole seconds, got {seconds!r}")
    if not 1 <= seconds <= MAX_HOST_TIMEOUT_S:
        raise UsageError(f"--host-timeout must be between 1 and {MAX_HOST_TIMEOUT_S} seconds, got {seconds}")
    return seconds


@dataclass(frozen=True)
class Remediation:
    """A remediation the rollout can run: its playbook and the module whose result is the host's."""

    name: str
    playbook: str
    actions: tuple[str, ...]
    help: str
    parameters: tuple[Param, ...] = ()
    # its place in the auto pass's order (cheap and local first, capacity-taking last); None: not a
    # policy action (a rung cannot name it)
    ladder: int | None = None
    disruptive: bool = False  # takes the host out of service for a while (a reboot, a stop, a drain)
    # it only protects work (quarantine): a storm brake, which holds disruptive rungs, lets it go on
    protects: bool = False
    # Kubernetes: "cordon" (it cordons and annotates nodes: the annotation names the rollout),
    # "uncordon" (it reads and gives nodes back); either way the targets' node names are checked
    kubernetes: Literal["cordon", "uncordon"] | None = None
    # Optional: the extra vars that are not a parameter's (validation across parameters, a phase)
    more_vars: Callable[[Mapping[str, Any], dict[str, Any]], dict[str, Any]] | None = None
    # Optional: work out, before planning, which hosts need what (``fix`` scans first).
    prepare: Prepare | None = None
    # Optional: what the batch gate checks on top of "answers, no new critical finding".
    gate: GateCheck | None = None
    # Optional: extra vars that make the playbook only probe the host (resume after a kill).
    probe_vars: dict[str, Any] | None = None
    # Optional: extra vars for a second pass over the hosts that passed their gate (None: no pass).
    post_vars: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None
    cooldown: float = 0.0  # default cooldown between batches
    # --host-timeout's default: seconds each remediation task may take on a host (task `timeout:`)
    host_timeout: int = DEFAULT_HOST_TIMEOUT_S
    # --max-unhealthy's default (guards.MaxUnhealthy text); None: no capacity floor unless asked
    max_unhealthy: str | None = None
    # The playbook replaces each host by a new one (replace): the gate judges the playbook's own scan of
    # the new host (gate.replacement_entry) instead of scanning the old one, which is gone.
    replaces_host: bool = False
    # Optional: (hostvars -> a key, None: none) hosts sharing a key never share a batch (replace: the
    # Auto Scaling group, whose new instances could not be told apart), and why, for the plan's note
    one_per_batch: tuple[Callable[[Mapping[str, Any]], str | None], str] | None = None
    # Optional: (hostvars -> why this remediation must not touch the host, or None); a refused host is
    # left out untouched, skipped with "refused: <why>" (the rollout then exits 3; it is not unhealthy)
    refuse: Callable[[Mapping[str, Any]], str | None] | None = None
    # Optional: the collection module whose ``finish_instance(settings, record)`` finishes this action on an
    # EC2 instance that a killed auto pass left half done (stop-start: stopped, never started; replace: the
    # group's new instance found, then scanned clean by the pass); ``record``: the reservation's journal,
    # which keeps the module's ``in_flight_record(settings, region, instance_id)``, read before the batch
    in_flight: str | None = None
    # Optional: the flag parameter with which a batch a dead auto pass cut off is run again by the next pass
    # on each host it left in doubt, with the rung's parameters it was reserved with (quarantine's evict:
    # the cordon is done at once, the drain may have been cut off with the node's work still running); the
    # same attempt, its budget not spent again
    rerun_in_doubt: str | None = None
    # two or three whole command lines its --help ends with (a test parses each with the real parser)
    examples: tuple[str, ...] = ()
    # Optional: the findings it acts on and the parameters each gives (``Fixes``): a scan's ``next`` for a
    # finding whose policy rung names no remediation that can act (a ``human`` rung, no rule, no policy)
    fixes: tuple[Fixes, ...] = ()
    _by_name: dict[str, Param] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name = {p.name: p for p in self.parameters}
        if len(by_name) != len(self.parameters):
            raise ValueError(f"remediation {self.name}: a parameter is declared twice")
        for p in self.parameters:
            if p.when is not None and p.when not in by_name:
                raise ValueError(
                    f"remediation {self.name}: {p.name} is passed when {p.when!r}, not a parameter"
                )
        rerun = by_name.get(self.rerun_in_doubt) if self.rerun_in_doubt is not None else None
        if self.rerun_in_doubt is not None and (rerun is None or rerun.kind != "flag"):
            raise ValueError(f"remediation {self.name}: rerun_in_doubt {self.rerun_in_doubt!r} is not a flag")
        for fx in self.fixes:
            unknown = sorted(set(fx.params) - set(by_name))
            if unknown:
                raise ValueError(
                    f"remediation {self.name}: fixes {fx.check}: not a parameter: {', '.join(unknown)}"
                )
        object.__setattr__(self, "_by_name", by_name)

    @property
    def braked(self) -> bool:
        """Whether a storm brake holds this action: disruptive, and not one that only protects work."""
        return self.disruptive and not self.protects

    @property
    def params(self) -> dict[str, Any]:
        """parameter name -> default (REQUIRED: none; a default the collection owns is read from it)."""
        return {p.name: p.default() if callable(p.default) else p.default for p in self.parameters}

    @property
    def parameters_by_name(self) -> Mapping[str, Param]:
        return self._by_name

    def from_finding(self) -> dict[str, str]:
        """parameter -> what of the finding an auto pass puts there ("check" or "reason")."""
        return {p.name: p.from_finding for p in self.parameters if p.from_finding is not None}

    def resolve(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The parameters with defaults filled in; unknown or missing ones are a UsageError."""
        unknown = sorted(set(given) - set(self._by_name))
        if unknown:
            raise UsageError(f"remediate {self.name}: unknown parameter(s): {', '.join(unknown)}")
        out: dict[str, Any] = {}
        for p in self.parameters:
            if p.name in given and given[p.name] is not None:
                out[p.name] = given[p.name]
            elif p.required:
                raise UsageError(f"remediate {self.name}: the parameter {p.name!r} is required")
            else:
                out[p.name] = p.default() if callable(p.default) else p.default
        return out

    def extravars(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The extra vars of resolved ``params``: each parameter's, in declaration order (left out when
        ``omit`` holds or its ``when`` parameter is not set), then ``more_vars``'. UsageError when a
        parameter's ``check`` refuses its value."""
        xv: dict[str, Any] = {}
        for p in self.parameters:
            if not p.extravars or (p.when is not None and not params.get(p.when)):
                continue
            value = params.get(p.name)
            if p.omit(value):
                continue
            if p.check is not None:
                p.check(self.name, value)
            value = p.convert(value) if p.convert is not None else value
            for var in p.extravars:
                xv[var] = value
        return self.more_vars(params, xv) if self.more_vars is not None else xv

    def check_host_timeout(self, seconds: int, extravars: Mapping[str, Any]) -> int:
        """``seconds`` if it is a usable ``--host-timeout`` for this remediation, else UsageError.

        A host's limit must leave room for what it waits for (``host_waits``: a reboot, a drain...)."""
        check_host_timeout(seconds)
        waits = [
            (label, int(extravars[var]))
            for label, var in host_waits()
            if isinstance(extravars.get(var), int) and not isinstance(extravars.get(var), bool)
        ]
        if waits and seconds <= sum(v for _n, v in waits):
            told = " + ".join(f"{n} {v}" for n, v in waits)
            raise UsageError(f"--host-timeout {seconds} must be more than {told}, which it includes")
        return seconds


# ------------------------------------------------------------------------------ the registry

REMEDIATIONS: dict[str, Remediation] = {}


def register(remediation: Remediation) -> Remediation:
    """Add a remediation (``catalog.py`` declares fleetops' own); a name taken is a ValueError."""
    if remediation.name in REMEDIATIONS:
        raise ValueError(f"remediation {remediation.name!r} is declared twice")
    REMEDIATIONS[remediation.name] = remediation
    return remediation


def get(name: str) -> Remediation:
    try:
        return REMEDIATIONS[name]
    except KeyError:
        raise UsageError(
            f"unknown remediation {name!r}{nearest(name, REMEDIATIONS)}; one of {', '.join(REMEDIATIONS)}"
        ) from None


def ladder_order() -> tuple[str, ...]:
    """The policy's actions, in the order an auto pass runs them (``Remediation.ladder``)."""
    ranked = sorted((r.ladder, r.name) for r in REMEDIATIONS.values() if r.ladder is not None)
    return tuple(name for _rank, name in ranked)


def host_waits() -> tuple[tuple[str, str], ...]:
    """(option, extra var) of every wait a host's time limit includes, each extra var once."""
    seen: dict[str, str] = {}
    for r in REMEDIATIONS.values():
        for p in r.parameters:
            for label, var in p.wait_labels():
                seen.setdefault(var, label)
    return tuple((label, var) for var, label in seen.items())
