"""Facts that live once, in the collection's plugins/module_utils, as the controller reads them.

The severity order (``findings.SEVERITIES``), the zombie thresholds' defaults
(``memcg.DEFAULT_THRESHOLDS``), the UCX environment fixes (``ucx.FIXES``) and the Prometheus gauges
(``gauges.GAUGES``, shared with the host timer's writer). Only this layer loads
the collection's code; scan, planner, fix and the CLI import these names from here. The constants are
read from the collection's source (``collection.constant``), without importing ansible: the CLI's
``--help`` shows them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cache
from types import ModuleType
from typing import Any

from fleetops.ansible.collection import constant, module_utils, option_spec

# The task actions of a scan: the node_health module, by its full and its short name (scan.yml's call,
# and the playbook's own scan of a host's replacement).
SCAN_ACTIONS = frozenset({"fleetops.node.node_health", "node_health"})


@cache
def severities() -> tuple[str, ...]:
    """Severities worst first: ``("critical", "warning", "info")`` (findings.SEVERITIES reversed)."""
    return tuple(reversed(tuple(module_utils("findings").SEVERITIES)))


def severity_rank(severity: str) -> int:
    """info < warning < critical; unknown names raise ValueError (findings.severity_rank)."""
    rank: int = module_utils("findings").severity_rank(severity)
    return rank


@cache
def coverage_levels() -> tuple[str, ...]:
    """Whether a check could look: ``("full", "partial", "none")`` (findings.COVERAGE_LEVELS)."""
    return tuple(module_utils("findings").COVERAGE_LEVELS)


@cache
def answered_statuses() -> tuple[str, ...]:
    """The scan statuses of a host that answered: ``("ok", "partial")`` (findings.ANSWERED_STATUSES); its
    findings stand either way, ``partial`` says a check could not look fully."""
    return tuple(module_utils("findings").ANSWERED_STATUSES)


def answered(entry: Mapping[str, Any]) -> bool:
    """A scan report entry whose host answered (``ok`` or ``partial``): its findings and facts can be used."""
    return entry.get("status") in answered_statuses()


def answered_status(coverage: Mapping[str, Any] | None) -> str:
    """``ok`` when every check of ``coverage`` ({check: {level, reason}}) looked fully, else ``partial``
    (findings.answered_status)."""
    return str(module_utils("findings").answered_status(coverage))


@cache
def _thresholds() -> dict[str, Any]:
    return dict(constant("memcg", "DEFAULT_THRESHOLDS"))


def zombie_warning_default() -> int:
    """Zombie memcgs at which the scan warns (and reclaim acts): memcg.DEFAULT_THRESHOLDS."""
    return int(_thresholds()["zombie_warning"])


def zombie_critical_default() -> int:
    return int(_thresholds()["zombie_critical"])


def headroom_critical_pct_default() -> float:
    return float(_thresholds()["headroom_critical_pct"])


def ucx_default_fix() -> str:
    """The fix ``remediate fix`` applies unless told otherwise (ucx.DEFAULT_FIX: the bounded rcache)."""
    return str(constant("ucx", "DEFAULT_FIX"))


@cache
def ucx_fixes() -> dict[str, dict[str, str]]:
    """``{"hooks-off": {"UCX_MEM_MMAP_HOOK_MODE": "none"}, "rcache-bound": {...}}`` (ucx.FIXES)."""
    return {name: dict(env) for name, env in constant("ucx", "FIXES").items()}


def module_option(module: str, option: str, key: str = "default") -> Any:
    """A literal of a module's option: ``module_option("set_env", "drop_in")`` -> its default, read from
    the module's argument spec (``collection.option_spec``)."""
    return option_spec(module, option, key)


def module_default(module: str, option: str) -> Callable[[], Any]:
    """A reader of a module option's default, for a parameter's default or help: called when needed."""

    def read() -> Any:
        return option_spec(module, option, "default")

    read.__name__ = f"{module}.{option}"
    return read


def module_choices(module: str, option: str) -> Callable[[], tuple[str, ...]]:
    """A reader of a module option's choices."""

    def read() -> tuple[str, ...]:
        return tuple(option_spec(module, option, "choices"))

    read.__name__ = f"{module}.{option}.choices"
    return read


def gauges() -> ModuleType:
    """The collection's gauge definitions (gauges.GAUGES: name, help, labels, scope) and ``host_series``,
    the values of one host's scan entry: the same the host timer writes on each host."""
    return module_utils("gauges")


def textfile_mode() -> int:
    """The mode of a node_exporter textfile (textfile.TEXTFILE_MODE, 0644, the host timer's): node_exporter
    runs as its own user and must read it; the gauges are counts, names and versions, no secret."""
    return int(constant("textfile", "TEXTFILE_MODE"))


def protected_unit(name: str, extra: Sequence[str] = ()) -> str | None:
    """The protected pattern ``name`` matches (systemd.protected_match: the modules' built-in list plus
    ``extra``), else None. On the host, disable_unit checks every name systemd resolves too."""
    match = module_utils("systemd").protected_match([normalize_unit_name(name), name], tuple(extra))
    return None if match is None else str(match[1])


def normalize_unit_name(name: str) -> str:
    """systemctl's unit-name rule, as the modules apply it (systemd.normalize_unit_name): ``ecs`` ->
    ``ecs.service``, ``dbus-org.freedesktop.login1`` -> ``dbus-org.freedesktop.login1.service``.
    A name the rule refuses is returned unchanged (the module then refuses it, with its reason)."""
    systemd = module_utils("systemd")
    try:
        return str(systemd.normalize_unit_name(name))
    except systemd.UnitNameError:
        return name


# The values the modules check on each host, checked here first (a remediation's options: the rollout
# starts only with values every host would accept). Each returns the modules' own message, or None.


def unit_name_problem(name: str) -> str | None:
    """Why systemctl (and disable_unit, set_env) would refuse the unit name, or None."""
    systemd = module_utils("systemd")
    try:
        systemd.normalize_unit_name(name)
    except systemd.UnitNameError as err:
        return str(err)
    return None


def unit_patterns_problem(patterns: Sequence[str], option: str) -> str | None:
    """The first unit-name glob the modules refuse (systemd.validate_unit_patterns), or None."""
    problem = module_utils("systemd").validate_unit_patterns(list(patterns), option)
    return None if problem is None else str(problem)


def container_names_problem(names: Sequence[str]) -> str | None:
    """The first docker container name disable_unit refuses, or None."""
    problem = module_utils("systemd").validate_container_names(list(names))
    return None if problem is None else str(problem)


def drop_in_problem(name: str) -> str | None:
    """Why set_env would refuse the drop-in file name, or None."""
    systemd = module_utils("systemd")
    try:
        systemd.check_drop_in_name(name)
    except systemd.DropInError as err:
        return str(err)
    return None


def env_problem(env: Mapping[str, Any]) -> str | None:
    """Why set_env would refuse a variable (its name, a control character in its value; never the value
    itself), or None."""
    systemd = module_utils("systemd")
    try:
        systemd.validate_env(dict(env))
    except systemd.DropInError as err:
        return str(err)
    return None
