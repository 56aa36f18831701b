"""`fleetops remediate reclaim --method` and `remediate fix --method`: parsed, passed to the playbook as
fleetops_reclaim_method, unset by default, and handed by both playbooks to reclaim_memcg's ``method``."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from fleetops.cli.app import build_parser
from fleetops.cli.remediate import remediation_request
from fleetops.remediations import REMEDIATIONS
from tests.paths import REPO

ACTIONS = ("reclaim", "fix")


def _extravars(action: str, *argv: str) -> dict[str, object]:
    args = build_parser().parse_args(["remediate", action, *argv])
    request = remediation_request(args)
    return REMEDIATIONS[action].extravars(request.params)


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("method", ["drop_caches", "memory_reclaim", "both"])
def test_method_reaches_the_playbook(action: str, method: str) -> None:
    assert _extravars(action, "--method", method)["fleetops_reclaim_method"] == method


@pytest.mark.parametrize("action", ACTIONS)
def test_no_method_leaves_the_modules_default(action: str) -> None:
    assert "fleetops_reclaim_method" not in _extravars(action)


@pytest.mark.parametrize("action", ACTIONS)
def test_an_unknown_method_is_refused(action: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["remediate", action, "--method", "purge"])
    assert "invalid choice: 'purge'" in capsys.readouterr().err


def _reclaim_tasks(node: Any) -> list[dict[str, Any]]:
    """Every task of a parsed playbook that calls reclaim_memcg, blocks and always included."""
    found: list[dict[str, Any]] = []
    if isinstance(node, list):
        for item in node:
            found += _reclaim_tasks(item)
    elif isinstance(node, dict):
        if "fleetops.node.reclaim_memcg" in node:
            found.append(node["fleetops.node.reclaim_memcg"])
        for key in ("tasks", "block", "always", "rescue"):
            found += _reclaim_tasks(node.get(key))
    return found


@pytest.mark.parametrize("playbook", ["remediate_reclaim.yml", "remediate_fix.yml"])
def test_the_playbook_passes_the_knob_to_the_module(playbook: str) -> None:
    tasks = _reclaim_tasks(yaml.safe_load((REPO / "playbooks" / playbook).read_text()))
    assert tasks, f"{playbook} calls no reclaim_memcg"
    for args in tasks:
        assert args.get("method") == "{{ fleetops_reclaim_method | default(omit) }}", args
