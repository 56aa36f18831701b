"""The options ``remediate ACTION`` and ``remediate auto`` share beyond plan's caps: the rollout guards'
value types (--host-timeout, --max-unhealthy, --not-after), kubectl's options, and the option of a
remediation's declared parameter (``add_param``). Both commands import
them from here: ``remediate`` registers ``auto`` beside its actions, so ``auto`` cannot import them from
``remediate`` without a cycle."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from fleetops.cli.args import argtype, collection_default, shown
from fleetops.errors import UsageError
from fleetops.remediations import Param, check_host_timeout
from fleetops.remediations.catalog import KUBECONFIG, KUBECTL
from fleetops.rollout.guards import MaxUnhealthy, parse_not_after


def _parse_host_timeout(text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise UsageError(f"must be whole seconds, got {text!r}") from None
    return check_host_timeout(value)


# the guards' parsers raise UsageError: checked at parse time (exit 2)
max_unhealthy = argtype(MaxUnhealthy.parse, errors=(UsageError,), name="--max-unhealthy")
host_timeout = argtype(_parse_host_timeout, errors=(UsageError,), name="--host-timeout")
not_after = argtype(
    lambda text: parse_not_after(text, datetime.now(UTC)), errors=(UsageError,), name="--not-after"
)


def _help(param: Param) -> str:
    """The option's help: ``{default}``, ``{module}`` and ``{module_value}`` filled in (the collection's
    values read when it is found: ``--help`` works without it)."""
    default = collection_default(param.default) if callable(param.default) else param.default
    module = collection_default(param.module_default) if param.module_default is not None else None
    return param.help.format(
        default="the module's" if default is None else default,
        module=shown(module),
        module_value="the module's" if module is None else module,
    )


def add_param(p: argparse.ArgumentParser, param: Param) -> None:
    """The option of a remediation's parameter (``fleetops.remediations.Param``), its name as dest."""
    kwargs: dict[str, Any] = {"dest": param.name, "help": _help(param)}
    if param.required:
        kwargs["required"] = True
    if param.kind == "flag":
        p.add_argument(param.option, action="store_true", **kwargs)
        return
    if param.metavar is not None:
        kwargs["metavar"] = param.metavar
    if param.parse is not None:
        kwargs["type"] = argtype(param.parse)
    choices = param.choices
    if callable(choices):  # None without the collection: the command then says so
        found = collection_default(choices)
        choices = None if found is None else tuple(found)
    if choices is not None:
        kwargs["choices"] = choices
    if param.kind == "repeat":
        kwargs["action"] = "append"
        kwargs["default"] = None if param.required else []
    elif not param.required and not callable(param.default):
        kwargs["default"] = param.default  # a default the collection owns is read when the run resolves
    p.add_argument(param.option, **kwargs)


def add_kubectl_args(p: argparse.ArgumentParser) -> None:
    """--kubectl and --kubeconfig, as quarantine and unquarantine declare them (``remediate auto``
    passes them to every action that acts on Kubernetes nodes)."""
    for param in (KUBECTL, KUBECONFIG):
        add_param(p, param)
