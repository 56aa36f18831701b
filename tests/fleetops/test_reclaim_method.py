"""`fleetops remediate reclaim --method`: parsed, passed to the playbook as fleetops_reclaim_method, unset by default."""

from __future__ import annotations

import pytest

from fleetops.cli.app import build_parser
from fleetops.cli.remediate import remediation_request
from fleetops.remediations import REMEDIATIONS


def _extravars(*argv: str) -> dict[str, object]:
    args = build_parser().parse_args(["remediate", "reclaim", *argv])
    request = remediation_request(args)
    return REMEDIATIONS["reclaim"].extravars(request.params)


@pytest.mark.parametrize("method", ["drop_caches", "memory_reclaim", "both"])
def test_method_reaches_the_playbook(method: str) -> None:
    assert _extravars("--method", method)["fleetops_reclaim_method"] == method


def test_no_method_leaves_the_modules_default() -> None:
    assert "fleetops_reclaim_method" not in _extravars()


def test_an_unknown_method_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["remediate", "reclaim", "--method", "purge"])
    assert "invalid choice: 'purge'" in capsys.readouterr().err


def test_the_playbook_passes_the_knob_to_the_module() -> None:
    from tests.paths import REPO

    text = (REPO / "playbooks/remediate_reclaim.yml").read_text()
    assert 'method: "{{ fleetops_reclaim_method | default(omit) }}"' in text
