"""Faults to inject into lab hosts, reproducing the incidents on real systemd hosts.

``install_crashloop_unit`` is the Pinterest incident: a unit named like ``ecs.service``, shipped
in a vendor directory (as a package in the base image would) and enabled, ``Restart=always``,
whose every start charges a few MB of page cache to a fresh memory cgroup of its own — as a
container runtime does for each new container — and then exits 1. Every crash leaves a zombie.
"""

from __future__ import annotations

import shlex

from fleetops.lab import Lab

UNIT_DIR = "/usr/lib/systemd/system"
SCRIPT = "/usr/local/libexec/fleetops-lab/{name}-crash"

_SCRIPT = """#!/bin/bash
# fleetops lab fault: start a "container" in a fresh memory cgroup, write its state to disk
# (page cache charged to that cgroup), then crash. The cgroup is removed; its page cache keeps
# it alive as a zombie.
set -eu
mem=/sys/fs/cgroup/memory
# The memory hierarchy is read-only inside an nspawn guest until remounted (a real host has it rw).
if awk '$5 == "/sys/fs/cgroup/memory" && $6 ~ /(^|,)ro(,|$)/ {{found=1}} END {{exit !found}}' /proc/self/mountinfo; then
  mount -o remount,bind,rw "$mem"
fi
own=$(awk -F: '$2 == "memory" {{print $3}}' /proc/self/cgroup)
task=task-$(date +%s%N)
mkdir -p "$mem/{name}-tasks" {data_dir}
mkdir "$mem/{name}-tasks/$task"
echo $$ > "$mem/{name}-tasks/$task/cgroup.procs"
dd if=/dev/zero of={data_dir}/$task bs=1M count={mb} status=none
echo $$ > "$mem/cgroup.procs" 2>/dev/null || echo $$ > "$mem$own/cgroup.procs"
rmdir "$mem/{name}-tasks/$task"
echo "{name}: agent exited: unable to reach the ECS endpoint" >&2
exit 1
"""

_UNIT = """[Unit]
Description=Amazon Elastic Container Service - container agent (fleetops lab fault)
After=network.target
StartLimitIntervalSec=0

[Service]
Type=simple
Restart=always
RestartSec={restart_sec}
ExecStart={script}

[Install]
WantedBy=multi-user.target
"""


def install_crashloop_unit(
    lab: Lab, host: str, *, name: str = "ecs", restart_sec: float = 1.0, mb: int = 2, start: bool = True
) -> str:
    """Install and enable the crash-looping unit on a lab host; returns the unit name."""
    unit = f"{name}.service"
    script = SCRIPT.format(name=name)
    data_dir = f"/var/lib/{name}/data"
    files = {
        script: (_SCRIPT.format(name=name, data_dir=data_dir, mb=mb), "0755"),
        f"{UNIT_DIR}/{unit}": (_UNIT.format(restart_sec=restart_sec, script=script), "0644"),
    }
    for path, (text, mode) in files.items():
        lab.run(
            host,
            f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0])} && cat > {shlex.quote(path)} && chmod {mode} {shlex.quote(path)}",
            input=text,
            check=True,
        )
    lab.run(
        host, f"systemctl daemon-reload && systemctl enable {'--now ' if start else ''}{unit}", check=True
    )
    return unit


def remove_crashloop_unit(lab: Lab, host: str, *, name: str = "ecs") -> None:
    """Undo install_crashloop_unit (unmask, remove the unit, its script and its data)."""
    unit = f"{name}.service"
    lab.run(
        host,
        f"systemctl unmask {unit}; systemctl disable --now {unit}; rm -f {UNIT_DIR}/{unit} "
        f"{SCRIPT.format(name=name)}; rm -rf /var/lib/{name}; systemctl daemon-reload; systemctl reset-failed",
        check=False,
    )
