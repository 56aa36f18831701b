"""The batch runner hands ansible-playbook the EC2 connection of a fleetops.node.ec2 inventory source in
the environment (what the controller-side EC2 modules read), never on its command line, and no secret
of it stays in runner's artifacts. A real moto_server answers the inventory plugin (loopback only).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from fleetops.ansible.runner import RunnerOptions, ec2_env, run_playbook
from fleetops.errors import FleetopsError
from fleetops_lab.ec2sim import MotoServer

SECRET = "stop-start-secret-9f3a1c77e2"
TOKEN = "stop-start-token-5d0b88aa41"


@pytest.fixture(scope="module")
def moto() -> Iterator[str]:
    server = MotoServer()
    url = server.start()
    try:
        yield url
    finally:
        server.stop()


def _inventory(tmp_path: Path, url: str, **extra: object) -> Path:
    folder = tmp_path / "inventory"
    folder.mkdir()
    (folder / "hosts.yml").write_text("all:\n  hosts:\n    localhost:\n      ansible_connection: local\n")
    config = {
        "plugin": "fleetops.node.ec2",
        "regions": ["us-east-1"],
        "endpoint_url": url,
        "aws_access_key": "AKIDSTOPSTART",
        "aws_secret_key": SECRET,
        "aws_session_token": TOKEN,
        **extra,
    }
    (folder / "fleet.fleet_ec2.yml").write_text(yaml.safe_dump(config))
    return folder


def test_ec2_env_of_an_ec2_source(tmp_path: Path) -> None:
    folder = _inventory(tmp_path, "http://127.0.0.1:5999")
    assert ec2_env([folder]) == {
        "AWS_ENDPOINT_URL_EC2": "http://127.0.0.1:5999",
        "AWS_ACCESS_KEY_ID": "AKIDSTOPSTART",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_SESSION_TOKEN": TOKEN,
    }
    assert ec2_env([folder / "hosts.yml"]) == {}


def test_only_a_file_that_names_the_plugin_is_parsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every batch of a rollout asks: a large static inventory is not parsed for it (a 7,500-host one took
    2.2 CPU s), whatever YAML style a source writes its plugin in (flow, quoted: found as before)."""
    folder = _inventory(tmp_path, "http://127.0.0.1:5999")
    (folder / "json.yml").write_text('{"plugin": "fleetops.node.ec2", "regions": ["eu-west-1"]}')
    parsed: list[str] = []
    real = yaml.safe_load

    def counting(text: str) -> object:
        parsed.append(text)
        return real(text)

    monkeypatch.setattr(yaml, "safe_load", counting)
    from fleetops.ansible.runner import ec2_sources

    found = [(p.name, data["regions"]) for p, data in ec2_sources([folder])]
    assert found == [("fleet.fleet_ec2.yml", ["us-east-1"]), ("json.yml", ["eu-west-1"])]
    assert len(parsed) == 2  # hosts.yml, which names no plugin, was not parsed


def test_ec2_env_refuses_a_connection_that_cannot_work(tmp_path: Path) -> None:
    folder = _inventory(tmp_path, "ftp://example")
    with pytest.raises(FleetopsError, match=r"^Failed to read the EC2 connection of .*endpoint_url must be"):
        ec2_env([folder])


def test_the_playbook_gets_the_connection_and_the_artifacts_keep_no_secret(
    tmp_path: Path, moto: str, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _inventory(tmp_path, moto)
    playbook = tmp_path / "check_env.yml"
    digest = {name: hashlib.sha1(value.encode()).hexdigest() for name, value in (("s", SECRET), ("t", TOKEN))}
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "The connection is in the environment (compared by digest: never printed)",
                            "ansible.builtin.assert": {
                                "that": [
                                    f"lookup('env', 'AWS_ENDPOINT_URL_EC2') == '{moto}'",
                                    "lookup('env', 'AWS_ACCESS_KEY_ID') == 'AKIDSTOPSTART'",
                                    f"lookup('env', 'AWS_SECRET_ACCESS_KEY') | hash('sha1') == '{digest['s']}'",
                                    f"lookup('env', 'AWS_SESSION_TOKEN') | hash('sha1') == '{digest['t']}'",
                                ],
                                "quiet": True,
                            },
                        }
                    ],
                }
            ]
        )
    )
    run = run_playbook(RunnerOptions(playbook=str(playbook), inventory=[folder], keep_artifacts=True))
    kept = capsys.readouterr().err.split("runner artifacts kept in ")[1].split()[0]
    assert run.status == "successful", run.tasks
    assert [t.status for t in run.tasks["localhost"]] == ["ok"]
    files = [p for p in Path(kept).rglob("*") if p.is_file()]
    command = [p for p in files if p.name == "command"]
    assert command, files  # runner's copy of the environment exists, scrubbed
    assert '"AWS_SECRET_ACCESS_KEY": "***"' in command[0].read_text()
    for path in files:
        text = path.read_bytes()
        assert SECRET.encode() not in text and TOKEN.encode() not in text, path
        assert b"AKIDSTOPSTART" not in text or path.name == "command", path  # the key id is no secret
