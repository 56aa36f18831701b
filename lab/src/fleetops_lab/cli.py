"""``fleetops-lab``: up / down / status / inventory / ssh for the test-host lab.

A development tool beside the product (``pip install -e ./lab``); ``python -m fleetops_lab.cli
COMMAND`` runs the same commands.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from fleetops.cli.errors import run_main
from fleetops_lab.core import DEFAULT_HOSTS, MAX_HOSTS, Lab, LabHost, host_index
from fleetops_lab.errors import LabError
from fleetops_lab.names import ENV as LAB_ENV
from fleetops_lab.names import check_name, current_name, lab_names
from fleetops_lab.vm import DEFAULT_MEMORY_MIB


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _prefixed(prefix: str) -> Callable[[str], None]:
    return lambda line: _progress(prefix + line)


def _table(hosts: Sequence[LabHost]) -> str:
    rows = [("NAME", "IP", "AZ", "KIND", "RUNNING", "SSH", "PID", "SUPERVISOR")]
    for h in hosts:
        rows.append(
            (
                h.name,
                h.ip,
                h.az,
                h.kind,
                "yes" if h.running else "no",
                "ok" if h.ssh_ok else "-",
                str(h.pid or "-"),
                str(h.supervisor_pid or "-"),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def cmd_up(args: argparse.Namespace) -> int:
    if args.asg is not None or args.asg_members is not None:
        return _up_asg(args)
    vm = args.count if args.vm == -1 else args.vm
    hosts = Lab().up(
        args.count,
        progress=None if args.quiet else _progress,
        timeout=args.timeout,
        ec2=args.ec2,
        vm=vm,
        vm_memory_mib=args.vm_memory,
        vm_cgroup=args.vm_cgroup,
        slurm=args.slurm,
        addresses=args.addresses,
        dead=args.dead,
    )
    print(_table(hosts))
    return 0


def cmd_slurm_job(args: argparse.Namespace) -> int:
    """Submit a real job (sleep SECONDS) to exactly one node of a Slurm lab; print its job id."""
    from fleetops_lab import slurm as lab_slurm

    lab = Lab()
    host_index(args.node)
    if not 1 <= args.seconds <= 86400:
        raise LabError(f"Failed to submit a job: seconds must be 1 .. 86400, not {args.seconds}")
    if not lab_slurm.controller_conf_path(lab.state_dir).exists():
        raise LabError("Failed to submit a job: the lab is not a Slurm lab (run 'fleetops-lab up N --slurm')")
    print(lab_slurm.submit(lab.run, args.node, args.seconds))
    return 0


def _up_asg(args: argparse.Namespace) -> int:
    """``up N --ec2 --asg K [--asg-members M]``: an Auto Scaling group of lab instances (fleetops_lab.asg)."""
    from fleetops_lab import asg as lab_asg

    if not args.ec2 or args.vm:
        raise LabError("Failed to start the lab: --asg needs --ec2 (the group is moto's) and no --vm")
    lab_asg.up(
        args.count,
        args.asg or 0,
        args.asg_members,
        progress=None if args.quiet else _progress,
        timeout=args.timeout,
    )
    print(_table(Lab().status()))
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    """Build what labs boot from, each cached by its inputs and locked against a second builder: the
    rootfs; with --vm the VM image; with --ucx the UCX wheels the lab's UCX services install."""
    from fleetops_lab import image, rootfs
    from fleetops_lab.host_faults import UCX_UNFIXED_VERSION, UCX_WHEEL_VERSION, ensure_ucx_wheel

    say = (lambda _line: None) if args.quiet else _progress
    cache = Lab().cache_dir
    print(rootfs.ensure_rootfs(cache, say))
    if args.vm:
        print(image.ensure_image(cache, say))
    if args.ucx:
        for version in (UCX_WHEEL_VERSION, UCX_UNFIXED_VERSION):
            print(ensure_ucx_wheel(version))
    return 0


def cmd_power(args: argparse.Namespace) -> int:
    Lab().power(
        args.name, args.state == "on", progress=None if args.quiet else _progress, timeout=args.timeout
    )
    return 0


def cmd_fault(args: argparse.Namespace) -> int:
    """``fault gpu-ecc HOST [--count N]`` / ``fault clear-hw HOST``: per-host stand-in hardware faults."""
    from fleetops_lab import hardware

    lab = Lab()
    host_index(args.name)
    if args.fault == "gpu-ecc":
        hardware.inject_ecc(lab, args.name, uncorrected=args.count)
        print(f"{args.name}: its stand-in GPU 0 reports {args.count} more uncorrectable ECC error(s)")
    else:
        cleared = hardware.clear_hardware(lab, args.name)
        said = "fresh stand-in GPU(s), no errors" if cleared else "no stand-in GPU: nothing to clear"
        print(f"{args.name}: {said}")
    return 0


def _cgroups(text: str) -> list[int]:
    try:
        versions = [int(v) for v in text.split(",")]
    except ValueError:
        versions = []
    if not versions or any(v not in (1, 2) for v in versions):
        raise argparse.ArgumentTypeError(f"not a list of cgroup versions (1 or 2, comma-separated): {text!r}")
    return versions


def cmd_down(args: argparse.Namespace) -> int:
    if not args.all:
        Lab().down(progress=None if args.quiet else _progress)
        return 0
    from fleetops_lab.names import labs_on_this_machine

    for name in labs_on_this_machine():  # each in its own state dir: $FLEETOPS_LAB_DIR is one lab's
        state = None if name != current_name() else os.environ.get("FLEETOPS_LAB_DIR")
        lab = Lab(name=name, state_dir=Path(state) if state else lab_names(name).default_state_dir)
        lab.down(progress=None if args.quiet else _prefixed(f"[{name}] "))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    hosts = Lab().status()
    if not hosts:
        print("no lab hosts")
        return 0
    print(_table(hosts))
    return 0 if all(h.running and h.ssh_ok for h in hosts) else 1


def cmd_inventory(args: argparse.Namespace) -> int:
    path = Lab().ec2_inventory_path() if args.ec2 else Lab().inventory_path()
    if not path.exists():
        raise LabError(f"Failed to find the lab inventory {path}: the lab is not up (run 'fleetops-lab up')")
    print(path)
    return 0


def cmd_ssh(args: argparse.Namespace) -> int:
    lab = Lab()
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if host_index(args.name) and not _is_up(lab, args.name):
        raise LabError(f"Failed to reach {args.name}: it is not up (run 'fleetops-lab up N')")
    tty = not command and sys.stdin.isatty()
    # One argument is a shell command line (as ssh itself takes it); several are quoted word by word.
    remote: str | list[str] | None = command[0] if len(command) == 1 else (command or None)
    argv = lab.ssh_argv(args.name, remote, tty=tty)
    return subprocess.run(argv, check=False).returncode


def _is_up(lab: Lab, name: str) -> bool:
    try:
        known = lab.known_hosts_path.read_text()
    except OSError:
        return False
    return any(line.startswith(f"{name},") for line in known.splitlines())


def _count(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of hosts: {text!r}") from None


def add_commands[P: argparse.ArgumentParser](sub: argparse._SubParsersAction[P]) -> None:
    """The lab's sub-commands, on any sub-parser collection."""
    up = sub.add_parser(
        "up",
        help="boot lab hosts lab-01 .. lab-N (idempotent)",
        description=f"Ensure exactly lab-01 .. lab-N run and answer ssh (N: 1 .. {MAX_HOSTS}). "
        "The first run builds the Debian rootfs (about 1-2 min, cached).",
    )
    up.add_argument("count", nargs="?", type=_count, default=DEFAULT_HOSTS, metavar="N")
    up.add_argument("--timeout", type=float, default=120.0, metavar="S", help="seconds to wait for ssh")
    up.add_argument(
        "--ec2",
        action="store_true",
        help="also run a local EC2 endpoint (moto) whose instances are the lab hosts, in two AZs, one with a "
        "scheduled event; 'fleetops-lab inventory --ec2' prints its fleetops.node.ec2 inventory",
    )
    up.add_argument(
        "--asg",
        type=int,
        default=None,
        metavar="K",
        help="with --ec2: the instances form the Auto Scaling group fleetops-lab (moto), and K more lab hosts "
        "boot as spares, powered off and not instances: each instance the group launches is bound to a spare, "
        "which powers on; a terminated instance's host powers off (fleetops_lab.asg)",
    )
    up.add_argument(
        "--asg-members",
        type=int,
        default=None,
        metavar="M",
        help="with --asg: only the first M instances are members of the group (default: all N)",
    )
    up.add_argument(
        "--vm",
        nargs="?",
        type=int,
        const=-1,
        default=0,
        metavar="K",
        help="the last K hosts (all N without K) are QEMU virtual machines with their own kernel: KVM when "
        "it boots a kernel here, else TCG (about a minute to boot each); the first use builds the VM image",
    )
    up.add_argument(
        "--vm-memory",
        type=int,
        default=DEFAULT_MEMORY_MIB,
        metavar="MIB",
        help=f"RAM of each VM (default {DEFAULT_MEMORY_MIB}); refused when MemAvailable cannot hold the VMs",
    )
    up.add_argument(
        "--vm-cgroup",
        type=_cgroups,
        default=[2],
        metavar="V[,V...]",
        help="cgroup version of each VM in turn, the last one repeating (default 2; 1 boots with "
        "systemd.unified_cgroup_hierarchy=0), e.g. 2,1",
    )
    up.add_argument(
        "--slurm",
        action="store_true",
        help="the hosts form a Slurm 22.05 cluster: slurmctld on lab-01, slurmd and munged on every host, "
        "a munged of the lab's on this machine for scontrol (SLURM_CONF=<state>/slurm/slurm.conf; the "
        "inventory's fleetops_slurm_conf); the first use installs Slurm into a cached layer",
    )
    up.add_argument(
        "--addresses",
        type=int,
        default=0,
        metavar="K",
        help="a simulated fleet: each host answers ssh on K addresses of its own (1 .. 999, routed over the "
        "bridge from the lab's alias /19), and the inventory lists the N x K addresses as hosts lab-01-a001 .. "
        "instead of the N hosts; an alias is its host (same faults, same CPU). Container hosts and the static "
        "inventory only (fleetops_lab.aliases)",
    )
    up.add_argument(
        "--dead",
        type=int,
        default=0,
        metavar="D",
        help="with --addresses: D more inventory hosts lab-dead-001 .. whose addresses are blackholed, so ssh "
        "waits out its connect timeout as it does for an instance that is gone",
    )
    up.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    up.set_defaults(func=cmd_up)

    job = sub.add_parser(
        "slurm-job",
        help="submit a job (sleep SECONDS) to exactly one node of a Slurm lab; prints its job id",
        description="sbatch --nodelist=NODE --wrap='sleep SECONDS' on lab-01 (the lab's slurmctld host).",
    )
    job.add_argument("node", metavar="NODE", help="lab-01, lab-02, ...")
    job.add_argument("seconds", type=int, metavar="SECONDS")
    job.set_defaults(func=cmd_slurm_job)

    prepare = sub.add_parser(
        "prepare",
        help="build what labs boot from (the rootfs; --vm: the VM image; --ucx: the UCX wheels), cached",
        description="Build the lab's cached inputs ahead of time (CI does, beside its lint and unit tests). "
        "Each is cached by a hash of its recipe and built by one process at a time; a second waits.",
    )
    prepare.add_argument("--vm", action="store_true", help="also the VM image (QEMU hosts)")
    prepare.add_argument("--ucx", action="store_true", help="also the UCX wheels (pip download)")
    prepare.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    prepare.set_defaults(func=cmd_prepare)

    power = sub.add_parser(
        "power",
        help="power a lab host off (orderly) or on again, keeping its disk (what EC2 stop/start uses)",
    )
    power.add_argument("state", choices=("off", "on"))
    power.add_argument("name", metavar="NAME", help="lab-01, lab-02, ...")
    power.add_argument("--timeout", type=float, default=None, metavar="S", help="seconds to wait")
    power.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    power.set_defaults(func=cmd_power)

    down = sub.add_parser("down", help="stop all lab hosts and remove what they used (idempotent)")
    down.add_argument(
        "--all",
        action="store_true",
        help="every lab on this machine, whatever its name (each in its own state dir)",
    )
    down.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    down.set_defaults(func=cmd_down)

    status = sub.add_parser("status", help="list lab hosts (exit 1 when one is down or not answering ssh)")
    status.set_defaults(func=cmd_status)

    inventory = sub.add_parser("inventory", help="print the path of the lab's Ansible inventory")
    inventory.add_argument("--ec2", action="store_true", help="the EC2 inventory (after 'lab up --ec2')")
    inventory.set_defaults(func=cmd_inventory)

    ssh = sub.add_parser("ssh", help="run a command (or a shell) on a lab host over ssh")
    ssh.add_argument("name", metavar="NAME", help="lab-01, lab-02, ...")
    ssh.add_argument("command", nargs=argparse.REMAINDER, metavar="CMD", help="command and arguments")
    ssh.set_defaults(func=cmd_ssh)

    fault = sub.add_parser(
        "fault",
        help="inject a per-host hardware fault (a STAND-IN: no GPU here; see fleetops_lab.hardware)",
        description="Per-host hardware faults: the host's nvidia-smi stand-in reads them from its own disk. "
        "An EC2 stop of the host's instance clears them (other hardware); a reboot keeps them.",
    )
    faults = fault.add_subparsers(dest="fault", metavar="FAULT", required=True)
    ecc = faults.add_parser("gpu-ecc", help="uncorrectable ECC errors on the host's stand-in GPU 0")
    ecc.add_argument("name", metavar="HOST", help="lab-01, lab-02, ...")
    ecc.add_argument("--count", type=int, default=1, metavar="N", help="errors to add (default: 1)")
    clear = faults.add_parser("clear-hw", help="give the host fresh stand-in hardware (no faults)")
    clear.add_argument("name", metavar="HOST", help="lab-01, lab-02, ...")
    fault.set_defaults(func=cmd_fault)


def _use_lab(args: argparse.Namespace) -> int:
    """``--lab NAME`` selects the lab for this command and all it starts, as ``FLEETOPS_LAB`` does."""
    if args.lab is not None:
        os.environ[LAB_ENV] = check_name(args.lab)
    return int(args.func(args))


def build_parser() -> argparse.ArgumentParser:
    """fleetops-lab's parser, every subcommand included (the docs' reference and their command check read it)."""
    parser = argparse.ArgumentParser(
        prog="fleetops-lab",
        description="The fleetops test-host lab. Several labs run side by side when each has its own name.",
    )
    parser.add_argument(
        "--lab",
        metavar="NAME",
        default=None,
        help=f"which lab (default: ${LAB_ENV}, else the default lab): its own bridge, subnet, links, "
        "namespaces, cgroups, lock and state dir; 1-6 characters, [a-z][a-z0-9]*; host names stay lab-NN",
    )
    sub = parser.add_subparsers(dest="lab_command", metavar="COMMAND")
    sub.required = True
    add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_main("fleetops-lab", lambda: _use_lab(args))


if __name__ == "__main__":
    sys.exit(main())
