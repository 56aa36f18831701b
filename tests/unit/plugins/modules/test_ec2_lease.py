"""fleetops.node.ec2_lease against a real moto_server on 127.0.0.1 (no boto3 mocks; loopback only).

The module runs as Ansible runs it (``ansible localhost -m``, tests.helpers.run_module: the whole
take/check/renew/release cycle and a check-mode take; ``ansible-playbook`` for the playbook tasks), and
elsewhere its main() runs in this process (tests.helpers.call_module: the same module code, arguments
and result, without 1.3 CPU-seconds of controller and module start per call). It shares its tags
with the CLI's lease (fleetops.rollout.lease.Ec2Lease) both ways: a lease either side holds refuses the
other, an expired one is taken over by the other, and a playbook run by the CLI checks the CLI's lease
instead of taking its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.fleetops.node.plugins.modules import ec2_lease

from fleetops.rollout.lease import KEY_PREFIX, Ec2Connection, Ec2Lease, LeaseError
from fleetops_lab.ec2sim import MotoServer, client, launch_many
from tests.helpers import call_module, run_module
from tests.paths import REPO

REGION = "us-east-1"
CLI_A, CLI_B = "20260101T000000Z-aaaaaa", "20260101T000001Z-bbbbbb"
MODULE = "fleetops.node.ec2_lease"


@pytest.fixture(scope="module")
def moto() -> Iterator[tuple[str, list[str]]]:
    server = MotoServer()
    url = server.start()
    try:
        yield url, launch_many(url, REGION, 4)
    finally:
        server.stop()


def _tags(url: str, ids: list[str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {i: {} for i in ids}
    answer = client(url, REGION).describe_tags(Filters=[{"Name": "resource-id", "Values": ids}])
    for tag in answer["Tags"]:
        if tag["Key"].startswith(KEY_PREFIX):
            out[tag["ResourceId"]][tag["Key"]] = tag["Value"]
    return out


def _cli(url: str, ids: list[str], rollout: str, lines: list[str] | None = None, **kw: Any) -> Ec2Lease:
    conn = Ec2Connection(
        endpoint_url=url,
        aws_access_key="testing",
        aws_secret_key="testing",
        regions=(REGION,),
        max_attempts=5,
        initial_backoff=0.01,
        max_backoff=0.05,
    )
    instances = {f"host-{i}": {"instance": iid, "region": REGION} for i, iid in enumerate(ids)}
    kw.setdefault("settle", 0.2)
    say = lines.append if lines is not None else (lambda _line: None)
    return Ec2Lease(conn, instances, rollout, "bob@laptop", say=say, **kw)


def _run(
    tmp_path: Path, url: str, ids: list[str], *extra: str, via_ansible: bool = False, **args: Any
) -> tuple[int, dict[str, Any]]:
    """The module on these instances: its main() in this process (tests.helpers.call_module), or with
    via_ansible as Ansible runs it (``ansible localhost -m``), where the controller's part is proven."""
    params: dict[str, Any] = {
        "instances": {f"gpu-{n}": iid for n, iid in enumerate(ids)},
        "instance_regions": {f"gpu-{n}": REGION for n in range(len(ids))},
        "endpoint_url": url,
        "aws_access_key": "testing",
        "aws_secret_key": "testing",
        "settle": 0.2,
        "operator": "alice@awx",
        **args,
    }
    if via_ansible:
        return run_module(tmp_path, MODULE, json.dumps(params), *extra)
    assert set(extra) <= {"--check"}, extra
    return call_module(tmp_path, ec2_lease.main, params, check="--check" in extra)


def test_take_check_renew_and_release(moto: tuple[str, list[str]], tmp_path: Path) -> None:
    url, ids = moto
    rc, taken = _run(tmp_path, url, ids[:2], rollout="awx-job-1", ttl=600, via_ansible=True)
    assert rc == 0 and taken["changed"] is True, taken
    assert taken["key"] == KEY_PREFIX + "awx-job-1"
    for iid in ids[:2]:  # the CLI's fields, compact JSON
        value = _tags(url, ids[:2])[iid][KEY_PREFIX + "awx-job-1"]
        assert value == taken["value"] and len(value.encode()) <= 256
        data = json.loads(value)
        assert set(data) == {"operator", "since", "expires"} and data["operator"] == "alice@awx"
        assert data["expires"] == taken["expires"] and data["since"] == taken["since"]
    rc, checked = _run(tmp_path, url, ids[:2], rollout="awx-job-1", state="checked", via_ansible=True)
    assert rc == 0 and checked["changed"] is False and checked["expires"] == taken["expires"], checked
    time.sleep(1.1)  # whole seconds in the tag
    rc, renewed = _run(
        tmp_path, url, ids[:2], rollout="awx-job-1", state="renewed", ttl=1200, via_ansible=True
    )
    assert rc == 0 and renewed["changed"] is True, renewed
    assert renewed["since"] == taken["since"] and renewed["expires"] > taken["expires"]
    rc, again = _run(
        tmp_path, url, ids[:2], rollout="awx-job-1", ttl=600, via_ansible=True
    )  # taking it again keeps its place
    assert rc == 0 and again["since"] == taken["since"]
    rc, released = _run(tmp_path, url, ids[:2], rollout="awx-job-1", state="released", via_ansible=True)
    assert rc == 0 and released["changed"] is True and released["released"] == sorted(ids[:2])
    assert _tags(url, ids[:2]) == {i: {} for i in ids[:2]}
    rc, twice = _run(tmp_path, url, ids[:2], rollout="awx-job-1", state="released", via_ansible=True)
    assert rc == 0 and twice["changed"] is False and twice["released"] == []
    rc, gone = _run(tmp_path, url, ids[:2], rollout="awx-job-1", state="checked", via_ansible=True)
    assert rc != 0 and "no lease of this rollout" in gone["msg"] and "gpu-0 (" in gone["msg"]
    rc, lost = _run(tmp_path, url, ids[:2], rollout="awx-job-1", state="renewed", via_ansible=True)
    assert rc != 0 and lost["msg"].startswith("Failed to renew the EC2 lease of rollout awx-job-1: ")


def test_check_mode_reads_and_reports_but_writes_nothing(moto: tuple[str, list[str]], tmp_path: Path) -> None:
    url, ids = moto
    rc, would = _run(tmp_path, url, ids[:2], "--check", rollout="awx-job-2", via_ansible=True)
    assert rc == 0 and would["changed"] is True and json.loads(would["value"])["operator"] == "alice@awx"
    assert _tags(url, ids[:2]) == {i: {} for i in ids[:2]}
    _run(tmp_path, url, ids[:2], rollout="awx-job-2")
    try:
        rc, would_release = _run(tmp_path, url, ids[:2], "--check", rollout="awx-job-2", state="released")
        assert rc == 0 and would_release["changed"] is True
        assert all(KEY_PREFIX + "awx-job-2" in t for t in _tags(url, ids[:2]).values())
        # a take that would be refused fails in check mode too, and writes nothing
        rc, refused = _run(tmp_path, url, ids[:2], "--check", rollout="awx-job-3")
        assert rc != 0 and "held by another rollout" in refused["msg"]
        assert all(KEY_PREFIX + "awx-job-3" not in t for t in _tags(url, ids[:2]).values())
    finally:
        _run(tmp_path, url, ids[:2], rollout="awx-job-2", state="released")


def test_a_cli_lease_refuses_the_module(moto: tuple[str, list[str]], tmp_path: Path) -> None:
    url, ids = moto
    cli = _cli(url, ids[1:3], CLI_A)
    cli.acquire()
    try:
        before = _tags(url, ids)
        rc, refused = _run(tmp_path, url, ids[:3], rollout="awx-job-4")
        assert rc != 0
        msg = refused["msg"]
        assert "\n" not in msg and msg.startswith(
            "Failed to take the EC2 lease on 2 instance(s) held by another"
        )
        # names the holder: the host, the rollout, its operator, its expiry
        assert f"gpu-1 ({ids[1]}): rollout {CLI_A} by bob@laptop, expires 20" in msg, msg
        assert f"gpu-2 ({ids[2]}): rollout {CLI_A}" in msg and "gpu-0" not in msg
        assert _tags(url, ids) == before  # refused: nothing written, nothing removed
        # a playbook the CLI runs checks the CLI's own lease (same rollout id) without touching it
        rc, checked = _run(tmp_path, url, ids[1:3], rollout=CLI_A, state="checked")
        assert rc == 0 and checked["changed"] is False, checked
        assert _tags(url, ids) == before
    finally:
        cli.release()
    assert _tags(url, ids) == {i: {} for i in ids}


def test_a_module_lease_refuses_the_cli(moto: tuple[str, list[str]], tmp_path: Path) -> None:
    url, ids = moto
    rc, _taken = _run(tmp_path, url, ids[:2], rollout="awx-job-5")
    assert rc == 0
    try:
        with pytest.raises(LeaseError) as refused:
            _cli(url, ids[:3], CLI_B).acquire()
        text = str(refused.value)
        assert "held by another rollout" in text
        assert f"host-0 ({ids[0]}): rollout awx-job-5 by alice@awx, expires 20" in text, text
        assert all(KEY_PREFIX + CLI_B not in t for t in _tags(url, ids).values())
    finally:
        _run(tmp_path, url, ids[:2], rollout="awx-job-5", state="released")
    assert _tags(url, ids) == {i: {} for i in ids}


def test_an_expired_cli_lease_is_taken_over_by_the_module(
    moto: tuple[str, list[str]], tmp_path: Path
) -> None:
    url, ids = moto
    stale = _cli(url, ids[:2], CLI_A, ttl=1)
    stale.acquire()
    time.sleep(1.3)
    rc, taken = _run(tmp_path, url, ids[:2], rollout="awx-job-6")
    try:
        assert rc == 0, taken
        assert len(taken["taken_over"]) == 2 and f"rollout {CLI_A} by bob@laptop" in taken["taken_over"][0]
        assert all(set(t) == {KEY_PREFIX + "awx-job-6"} for t in _tags(url, ids[:2]).values())
        assert stale.check() is not None  # the CLI knows it lost
        stale.release()  # removes nothing of the module's
        assert all(set(t) == {KEY_PREFIX + "awx-job-6"} for t in _tags(url, ids[:2]).values())
    finally:
        _run(tmp_path, url, ids[:2], rollout="awx-job-6", state="released")


def test_an_expired_module_lease_is_taken_over_by_the_cli(
    moto: tuple[str, list[str]], tmp_path: Path
) -> None:
    url, ids = moto
    rc, _taken = _run(tmp_path, url, ids[:2], rollout="awx-job-7", ttl=1)
    assert rc == 0
    time.sleep(1.3)
    rc, expired = _run(tmp_path, url, ids[:2], rollout="awx-job-7", state="checked")
    assert rc != 0 and "its lease expired" in expired["msg"]
    lines: list[str] = []
    fresh = _cli(url, ids[:2], CLI_B, lines)
    fresh.acquire()
    try:
        assert any(
            "taking over the expired lease of rollout awx-job-7 by alice@awx" in line for line in lines
        )
        rc, lost = _run(tmp_path, url, ids[:2], rollout="awx-job-7", state="renewed")
        assert rc != 0 and "no lease of this rollout" in lost["msg"]
        rc, released = _run(tmp_path, url, ids[:2], rollout="awx-job-7", state="released")
        assert rc == 0 and released["changed"] is False  # nothing of ours left, the CLI's stays
        assert all(set(t) == {KEY_PREFIX + CLI_B} for t in _tags(url, ids[:2]).values())
    finally:
        fresh.release()


def test_without_instances_there_is_nothing_to_lock(tmp_path: Path) -> None:
    rc, result = run_module(tmp_path, MODULE, json.dumps({"rollout": "awx-job-8", "instances": {}}))
    assert rc == 0 and result["changed"] is False and result["instances"] == []
    assert result["msg"] == "no EC2 instances: nothing to lock"


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ({"rollout": "has space", "instance_ids": ["i-0123456789abcdef0"]}, "a rollout id is 1 to 113"),
        ({"rollout": "x" * 114, "instance_ids": ["i-0123456789abcdef0"]}, "a rollout id is 1 to 113"),
        (
            {"rollout": "r", "instance_ids": ["i-0123456789abcdef0"], "ttl": 1, "settle": 2},
            "above the settle",
        ),
        ({"rollout": "r", "instance_ids": ["i-0123456789abcdef0"], "ttl": 90000}, "at most 86400"),
        ({"rollout": "r", "instances": {"gpu-1": "vol-1"}}, "gpu-1: 'vol-1' is not an EC2 instance id"),
    ],
)
def test_options_that_cannot_work_are_refused(tmp_path: Path, args: dict[str, Any], why: str) -> None:
    rc, result = call_module(tmp_path, ec2_lease.main, args)
    assert rc != 0 and result["msg"].startswith("Failed to read the lease options: ") and why in result["msg"]


# ---- the playbook tasks --------------------------------------------------------------------------

# What every remediation and reboot playbook adds around its changes (the report of issue 16 item 3
# has the same text): name the run's lease once (the CLI's rollout, the AWX job, or this run), take it
# on every EC2 target before the first change (each batch renews it), release it in `always:` after
# the last batch or when a host failed. When the CLI runs the playbook holding an EC2 lease, it passes
# fleetops_lease_rollout: the playbook checks that lease and leaves it alone; when the CLI holds none (no
# fleetops.node.ec2 inventory source), it passes fleetops_lease=false: no lease tasks run.
LEASE_BLOCK = """\
- name: Name this run's EC2 lease (the CLI's rollout, the AWX job, or this run)
  ansible.builtin.set_fact:
    fleetops_lease_id: >-
      {{ fleetops_lease_rollout | default(('awx-job-' ~ awx_job_id) if awx_job_id is defined else
      ('play-' ~ now(utc=true, fmt='%Y%m%dT%H%M%SZ') ~ '-' ~ ('%06x' | format(16777215 | random)))) }}
  delegate_to: localhost
  delegate_facts: true
  run_once: true
  when:
    - fleetops_lease | default(true) | bool
    - hostvars['localhost']['fleetops_lease_id'] is not defined

- name: Change the hosts under the EC2 lease
  vars:
    fleetops_lease_ec2: >-
      {{ ansible_play_hosts_all | map('extract', hostvars) | selectattr('ec2_instance_id', 'defined') | list }}
    fleetops_lease_names: "{{ fleetops_lease_ec2 | map(attribute='inventory_hostname') | list }}"
  block:
    - name: Take the EC2 lease on every target (refused while another rollout, CLI or AWX, holds one)
      fleetops.node.ec2_lease:
        state: "{{ 'checked' if fleetops_lease_rollout is defined else 'acquired' }}"
        rollout: "{{ hostvars['localhost']['fleetops_lease_id'] }}"
        operator: "{{ (awx_user_name ~ '@awx') if awx_user_name is defined else omit }}"
        instances: "{{ dict(fleetops_lease_names | zip(fleetops_lease_ec2 | map(attribute='ec2_instance_id'))) }}"
        instance_regions: >-
          {{ dict(fleetops_lease_names | zip(fleetops_lease_ec2 | map(attribute='ec2_region', default=''))) }}
        ttl: "{{ fleetops_lease_ttl | default(omit) }}"
        store_table: "{{ fleetops_store_table | default(omit) }}"
        store_region: "{{ fleetops_store_region | default(omit) }}"
        store_endpoint_url: "{{ fleetops_store_endpoint_url | default(omit) }}"
      delegate_to: localhost
      run_once: true
      become: false
      when: fleetops_lease | default(true) | bool
    # <the playbook's changes>
  always:
    - name: Release the EC2 lease after the last batch, or when a host failed
      fleetops.node.ec2_lease:
        state: released
        rollout: "{{ hostvars['localhost']['fleetops_lease_id'] }}"
        instances: "{{ dict(fleetops_lease_names | zip(fleetops_lease_ec2 | map(attribute='ec2_instance_id'))) }}"
        instance_regions: >-
          {{ dict(fleetops_lease_names | zip(fleetops_lease_ec2 | map(attribute='ec2_region', default=''))) }}
        store_table: "{{ fleetops_store_table | default(omit) }}"
        store_region: "{{ fleetops_store_region | default(omit) }}"
        store_endpoint_url: "{{ fleetops_store_endpoint_url | default(omit) }}"
      delegate_to: localhost
      run_once: true
      become: false
      when:
        - fleetops_lease | default(true) | bool
        - fleetops_lease_rollout is not defined
        - >-
          (ansible_play_hosts | length) < (ansible_play_hosts_all | length)
          or ansible_play_batch[-1:] == ansible_play_hosts_all[-1:]
"""

# The test's "changes": record, per host, the lease tags on the instances at that moment.
CHANGES = """\
    - name: Record the lease tags while this host is changed
      ansible.builtin.command:
        argv: ["{{ ansible_playbook_python }}", "{{ snapshot }}", "{{ inventory_hostname }}"]
      delegate_to: localhost
      changed_when: true
    - name: Fail where asked
      ansible.builtin.fail:
        msg: this host fails
      when: inventory_hostname == (fail_host | default(''))
"""

# One EC2 DescribeTags query to moto with the standard library (moto reads the region from the credential
# scope and verifies no signature): what boto3's describe_tags asks, without its ~0.5 CPU-s of import in
# each of the 24 snapshots the playbook tests take.
SNAPSHOT = """\
import json, sys, urllib.parse, urllib.request, xml.etree.ElementTree as ET
params = {"Action": "DescribeTags", "Version": "2016-11-15", "Filter.1.Name": "resource-id"}
params.update(("Filter.1.Value.%%d" %% n, i) for n, i in enumerate(%(ids)r, 1))
request = urllib.request.Request(%(url)r, data=urllib.parse.urlencode(params).encode(), headers={
    "Content-Type": "application/x-www-form-urlencoded; charset=utf-8",
    "Authorization": "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/ec2/aws4_request, "
                     "SignedHeaders=host, Signature=0"})
with urllib.request.urlopen(request, timeout=30) as answer:
    root = ET.fromstring(answer.read())
local = lambda e: e.tag.rsplit("}", 1)[-1]
tags = [{local(c): c.text or "" for c in item} for item in root.iter() if local(item) == "item"]
with open(%(out)r, "a") as f:
    f.write(json.dumps({"host": sys.argv[1], "tags": sorted(
        [t["resourceId"], t["key"], t["value"]] for t in tags if t["key"].startswith("fleetops:lease:"))}) + "\\n")
"""


def _playbook(tmp_path: Path, url: str, ids: list[str]) -> tuple[Path, Path, Path]:
    hosts: dict[str, Any] = {
        f"gpu-{n}": {"ec2_instance_id": iid, "ec2_region": REGION} for n, iid in enumerate(ids)
    }
    hosts["lab-1"] = {}  # not an EC2 instance: changed, never tagged
    for hv in hosts.values():
        hv.update(ansible_connection="local", ansible_python_interpreter=sys.executable)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    out = tmp_path / "snapshots.jsonl"
    snapshot = tmp_path / "snapshot.py"
    snapshot.write_text(SNAPSHOT % {"url": url, "ids": ids, "out": str(out)})
    play = [
        {
            "name": "A remediation",
            "hosts": "all",
            "serial": 1,
            "max_fail_percentage": 0,
            "gather_facts": False,
            "vars": {"snapshot": str(snapshot)},
            "tasks": yaml.safe_load(LEASE_BLOCK.replace("    # <the playbook's changes>\n", CHANGES)),
        }
    ]
    playbook = tmp_path / "remediate.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    return inventory, playbook, out


def _playbook_run(inventory: Path, playbook: Path, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections"),
        "AWS_ENDPOINT_URL": url,  # the module reads the connection from the environment, as in AWX
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCAL_TEMP": str(inventory.parent / "tmp"),
    }
    return subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(inventory), str(playbook), *extra],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def _snapshots(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def test_playbook_takes_the_lease_before_changing_and_releases_it_after(
    moto: tuple[str, list[str]], tmp_path: Path
) -> None:
    url, ids = moto
    inventory, playbook, out = _playbook(tmp_path, url, ids[:3])
    proc = _playbook_run(inventory, playbook, url, "-e", "awx_job_id=77", "-e", "awx_user_name=carol")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = _snapshots(out)
    assert [s["host"] for s in seen] == ["gpu-0", "gpu-1", "gpu-2", "lab-1"]  # one host a batch
    for snap in seen:  # every change happened under the job's lease on all three instances
        assert [(i, k) for i, k, _v in snap["tags"]] == sorted(
            (i, KEY_PREFIX + "awx-job-77") for i in ids[:3]
        )
        assert all(json.loads(v)["operator"] == "carol@awx" for _i, _k, v in snap["tags"])
    assert _tags(url, ids[:3]) == {i: {} for i in ids[:3]}  # released after the last batch


def test_playbook_refused_by_a_cli_rollout_changes_nothing(
    moto: tuple[str, list[str]], tmp_path: Path
) -> None:
    url, ids = moto
    inventory, playbook, out = _playbook(tmp_path, url, ids[:3])
    cli = _cli(url, ids[2:3], CLI_A)
    cli.acquire()
    try:
        proc = _playbook_run(inventory, playbook, url, "-e", "awx_job_id=78")
        assert proc.returncode != 0
        assert f"held by another rollout: gpu-2 ({ids[2]}): rollout {CLI_A} by bob@laptop" in proc.stdout
        assert _snapshots(out) == []  # no host was changed
        assert _tags(url, ids[:3]) == {ids[0]: {}, ids[1]: {}, ids[2]: {KEY_PREFIX + CLI_A: cli.value or ""}}
        # the CLI running the playbook under its own lease: checked, used, left in place
        cli_run = _cli(url, ids[:3], CLI_B)
        with pytest.raises(LeaseError):  # ids[2] is CLI_A's
            cli_run.acquire()
    finally:
        cli.release()
    cli_run = _cli(url, ids[:3], CLI_B)
    cli_run.acquire()
    try:
        proc = _playbook_run(inventory, playbook, url, "-e", f"fleetops_lease_rollout={CLI_B}")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert len(_snapshots(out)) == 4
        assert all(set(t) == {KEY_PREFIX + CLI_B} for t in _tags(url, ids[:3]).values())  # not released
        assert cli_run.check() is None
    finally:
        cli_run.release()


def test_playbook_releases_the_lease_when_a_host_fails(moto: tuple[str, list[str]], tmp_path: Path) -> None:
    url, ids = moto
    inventory, playbook, out = _playbook(tmp_path, url, ids[:3])
    proc = _playbook_run(inventory, playbook, url, "-e", "awx_job_id=79", "-e", "fail_host=gpu-1")
    assert proc.returncode != 0, proc.stdout
    assert [s["host"] for s in _snapshots(out)] == ["gpu-0", "gpu-1"]  # stopped at the failure
    assert _tags(url, ids[:3]) == {i: {} for i in ids[:3]}  # and released on the way out


def test_playbook_without_the_lease_when_told(moto: tuple[str, list[str]], tmp_path: Path) -> None:
    """fleetops_lease=false (the CLI holds no EC2 lease for this inventory): the lease makes no EC2
    call (a dead endpoint does not matter) and writes no tag; the changes run."""
    url, ids = moto
    inventory, playbook, out = _playbook(tmp_path, url, ids[:3])
    proc = _playbook_run(inventory, playbook, "http://127.0.0.1:9", "-e", "fleetops_lease=false")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    snaps = _snapshots(out)  # the snapshot task reads moto itself
    assert len(snaps) == 4 and all(s["tags"] == [] for s in snaps)


@pytest.mark.parametrize(
    "operator",
    [
        "alice@bastion",
        "é" * 300 + "@ctl",
        "bob@" + "h" * 400,
        "x" * 500,
        "\udcff\udcfe@ctl",
        "名前" * 80 + "@制御",
    ],
)
def test_the_shared_protocol_writes_and_reads_what_the_cli_does(operator: str) -> None:
    """module_utils/lease.py (the module's) and fleetops.rollout.lease (the CLI's): the same tag value
    for the same lease, the same reading of it, the same words for its holder."""
    from ansible_collections.fleetops.node.plugins.module_utils import lease as shared

    from fleetops.rollout import lease as cli

    since, expires, now = 1764547200.0, 1764548100.0, 1764547500.0
    value = shared.encode(operator, since, expires)
    assert value == cli.encode(operator, since, expires) and len(value.encode()) <= shared.TAG_VALUE_MAX
    assert shared.KEY_PREFIX == cli.KEY_PREFIX and shared.TAG_VALUE_MAX == cli.TAG_VALUE_MAX
    for text in (value, "not json", '{"operator": "x"}'):
        mine, theirs = (
            shared.LeaseRecord.parse(KEY_PREFIX + "r1", text),
            cli.LeaseRecord.parse(KEY_PREFIX + "r1", text),
        )
        assert (mine.rollout, mine.operator, mine.since, mine.expires, mine.value) == (
            theirs.rollout, theirs.operator, theirs.since, theirs.expires, theirs.value,
        )  # fmt: skip
        assert mine.describe(now) == theirs.describe(now) and mine.live(now) == theirs.live(now)
        assert mine.order() == theirs.order()


# ---- with a shared store -------------------------------------------------------------------------


def _store(url: str, table: str) -> Any:
    from fleetops.ansible.collection import module_utils

    aws, mu = module_utils("aws"), module_utils("store")
    settings = aws.ConnectionSettings(endpoint_url=url, aws_access_key="testing", aws_secret_key="testing")
    return mu.DynamoStore(settings, table, REGION)


def _held(url: str, table: str) -> dict[str, str]:
    """{instance: rollout} as the store's lease items name them."""
    return {i.key[len("lease#") :]: i.doc["rollout"] for i in _store(url, table).items("lease#")}


def test_with_a_store_the_module_takes_the_lease_there_and_the_cli_honours_it(
    moto: tuple[str, list[str]], tmp_path: Path
) -> None:
    url, ids = moto
    table = "module-leases"
    rc, would = _run(tmp_path, url, ids[:2], "--check", rollout="awx-job-11", store_table=table)
    assert rc == 0 and would["changed"] is True and _held(url, table) == {}  # check mode writes nothing
    rc, taken = _run(tmp_path, url, ids[:2], rollout="awx-job-11", store_table=table)
    assert rc == 0 and taken["store"] == f"DynamoDB table {table} in {REGION}", taken
    assert _held(url, table) == {ids[0]: "awx-job-11", ids[1]: "awx-job-11"} and taken["leases"] == {}
    assert all(
        t == {KEY_PREFIX + "awx-job-11": taken["value"]} for t in _tags(url, ids[:2]).values()
    )  # mirror
    conn = Ec2Connection(
        endpoint_url=url, aws_access_key="testing", aws_secret_key="testing", regions=(REGION,)
    )
    instances = {"host-1": {"instance": ids[1], "region": REGION}}
    with pytest.raises(LeaseError, match="awx-job-11"):
        Ec2Lease(conn, instances, CLI_A, "bob@laptop", store=_store(url, table)).acquire()
    rc, checked = _run(tmp_path, url, ids[:2], rollout="awx-job-11", state="checked", store_table=table)
    assert rc == 0 and checked["expires"] == taken["expires"], checked
    assert set(checked["leases"]) == set(ids[:2])
    assert all(held["awx-job-11"]["live"] for held in checked["leases"].values())
    rc, refused = _run(tmp_path, url, ids[1:3], rollout="awx-job-12", store_table=table)
    assert rc != 0 and list(refused["leases"]) == [ids[1]] and "awx-job-11" in refused["msg"], refused
    time.sleep(1.1)
    rc, renewed = _run(
        tmp_path, url, ids[:2], rollout="awx-job-11", state="renewed", ttl=1200, store_table=table
    )
    assert rc == 0 and renewed["since"] == taken["since"] and renewed["expires"] > taken["expires"], renewed
    rc, released = _run(tmp_path, url, ids[:2], rollout="awx-job-11", state="released", store_table=table)
    assert rc == 0 and released["released"] == sorted(ids[:2]), released
    assert _held(url, table) == {} and _tags(url, ids[:2]) == {i: {} for i in ids[:2]}
    rc, gone = _run(tmp_path, url, ids[:2], rollout="awx-job-11", state="checked", store_table=table)
    assert rc != 0 and "has no lease in the store" in gone["msg"]


def test_a_playbook_reads_the_store_from_the_inventory_and_is_refused_by_a_lease_held_there(
    moto: tuple[str, list[str]], tmp_path: Path
) -> None:
    """The lease held in the store has no mirror tag here, so only a playbook that reads the store can
    be refused by it; the variables are those the fleetops.node.ec2 inventory publishes."""
    from fleetops.ansible.collection import module_utils

    url, ids = moto
    table = "playbook-leases"
    inventory, playbook, out = _playbook(tmp_path, url, ids[:3])
    hosts = yaml.safe_load(inventory.read_text())
    hosts["all"]["vars"] = {"fleetops_store_table": table, "fleetops_store_endpoint_url": url}
    inventory.write_text(yaml.safe_dump(hosts))
    backend = _store(url, table)
    backend.ensure()
    held = module_utils("lease").StoreLease(backend, CLI_A, {ids[2]: "gpu-2"}, "bob@laptop", 600)
    held.acquire()
    try:
        proc = _playbook_run(inventory, playbook, url, "-e", "awx_job_id=80")
        assert proc.returncode != 0 and f"gpu-2 ({ids[2]}): rollout {CLI_A} by bob@laptop" in proc.stdout
        assert _snapshots(out) == [] and _held(url, table) == {ids[2]: CLI_A}
    finally:
        held.release()
    proc = _playbook_run(inventory, playbook, url, "-e", "awx_job_id=81")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = _snapshots(out)
    assert len(seen) == 4 and all(len(s["tags"]) == 3 for s in seen)  # the mirror, during every change
    assert _held(url, table) == {} and _tags(url, ids[:3]) == {i: {} for i in ids[:3]}  # released


def test_a_pause_in_the_store_stops_an_awx_job_before_its_next_batch(
    moto: tuple[str, list[str]], tmp_path: Path
) -> None:
    """`fleetops pause` (fleetops.store.Store.pause, the CLI's own call) holds AWX's playbooks too: their
    lease is taken before each batch, and neither a take nor a renewal passes while paused; releasing
    still works. After unpause the take goes through."""
    from fleetops import store as cli_store

    url, ids = moto
    table = "paused-leases"
    rc, taken = _run(tmp_path, url, ids[:1], rollout="awx-job-21", store_table=table)
    assert rc == 0, taken
    paused = cli_store.Store(_store(url, table))
    paused.pause("carol@laptop", "driver rollout")
    try:
        rc, renewed = _run(tmp_path, url, ids[:1], rollout="awx-job-21", state="renewed", store_table=table)
        assert rc != 0 and "automation is paused by carol@laptop since " in renewed["msg"], renewed
        assert renewed["msg"].endswith(": driver rollout ('fleetops unpause' lifts it)")
        rc, refused = _run(tmp_path, url, ids[1:2], rollout="awx-job-22", store_table=table)
        assert (
            rc != 0
            and "automation is paused" in refused["msg"]
            and _held(url, table) == {ids[0]: "awx-job-21"}
        )
        rc, released = _run(tmp_path, url, ids[:1], rollout="awx-job-21", state="released", store_table=table)
        assert rc == 0 and released["released"] == [ids[0]] and _held(url, table) == {}
    finally:
        paused.unpause("carol@laptop", "done")
    rc, after = _run(tmp_path, url, ids[1:2], rollout="awx-job-22", store_table=table)
    assert rc == 0 and _held(url, table) == {ids[1]: "awx-job-22"}, after
    _run(tmp_path, url, ids[1:2], rollout="awx-job-22", state="released", store_table=table)
