"""The lab's EC2 side: a real local EC2 endpoint (moto_server) whose instances ARE the lab hosts.

``fleetops-lab up N --ec2`` starts one detached process that runs moto_server on 127.0.0.1 and the
events proxy in front of it (moto does not model scheduled maintenance events), registers every
lab host as a running instance — a VPC with one subnet per AZ, private IP = the host's address,
tag Name = the host's name — gives one instance a scheduled ``system-reboot`` event, and writes
``lab.fleet_ec2.yml``: an inventory for the ``fleetops.node.ec2`` plugin that reaches the lab hosts
over ssh. ``fleetops-lab down`` stops it (by PID). Loopback only.

The instances' power is the lab hosts' (``lab_power_hook``): StopInstances powers the host off before
EC2 answers, and gives it "other hardware" (its injected hardware faults are cleared:
``fleetops_lab.hardware``), as EC2 starts a stopped EBS instance on another host; StartInstances boots
it in the background (EC2 says running before ssh answers, as on AWS); TerminateInstances powers it
off. A reboot from inside the host keeps its hardware, and its faults.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from fleetops.util import atomic_write, pid_alive
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


POWER_OFF_TIMEOUT_S = 60.0  # a StopInstances answer waits this long at most for the host to be off
LAB_TAG = ("fleetops", "lab")  # only instances with this tag are lab hosts (tag Name = the host's name)


def _log(line: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} ec2: {line}", flush=True)  # the process's log: ec2.log


def lab_power_hook(
    state_dir: Path, say: Callable[[str], None] = _log
) -> Callable[[str, str, dict[str, str]], None]:
    """The proxy's power hook (``ec2sim.Ec2Proxy(power_hook=...)``) tying instances to the lab hosts of
    ``state_dir``: "stop" powers the host off (bounded by POWER_OFF_TIMEOUT_S) and clears its hardware
    faults, "terminate" powers it off, "start" powers it on in a background thread."""
    from fleetops_lab import hardware
    from fleetops_lab.core import Lab

    lab = Lab(state_dir=state_dir)

    def off(name: str, new_hardware: bool) -> None:
        try:
            if new_hardware and lab.is_vm(name):  # a VM's disk is reached over ssh: before it goes down
                hardware.clear_hardware(lab, name)
            lab.power(name, False, progress=say, timeout=POWER_OFF_TIMEOUT_S / 2)
            if new_hardware and not lab.is_vm(name) and hardware.clear_hardware(lab, name):
                say(f"{name}: other hardware: its injected hardware faults are gone")
        except Exception as exc:  # the log is the only place to say it; EC2 answers anyway
            say(f"{name}: power off failed: {exc}")

    def on(name: str) -> None:
        try:
            lab.power(name, True, progress=say)
        except Exception as exc:
            say(f"{name}: power on failed: {exc}")

    def hook(phase: str, instance_id: str, tags: dict[str, str]) -> None:
        name = tags.get("Name", "")
        if tags.get(LAB_TAG[0]) != LAB_TAG[1] or not name:
            return
        say(f"{phase} {instance_id} ({name})")
        if phase in ("stop", "terminate"):
            worker = threading.Thread(target=off, args=(name, phase == "stop"), daemon=True)
            worker.start()
            worker.join(POWER_OFF_TIMEOUT_S)
            if worker.is_alive():
                say(f"{name}: still powering off after {POWER_OFF_TIMEOUT_S:g} s: EC2 answers anyway")
        elif phase == "start":
            threading.Thread(target=on, args=(name,), daemon=True).start()

    return hook


def _serve(state_path: Path) -> int:
    """The detached EC2 process: moto_server + the events proxy, until SIGTERM."""
    from fleetops_lab.ec2sim import Ec2Proxy, MotoServer

    moto = MotoServer()
    upstream = moto.start()
    proxy = Ec2Proxy(upstream, power_hook=lab_power_hook(state_path.parent))
    url = proxy.start()
    assert moto.proc is not None
    from fleetops_lab import asg  # the lab's Auto Scaling group: binds its new instances to spare hosts

    reconciler = asg.serve(state_path.parent, upstream)
    state = {"pid": os.getpid(), "moto_pid": moto.proc.pid, "moto_url": upstream, "url": url}
    atomic_write(state_path, json.dumps(state))
    stop = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        while not stop:
            time.sleep(0.2)
    finally:
        reconciler.stop()
        proxy.stop()
        moto.stop()
    return 0


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
        [sys.executable, "-m", "fleetops_lab.ec2", str(state_dir / STATE_FILE)],
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
        # default states: a stop-start killed half way is resumed through them (README: stop-start).
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


if __name__ == "__main__":
    sys.exit(_serve(Path(sys.argv[1])))
