"""The options ``remediate ACTION`` and ``remediate auto`` share beyond plan's caps: the rollout guards'
value types (--host-timeout, --max-unhealthy, --not-after) and kubectl's options. Both commands import
them from here: ``remediate`` registers ``auto`` beside its actions, so ``auto`` cannot import them from
``remediate`` without a cycle."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from fleetops.cli.args import argtype
from fleetops.errors import UsageError
from fleetops.remediations import check_host_timeout
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


def add_kubectl_args(p: argparse.ArgumentParser) -> None:
    """--kubeconfig and --kubectl: the kubectl that quarantine and unquarantine run."""
    p.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig for kubectl (default: $KUBECONFIG, else ~/.kube/config, else in-cluster)",
    )
    p.add_argument("--kubectl", default="kubectl", metavar="PATH", help="kubectl to run (default: kubectl)")
