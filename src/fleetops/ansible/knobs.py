"""The scan's knobs, checked on the controller before any host is contacted.

``playbooks/scan.yml`` passes each node_health option OPTION as the extra var ``fleetops_OPTION``
(``| default(omit)``: the module's own default applies), and has two knobs of its own (``PLAYBOOK_KNOBS``:
the play's ``hosts`` and the task's ``timeout``). The options, their types and their ranges are declared
once, in the module's argument spec and ``health.validate`` (plugins/module_utils/health.py); this module
derives the knobs from them and checks what ``fleetops scan`` would send (``--checks``, the threshold
options, every ``-e``) the way the module would check it on each host: an unknown knob (a typo names the
nearest one), a value of the wrong type, an unknown check or a value out of range is one UsageError (exit 2)
instead of every host failing, or, for a misspelt knob, being silently ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cache
from typing import Any

from fleetops.ansible.collection import module_utils
from fleetops.errors import UsageError
from fleetops.util import nearest

KNOB_PREFIX = "fleetops_"
# The playbook's own knobs (a play or task keyword, not a module option), as argument specs.
PLAYBOOK_KNOBS: dict[str, dict[str, Any]] = {
    "fleetops_targets": {"type": "str"},  # the play's hosts: pattern
    "fleetops_host_timeout": {"type": "int"},  # the task's timeout:
}
# Host variables the playbook reads when the knob is unset (the fleetops.node.ec2 inventory's events).
FALLBACKS = {"ec2_scheduled_events": "inventory_events"}
# ansible's own variables (connection, become, interpreter): ansible-playbook's, not the playbook's knobs
ANSIBLE_PREFIX = "ansible_"


def _health() -> Any:
    return module_utils("health")


@cache
def knobs() -> dict[str, tuple[str, dict[str, Any]]]:
    """knob -> (the module option it sets, or the knob itself for the playbook's own; its argument spec)."""
    spec: dict[str, dict[str, Any]] = _health().ARGUMENT_SPEC
    out = {f"{KNOB_PREFIX}{option}": (option, dict(entry)) for option, entry in spec.items()}
    out.update({var: (option, dict(spec[option])) for var, option in FALLBACKS.items()})
    out.update({knob: (knob, dict(entry)) for knob, entry in PLAYBOOK_KNOBS.items()})
    return out


def check_names() -> tuple[str, ...]:
    """The detectors ``--checks`` may name, in the module's order (health.DETECTORS)."""
    return tuple(_health().DETECTORS)


def _template(value: Any) -> bool:
    """A Jinja template: ansible templates it on each host (fleetops.ansible.direct leaves such a host to
    ansible-playbook too); its value cannot be known here."""
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def check_checks(names: Iterable[str], where: str = "--checks") -> None:
    """UsageError naming the first unknown detector, the nearest known name and every known one."""
    known = check_names()
    for name in names:
        if name not in known:
            raise UsageError(
                f"{where}: unknown check {name!r}{nearest(name, known)}; known: {', '.join(known)}"
            )


def check_scan_vars(extravars: Mapping[str, Any]) -> None:
    """UsageError (one line) unless every extra var of a scan is a knob of playbooks/scan.yml (or one of
    ansible's own ``ansible_*`` variables) with a value the module accepts: its type, its choices, its range
    and the rules across options (``health.validate``: a warning level above its critical level)."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    table = knobs()
    given: dict[str, Any] = {}
    for key, value in extravars.items():
        if key.startswith(ANSIBLE_PREFIX):
            continue
        if key not in table:
            raise UsageError(
                f"-e {key}: not a knob of playbooks/scan.yml{nearest(key, table)} "
                "(the knobs: fleetops_<option> for each option of ansible-doc fleetops.node.node_health, "
                f"{', '.join(PLAYBOOK_KNOBS)})"
            )
        if value is None or _template(value):
            continue
        option, spec = table[key]
        if option == "checks":
            listed = value.split(",") if isinstance(value, str) else value
            if isinstance(listed, list | tuple):
                check_checks((str(c).strip() for c in listed), where=f"-e {key}")
        result = ArgumentSpecValidator({option: spec}).validate({option: value})
        if result.error_messages:
            raise UsageError(f"-e {key}={value!r}: {result.error_messages[0]}")
        if option in PLAYBOOK_KNOBS:
            continue
        if key.startswith(KNOB_PREFIX) or option not in given:  # the knob wins over its fallback
            given[option] = result.validated_parameters[option]
    params = dict(_health().DEFAULTS, **given)
    problem = _health().validate(params)
    if problem:
        raise UsageError(f"scan options: {problem}")
