"""What every ``--help`` ends with: the command's exit codes and two or three examples, declared once here.

``EXITS`` says, per command, which exit codes (``fleetops.exitcodes.ExitCode``) it uses and what each
means for it; the top-level help lists every code (``fleetops.exitcodes.MEANINGS``), and the docs' one
exit-code table (docs/_ext/fleetops_docs.py) is made from both. ``EXAMPLES`` are each command's examples
(a remediation's are declared with it, ``Remediation.examples``); tests/fleetops/test_cli_help.py parses
every one with the real parser. ``HelpFormatter`` keeps those lines as lines (argparse would run the
epilog into one paragraph).
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Sequence

from fleetops.exitcodes import MEANINGS, ExitCode

E = ExitCode
_INTERRUPTED = (E.INTERRUPTED, "interrupted (Ctrl-C)")
_ROLLOUT = (
    (E.OK, "done: every host verified"),
    (E.USAGE, "usage error (options, an action's parameters, the inventory and --limit): nothing started"),
    (
        E.FAILED,
        "a host failed, timed out, was skipped or is in doubt, or the rollout stopped (circuit breaker, "
        "`fleetops stop`, `fleetops pause`, --not-after, the capacity floor)",
    ),
    (E.LOCKED, "hosts locked (lock file or EC2 lease) by another rollout"),
    (E.HANGUP, "SIGHUP: the batch aborted at once, the state saved (--resume probes its hosts first)"),
    (E.INTERRUPTED, "Ctrl-C: stopped after the current batch, the state saved"),
    (E.TERMINATED, "SIGTERM: the batch aborted at once, the state saved"),
)

# command (as typed after "fleetops"; "remediate ACTION" for every remediation) -> (code, what it means)
EXITS: dict[str, tuple[tuple[ExitCode, str], ...]] = {
    "scan": (
        (E.OK, "clean: no finding that --fail-on counts"),
        (
            E.FINDINGS,
            "findings at or above --fail-on (or, with --fail-on partial, a host a check could not fully look at)",
        ),
        (
            E.USAGE,
            "usage error, checked before any host is contacted: options, --checks, every -e knob and its value",
        ),
        (
            E.FAILED,
            "a host unreachable, failed or not scanned, or a detector could not run (whatever --fail-on says)",
        ),
        (E.INTERRUPTED, "interrupted (Ctrl-C): what arrived is kept"),
    ),
    "plan": (
        (E.OK, "planned (nothing is changed)"),
        (
            E.USAGE,
            "usage error: an unknown action, a cap out of range, a --limit or --exclude that matches no host",
        ),
        _INTERRUPTED,
    ),
    "remediate": _ROLLOUT,
    "remediate ACTION": _ROLLOUT,
    "remediate auto": (
        (
            E.OK,
            "the pass did what it decided; hosts that wait for a person (a ladder at `human` or run out, a "
            "storm brake) do not change it: the pass's JSON, the audit log and the FleetopsAutoHumanNeeded "
            "and FleetopsAutoStormBrake alerts name them",
        ),
        (E.FINDINGS, "with --fail-on human: a host waits for a person, or a storm brake holds a rule"),
        (
            E.USAGE,
            "bad input (the policy, an option, --from a file that is not a scan report): nothing acted",
        ),
        (
            E.FAILED,
            "the pass failed: a host could not be scanned, a detector a ladder in progress relies on failed "
            "(the ladder is kept), an action's rollout did not finish every host (`fleetops stop` of one "
            "ends the pass), or the shared store, an EC2 tag or the fleet record failed",
        ),
        (E.LOCKED, "another pass (or rollout) holds the state directory, the store's lease or the hosts"),
        (E.PAUSED, "automation is paused (`fleetops pause`): nothing acted"),
        (E.HANGUP, "SIGHUP stopped the pass (no further action started, what was attempted recorded)"),
        (E.INTERRUPTED, "Ctrl-C stopped the pass (no further action started, what was attempted recorded)"),
        (E.TERMINATED, "SIGTERM stopped the pass (no further action started, what was attempted recorded)"),
    ),
    "report": (
        (E.OK, "the rollout is done with every host verified"),
        (E.USAGE, "not a rollout id or a readable rollout state file"),
        (E.FAILED, "a host failed, was skipped or is pending, or the rollout stopped"),
    ),
    "rollouts": ((E.OK, "listed (an unreadable state file is a row of its own)"),),
    "stop": (
        (E.OK, "the stop is requested (or cleared)"),
        (E.USAGE, "usage error: neither a ROLLOUT nor --all, or both"),
        (E.FAILED, "the EC2 instances could not be tagged (the local stop file is written)"),
    ),
    "pause": (
        (E.OK, "paused (or already)"),
        (E.USAGE, "usage error (the inventory, the reason)"),
        (E.FAILED, "the shared store failed"),
    ),
    "unpause": (
        (E.OK, "the pause is lifted (or there was none)"),
        (E.USAGE, "usage error (the inventory, the reason)"),
        (E.FAILED, "the shared store failed"),
    ),
    "store": (
        (E.OK, "done"),
        (
            E.USAGE,
            "bad input: no store named for init or forget, forget without ENTRY or --reason, an entry no "
            "unfinished record has",
        ),
        (E.FAILED, "the store failed"),
        (E.PAUSED, "(status) automation is paused, in the store or on this controller"),
    ),
    "brake": (
        (E.OK, "the brake is lifted"),
        (E.USAGE, "no storm brake holds RULE (nothing lifted), or a bad option"),
        (E.FAILED, "the audit log or the shared store could not be written"),
    ),
    "brake lift": (
        (E.OK, "the brake is lifted"),
        (E.USAGE, "no storm brake holds RULE (nothing lifted), or a bad option"),
        (E.FAILED, "the audit log or the shared store could not be written"),
    ),
    "drift": (
        (E.OK, "no drift"),
        (E.FINDINGS, "drift: a host differs from the majority, or groups differ"),
        (E.USAGE, "usage error (options, --from a file that is not a scan report)"),
        (E.FAILED, "a host unreachable or failed (not compared)"),
        _INTERRUPTED,
    ),
    "merge": (
        (E.OK, "the merged scan is clean"),
        (E.FINDINGS, "the merged scan has findings at or above the shards' --fail-on"),
        (
            E.USAGE,
            "the reports do not join: schema versions, options or shard counts differ, a shard is missing "
            "or repeated, a host is in two reports",
        ),
        (E.FAILED, "a host of the merged scan unreachable, failed or not scanned"),
    ),
    "policy": (
        (E.OK, "every file is a policy whose rules can all match"),
        (E.USAGE, "a file does not load or holds a rule that never matches (one line each)"),
    ),
    "policy check": (
        (E.OK, "every file is a policy whose rules can all match"),
        (E.USAGE, "a file does not load or holds a rule that never matches (one line each)"),
    ),
}

# command -> examples (each a whole command line; a remediation's are Remediation.examples)
EXAMPLES: dict[str, tuple[str, ...]] = {
    "": (
        "fleetops scan",
        "fleetops scan -i inventory/example.fleet_ec2.yml --fail-on critical -o scan.json",
        "fleetops remediate auto -i inventory/example.fleet_ec2.yml --from scan.json",
    ),
    "scan": (
        "fleetops scan",
        "fleetops scan -i inventory/example.fleet_ec2.yml -l family_p5 --checks zombie_memcg,crashloop_unit",
        "fleetops scan -q --fail-on critical --prometheus /var/lib/node_exporter/fleetops.prom",
    ),
    "plan": (
        "fleetops plan reboot -i inventory/example.fleet_ec2.yml",
        "fleetops plan reboot -i inventory/example.fleet_ec2.yml --max-parallel 5% --exclude gpu-01,gpu-02",
    ),
    "remediate": (
        "fleetops remediate reboot -i inventory/example.fleet_ec2.yml -l gpu-01",
        "fleetops remediate --resume /var/lib/fleetops/rollouts/20261129T170102Z-3fa9c1-reboot.json",
        "fleetops remediate -q --resume /var/lib/fleetops/rollouts/20261129T170102Z-3fa9c1-reboot.json "
        "--break-lock",
    ),
    "remediate auto": (
        "fleetops remediate auto -i inventory/example.fleet_ec2.yml",
        "fleetops remediate auto -i inventory/example.fleet_ec2.yml --apply --fail-on human "
        "--reason 'ticket OPS-1234'",
        "fleetops remediate auto --from scan.json --policy site.yml",
    ),
    "report": (
        "fleetops report 20261129T170102Z-3fa9c1",
        "fleetops report /var/lib/fleetops/rollouts/20261129T170102Z-3fa9c1-reboot.json --format json",
    ),
    "rollouts": ("fleetops rollouts", "fleetops rollouts --format json"),
    "stop": (
        "fleetops stop 20261129T170102Z-3fa9c1 --reason 'wrong AMI'",
        "fleetops stop --all --reason 'incident 42' -i inventory/example.fleet_ec2.yml",
        "fleetops stop --all --clear",
    ),
    "pause": (
        "fleetops pause --reason 'incident 42'",
        "fleetops pause -i inventory/example.fleet_ec2.yml --reason 'change freeze'",
    ),
    "unpause": (
        "fleetops unpause --reason 'incident 42 closed'",
        "fleetops unpause -i inventory/example.fleet_ec2.yml --reason 'freeze over'",
    ),
    "store": (
        "fleetops store status -i inventory/example.fleet_ec2.yml",
        "fleetops store forget 1d2c3b4a --reason 'started i-0abc by hand' -i inventory/example.fleet_ec2.yml",
    ),
    "brake": (
        "fleetops brake lift gpu-fatal --reason 'driver fixed'",
        "fleetops brake lift gpu-fatal -i inventory/example.fleet_ec2.yml --reason 'bad AMI replaced'",
    ),
    "brake lift": (
        "fleetops brake lift gpu-fatal --reason 'driver fixed'",
        "fleetops brake lift gpu-fatal -i inventory/example.fleet_ec2.yml --reason 'bad AMI replaced'",
    ),
    "drift": (
        "fleetops drift -i inventory/example.fleet_ec2.yml",
        "fleetops drift --from scan.json --group-by az,ami",
    ),
    "merge": (
        "fleetops merge shard-1.json shard-2.json -o fleet.json",
        "fleetops merge shard-1.json shard-2.json.partial --format json",
    ),
    "policy": (
        "fleetops policy check policies/default.yml",
        "fleetops policy check site.yml",
    ),
    "policy check": (
        "fleetops policy check policies/default.yml",
        "fleetops policy check site.yml other.yml",
    ),
}


def exit_lines(command: str) -> list[str]:
    """``  CODE  meaning`` for each exit code of ``command`` ("": every code, as MEANINGS says)."""
    rows = [(code, m.happened) for code, m in MEANINGS.items()] if command == "" else list(EXITS[command])
    return [f"  {int(code):<4} {text}" for code, text in rows]


def epilog(command: str, examples: Sequence[str] | None = None, before: str = "") -> str:
    """A command's epilog: ``before`` (a paragraph), its exit codes, then its examples (``EXAMPLES``)."""
    shown = EXAMPLES[command] if examples is None else tuple(examples)
    head = [before, ""] if before else []
    return "\n".join(
        [*head, "exit codes:", *exit_lines(command), "", "examples:", *(f"  {e}" for e in shown)]
    )


def commands_using(code: ExitCode) -> list[str]:
    """The commands whose exit codes include ``code`` (the docs' table)."""
    return [c for c, rows in EXITS.items() if any(r[0] == code for r in rows)]


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter; an epilog's or description's lines that start with two spaces (an exit code,
    an example) stay lines: an exit code's text wraps under itself, an example is never cut."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out: list[str] = []
        paragraph: list[str] = []

        def flush() -> None:
            if paragraph:
                out.append(super(HelpFormatter, self)._fill_text(" ".join(paragraph), width, indent))
                paragraph.clear()

        for line in text.splitlines():
            if not line.startswith("  "):
                if line.strip():
                    paragraph.append(line)
                else:
                    flush()
                    out.append("")
                continue
            flush()
            code, _, _rest = line[2:].partition(" ")
            if code.isdigit():  # "  130  interrupted": the text wraps under itself
                lead = f"{indent}  {line[2:7]}"
                out.append(
                    textwrap.fill(
                        line[7:].strip(),
                        max(width, len(lead) + 20),
                        initial_indent=lead,
                        subsequent_indent=" " * len(lead),
                    )
                )
            else:
                out.append(indent + line)
        flush()
        return "\n".join(out)
