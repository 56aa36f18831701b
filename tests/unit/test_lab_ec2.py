"""The lab's EC2 launcher (fleetops_lab.ec2) starts its process (python -m fleetops_lab.ec2_server: moto and
the events proxy on 127.0.0.1), registers the hosts it is given as instances and stops the process again,
in a temporary state directory: no lab host is booted, powered or touched (the power hook acts only on a
StopInstances, StartInstances or TerminateInstances, which this test never sends)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from fleetops.util import pid_alive
from fleetops_lab import ec2
from fleetops_lab.ec2sim import client
from fleetops_lab.names import lab_names


def test_up_starts_the_ec2_process_registers_the_hosts_and_down_stops_it(tmp_path: Path) -> None:
    names = lab_names(None)
    hosts = [("lab-01", names.host_ip(1), "lab-1a"), ("lab-02", names.host_ip(2), "lab-1b")]
    said: list[str] = []
    try:
        inventory = ec2.up(tmp_path, hosts, {"ansible_user": "root"}, said.append, names)
        state = json.loads((tmp_path / ec2.STATE_FILE).read_text())
        argv = Path(f"/proc/{state['pid']}/cmdline").read_bytes().split(b"\0")[1:-1]
        assert argv == [b"-m", b"fleetops_lab.ec2_server", str(tmp_path / ec2.STATE_FILE).encode()]
        url = ec2.running(tmp_path)
        assert url == state["url"] and said == [
            f"lab: EC2 endpoint {url} (moto {state['moto_url']}); inventory: {inventory}"
        ]
        config = yaml.safe_load(inventory.read_text())
        assert config["endpoint_url"] == url and config["compose"] == {"ansible_user": "'root'"}
        assert url is not None
        instances = [
            i for r in client(url, ec2.REGION).describe_instances()["Reservations"] for i in r["Instances"]
        ]
        found = {}
        for i in instances:
            tags = {t["Key"]: t["Value"] for t in i["Tags"]}
            found[tags["Name"]] = (
                i["PrivateIpAddress"],
                i["Placement"]["AvailabilityZone"],
                tags.get("fleetops:event"),
            )
        assert found == {
            "lab-01": (hosts[0][1], "us-east-1a", None),
            "lab-02": (hosts[1][1], "us-east-1b", ec2.EVENT_CODE),
        }
    finally:
        ec2.down(tmp_path)
    assert ec2.running(tmp_path) is None and not pid_alive(state["pid"]) and not pid_alive(state["moto_pid"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ec2.log"]
