"""Fleet drift: which facts differ between hosts that should be identical, from one scan.

Both teams in design §1 learned not to trust "identical-looking" environments: Pinterest's one
unaffected AZ differed from the others by a unit that never started. ``build_drift`` takes one
``fleetops.scan/v1`` report (and the inventory's hostvars for AZ, AMI and instance type) and
compares, per fact, every host against the majority — fleet-wide, within each group of a
group-by dimension (az, ami, kernel, instance_type), and between the groups of a dimension.

The facts compared come from what the scan already returns (one module call per host):
the enabled units and the ``Environment=`` of the key services (``unexpected_unit``), the
kernel and OS (``facts.host``), the UCX versions in use (``ucx_mmap_hooks``) and the zombie
memcg level (``zombie_memcg``), bucketed by order of magnitude so that noise is not drift.
The JSON form is the contract ``fleetops.drift/v1``. Pure: no I/O but ``load_unit_allowlist``;
the table for people is ``fleetops.cli.render.render_drift``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from fleetops.ansible.facts import answered
from fleetops.errors import UsageError
from fleetops.exitcodes import ExitCode
from fleetops.util import DRIFT_SCHEMA, SCAN_SCHEMA

SCHEMA = DRIFT_SCHEMA
DIMENSIONS = ("az", "ami", "kernel", "instance_type")
# The hostvars that give a dimension: the fleetops.node.ec2 inventory's first, then plain inventories'.
HOSTVARS: dict[str, tuple[str, ...]] = {
    "az": ("ec2_az", "fleetops_az"),
    "ami": ("ec2_image_id", "fleetops_ami"),
    "instance_type": ("ec2_instance_type", "fleetops_instance_type"),
}
# The checks whose facts drift compares (a drift scan runs only these).
DRIFT_CHECKS = ("zombie_memcg", "ucx_mmap_hooks", "unexpected_unit")
NOT_ENABLED = "not enabled"
UNSET = "unset"
UNKNOWN_GROUP = "(unknown)"

EXIT_OK = ExitCode.OK
EXIT_DRIFT = ExitCode.FINDINGS
EXIT_HOSTS = ExitCode.FAILED

# One drift item: {"fact", "label", "majority", "majority_hosts", "hosts", "tie", "odd": {host: value}}
Item = dict[str, Any]


def zombie_bucket(zombies: int) -> str:
    """An order of magnitude, so that 1,200 and 1,900 zombies are the same level: '1,000-9,999'."""
    if zombies <= 0:
        return "0"
    low: int = 10 ** math.floor(math.log10(zombies))
    return f"{low:,}-{low * 10 - 1:,}"


def label(fact: str) -> str:
    """A fact key for people: 'unit:ecs.service' -> 'unit ecs.service'."""
    kind, _, rest = fact.partition(":")
    if kind == "unit":
        return f"unit {rest}"
    if kind == "env":
        unit, _, var = rest.partition(":")
        return f"{unit} Environment {var}"
    return {"ucx_version": "UCX version", "zombies": "zombie memcgs"}.get(fact, fact)


class HostFacts:
    """One scanned host's comparable facts: ``value(fact)`` is its value, or None when unknown."""

    def __init__(self, entry: Mapping[str, Any]) -> None:
        facts: Mapping[str, Any] = entry.get("facts") or {}
        self.values: dict[str, str] = {}
        host: Mapping[str, Any] = facts.get("host") or {}
        for key in ("kernel", "os"):
            if host.get(key):
                self.values[key] = str(host[key])
        units: Mapping[str, Any] = facts.get("units") or {}
        self.units_known = bool(units.get("systemd"))
        files: Mapping[str, Any] = units.get("unit_files") or {}
        for unit in units.get("enabled") or ():
            self.values[f"unit:{unit}"] = str((files.get(unit) or {}).get("state") or "enabled")
        self.env_units: set[str] = set()
        for unit, env in (units.get("environment") or {}).items():
            self.env_units.add(unit)
            for var, val in (env or {}).items():
                self.values[f"env:{unit}:{var}"] = str(val)
        ucx = facts.get("ucx")
        if isinstance(ucx, Mapping):
            versions = sorted({str(p.get("version") or "unknown") for p in ucx.get("processes") or ()})
            self.values["ucx_version"] = ", ".join(versions) if versions else "none"
        memcg: Mapping[str, Any] = facts.get("memcg") or {}
        if isinstance(memcg.get("zombies"), int):
            self.values["zombies"] = zombie_bucket(memcg["zombies"])

    def value(self, fact: str) -> str | None:
        if fact in self.values:
            return self.values[fact]
        kind, _, rest = fact.partition(":")
        if kind == "unit" and self.units_known:
            return NOT_ENABLED
        if kind == "env" and rest.partition(":")[0] in self.env_units:
            return UNSET
        return None


def compare(
    hosts: Mapping[str, HostFacts],
    facts: Sequence[str],
    reference: Mapping[str, str] | None = None,
) -> list[Item]:
    """Per fact, the majority value among ``hosts`` and the hosts that differ from it.

    A tie is broken by ``reference`` (the fleet-wide majority) when one of the tied values is it,
    else by the value's order; the item says ``tie``. Facts no host knows, or all hosts agree on,
    give no item.
    """
    items: list[Item] = []
    for fact in facts:
        known = {h: v for h, f in hosts.items() if (v := f.value(fact)) is not None}
        if len(known) < 2:
            continue
        counts = Counter(known.values())
        if len(counts) == 1:
            continue
        top = max(counts.values())
        leaders = sorted(v for v, n in counts.items() if n == top)
        ref = (reference or {}).get(fact)
        majority = ref if ref in leaders else leaders[0]
        items.append(
            {
                "fact": fact,
                "label": label(fact),
                "majority": majority,
                "majority_hosts": counts[majority],
                "hosts": len(known),
                "tie": len(leaders) > 1,
                "odd": {h: v for h, v in sorted(known.items()) if v != majority},
            }
        )
    return items


def _majorities(hosts: Mapping[str, HostFacts], facts: Sequence[str]) -> dict[str, str]:
    """The fleet-wide majority of every fact (agreeing facts included), for tie-breaks."""
    out: dict[str, str] = {}
    for fact in facts:
        counts = Counter(v for f in hosts.values() if (v := f.value(fact)) is not None)
        if counts:
            top = max(counts.values())
            out[fact] = sorted(v for v, n in counts.items() if n == top)[0]
    return out


def dimension_value(dim: str, hostvars: Mapping[str, Any], facts: HostFacts | None) -> str | None:
    """A host's value for a group-by dimension: hostvars for az/ami/instance_type, the scan's kernel."""
    if dim == "kernel":
        return facts.values.get("kernel") if facts is not None else None
    for var in HOSTVARS[dim]:
        value = hostvars.get(var)
        if value is not None and value != "" and not isinstance(value, Mapping | list):
            return str(value)
    return None


def build_drift(
    report: Mapping[str, Any],
    hostvars: Mapping[str, Mapping[str, Any]] | None = None,
    group_by: Sequence[str] = DIMENSIONS,
) -> dict[str, Any]:
    """The drift report (``fleetops.drift/v1``) of one scan report; ``hostvars`` by inventory host."""
    if report.get("schema") != SCAN_SCHEMA:
        raise UsageError(f"not a {SCAN_SCHEMA} report (schema {report.get('schema')!r})")
    for dim in group_by:
        if dim not in DIMENSIONS:
            raise UsageError(f"cannot group by {dim!r}: choose from {', '.join(DIMENSIONS)}")
    entries: Mapping[str, Mapping[str, Any]] = report.get("hosts") or {}
    hostvars = hostvars or {}
    compared = {h: HostFacts(e) for h, e in sorted(entries.items()) if answered(e)}
    not_compared = {
        h: {"status": e.get("status"), "msg": e.get("msg", "")}
        for h, e in sorted(entries.items())
        if not answered(e)
    }
    facts = sorted({f for hf in compared.values() for f in hf.values})
    reference = _majorities(compared, facts)
    fleet = compare(compared, facts, reference)

    hosts_out: dict[str, dict[str, Any]] = {}
    for h, e in sorted(entries.items()):
        hv = hostvars.get(h) or {}
        row: dict[str, Any] = {"status": e.get("status")}
        for dim in DIMENSIONS:
            row[dim] = dimension_value(dim, hv, compared.get(h))
        hosts_out[h] = row

    groups: dict[str, dict[str, Any]] = {}
    between: dict[str, list[dict[str, Any]]] = {}
    skipped: dict[str, str] = {}
    for dim in group_by:
        members: dict[str, dict[str, HostFacts]] = {}
        for h, hf in compared.items():
            members.setdefault(hosts_out[h][dim] or UNKNOWN_GROUP, {})[h] = hf
        if not members or set(members) == {UNKNOWN_GROUP}:
            where = "the scan" if dim == "kernel" else "the inventory (" + ", ".join(HOSTVARS[dim]) + ")"
            skipped[dim] = f"no host has a value from {where}"
            continue
        dim_facts = [f for f in facts if f != dim]
        # a group of every compared host would repeat the fleet-wide items: "all_hosts", no items
        groups[dim] = {
            name: {
                "hosts": sorted(group),
                "all_hosts": len(group) == len(compared),
                "drift": compare(group, dim_facts, reference) if len(group) < len(compared) else [],
            }
            for name, group in sorted(members.items())
        }
        if len(members) > 1:
            rows = []
            for fact in dim_facts:
                per_group = {
                    name: maj
                    for name, group in sorted(members.items())
                    if (maj := _majorities(group, [fact]).get(fact)) is not None
                }
                if len(set(per_group.values())) > 1:
                    rows.append({"fact": fact, "label": label(fact), "groups": per_group})
            between[dim] = rows

    odd: dict[str, list[dict[str, Any]]] = {}

    def note(items: list[Item], scope: str) -> None:
        for item in items:
            for h, v in item["odd"].items():
                odd.setdefault(h, []).append(
                    {"fact": item["fact"], "label": item["label"], "value": v,
                     "majority": item["majority"], "scope": scope, "tie": item["tie"]}
                )  # fmt: skip

    note(fleet, "fleet")
    for dim, by_name in groups.items():
        for name, body in by_name.items():
            note(body["drift"], f"{dim}={name}")
    drifting = sorted({i["fact"] for i in fleet} | {i["fact"] for b in groups.values() for g in b.values() for i in g["drift"]}
                      | {r["fact"] for rows in between.values() for r in rows})  # fmt: skip
    return {
        "schema": SCHEMA,
        "scan": {"started_at": report.get("started_at"), "interrupted": bool(report.get("interrupted"))},
        "group_by": list(group_by),
        "hosts": hosts_out,
        "fleet": fleet,
        "groups": groups,
        "between_groups": between,
        "skipped_dimensions": skipped,
        "odd_hosts": {h: odd[h] for h in sorted(odd)},
        "not_compared": not_compared,
        "summary": {
            "hosts": len(entries),
            "compared": len(compared),
            "not_compared": len(not_compared),
            "facts_compared": len(facts),
            "drifting_facts": len(drifting),
            "odd_hosts": sorted(odd),
        },
    }


def exit_code(drift: Mapping[str, Any]) -> ExitCode:
    """3 when a host could not be compared (unreachable, failed), else 1 on any drift, else 0."""
    if drift["not_compared"]:
        return EXIT_HOSTS
    if drift["summary"]["drifting_facts"]:
        return EXIT_DRIFT
    return EXIT_OK


def load_unit_allowlist(path: Path) -> list[str]:
    """A unit allow-list file: a YAML list of patterns, or a group_vars file with ``fleetops_unit_allowlist``."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read the unit allow-list {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"the unit allow-list {path} is not YAML: {str(exc).splitlines()[0]}") from None
    if isinstance(data, dict):
        data = data.get("fleetops_unit_allowlist")
    if not isinstance(data, list) or not data or not all(isinstance(p, str) and p.strip() for p in data):
        raise UsageError(
            f"the unit allow-list {path} must be a non-empty YAML list of unit-name patterns "
            "(or a group_vars file with fleetops_unit_allowlist)"
        )
    return [p.strip() for p in data]
