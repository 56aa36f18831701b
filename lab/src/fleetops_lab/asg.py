"""An EC2 Auto Scaling group of lab hosts: ``fleetops-lab up N --ec2 --asg K``.

moto implements Auto Scaling on top of its EC2: a group launches and terminates moto instances. This
module makes those instances lab hosts:

- ``up``: boots N instance hosts plus K spare hosts, registers only the N as EC2 instances (the lab's
  moto endpoint, ``fleetops_lab.ec2``), makes the first M of them the members of the group
  ``fleetops-lab`` (desired capacity M), powers the spares off, and records the group and its spares
  in ``asg.json`` in the lab's state directory.
- ``Reconciler``: runs in the lab's EC2 process (``fleetops_lab.ec2_server``: a thread beside moto
  and the events proxy) and, every half second, binds each group instance that has no lab host yet to
  a spare: powers the spare on, then tags the instance ``Name=<spare>``, ``fleetops=lab`` and
  ``fleetops:lab:address=<its IP>`` (moto gives group instances random private IPs; the lab's EC2
  inventory reaches a host at that tag's address, else at its private IP). With no spare left the
  instance stays unbound and the EC2 log says so. A terminated lab instance's host is powered off.
- AWS replaces an instance marked ``Unhealthy`` (``SetInstanceHealth``) on its next health check;
  moto 5.2 only records the status. The reconciler does what AWS does: it terminates such an instance
  in its group without lowering the desired capacity (the group then launches a replacement).

A spare is powered on fresh: its stand-in hardware faults (``fleetops_lab.hardware``) are cleared first.
A spare is used once: a host whose instance was terminated stays off.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from fleetops.util import atomic_write
from fleetops_lab.errors import LabError

GROUP = "fleetops-lab"
TEMPLATE = "fleetops-lab-asg"
CONFIG_FILE = "asg.json"
ADDRESS_TAG = "fleetops:lab:address"
REGION = "us-east-1"
INTERVAL_S = 0.5
# The lab inventory's compose: a host's address is its address tag when bound by the reconciler.
ADDRESS_COMPOSE = f"ec2_tags[{ADDRESS_TAG!r}] | default(ec2_private_ip)"

Power = Callable[[str, bool], None]  # (lab host, on)
Say = Callable[[str], None]


def config_path(state_dir: Path) -> Path:
    return state_dir / CONFIG_FILE


def read_config(state_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(config_path(state_dir).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _clients(url: str) -> tuple[Any, Any]:
    from fleetops_lab.ec2sim import client

    return client(url, REGION), client(url, REGION, service="autoscaling")


def _tags(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags") or []}


def _all_instances(ec2: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for page in ec2.get_paginator("describe_instances").paginate():
        for reservation in page.get("Reservations") or []:
            out.extend(reservation.get("Instances") or [])
    return out


def create_group(
    url: str, members: Sequence[str], max_size: int, name: str = GROUP, template: str = TEMPLATE
) -> str:
    """An Auto Scaling group of the running instances ``members`` (ids), desired capacity len(members).

    It launches from a template of the first member's image and type, into the first member's subnet
    (moto launches into the first subnet of a group only).
    """
    ec2, asg = _clients(url)
    described = {i["InstanceId"]: i for i in _all_instances(ec2)}
    first = described[members[0]]
    ec2.create_launch_template(
        LaunchTemplateName=template,
        LaunchTemplateData={"ImageId": first["ImageId"], "InstanceType": first["InstanceType"]},
    )
    asg.create_auto_scaling_group(
        AutoScalingGroupName=name,
        MinSize=0,
        MaxSize=max_size,
        DesiredCapacity=0,
        LaunchTemplate={"LaunchTemplateName": template, "Version": "$Latest"},
        VPCZoneIdentifier=first["SubnetId"],
    )
    asg.attach_instances(AutoScalingGroupName=name, InstanceIds=list(members))  # desired += len(members)
    return name


class Reconciler:
    """Binds the group's new instances to spare lab hosts (see the module docstring).

    ``power(host, on)`` powers a lab host (``Lab.power`` in the lab; tests may record the calls).
    Reads its group and spares from ``asg.json`` in ``state_dir`` on every step: idle without it.
    """

    def __init__(self, state_dir: Path, url: str, power: Power, say: Say | None = None) -> None:
        self.state_dir = state_dir
        self.url = url
        self.power = power
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.powered_off: set[str] = set()  # terminated instances whose host we powered off
        self.told: set[str] = set()  # instances we said we cannot bind
        self.failed: set[str] = set()  # spares that did not power on
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._clients: tuple[Any, Any] | None = None

    # ---- the thread ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="asg-reconciler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as exc:  # the lab's EC2 must keep running; the log says why
                if not self._stop.is_set():  # not moto going down with the lab's EC2
                    self.say(f"lab asg: reconcile failed: {type(exc).__name__}: {exc}")
            self._stop.wait(INTERVAL_S)

    # ---- one pass --------------------------------------------------------------------------

    def step(self) -> None:
        config = read_config(self.state_dir)
        if not config:
            return
        if self._clients is None:
            self._clients = _clients(self.url)
        ec2, asg = self._clients
        groups = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[config["group"]])[
            "AutoScalingGroups"
        ]
        if not groups:
            return
        for entry in groups[0].get("Instances") or []:
            if entry.get("HealthStatus") == "Unhealthy" and entry.get("LifecycleState") == "InService":
                # What AWS does on its next health check; moto only records the status.
                self.say(f"lab asg: {entry['InstanceId']} is Unhealthy: the group replaces it (as AWS does)")
                asg.terminate_instance_in_auto_scaling_group(
                    InstanceId=entry["InstanceId"], ShouldDecrementDesiredCapacity=False
                )
        group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[config["group"]])[
            "AutoScalingGroups"
        ][0]
        members = {i["InstanceId"] for i in group.get("Instances") or []}
        instances = _all_instances(ec2)
        spares: dict[str, str] = dict(config.get("spares") or {})
        live = {
            _tags(i).get("Name")
            for i in instances
            if _tags(i).get("fleetops") == "lab" and i["State"]["Name"] not in ("shutting-down", "terminated")
        }
        # a spare is used once: a host whose instance was terminated stays off (its tags keep its name)
        used = {_tags(i).get("Name") for i in instances if _tags(i).get("fleetops") == "lab"}
        for inst in instances:
            tags, iid, state = _tags(inst), inst["InstanceId"], inst["State"]["Name"]
            if state in ("shutting-down", "terminated"):
                host = tags.get("Name")
                if (
                    tags.get("fleetops") == "lab"
                    and host
                    and host not in live
                    and iid not in self.powered_off
                ):
                    self.powered_off.add(iid)
                    self.say(f"lab asg: {iid} terminated: powering its host {host} off")
                    self.power(host, False)
                continue
            if iid not in members or state != "running" or tags.get("Name"):
                continue
            free = [h for h in spares if h not in used and h not in self.failed]
            if not free:
                if iid not in self.told:
                    self.told.add(iid)
                    self.say(
                        f"lab asg: no spare lab host left: {iid} stays unbound (no lab host, not in the inventory)"
                    )
                continue
            host = free[0]
            self.say(f"lab asg: binding {iid} to the spare {host} ({spares[host]}): powering it on")
            try:
                self.power(host, True)
            except Exception as exc:  # one spare failing leaves the instance for the next
                self.failed.add(host)
                self.say(f"lab asg: {host} did not power on ({exc}): {iid} waits for another spare")
                continue
            ec2.create_tags(
                Resources=[iid],
                Tags=[
                    {"Key": "Name", "Value": host},
                    {"Key": "fleetops", "Value": "lab"},
                    {"Key": ADDRESS_TAG, "Value": spares[host]},
                ],
            )
            live.add(host)
            used.add(host)
            self.say(f"lab asg: {iid} is {host} ({spares[host]})")


def lab_power(state_dir: Path) -> Power:
    """``Lab.power`` of the lab in ``state_dir``, for the reconciler in the lab's EC2 process."""

    def power(host: str, on: bool) -> None:
        from fleetops_lab import hardware
        from fleetops_lab.core import Lab

        lab = Lab(state_dir=state_dir)
        if on and not lab.is_vm(host):
            hardware.clear_hardware(lab, host)  # a fresh host: no stand-in hardware fault injected before
        lab.power(host, on, progress=lambda line: print(line, file=sys.stderr, flush=True))

    return power


def serve(state_dir: Path, url: str) -> Reconciler:
    """The hook of the lab's EC2 process: a stale config goes, then the reconciler runs until stopped."""
    with contextlib.suppress(FileNotFoundError):
        config_path(state_dir).unlink()
    reconciler = Reconciler(state_dir, url, lab_power(state_dir))
    reconciler.start()
    return reconciler


def _use_address_tag(inventory: Path) -> None:
    """The lab's EC2 inventory reaches a host at its address tag (a bound group instance), else its IP."""
    config = yaml.safe_load(inventory.read_text())
    compose = config.setdefault("compose", {})
    compose["ansible_host"] = ADDRESS_COMPOSE
    compose["fleetops_replace_address_tag"] = repr(ADDRESS_TAG)  # replace.yml reaches a new instance there
    text = inventory.read_text().split("\n", 1)[0] + "\n" + yaml.safe_dump(config, sort_keys=False)
    atomic_write(inventory, text)


def up(
    count: int,
    spares: int,
    members: int | None = None,
    progress: Say | None = None,
    timeout: float = 120.0,
) -> tuple[list[str], list[str]]:
    """Boot ``count`` instance hosts and ``spares`` spare hosts; the first ``members`` instances (all by
    default) form the group. Returns (member host names, spare host names)."""
    from fleetops_lab import ec2 as lab_ec2
    from fleetops_lab.core import Lab, host_az, host_name

    members = count if members is None else members
    if not 1 <= members <= count or spares < 0:
        raise LabError(
            f"Failed to start the lab's Auto Scaling group: 1 .. {count} members and 0 or more spares, "
            f"not {members} and {spares}"
        )
    say = progress or (lambda _line: None)
    lab = Lab()
    lab.up(count + spares, progress=progress, timeout=timeout)
    names = [host_name(i) for i in range(1, count + 1)]
    spare_names = [host_name(i) for i in range(count + 1, count + spares + 1)]
    state_dir = lab.state_dir
    inventory = lab_ec2.up(
        state_dir, [(n, lab.host_ip(n), host_az(n)) for n in names], lab.ssh_vars(), say, lab.names
    )
    url = lab_ec2.running(state_dir)
    if url is None:
        raise LabError("Failed to start the lab's Auto Scaling group: the lab's EC2 endpoint is not running")
    ec2, _asg = _clients(url)
    by_name = {
        _tags(i).get("Name"): i["InstanceId"] for i in _all_instances(ec2) if i["State"]["Name"] == "running"
    }
    member_names = names[:members]
    create_group(url, [by_name[n] for n in member_names], max_size=members + spares)
    for spare in spare_names:
        lab.power(spare, False, progress=progress)
    atomic_write(
        config_path(state_dir),
        json.dumps(
            {"group": GROUP, "members": member_names, "spares": {s: lab.host_ip(s) for s in spare_names}}
        ),
    )
    _use_address_tag(inventory)
    say(
        f"lab: Auto Scaling group {GROUP}: {', '.join(member_names)} (desired capacity {members}); "
        f"spare host(s) powered off: {', '.join(spare_names) or 'none'}"
    )
    return member_names, spare_names
