# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The detectors of node_health, their options and one call of all of them (``run_checks``).

Here, not in the module, so that two callers run the very same code: the ``node_health`` module (one
scan, through Ansible) and the host timer's runner (``textfile``, every minute, with no Ansible on the
host: stdlib only). In-process callers pass ``_run`` (a command runner, ``argv -> (rc, out, err)``),
``_docker`` (docker's path or None) and ``_open_url`` (an URL opener, for IMDS) in the params, and may pass
``_bus`` (``sdbus.Systemd``: crashloop_unit and unexpected_unit ask systemd over D-Bus what they would ask
``systemctl``, and run systemctl whenever it cannot answer).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import collections
import time

from ansible_collections.fleetops.node.plugins.module_utils import (
    containers,
    coverage,
    cpustat,
    crashloop,
    ec2events,
    ena,
    gpu,
    kernlog,
    memcg,
    procs,
    ucx,
    units,
)
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


def _no_runner(argv):
    """In-process callers of run_checks() pass ``_run`` (AnsibleModule.run_command does it in the module)."""
    raise DetectorError(
        "run", argv[0], "no command runner: pass params['_run'] when calling run_checks() in-process"
    )


def _crashloop_thresholds(params):
    return dict((key, params[key]) for key in ("crashloop_warning_per_min", "crashloop_critical_per_min"))


def _anon_thresholds(params):
    return dict(
        (key, params[key]) for key in ("anon_growth_warning_mb_per_min", "anon_growth_critical_mb_per_min")
    )


def _kernel_log(params):
    """The kernel log, read once per sampling round for every detector that wants it (kernlog)."""
    return kernlog.cached(params.get("_kernel_log"), params.get("_run"))


def _cpu_thresholds(params):
    return dict((key, params[key]) for key in ("cpu_system_warning_pct", "cpu_system_critical_pct"))


def _crashloop_sample(params):
    # One sample reads the journal for a rate; with two samples the NRestarts deltas give it.
    return crashloop.collect(
        params.get("_run") or _no_runner,
        use_journal=params["sample_seconds"] <= 0,
        window_seconds=params["journal_window_seconds"],
        bus=params.get("_bus"),
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
        (
            "crashloop_container",
            Detector(
                fact_key="containers",
                sample=lambda params: containers.collect(
                    params.get("_run") or _no_runner, params.get("_docker")
                ),
                add_growth=containers.add_growth,
                evaluate=lambda facts, params: containers.evaluate(facts, _crashloop_thresholds(params)),
            ),
        ),
        (
            "anon_rss_growth",
            Detector(
                fact_key="anon_rss",
                sample=lambda params: procs.sample(
                    threshold_mb_per_min=params["anon_growth_warning_mb_per_min"]
                ),
                add_growth=procs.add_growth,
                evaluate=lambda facts, params: procs.evaluate(facts, _anon_thresholds(params)),
            ),
        ),
        (
            "ucx_mmap_hooks",
            Detector(
                fact_key="ucx",
                sample=lambda params: ucx.collect(params.get("_run") or _no_runner),
                add_growth=ucx.add_growth,
                evaluate=lambda facts, params: ucx.evaluate(facts),
            ),
        ),
        (
            "ec2_scheduled_event",
            Detector(
                fact_key="ec2_events",
                sample=lambda params: ec2events.collect(
                    params["inventory_events"],
                    imds=params["imds"],
                    imds_url=params["imds_url"],
                    opener=params.get("_open_url"),
                ),
                add_growth=lambda first, second, seconds: second,
                evaluate=lambda facts, params: ec2events.evaluate(facts),
            ),
        ),
        (
            "unexpected_unit",
            Detector(
                fact_key="units",
                sample=lambda params: units.collect(
                    params.get("_run") or _no_runner, params["env_units"], bus=params.get("_bus")
                ),
                add_growth=units.add_growth,
                evaluate=lambda facts, params: units.evaluate(facts, params["unit_allowlist"]),
            ),
        ),
        (
            "ena_resets",
            Detector(
                fact_key="ena",
                sample=lambda params: ena.collect(
                    params.get("_run") or _no_runner, lambda: _kernel_log(params)
                ),
                add_growth=ena.add_growth,
                evaluate=lambda facts, params: ena.evaluate(
                    facts, {"ena_resets_critical": params["ena_resets_critical"]}
                ),
            ),
        ),
        (
            "cpu_starvation",
            Detector(
                fact_key="cpu",
                sample=lambda params: cpustat.sample(warning_pct=params["cpu_system_warning_pct"]),
                add_growth=cpustat.add_growth,
                evaluate=lambda facts, params: cpustat.evaluate(facts, _cpu_thresholds(params)),
            ),
        ),
        (
            "gpu_health",
            Detector(
                fact_key="gpu",
                sample=lambda params: gpu.collect(params.get("_run") or _no_runner, _kernel_log(params)),
                add_growth=gpu.add_growth,
                evaluate=lambda facts, params: gpu.evaluate(facts),
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
            "%s (%s restarts/min, %s memcgs per restart)"
            % (c["unit"], c["restarts_per_min"], c["memcgs_per_restart"])
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
        out.append(
            make_finding(memcg.CHECK, "warning", text, dict(facts["memcg"].get("growth") or {}, **extra))
        )
    return out


def _ucx_growth(facts, findings, params):
    """Re-judge UCX findings knowing which processes anon_rss_growth saw growing in this scan."""
    growing = procs.growing_pids(facts.get("anon_rss"), _anon_thresholds(params))
    if "ucx" not in facts or not growing:
        return findings
    return [f for f in findings if f["check"] != ucx.CHECK] + ucx.evaluate(facts["ucx"], growing)


def validate(params):
    """The first problem with the options, or None."""
    params = dict(DEFAULTS, **params)
    unknown = [name for name in params["checks"] or () if name not in DETECTORS]
    if unknown:
        return "checks: unknown detector(s) %s (known: %s)" % (
            ", ".join(map(str, unknown)),
            ", ".join(DETECTORS),
        )
    for key in (
        "sample_seconds",
        "zombie_warning",
        "zombie_critical",
        "headroom_critical_pct",
        "crashloop_warning_per_min",
        "crashloop_critical_per_min",
        "journal_window_seconds",
        "zombie_growth_warning_per_min",
        "anon_growth_warning_mb_per_min",
        "anon_growth_critical_mb_per_min",
        "ena_resets_critical",
        "cpu_system_warning_pct",
        "cpu_system_critical_pct",
    ):
        if params[key] < 0:
            return "%s must not be negative, got %s" % (key, params[key])
    if params["zombie_warning"] > params["zombie_critical"]:
        return "zombie_warning (%d) must not be greater than zombie_critical (%d)" % (
            params["zombie_warning"],
            params["zombie_critical"],
        )
    if params["anon_growth_warning_mb_per_min"] > params["anon_growth_critical_mb_per_min"]:
        return (
            "anon_growth_warning_mb_per_min (%s) must not be greater than anon_growth_critical_mb_per_min (%s)"
            % (
                params["anon_growth_warning_mb_per_min"],
                params["anon_growth_critical_mb_per_min"],
            )
        )
    if params["headroom_critical_pct"] > 100:
        return "headroom_critical_pct must be at most 100, got %s" % params["headroom_critical_pct"]
    if params["cpu_system_critical_pct"] > 100:
        return "cpu_system_critical_pct must be at most 100, got %s" % params["cpu_system_critical_pct"]
    if params["cpu_system_warning_pct"] > params["cpu_system_critical_pct"]:
        return "cpu_system_warning_pct (%s) must not be greater than cpu_system_critical_pct (%s)" % (
            params["cpu_system_warning_pct"],
            params["cpu_system_critical_pct"],
        )
    problem = units.validate_patterns(params["unit_allowlist"]) or units.validate_env_units(
        params["env_units"]
    )
    if problem:
        return problem
    return None


def _sample(names, params, errors):
    """{name: facts} for each detector that ran; failures go to ``errors``."""
    samples = collections.OrderedDict()
    params = dict(params, _kernel_log={})  # one kernel-log read per round, shared (kernlog.cached)
    for name in names:
        try:
            samples[name] = DETECTORS[name].sample(params)
        except DetectorError as err:
            errors.append(make_error(name, err))
    return samples


# Each default is defined once, in the detector's module_utils (its DEFAULT_THRESHOLDS); DOCUMENTATION
# repeats the values as text (ansible-test validate-modules checks that they agree), and the playbooks
# pass ``default(omit)``.
ARGUMENT_SPEC = dict(
    checks=dict(type="list", elements="str", choices=list(DETECTORS)),
    sample_seconds=dict(type="float", default=0),
    zombie_warning=dict(type="int", default=memcg.DEFAULT_THRESHOLDS["zombie_warning"]),
    zombie_critical=dict(type="int", default=memcg.DEFAULT_THRESHOLDS["zombie_critical"]),
    headroom_critical_pct=dict(type="float", default=memcg.DEFAULT_THRESHOLDS["headroom_critical_pct"]),
    crashloop_warning_per_min=dict(
        type="float", default=crashloop.DEFAULT_THRESHOLDS["crashloop_warning_per_min"]
    ),
    crashloop_critical_per_min=dict(
        type="float", default=crashloop.DEFAULT_THRESHOLDS["crashloop_critical_per_min"]
    ),
    journal_window_seconds=dict(type="int", default=crashloop.DEFAULT_THRESHOLDS["journal_window_seconds"]),
    zombie_growth_warning_per_min=dict(
        type="float", default=crashloop.DEFAULT_THRESHOLDS["zombie_growth_warning_per_min"]
    ),
    anon_growth_warning_mb_per_min=dict(
        type="float", default=procs.DEFAULT_THRESHOLDS["anon_growth_warning_mb_per_min"]
    ),
    anon_growth_critical_mb_per_min=dict(
        type="float", default=procs.DEFAULT_THRESHOLDS["anon_growth_critical_mb_per_min"]
    ),
    inventory_events=dict(type="list", elements="dict", default=[]),
    imds=dict(type="str", choices=list(ec2events.IMDS_MODES), default=ec2events.IMDS_MODES[0]),
    imds_url=dict(type="str", default=ec2events.IMDS_URL),
    unit_allowlist=dict(type="list", elements="str", default=[]),
    env_units=dict(type="list", elements="str", default=[]),
    ena_resets_critical=dict(type="int", default=ena.DEFAULT_THRESHOLDS["ena_resets_critical"]),
    cpu_system_warning_pct=dict(type="float", default=cpustat.DEFAULT_THRESHOLDS["cpu_system_warning_pct"]),
    cpu_system_critical_pct=dict(type="float", default=cpustat.DEFAULT_THRESHOLDS["cpu_system_critical_pct"]),
)
# What run_checks() uses for options an in-process caller leaves out.
DEFAULTS = dict((key, spec.get("default")) for key, spec in ARGUMENT_SPEC.items())


def module_result(result):
    """node_health's task result for run_checks' ``result``: the result itself, unchanged (read-only), and as a
    facts module the same data under the one fact ``fleetops_node_health`` (the module, its action's runner
    path and ``fleetops scan --transport ssh`` all answer this)."""
    fact = dict((key, result[key]) for key in ("facts", "findings", "errors", "checks", "coverage"))
    return dict(result, changed=False, ansible_facts={"fleetops_node_health": fact})


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
            (
                name,
                DETECTORS[name].add_growth(first[name], second[name], elapsed)
                if name in second
                else first[name],
            )
            for name in first
        )
    facts = {}
    findings = []
    for name, detector_facts in samples.items():
        detector = DETECTORS[name]
        # keys starting with "_" are a detector's raw samples, carried between its two ends only
        detector_facts = dict((k, v) for k, v in detector_facts.items() if not k.startswith("_"))
        facts[detector.fact_key] = detector_facts
        findings.extend(detector.evaluate(detector_facts, params))
    findings = _attribute(facts, findings, params)
    findings = _ucx_growth(facts, findings, params)
    facts["host"] = units.host_facts()  # always: what the host is, for drift reports (no process run)
    # whether each requested check could look (coverage.of): none for one that could not run
    covered = collections.OrderedDict(
        (name, coverage.of(name, facts.get(DETECTORS[name].fact_key) if name in samples else None, errors))
        for name in names
    )
    return {
        "facts": facts,
        "findings": findings,
        "errors": errors,
        "checks": names,
        "coverage": covered,
        "duration_ms": round((time.monotonic() - started) * 1000.0, 3),
    }
