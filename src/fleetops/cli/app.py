"""fleetops command line: scan, plan, remediate, report, lab.

Exit codes: 0 clean; 1 warning or critical findings; 2 usage or configuration error;
3 a host unreachable or failed (or a detector could not run); 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import yaml
from rich.console import Console

from fleetops import __version__, paths
from fleetops.cli.render import host_line, render_scan
from fleetops.errors import FleetopsError, UsageError
from fleetops.scan import (
    EXIT_USAGE,
    MAX_FORKS,
    PartialReport,
    ScanOptions,
    exit_code,
    run_scan,
    write_report,
)


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line and exit 2 (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return value


def _percent(text: str) -> float:
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a percentage: {text!r}") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"must be between 0 and 100: {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"must be between 0 and 3600: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="fleetops",
        description="Find and fix the hidden faults that break GPU fleets: zombie memory cgroups, "
        "crash loops, UCX memory hooks. Scans run one module call per host through ansible-runner.",
        epilog="Exit codes: 0 clean, 1 warning/critical findings, 2 usage error, 3 host unreachable/failed.",
    )
    parser.add_argument("--version", action="version", version=f"fleetops {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    scan = sub.add_parser(
        "scan",
        help="scan hosts for faults (default: this machine)",
        description="Scan hosts: one fleetops.node.node_health call per host, all detectors in one round trip.",
    )
    scan.add_argument(
        "-i",
        "--inventory",
        action="append",
        type=Path,
        metavar="INV",
        help="inventory file or directory (repeatable; default: the localhost inventory)",
    )
    scan.add_argument("-l", "--limit", help="further limit the hosts (ansible --limit pattern)")
    scan.add_argument(
        "--format", choices=("table", "json"), default="table", help="output format (default: table)"
    )
    scan.add_argument(
        "-o",
        "--output",
        type=Path,
        help="also write the JSON report to this file (atomically, at the end; meanwhile each host "
        "is appended to FILE.partial as it answers, one JSON line each)",
    )
    scan.add_argument(
        "--prometheus",
        type=Path,
        metavar="FILE",
        help="also write node_exporter textfile-collector metrics to FILE (atomically)",
    )
    scan.add_argument("--checks", help="comma-separated detectors to run (default: all)")
    scan.add_argument(
        "--sample-seconds",
        type=_seconds,
        default=0.0,
        metavar="S",
        help="take two samples S seconds apart to report growth rates (default: 0)",
    )
    scan.add_argument("--zombie-warning", type=_positive_int, default=1000, metavar="N", help="default: 1000")
    scan.add_argument(
        "--zombie-critical", type=_positive_int, default=20000, metavar="N", help="default: 20000"
    )
    scan.add_argument(
        "--headroom-critical",
        type=_percent,
        default=20.0,
        metavar="PCT",
        help="critical when fewer than PCT%% of the 65,535 memcg IDs are left (default: 20)",
    )
    scan.add_argument(
        "--forks",
        type=_positive_int,
        metavar="N",
        help=f"parallel hosts (default: all targeted hosts, at most {MAX_FORKS})",
    )
    scan.add_argument(
        "--host-timeout",
        type=_positive_int,
        default=120,
        metavar="S",
        help="seconds one host may take, connecting included: a host that does not answer ssh is "
        "unreachable after min(S/2, ansible's timeout of 10) s (default: 120; 0: no limit)",
    )
    scan.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    scan.add_argument(
        "--unit-allowlist",
        type=Path,
        metavar="FILE",
        help="the fleet's allow-list of enabled units (a YAML list of unit-name globs, or a group_vars file "
        "with fleetops_unit_allowlist), for every host: each enabled unit it does not match is an "
        "unexpected_unit warning (default: the inventory's fleetops_unit_allowlist)",
    )
    scan.add_argument(
        "-e",
        "--extra-vars",
        action="append",
        metavar="VARS",
        default=[],
        help="a knob of playbooks/scan.yml, as ansible-playbook takes it: KEY=VALUE, a YAML/JSON mapping, or "
        "@FILE (repeatable; later ones win), e.g. -e fleetops_cpu_system_warning_pct=30",
    )
    scan.set_defaults(func=cmd_scan)

    from fleetops.cli.plan import register as register_plan

    register_plan(sub)
    from fleetops.cli.remediate import register as register_remediate
    from fleetops.cli.remediate import register_report

    register_remediate(sub)
    register_report(sub)
    from fleetops.cli.drift import register as register_drift

    register_drift(sub)
    return parser


def parse_extra_vars(spec: str) -> dict[str, Any]:
    """One -e value the way ansible-playbook reads it: @FILE, a YAML/JSON mapping, or KEY=VALUE pairs."""
    if spec.startswith("@"):
        path = Path(spec[1:])
        try:
            text = path.read_text()
        except OSError as err:
            raise UsageError(f"-e {spec}: cannot read {path}: {err.strerror or err}") from err
        return _vars_mapping(text, f"-e {spec}")
    if spec.lstrip().startswith("{"):
        return _vars_mapping(spec, "-e")
    out: dict[str, Any] = {}
    for pair in shlex.split(spec):
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(f"-e {spec!r}: expected KEY=VALUE, a mapping or @FILE, got {pair!r}")
        try:
            out[key] = yaml.safe_load(value) if value else ""
        except yaml.YAMLError:
            out[key] = value
    return out


def _vars_mapping(text: str, where: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise UsageError(f"{where}: not YAML/JSON: {str(err).splitlines()[0]}") from err
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise UsageError(f"{where}: expected a mapping of variable names to values")
    return data


def cmd_scan(args: argparse.Namespace) -> int:
    if args.zombie_warning > args.zombie_critical:
        raise UsageError(
            f"--zombie-warning ({args.zombie_warning}) must not exceed --zombie-critical ({args.zombie_critical})"
        )
    inventories: list[Path] = list(args.inventory or [])
    if not inventories:
        default = paths.default_inventory()
        if default is None:
            raise UsageError("no inventory given and no fleetops checkout found: use -i INVENTORY")
        inventories = [default]
    for inv in inventories:
        if not inv.exists():
            raise UsageError(f"inventory not found: {inv}")
    for out_path in (args.output, args.prometheus):
        if out_path is not None and not out_path.parent.is_dir():
            raise UsageError(f"cannot write {out_path}: no such directory {out_path.parent}")
    opts = ScanOptions(
        inventory=inventories,
        limit=args.limit,
        checks=[c.strip() for c in args.checks.split(",") if c.strip()] if args.checks else None,
        sample_seconds=args.sample_seconds,
        zombie_warning=args.zombie_warning,
        zombie_critical=args.zombie_critical,
        headroom_critical_pct=args.headroom_critical,
        forks=args.forks,
        host_timeout=args.host_timeout,
    )
    for spec in args.extra_vars:
        opts.extravars.update(parse_extra_vars(spec))
    if args.unit_allowlist is not None:
        from fleetops.drift import load_unit_allowlist

        opts.extravars["fleetops_unit_allowlist"] = load_unit_allowlist(args.unit_allowlist)
    err = Console(stderr=True, highlight=False)
    out = Console(highlight=False, soft_wrap=True)

    partial = PartialReport(args.output.with_name(args.output.name + ".partial")) if args.output else None

    def on_host(host: str, entry: dict[str, Any]) -> None:
        if partial is not None:
            partial.add(host, entry)
        if not args.quiet:
            err.print(host_line(host, entry))

    cancel = threading.Event()
    previous = signal.getsignal(signal.SIGINT)

    def interrupt(signum: int, frame: object) -> None:
        if cancel.is_set():  # a second Ctrl-C: stop now
            signal.signal(signal.SIGINT, previous)
            raise KeyboardInterrupt
        err.print(
            "[yellow]interrupted: stopping the scan, keeping what has arrived (Ctrl-C again to abort)[/]"
        )
        cancel.set()

    signal.signal(signal.SIGINT, interrupt)
    try:
        report = run_scan(opts, on_host=on_host, cancel=cancel)
    finally:
        signal.signal(signal.SIGINT, previous)
        if partial is not None:
            partial.close(done=False)  # kept until the final report is written
    if report["summary"]["hosts"] == 0 and not report.get("interrupted"):
        if partial is not None:
            partial.close(done=True)
        raise UsageError("no hosts matched the inventory and limit")
    text = json.dumps(report, indent=2, sort_keys=False)
    if args.output:
        write_report(args.output, text + "\n")
        if partial is not None:
            partial.close(done=True)
    if args.prometheus:
        from fleetops.metrics import write_textfile

        write_textfile(report, args.prometheus)
    if args.format == "json":
        sys.stdout.write(text + "\n")
    else:
        render_scan(report, out)
    return 130 if report.get("interrupted") else exit_code(report)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except FleetopsError as exc:
        print(f"fleetops: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("fleetops: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
