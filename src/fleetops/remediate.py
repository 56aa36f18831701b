"""`fleetops remediate ACTION`: run a remediation playbook batch by batch through the planner.

One batch = one ansible-runner invocation limited to that batch's hosts. A dry run (check mode +
diff) unless ``--apply``. A circuit breaker stops the rollout once failed hosts pass
``--max-failures`` (exactly that many are tolerated; one more stops it): hosts of later batches
stay untouched and are reported as pending.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from rich.console import Console

from fleetops import paths
from fleetops.plan_cli import add_rollout_args, add_target_args, plan_document, plan_from_args
from fleetops.runner import RunnerOptions, TaskResult, run_playbook

SCHEMA = "fleetops.rollout/v1"
EXIT_OK = 0
EXIT_FAILED = 3


@dataclass(frozen=True)
class Remediation:
    """A remediation the rollout can run: its playbook and the module whose result is the host's."""

    name: str
    playbook: str
    actions: tuple[str, ...]
    help: str
    add_args: Callable[[argparse.ArgumentParser], None]
    extravars: Callable[[argparse.Namespace], dict[str, Any]]
    # Optional: work out, before planning, which hosts need what (``fix`` scans first). Returns the
    # extra vars and the hosts to target (None: every host the inventory and --limit select).
    prepare: Callable[[argparse.Namespace, Console], tuple[dict[str, Any], list[str] | None]] | None = None


def _disable_unit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--unit", required=True, metavar="NAME", help="the unit to stop, disable and mask")
    p.add_argument(
        "--container",
        dest="containers",
        action="append",
        default=[],
        metavar="NAME",
        help="a docker container the unit ran, removed too when docker is present (repeatable)",
    )
    p.add_argument(
        "--protected",
        action="append",
        default=[],
        metavar="PATTERN",
        help="more units to refuse, on top of the built-in protected list (repeatable)",
    )
    p.add_argument(
        "--allow-protected", action="store_true", help="override the protected-unit refusal (think twice)"
    )


def _disable_unit_vars(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "fleetops_unit": args.unit,
        "fleetops_containers": list(args.containers),
        "fleetops_protected": list(args.protected),
        "fleetops_allow_protected": bool(args.allow_protected),
    }


def _reclaim_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--min-zombies", type=int, default=1, metavar="N", help="do nothing below N zombies (default: 1)"
    )
    p.add_argument(
        "--reboot-threshold",
        type=int,
        default=1000,
        metavar="N",
        help="zombies left after the reclaim that mark a host as needing a reboot (default: 1000)",
    )


def _reclaim_vars(args: argparse.Namespace) -> dict[str, Any]:
    return {"fleetops_min_zombies": args.min_zombies, "fleetops_reboot_threshold": args.reboot_threshold}


def _fix_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sample-seconds",
        type=float,
        default=10.0,
        metavar="S",
        help="the scan before the fix takes two samples S seconds apart, for restart and growth rates (default: 10)",
    )
    p.add_argument(
        "--protected",
        action="append",
        default=[],
        metavar="PATTERN",
        help="more units never to turn off, on top of the built-in protected list (repeatable)",
    )
    p.add_argument(
        "--reboot-threshold", type=int, default=1000, metavar="N", help="see reclaim (default: 1000)"
    )


def _fix_vars(args: argparse.Namespace) -> dict[str, Any]:
    return {"fleetops_protected": list(args.protected), "fleetops_reboot_threshold": args.reboot_threshold}


def _fix_prepare(args: argparse.Namespace, console: Console) -> tuple[dict[str, Any], list[str] | None]:
    from fleetops.fix import fix_plan_from_report
    from fleetops.scan import ScanOptions, run_scan

    inventories = list(args.inventory or [])
    if not inventories:
        plan_inventory = paths.default_inventory()
        inventories = [plan_inventory] if plan_inventory else []
        args.inventory = inventories
    console.print(f"scanning first ({args.sample_seconds:g}s between two samples) to find what to fix")
    report = run_scan(
        ScanOptions(inventory=inventories, limit=args.limit, sample_seconds=args.sample_seconds)
    )
    fix_plan, notes = fix_plan_from_report(report)
    for note in notes:
        console.print(f"[yellow]note: {note}[/]")
    for host, todo in fix_plan.items():
        console.print(
            f"  {host}: disable {', '.join(todo['disable_units']) or '-'}; reclaim {todo['reclaim']}"
        )
    return {**_fix_vars(args), "fleetops_fix_plan": fix_plan}, sorted(fix_plan)


REMEDIATIONS: dict[str, Remediation] = {
    r.name: r
    for r in (
        Remediation(
            name="disable-unit",
            playbook="fleetops.node.remediate_disable_unit",
            actions=("fleetops.node.disable_unit",),
            help="stop, disable and mask a unit (and remove its container)",
            add_args=_disable_unit_args,
            extravars=_disable_unit_vars,
        ),
        Remediation(
            name="reclaim",
            playbook="fleetops.node.remediate_reclaim",
            actions=("fleetops.node.reclaim_memcg",),
            help="free zombie memory cgroups by dropping the page cache that pins them",
            add_args=_reclaim_args,
            extravars=_reclaim_vars,
        ),
        Remediation(
            name="fix",
            playbook="fleetops.node.remediate_fix",
            actions=("fleetops.node.disable_unit", "fleetops.node.reclaim_memcg"),
            help="scan, then fix what was found: turn off crash-looping units, reclaim zombie memcgs",
            add_args=_fix_args,
            extravars=_fix_vars,
            prepare=_fix_prepare,
        ),
    )
}


@dataclass(frozen=True)
class FailureBudget:
    """--max-failures: failed hosts tolerated, as a count or a percent of the planned hosts (rounded down)."""

    count: int | None = None
    percent: Fraction | None = None

    @classmethod
    def parse(cls, text: str) -> FailureBudget:
        raw = text.strip()
        try:
            if raw.endswith("%"):
                pct = Fraction(raw[:-1].strip())
                if not 0 <= pct <= 100:
                    raise ValueError
                return cls(percent=pct)
            count = int(raw)
            if count < 0:
                raise ValueError
            return cls(count=count)
        except (ValueError, ZeroDivisionError):
            raise argparse.ArgumentTypeError(
                f"not a host count >= 0 or a percentage 0-100%: {text!r}"
            ) from None

    def tolerated(self, hosts: int) -> int:
        if self.count is not None:
            return self.count
        return math.floor((self.percent or Fraction(0)) * hosts / 100)


def host_outcome(results: list[TaskResult], actions: tuple[str, ...]) -> dict[str, Any]:
    """One host's outcome in a batch, from its task results (changed when any remediation task changed)."""
    for tr in results:
        if tr.status == "unreachable":
            return {"status": "unreachable", "changed": False, "msg": tr.msg}
    failed = next((tr for tr in results if tr.status == "failed"), None)
    if failed is not None:
        return {"status": "failed", "changed": False, "msg": failed.msg, "result": _slim(failed.result)}
    done = [tr for tr in results if tr.action in actions and tr.status == "ok"]
    if not done and not any(tr.action in actions for tr in results):
        return {"status": "failed", "changed": False, "msg": "the remediation task did not run"}
    return {
        "status": "ok",
        "changed": any(bool(tr.result.get("changed")) for tr in done),
        "result": _slim(done[0].result) if len(done) == 1 else {"tasks": [_slim(tr.result) for tr in done]},
    }


def _slim(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if not k.startswith("_ansible") and k not in ("invocation",)}


def run_rollout(args: argparse.Namespace, remediation: Remediation, console: Console) -> dict[str, Any]:
    extravars = remediation.extravars(args)
    if remediation.prepare is not None:
        extravars, targets = remediation.prepare(args, console)
        if targets is not None:
            if not targets:
                return _empty_report(remediation, args)
            args.limit = ",".join(targets)
    plan, group_by = plan_from_args(args)
    doc = plan_document(remediation.name, plan, group_by)
    budget = args.max_failures.tolerated(plan.hosts)
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "action": remediation.name,
        "apply": bool(args.apply),
        "plan": doc,
        "max_failures": budget,
        "batches": [],
        "stopped": None,
    }
    failures = 0
    for index, batch in enumerate(plan.batches, start=1):
        mode = "apply" if args.apply else "dry run"
        console.print(f"[bold]batch {index}/{len(plan.batches)}[/] ({mode}): {' '.join(batch)}")
        started = time.time()
        run = run_playbook(
            RunnerOptions(
                playbook=remediation.playbook,
                inventory=list(args.inventory),
                limit=",".join(batch),
                extravars=extravars,
                check=not args.apply,
                diff=True,
            )
        )
        hosts = {h: host_outcome(run.results_for(h), remediation.actions) for h in batch}
        for host, outcome in hosts.items():
            style = "green" if outcome["status"] == "ok" else "bold red"
            what = "changed" if outcome["changed"] else "ok"
            if not args.apply and outcome["changed"]:
                what = "would change"
            detail = outcome.get("msg") or ", ".join(outcome.get("result", {}).get("actions") or [])
            console.print(
                f"  [{style}]{host}: {what if outcome['status'] == 'ok' else outcome['status']}[/] {detail}"
            )
        report["batches"].append({"hosts": batch, "started": started, "results": hosts})
        failures += sum(1 for o in hosts.values() if o["status"] != "ok")
        if failures > budget:
            pending = [h for b in plan.batches[index:] for h in b]
            report["stopped"] = {
                "after_batch": index,
                "reason": f"{failures} failed host(s), more than the {budget} tolerated (--max-failures)",
                "pending": pending,
            }
            console.print(
                f"[bold red]circuit breaker: {report['stopped']['reason']}; {len(pending)} host(s) untouched[/]"
            )
            break
    report["summary"] = _summary(report)
    return report


def _empty_report(remediation: Remediation, args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "action": remediation.name,
        "apply": bool(args.apply),
        "plan": {"hosts": 0, "batches": []},
        "batches": [],
        "stopped": None,
        "note": "nothing to fix: no host has a finding this remediation acts on",
    }
    report["summary"] = _summary(report)
    return report


def _summary(report: dict[str, Any]) -> dict[str, int]:
    counts = {"hosts": report["plan"]["hosts"], "ok": 0, "changed": 0, "failed": 0, "unreachable": 0}
    for batch in report["batches"]:
        for outcome in batch["results"].values():
            counts[outcome["status"]] = counts.get(outcome["status"], 0) + 1
            counts["changed"] += bool(outcome["changed"])
    counts["pending"] = len(report["stopped"]["pending"]) if report["stopped"] else 0
    return counts


def cmd_remediate(args: argparse.Namespace) -> int:
    remediation = REMEDIATIONS[args.remediation]
    console = Console(stderr=True, highlight=False)
    report = run_rollout(args, remediation, console)
    if args.format == "json":
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        s = report["summary"]
        verb = "changed" if args.apply else "would change"
        Console(highlight=False).print(
            f"{remediation.name}: {s['hosts']} host(s): {s['changed']} {verb}, {s['failed']} failed, "
            f"{s['unreachable']} unreachable, {s['pending']} pending"
            + ("" if args.apply else " (dry run: add --apply to change hosts)")
        )
    s = report["summary"]
    return EXIT_FAILED if (s["failed"] or s["unreachable"] or report["stopped"]) else EXIT_OK


def register[P: argparse.ArgumentParser](subparsers: argparse._SubParsersAction[P]) -> None:
    """Add ``fleetops remediate ACTION ...`` with one sub-command per remediation."""
    p = subparsers.add_parser(
        "remediate",
        help="run a remediation in rolling batches (a dry run unless --apply)",
        description="Run a remediation batch by batch (one ansible-runner invocation per batch), "
        "planned with the same caps as `fleetops plan`. Dry run (check mode + diff) unless --apply.",
    )
    sub = p.add_subparsers(dest="remediation", metavar="ACTION", parser_class=type(p))
    sub.required = True
    for remediation in REMEDIATIONS.values():
        rp = sub.add_parser(remediation.name, help=remediation.help, description=remediation.help)
        remediation.add_args(rp)
        add_target_args(rp)
        add_rollout_args(rp)
        rp.add_argument("--apply", action="store_true", help="change hosts (default: dry run)")
        rp.add_argument(
            "--max-failures",
            type=FailureBudget.parse,
            default=FailureBudget(count=0),
            metavar="N|P%",
            help="failed hosts tolerated before the rollout stops (default: 0)",
        )
        rp.add_argument("--format", choices=("table", "json"), default="table")
        rp.set_defaults(func=cmd_remediate)
