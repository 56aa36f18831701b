"""The lab's EC2 process: ``python -m fleetops_lab.ec2_server STATE_FILE``, started detached by
``fleetops_lab.ec2.up`` (its log is the lab's ``ec2.log``) and stopped by ``fleetops_lab.ec2.down``
(SIGTERM, by the PID it writes to STATE_FILE). It runs moto_server on 127.0.0.1, the events proxy in
front of it (``fleetops_lab.ec2sim``) and the Auto Scaling group's reconciler (``fleetops_lab.asg``),
until SIGTERM or SIGINT. The lab it powers is the one ``$FLEETOPS_LAB`` names (set by the launcher).

The instances' power is the lab hosts' (``lab_power_hook``): StopInstances powers the host off before
EC2 answers, and gives it "other hardware" (its injected hardware faults are cleared:
``fleetops_lab.hardware``), as EC2 starts a stopped EBS instance on another host; StartInstances boots
it in the background (EC2 says running before ssh answers, as on AWS); TerminateInstances powers it
off. A reboot from inside the host keeps its hardware, and its faults.

A module of its own, not the launcher's ``__main__``: this process drives the lab's hosts
(``fleetops_lab.core``), which start the launcher.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from fleetops.util import atomic_write
from fleetops_lab import asg, hardware
from fleetops_lab.core import Lab
from fleetops_lab.ec2sim import Ec2Proxy, MotoServer

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


def serve(state_path: Path) -> int:
    """moto_server + the events proxy + the group's reconciler, until SIGTERM; writes ``state_path``
    (its PID, moto's PID and both URLs: what the launcher waits for) once they run."""
    moto = MotoServer()
    upstream = moto.start()
    proxy = Ec2Proxy(upstream, power_hook=lab_power_hook(state_path.parent))
    url = proxy.start()
    assert moto.proc is not None
    reconciler = asg.serve(state_path.parent, upstream)  # binds the group's new instances to spare hosts
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


if __name__ == "__main__":
    sys.exit(serve(Path(sys.argv[1])))
