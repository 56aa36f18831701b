#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: node_health
short_description: Scan a host for the hidden faults that break GPU fleets (read-only)
version_added: "0.1.0"
description:
  - Runs the selected detectors in one call and returns their facts and findings.
  - C(crashloop_unit) reads every service in one C(systemctl show) call (never one call per
    unit) and reports units that crash loop, with a restart rate from two samples (NRestarts
    deltas) or, with one sample, from the journal's "Scheduled restart job" entries. It names
    whether the image enabled the unit (a vendor unit file, enabled).
  - When zombie memory cgroups grow while units crash loop in the same window, the
    C(zombie_memcg) finding names the likely culprits, with the evidence.
  - C(zombie_memcg) counts dying ("zombie") memory cgroups and the headroom to the 65,535
    memcg ID limit, on cgroup v1 and v2. Its cost does not grow with the number of zombies
    (one read of C(/proc/cgroups), C(/proc/self/mountinfo), the root C(cgroup.stat), and a
    directory walk linear in the live cgroups); it never reads C(memory.stat) of any cgroup.
  - Inside a cgroup namespace or a container that sees only a subtree of the hierarchy, the
    zombie count cannot be known; the host-wide total and headroom are still reported, with
    the scope and the reason.
  - A detector that cannot run (unreadable or malformed input) adds an entry to RV(errors);
    the module itself still succeeds.
  - Never changes anything on the host.
options:
  checks:
    description:
      - Detectors to run. Default is all of them.
    type: list
    elements: str
    choices: [zombie_memcg, crashloop_unit]
  sample_seconds:
    description:
      - When greater than 0, take two samples this many seconds apart and report growth
        per minute.
    type: float
    default: 0
  zombie_warning:
    description:
      - A warning finding when at least this many zombie memory cgroups exist.
      - Must not be greater than O(zombie_critical).
    type: int
    default: 1000
  zombie_critical:
    description:
      - A critical finding when at least this many zombie memory cgroups exist.
    type: int
    default: 20000
  headroom_critical_pct:
    description:
      - A critical finding when the free memcg IDs (of 65,535) are under this percentage.
    type: float
    default: 20
  crashloop_warning_per_min:
    description:
      - A warning finding for a service restarting at least this often per minute.
    type: float
    default: 0.5
  crashloop_critical_per_min:
    description:
      - A critical finding for a service restarting at least this often per minute.
    type: float
    default: 5
  journal_window_seconds:
    description:
      - With one sample (O(sample_seconds=0)), the restart rate comes from the journal's
        "Scheduled restart job" entries in this many seconds before the scan.
    type: int
    default: 600
  zombie_growth_warning_per_min:
    description:
      - With two samples, a warning when memory cgroups pile up at least this fast per minute
        (zombies; in namespace scope the host-wide total less this host's live growth).
      - The finding names the likely culprit units, crash-looping in the same window.
    type: float
    default: 10
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
notes:
  - Needs no privileges for C(zombie_memcg); C(/proc/cgroups) and the cgroup hierarchy are
    world-readable.
  - Since kernel 6.12 C(/proc/cgroups) omits controllers not available on cgroup v1, so on a
    cgroup v2 host the memory line may be missing; the counts then come from C(cgroup.stat).
  - C(id_headroom) is 65,535 minus every memcg the kernel counts, dying ones included, which is the
    worst case. Since Linux 4.8 a dying memcg gives its ID back when it goes offline unless swap
    entries still reference it, so page-cache zombies alone do not exhaust IDs (on a 6.18
    kernel, mkdir still worked with 66,051 memcgs counted); live memcgs and swap-pinned
    zombies do.
seealso:
  - name: Kernel cgroup v2 documentation
    description: cgroup.stat and its nr_dying_subsys_<controller> fields.
    link: https://docs.kernel.org/admin-guide/cgroup-v2.html
author:
  - fleetops maintainers (@fleetops)
"""

EXAMPLES = r"""
- name: Scan for zombie memory cgroups
  fleetops.node.node_health:
    checks: [zombie_memcg]
  register: health

- name: Measure growth over 30 seconds, with stricter thresholds
  fleetops.node.node_health:
    sample_seconds: 30
    zombie_warning: 500
    zombie_critical: 10000
  register: health

- name: Fail when a detector found something critical
  ansible.builtin.assert:
    that: health.findings | selectattr('severity', 'equalto', 'critical') | list | length == 0
"""

RETURN = r"""
checks:
  description: The detectors that ran, in order.
  returned: always
  type: list
  elements: str
  sample: [zombie_memcg]
facts:
  description: Facts per detector, keyed by fact name; a detector that failed has no key here.
  returned: always
  type: dict
  contains:
    memcg:
      description:
        - Facts of C(zombie_memcg).
        - C(cgroup_version) is 1, 2, or null when the host has no memory controller (then
          C(reason) says why and the counts are null).
        - C(scope) is C(host) or C(namespace); in namespace scope C(zombies) is null, C(total)
          and C(id_headroom) are host-wide, and C(scope_reason) says why.
        - C(total), C(live), C(zombies), C(id_headroom) (free IDs of 65,535),
          C(id_headroom_pct), C(basis) (how the counts were made), C(hierarchy) (the mount
          point), C(reason) (null when measured).
        - C(growth) (only when sampled) has C(seconds), C(total_per_min), C(live_per_min),
          C(zombies_per_min) (null when zombies are unknown).
      returned: when zombie_memcg ran without error
      type: dict
      sample:
        cgroup_version: 1
        scope: host
        total: 1564
        live: 41
        zombies: 1523
        id_headroom: 63971
        id_headroom_pct: 97.61
        basis: "cgroup v1: num_cgroups of the memory line of /proc/cgroups (live + dying memcgs) minus the directories under the memory hierarchy"
        scope_reason: "initial cgroup namespace (cgroup:[4026531835]) and the hierarchy is mounted at its root"
        hierarchy: /sys/fs/cgroup/memory
        reason: null
    crashloop:
      description:
        - Facts of C(crashloop_unit). C(systemd) false (with C(reason)) on a host without systemd.
        - C(services) is how many services systemd reported; C(units) holds only services that
          restarted or failed, keyed by unit, with C(n_restarts), C(restarts_per_min),
          C(restarts_in_window), C(sub_state), C(result), C(unit_file_state), C(vendor_unit).
        - C(rate_basis) is C(samples), C(journal), or null (no rate could be measured).
      returned: when crashloop_unit ran without error
      type: dict
findings:
  description: Findings; zombie_memcg gives at most one, crashloop_unit one per looping unit.
  returned: always
  type: list
  elements: dict
  contains:
    check:
      description: The detector.
      type: str
      returned: always
      sample: zombie_memcg
    severity:
      description: One of C(info), C(warning), C(critical).
      type: str
      returned: always
      sample: warning
    summary:
      description: One readable line.
      type: str
      returned: always
      sample: "1,523 zombie memory cgroups (warning at 1,000); 63,971 of 65,535 memcg IDs free"
    data:
      description: The numbers behind the finding (counts, thresholds, growth when sampled).
      type: dict
      returned: always
errors:
  description: Detectors that could not run; the module still succeeds.
  returned: always
  type: list
  elements: dict
  contains:
    check:
      description: The detector.
      type: str
      returned: always
      sample: zombie_memcg
    msg:
      description: 'What failed, as "Failed to <verb> <object>: <cause>".'
      type: str
      returned: always
      sample: "Failed to parse /proc/cgroups: line 6: num_cgroups 'x' is not an integer"
duration_ms:
  description: Wall time of the whole call in milliseconds, sampling wait included.
  returned: always
  type: float
  sample: 1.42
"""

import collections
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.fleetops.node.plugins.module_utils import crashloop, memcg
from ansible_collections.fleetops.node.plugins.module_utils.findings import (
    DetectorError,
    fmt_int,
    make_error,
    make_finding,
    severity_rank,
)

# A detector: ``sample(params) -> facts`` (raises DetectorError), ``add_growth(first, second,
# seconds) -> facts`` and ``evaluate(facts, params) -> findings``. Adding a detector is a new
# module_utils file plus one entry here and in DOCUMENTATION's ``checks`` choices.
Detector = collections.namedtuple("Detector", ["fact_key", "sample", "add_growth", "evaluate"])


def _memcg_thresholds(params):
    return dict((key, params[key]) for key in ("zombie_warning", "zombie_critical", "headroom_critical_pct"))


def _crashloop_thresholds(params):
    return dict((key, params[key]) for key in ("crashloop_warning_per_min", "crashloop_critical_per_min"))


def _crashloop_sample(params):
    # One sample reads the journal for a rate; with two samples the NRestarts deltas give it.
    return crashloop.collect(
        params.get("_run") or crashloop.run_command,
        use_journal=params["sample_seconds"] <= 0,
        window_seconds=params["journal_window_seconds"],
    )


DETECTORS = collections.OrderedDict(
    [
        (
            "zombie_memcg",
            Detector(
                fact_key="memcg",
                sample=lambda params: memcg.collect(),
                add_growth=memcg.add_growth,
                evaluate=lambda facts, params: memcg.evaluate(facts, _memcg_thresholds(params)),
            ),
        ),
        (
            "crashloop_unit",
            Detector(
                fact_key="crashloop",
                sample=_crashloop_sample,
                add_growth=crashloop.add_growth,
                evaluate=lambda facts, params: crashloop.evaluate(facts, _crashloop_thresholds(params)),
            ),
        ),
    ]
)


def _attribute(facts, findings, params):
    """Name the likely culprits of zombie memcg growth on the zombie_memcg finding (or raise one)."""
    if "memcg" not in facts:
        return findings
    rate, basis, culprits = crashloop.attribute_culprits(
        facts["memcg"], facts.get("crashloop"), params["zombie_growth_warning_per_min"]
    )
    if rate is None or rate < params["zombie_growth_warning_per_min"]:
        return findings
    text = "memory cgroups piling up at %s/min (%s)" % (fmt_int(round(rate)), basis)
    if culprits:
        text += "; likely culprit: " + ", ".join(
            "%s (%s restarts/min, %s memcgs per restart)" % (c["unit"], c["restarts_per_min"], c["memcgs_per_restart"])
            for c in culprits
        )
    extra = {"growth_per_min": rate, "growth_basis": basis, "culprits": culprits}
    out = []
    merged = False
    for finding in findings:
        if finding["check"] == memcg.CHECK and not merged:
            merged = True
            severity = finding["severity"]
            if severity_rank(severity) < severity_rank("warning"):
                severity = "warning"
            data = dict(finding["data"], **extra)
            finding = make_finding(memcg.CHECK, severity, text + "; " + finding["summary"], data)
        out.append(finding)
    if not merged:
        out.append(make_finding(memcg.CHECK, "warning", text, dict(facts["memcg"].get("growth") or {}, **extra)))
    return out


def _validate(params):
    """The first problem with the options, or None."""
    for key in (
        "sample_seconds",
        "zombie_warning",
        "zombie_critical",
        "headroom_critical_pct",
        "crashloop_warning_per_min",
        "crashloop_critical_per_min",
        "journal_window_seconds",
        "zombie_growth_warning_per_min",
    ):
        if params[key] < 0:
            return "%s must not be negative, got %s" % (key, params[key])
    if params["zombie_warning"] > params["zombie_critical"]:
        return "zombie_warning (%d) must not be greater than zombie_critical (%d)" % (
            params["zombie_warning"],
            params["zombie_critical"],
        )
    if params["headroom_critical_pct"] > 100:
        return "headroom_critical_pct must be at most 100, got %s" % params["headroom_critical_pct"]
    return None


def _sample(names, params, errors):
    """{name: facts} for each detector that ran; failures go to ``errors``."""
    samples = collections.OrderedDict()
    for name in names:
        try:
            samples[name] = DETECTORS[name].sample(params)
        except DetectorError as err:
            errors.append(make_error(name, err))
    return samples


ARGUMENT_SPEC = dict(
    checks=dict(type="list", elements="str", choices=list(DETECTORS)),
    sample_seconds=dict(type="float", default=0),
    zombie_warning=dict(type="int", default=1000),
    zombie_critical=dict(type="int", default=20000),
    headroom_critical_pct=dict(type="float", default=20),
    crashloop_warning_per_min=dict(type="float", default=0.5),
    crashloop_critical_per_min=dict(type="float", default=5),
    journal_window_seconds=dict(type="int", default=600),
    zombie_growth_warning_per_min=dict(type="float", default=10),
)
# What run_checks() uses for options an in-process caller leaves out.
DEFAULTS = dict((key, spec.get("default")) for key, spec in ARGUMENT_SPEC.items())


def run_checks(params):
    """The module's result (without ``changed``) for validated ``params`` (missing keys take defaults)."""
    params = dict(DEFAULTS, **params)
    started = time.monotonic()
    names = []
    for name in params["checks"] or list(DETECTORS):
        if name not in names:
            names.append(name)
    errors = []
    samples = _sample(names, params, errors)
    if params["sample_seconds"] > 0 and samples:
        first, first_at = samples, time.monotonic()
        time.sleep(params["sample_seconds"])
        second = _sample(list(first), params, errors)
        elapsed = time.monotonic() - first_at
        # a detector whose second sample failed keeps its first one (and an errors entry)
        samples = collections.OrderedDict(
            (name, DETECTORS[name].add_growth(first[name], second[name], elapsed) if name in second else first[name])
            for name in first
        )
    facts = {}
    findings = []
    for name, detector_facts in samples.items():
        detector = DETECTORS[name]
        facts[detector.fact_key] = detector_facts
        findings.extend(detector.evaluate(detector_facts, params))
    findings = _attribute(facts, findings, params)
    return {
        "facts": facts,
        "findings": findings,
        "errors": errors,
        "checks": names,
        "duration_ms": round((time.monotonic() - started) * 1000.0, 3),
    }


def main():
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        supports_check_mode=True,
    )
    problem = _validate(module.params)
    if problem:
        module.fail_json(msg="Failed to validate node_health options: %s" % problem)
    params = dict(module.params, _run=module.run_command)
    module.exit_json(changed=False, **run_checks(params))


if __name__ == "__main__":
    main()
