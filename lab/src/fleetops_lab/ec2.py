"""The lab's EC2 side: a real local EC2 endpoint (moto_server) whose instances ARE the lab hosts.

``fleetops-lab up N --ec2`` starts one detached process (``fleetops_lab.ec2_server``) that runs
moto_server on 127.0.0.1 and the events proxy in front of it (moto does not model scheduled maintenance
events), registers every lab host as a running instance — a VPC with one subnet per AZ, private IP =
the host's address, tag Name = the host's name — gives one instance a scheduled ``system-reboot``
event, and writes ``lab.fleet_ec2.yml``: an inventory for the ``fleetops.node.ec2`` plugin that reaches
the lab hosts over ssh. ``fleetops-lab down`` stops it (by PID). Loopback only.

This module is the launcher (``up``, ``down``, ``running``), below ``fleetops_lab.core``, which calls
it; the process, which powers the instances' lab hosts through ``core``, is ``fleetops_lab.ec2_server``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from fleetops.util import pid_alive
from fleetops_lab.errors import LabError
from fleetops_lab.names import ENV as LAB_ENV
from fleetops_lab.names import LabNames

REGION = "us-east-1"
# Each lab AZ's EC2 availability zone; its subnet is one contiguous half of the lab's /24
# (LabNames.az_subnets, as LabNames.host_ip places the hosts): it holds exactly those hosts.
ZONES = {"lab-1a": f"{REGION}a", "lab-1b": f"{REGION}b"}
EVENT_HOST_INDEX = 2  # lab-02 gets the scheduled event
EVENT_CODE = "system-reboot"
STATE_FILE = "ec2.json"
INVENTORY_FILE = "lab.fleet_ec2.yml"
SERVER_MODULE = "fleetops_lab.ec2_server"  # the process up starts: python -m SERVER_MODULE STATE_FILE


def _read_state(state_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((state_dir / STATE_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def inventory_path(state_dir: Path) -> Path:
    return state_dir / INVENTORY_FILE


def up(
    state_dir: Path,
    hosts: Sequence[tuple[str, str, str]],
    ssh: dict[str, str],
    say: Callable[[str], None],
    names: LabNames,
) -> Path:
    """Start the endpoint (if not running), register ``hosts`` [(name, ip, lab az)] of the lab ``names``,
    write the inventory. The endpoint's process powers that lab's hosts (it is told the lab's name)."""
    down(state_dir)  # instances must match the fleet exactly: start from a fresh endpoint
    log = (state_dir / "ec2.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", SERVER_MODULE, str(state_dir / STATE_FILE)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
        env={**os.environ, LAB_ENV: names.name},
    )
    deadline = time.monotonic() + 60
    state = None
    while time.monotonic() < deadline:
        state = _read_state(state_dir)
        if state and state.get("pid") == proc.pid:
            break
        if proc.poll() is not None:
            raise LabError(
                f"Failed to start the lab's EC2 endpoint: it exited {proc.returncode} (see {log.name})"
            )
        time.sleep(0.1)
    else:
        proc.kill()
        raise LabError(f"Failed to start the lab's EC2 endpoint within 60 s (see {log.name})")
    assert state is not None
    _register(state["moto_url"], hosts, names)
    path = inventory_path(state_dir)
    _write_inventory(path, state["url"], ssh)
    say(f"lab: EC2 endpoint {state['url']} (moto {state['moto_url']}); inventory: {path}")
    return path


def _register(url: str, hosts: Sequence[tuple[str, str, str]], names: LabNames) -> None:
    from fleetops_lab.ec2sim import client, register_ami

    ec2 = client(url, REGION)
    image = register_ami(url, REGION, name="fleetops-lab-debian12")
    vpc = ec2.create_vpc(CidrBlock=str(names.network))["Vpc"]["VpcId"]
    subnets = {
        lab_az: ec2.create_subnet(VpcId=vpc, CidrBlock=cidr, AvailabilityZone=ZONES[lab_az])["Subnet"][
            "SubnetId"
        ]
        for lab_az, cidr in names.az_subnets().items()
    }
    for name, ip, lab_az in hosts:
        tags = [{"Key": "Name", "Value": name}, {"Key": "fleetops", "Value": "lab"}]
        if name == f"lab-{EVENT_HOST_INDEX:02d}":
            tags.append({"Key": "fleetops:event", "Value": EVENT_CODE})
        ec2.run_instances(
            ImageId=image,
            MinCount=1,
            MaxCount=1,
            InstanceType="g5.xlarge",
            SubnetId=subnets[lab_az],
            PrivateIpAddress=ip,
            TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
        )


def _write_inventory(path: Path, url: str, ssh: dict[str, str]) -> None:
    config = {
        "plugin": "fleetops.node.ec2",
        "regions": [REGION],
        "endpoint_url": url,
        "aws_access_key": "testing",
        "aws_secret_key": "testing",
        # Stopped instances stay hosts of the inventory (unreachable while stopped), as with the plugin's
        # default states: a stop-start killed half way is resumed through them (docs/guides/fixing.md).
        "filters": {
            "instance-state-name": ["pending", "running", "stopping", "stopped"],
            "tag:fleetops": "lab",
        },
        "hostnames": ["tag:Name"],
        "include_events": True,
        "compose": {key: repr(value) for key, value in ssh.items()},
    }
    text = "# Written by 'fleetops-lab up --ec2': the lab hosts as EC2 instances of a local moto endpoint.\n"
    path.write_text(text + yaml.safe_dump(config, sort_keys=False))


def down(state_dir: Path) -> None:
    """Stop the endpoint and remove its inventory (also after a killed run). Idempotent."""
    state = _read_state(state_dir)
    if state:
        for key, sig in (("pid", signal.SIGTERM), ("moto_pid", signal.SIGINT)):
            pid = int(state.get(key) or 0)
            if pid > 0 and pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        deadline = time.monotonic() + 10
        pids = [int(state.get(k) or 0) for k in ("pid", "moto_pid")]
        while time.monotonic() < deadline and any(p > 0 and pid_alive(p) for p in pids):
            time.sleep(0.1)
        for pid in pids:
            if pid > 0 and pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    for name in (STATE_FILE, INVENTORY_FILE):
        with contextlib.suppress(FileNotFoundError):
            (state_dir / name).unlink()


def running(state_dir: Path) -> str | None:
    """The endpoint's URL when it runs."""
    state = _read_state(state_dir)
    if state and pid_alive(int(state.get("pid") or 0)):
        return str(state["url"])
    return None
