"""fleetops command line: scan, merge, plan, remediate, report, drift.

Exit codes: fleetops.exitcodes (what each means) and fleetops.cli.helptext (which command uses which; every
--help ends with its own, and with examples).

Building the parser imports neither fleetops.api nor ansible, boto3, paramiko, pydantic or rich: each
command imports what it runs, so ``--help`` does not wait for them and works without the collection
(tests/fleetops/test_cli_help.py; bench/cli_help.py times it).
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import threading
from collections.abc import Sequence
from importlib import import_module
from pathlib import Path
from typing import Any

import yaml

from fleetops.ansible import facts
from fleetops.cli.args import (
    PLAIN_EVERY_S,
    SUMMARY_ABOVE,
    Parser,
    VersionAction,
    add_all_arg,
    add_format_arg,
    add_policy_arg,
    add_state_dir_arg,
    add_target_args,
    collection_default,
    int_range,
    percent,
    positive_int,
    seconds,
    shard,
    shown,
)
from fleetops.cli.errors import run_main
from fleetops.cli.helptext import epilog
from fleetops.errors import UsageError
from fleetops.scan import DEFAULT_TRANSPORT, FAIL_ON, FAIL_ON_DEFAULT, MAX_FORKS, TRANSPORTS
from fleetops.util import DAY_S, HOUR_S

_Parser = Parser  # the name tests and older callers use
STDOUT = "-"  # a FILE argument that means standard output


def _register_scan[P: argparse.ArgumentParser](sub: argparse._SubParsersAction[P]) -> None:
    scan = sub.add_parser(
        "scan",
        help="scan hosts for faults (default: this machine)",
        description="Scan hosts: one fleetops.node.node_health call per host, all detectors in one round trip.",
        epilog=epilog("scan"),
    )
    add_target_args(scan)
    add_format_arg(
        scan,
        ("table", "json", "ndjson"),
        "output format: table (default; summarised past "
        f"{SUMMARY_ABOVE} hosts), json (the report, at the end), ndjson (one fleetops.scan.host/v1 object a "
        "line, written as each host answers: a run killed half way keeps every host that answered)",
    )
    add_all_arg(scan, "counts per check and severity, the worst hosts, the AZs most affected")
    scan.add_argument(
        "--wide",
        action="store_true",
        help="with --format table: also each host's row with its memory-cgroup columns (cgroup version, "
        "scope, memcgs, live, zombies, ID headroom) after the findings",
    )
    scan.add_argument(
        "-o",
        "--output",
        type=Path,
        metavar="FILE",
        help="also write the JSON report to this file (atomically, at the end; meanwhile each host "
        "is appended to FILE.partial as it answers, one JSON line each)",
    )
    scan.add_argument(
        "--prometheus",
        metavar="FILE",
        help="also write node_exporter textfile-collector metrics to FILE (atomically, mode 0644 as the host "
        "timer's: node_exporter reads it as its own user, and the metrics hold no secret); -: to stdout, "
        "instead of the table (not with --format json or ndjson)",
    )
    scan.add_argument(
        "--checks",
        metavar="CHECK[,CHECK...]",
        help="comma-separated detectors to run (default: all; an unknown name is a usage error that lists them)",
    )
    scan.add_argument(
        "--fail-on",
        choices=tuple(FAIL_ON),
        default=FAIL_ON_DEFAULT,
        help="the least severe finding that makes the scan exit 1: warning (a warning or critical finding), "
        "critical (only a critical one: a timer stays green on warnings), partial (as warning, and also a host "
        "whose status is partial: a check could not look fully, e.g. systemd not PID 1 or an unprivileged "
        "user), never (findings never change the exit code; they stay in the report and the metrics) "
        f"(default: {FAIL_ON_DEFAULT})",
    )
    scan.add_argument(
        "--sample-seconds",
        type=seconds,
        default=None,
        metavar="S",
        help=f"take two samples S seconds apart to report growth rates (0..{HOUR_S}; default: the module's, 0: one sample)",
    )
    # None: node_health's own default applies (memcg.DEFAULT_THRESHOLDS, read here only for the help)
    warning = collection_default(facts.zombie_warning_default)
    critical = collection_default(facts.zombie_critical_default)
    headroom = collection_default(facts.headroom_critical_pct_default)
    scan.add_argument(
        "--zombie-warning",
        type=positive_int,
        default=None,
        metavar="N",
        help=f"zombie memcgs that make a warning (>= 0; default: the module's{shown(warning)})",
    )
    scan.add_argument(
        "--zombie-critical",
        type=positive_int,
        default=None,
        metavar="N",
        help=f"zombie memcgs that make it critical (>= 0; default: the module's{shown(critical)})",
    )
    scan.add_argument(
        "--headroom-critical",
        type=percent,
        default=None,
        metavar="PCT",
        help="critical when fewer than PCT%% of the 65,535 memcg IDs are left "
        f"(0..100; default: the module's{shown(headroom, 'g')})",
    )
    scan.add_argument(
        "--forks",
        type=int_range(1),
        metavar="N",
        help=f"parallel hosts (default: all targeted hosts, at most {MAX_FORKS})",
    )
    scan.add_argument(
        "--host-timeout",
        type=int_range(0, DAY_S),
        default=120,
        metavar="S",
        help="seconds one host may take, connecting included: a host that does not answer ssh is "
        "unreachable after min(S/2, ansible's timeout of 10) s (default: 120; 0: no limit)",
    )
    scan.add_argument(
        "--transport",
        choices=TRANSPORTS,
        default=DEFAULT_TRANSPORT,
        help="how hosts are reached: auto (one ssh command a host from fleetops itself, the same runner and "
        "results for a seventh of the controller CPU, for every host it can serve; a host it cannot, such as one "
        "needing a become password or another connection type, goes through ansible-playbook in the same scan, "
        "named in the report's transport.by_ansible), ansible (ansible-playbook runs playbooks/scan.yml for every "
        f"host, as AWX's scan template does) or ssh (auto's alias) (default: {DEFAULT_TRANSPORT})",
    )
    scan.add_argument(
        "--shard",
        type=shard,
        metavar="I/N",
        help="scan only shard I of N (1 <= I <= N) of the selected hosts, by a hash of each host's name "
        "(a host stays in its shard as the fleet changes); join the N reports with `fleetops merge`",
    )
    scan.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress on stderr (default: a line a host up to "
        f"{SUMMARY_ABOVE} hosts; past that, hosts without a result and a bar with the rate and ETA on a "
        f"terminal, a progress line every {PLAIN_EVERY_S} s otherwise)",
    )
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
        "@FILE (repeatable; later ones win), e.g. -e fleetops_cpu_system_warning_pct=30; each is checked before "
        "any host is contacted, as node_health checks it: an unknown knob (a typo names the nearest), a value "
        "of the wrong type or out of range is a usage error (ansible's own ansible_* variables pass through)",
    )
    scan.add_argument(
        "--no-record",
        dest="record",
        action="store_false",
        help="do not write the fleet record. By default a scan of an inventory (-i) records, for the limited "
        "`remediate auto` passes' storm brake and floors, when it saw each host, whether it answered, and "
        "the policy's rules its findings match (only for the checks it ran): in the inventory's shared store "
        "(store_table), else in the state directory's seen.json. The hosts are only read either way",
    )
    add_policy_arg(
        scan,
        " whose rung each finding's next step names and whose rules the fleet record names (that of your "
        "`remediate auto` passes; checked before any host is contacted)",
    )
    add_state_dir_arg(
        scan,
        "where remediate auto keeps its ladders, read (never written) for the rung each finding is at, and, "
        "without a shared store, where the fleet record goes (that of your passes)",
    )
    scan.set_defaults(func=cmd_scan)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line's parser, every command in it. Given the arguments it will parse, only the command
    they name (its module imported): ``fleetops scan ...`` neither builds remediate's parsers nor imports
    the remediations; ``--help``, ``--version`` or an unknown command still build all."""
    parser = Parser(
        prog="fleetops",
        description="Find and fix the hidden faults that break GPU fleets: zombie memory cgroups, "
        "crash loops, UCX memory hooks. Scans run one module call per host through ansible-runner.",
        epilog=epilog(""),
    )
    parser.add_argument(
        "--version",
        action=VersionAction,
        help="show the version, the Python, and which fleetops.node collection runs (path, version)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    named = _command_named(argv)
    for module, names in COMMANDS:
        if named is None or named in names:
            register = _register_scan if module is None else import_module(module).register
            register(sub)
    return parser


# Each module that registers commands, and the commands it registers, in the order --help lists them
# (None: this module's scan). tests/fleetops/test_cli_help.py checks it against what each registers.
COMMANDS: tuple[tuple[str | None, tuple[str, ...]], ...] = (
    (None, ("scan",)),
    ("fleetops.cli.plan", ("plan",)),
    ("fleetops.cli.remediate", ("remediate",)),
    ("fleetops.cli.report", ("report", "rollouts")),
    ("fleetops.cli.stop", ("stop",)),
    ("fleetops.cli.pause", ("pause", "unpause", "store")),
    ("fleetops.cli.drift", ("drift",)),
    ("fleetops.cli.merge", ("merge",)),
    ("fleetops.cli.policy", ("policy",)),
    ("fleetops.cli.brake", ("brake",)),
)


def _command_named(argv: Sequence[str] | None) -> str | None:
    """The command the arguments name when their first is one (argparse's top level takes only -h and
    --version, before the command); None otherwise."""
    if not argv or argv[0].startswith("-"):
        return None
    return argv[0] if any(argv[0] in names for _, names in COMMANDS) else None


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
    from rich.console import Console
    from rich.markup import escape

    from fleetops import api
    from fleetops.cli.args import check_all_arg
    from fleetops.cli.progress import NdjsonOutput, ScanProgress
    from fleetops.cli.render import host_line, render_scan

    check_all_arg(args)
    if args.wide and args.format != "table":
        raise UsageError(f"--wide applies to --format table only, not {args.format}")
    metrics_out = args.prometheus == STDOUT
    if metrics_out and args.format != "table":
        raise UsageError(f"--prometheus - and --format {args.format} would both write to stdout")
    request = api.ScanRequest(
        inventory=list(args.inventory or []),
        limit=args.limit,
        checks=[c.strip() for c in args.checks.split(",") if c.strip()] if args.checks else None,
        sample_seconds=args.sample_seconds,
        zombie_warning=args.zombie_warning,
        zombie_critical=args.zombie_critical,
        headroom_critical_pct=args.headroom_critical,
        forks=args.forks,
        host_timeout=args.host_timeout,
        unit_allowlist=args.unit_allowlist,
        output=args.output,
        prometheus=None if args.prometheus is None or metrics_out else Path(args.prometheus),
        shard=args.shard,
        transport=args.transport,
        fail_on=args.fail_on,
        fleet_record=args.record,
        policy=args.policy,
        state_dir=args.state_dir,
    )
    for spec in args.extra_vars:
        request.extravars.update(parse_extra_vars(spec))
    err = Console(stderr=True, highlight=False)
    out = Console(highlight=False, soft_wrap=True)
    # ndjson lines on the terminal that shows the bar would tear it: plain progress lines then
    live = False if args.format == "ndjson" and sys.stdout.isatty() else None
    progress = None if args.quiet else ScanProgress(err, host_line, live=live)
    groups: dict[str, str | None] = {}
    cancel = threading.Event()
    stream = NdjsonOutput(sys.stdout, on_closed=cancel.set) if args.format == "ndjson" else None

    def on_targets(hosts: Sequence[Any]) -> None:
        groups.update((h.name, h.group) for h in hosts)
        if progress is not None:
            progress.start(len(hosts))

    def on_host(host: str, entry: dict[str, Any]) -> None:
        if stream is not None:
            stream.host(host, entry)
        if progress is not None:
            progress.host(host, entry)

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
        result = api.scan(request, on_host=on_host, cancel=cancel, on_targets=on_targets)
    finally:
        signal.signal(signal.SIGINT, previous)
        if progress is not None:
            progress.finish()
    unmatched = (result.report.get("selection") or {}).get("unmatched")
    if unmatched:
        err.print(
            f"[yellow]warning:[/] --limit {escape(repr(args.limit))}: {escape(', '.join(map(repr, unmatched)))} "
            "matched no host and selected nothing (a remediation refuses such a limit)",
            soft_wrap=True,
        )
    for line in result.record_warnings:
        err.print(f"[yellow]warning:[/] {escape(line)}", soft_wrap=True)
    if result.recorded and not args.quiet:
        err.print(f"[dim]fleet record: written to {escape(result.recorded)}[/]", soft_wrap=True)
    if metrics_out:
        sys.stdout.buffer.write(api.scan_metrics(result.report))
        sys.stdout.flush()
    elif stream is not None:
        stream.finish(result.report)
    elif args.format == "json":
        sys.stdout.write(result.json() + "\n")
    else:
        render_scan(result.report, out, show_all=args.all_rows, groups=groups, wide=args.wide)
    return result.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    def run() -> int:
        # parsing inside run_main too: an option's type may need the collection (its one-line error)
        given = list(sys.argv[1:] if argv is None else argv)
        args = build_parser(given).parse_args(given)
        from fleetops.ansible.install import check_ansible_core  # packaging: only once a command runs

        check_ansible_core()  # one line, exit 2, before the command runs anything
        return int(args.func(args))

    return run_main("fleetops", run)


if __name__ == "__main__":
    sys.exit(main())
