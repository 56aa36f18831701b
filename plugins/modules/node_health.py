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
    (one read of C(/proc/cgroups), C(/proc/self/mountinfo), C(/proc/swaps), the root
    C(cgroup.stat), and a directory walk linear in the live cgroups); it never reads
    C(memory.stat) of any cgroup.
  - Inside a cgroup namespace or a container that sees only a subtree of the hierarchy, the
    zombie count cannot be known; the host-wide total and the worst-case headroom (every memcg
    counted) are still reported, with the scope and the reason.
  - C(anon_rss_growth) (with O(sample_seconds)) reports processes whose anonymous memory grows
    faster than O(anon_growth_warning_mb_per_min). Both samples read only C(/proc/PID/stat) and
    C(/proc/PID/statm) of every process (constant cost each, no page-table walk); the processes
    over half the threshold get their C(smaps_rollup) and mapping count read once, at the end.
  - C(ucx_mmap_hooks) finds processes with UCX loaded (C(libucm) / C(libucs) in C(/proc/PID/maps),
    renamed wheel copies included), their launch environment, owning systemd unit and its
    C(Environment=), the UCX config files UCX reads, and the UCX version. Hooks on
    (C(UCX_MEM_MMAP_HOOK_MODE) not C(none)) with an unbounded registration cache
    (C(UCX_RCACHE_MAX_UNRELEASED) unset or C(inf)) is the Mistral leak on UCX < 1.21 or an
    unknown version. That is a warning, or critical when C(anon_rss_growth) sees the process
    growing in the same scan. On UCX >= 1.21 (openucx/ucx#11248) the same setup is only info.
  - C(crashloop_container) reports docker containers that are re-created or restarted over and over
    (two docker calls for all of them). RestartCount only counts Docker's own restart policy; the ECS
    agent re-creates its container on every start, so a new Id under the same name between two samples
    (or a container created seconds ago and already exited) counts too. No docker, or a daemon that
    does not answer, is no finding and no error.
  - C(ec2_scheduled_event) reports EC2 maintenance events scheduled for the instance, from the
    inventory (O(inventory_events), which the scan playbook fills from the C(fleetops.node.ec2)
    plugin's C(ec2_scheduled_events)) merged with the instance metadata service (IMDSv2), asked only
    when the host's firmware says it is an EC2 instance, with short timeouts.
  - C(unexpected_unit) lists the units enabled on the host (the links in systemd's C(*.wants) /
    C(*.requires) directories as candidates, then one C(systemctl show) for them that gives their C(UnitFileState)
    and preset and, in the same answer, the C(Environment=) of the key services (O(env_units)); listing every
    unit file instead costs ~0.6 s on systemd 252). With O(unit_allowlist), every enabled unit no pattern matches is a
    warning that names it and whether the image (its vendor preset) enabled it; without one, facts only.
  - C(ena_resets) finds interfaces on the EC2 C(ena) driver (C(/sys/class/net/*/device/driver)), reads one
    C(ethtool -S) per ENA interface (C(total_resets), C(reset_fail), C(tx_timeout), C(wd_expired),
    C(missing_tx_cmpl), ... whichever the driver has) and the driver's reset lines in the kernel log. Any reset or
    TX timeout since the driver loaded, or between two samples, is a warning; C(reset_fail), a failed reset, or at
    least O(ena_resets_critical) resets is critical. No ENA interface is no finding; ENA without C(ethtool) is an
    error.
  - C(cpu_starvation) (with O(sample_seconds)) reads the C(cpuN) lines of C(/proc/stat), C(/proc/softirqs) and
    C(/proc/interrupts) at both ends and reports CPUs whose system + irq + softirq share of the interval reaches
    O(cpu_system_warning_pct) (critical at O(cpu_system_critical_pct)), with the softirqs (C(NET_RX), ...) and
    interrupts that grew on them. With one sample, facts only.
  - C(gpu_health) parses the NVIDIA driver's Xid lines in the kernel log (code, PCI address, pid, process, time; Xid 154's
    recovery action) and, when C(nvidia-smi) exists, one C(nvidia-smi --query-gpu) call for ECC and row-remap
    counters. Severity follows the immediate action of NVIDIA's Xid catalog (79, 48, 74, 95, 119, ... critical;
    63, 94 warning; application faults info); uncorrectable volatile ECC errors or a remap failure are critical, a
    pending remap a warning. No GPU, no finding.
  - The kernel log is read once per sample for C(ena_resets) and C(gpu_health), from C(/dev/kmsg) (the ring buffer, fixed
    size, needs CAP_SYSLOG when C(kernel.dmesg_restrict=1)), else C(journalctl -k -b --grep), else nothing (said
    in the facts' C(kernel_log)).
  - Every call also returns C(facts.host) (kernel release, OS, architecture, boot id) from C(os.uname()) and
    C(/etc/os-release), with no process run, for a drift report (C(fleetops drift)) to compare.
  - A detector that cannot run (unreadable or malformed input) adds an entry to RV(errors);
    the module itself still succeeds.
  - Never changes anything on the host.
  - Also a facts module. With C(fleetops.node.node_health) in the C(facts_modules) setting (or
    C(ANSIBLE_FACTS_MODULES)), a plain C(gather_facts) returns its facts, findings and errors under
    the one fact C(fleetops_node_health), so playbooks can branch on them.
options:
  checks:
    description:
      - Detectors to run. Default is all of them.
    type: list
    elements: str
    choices: [zombie_memcg, crashloop_unit, crashloop_container, anon_rss_growth, ucx_mmap_hooks, ec2_scheduled_event, unexpected_unit,
              ena_resets, cpu_starvation, gpu_health]
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
  anon_growth_warning_mb_per_min:
    description:
      - With two samples, a warning for a process whose anonymous memory grows at least this many
        MB (10^6 bytes; a leak of 90 MiB a minute is 94.4 MB/min) per minute.
      - Must not be greater than O(anon_growth_critical_mb_per_min).
    type: float
    default: 100
  anon_growth_critical_mb_per_min:
    description:
      - With two samples, a critical finding for a process growing at least this many MB (10^6 bytes) per minute.
    type: float
    default: 1000
  inventory_events:
    description:
      - Scheduled events the inventory knows for this host (the C(fleetops.node.ec2) plugin's
        C(ec2_scheduled_events)), merged with what IMDS says.
    type: list
    elements: dict
    default: []
  imds:
    description:
      - Ask the instance metadata service for scheduled events. C(auto) asks only on an EC2 instance
        (DMI board vendor or hypervisor uuid), so a host off EC2 never waits.
    type: str
    choices: [auto, always, never]
    default: auto
  imds_url:
    description: The metadata service's base URL (a proxy, or a test server).
    type: str
    default: http://169.254.169.254
  unit_allowlist:
    description:
      - The fleet's allow-list of enabled units, as unit-name glob patterns (C(systemd-*), C(getty@*), C(ssh.service));
        a pattern without a unit type also matches C(NAME.service). The scan playbook passes the group var
        C(fleetops_unit_allowlist).
      - When given (not empty), C(unexpected_unit) makes a warning for every enabled unit no pattern matches. When
        empty, it reports facts only.
    type: list
    elements: str
    default: []
  env_units:
    description:
      - The services whose C(Environment=) C(unexpected_unit) reads (one C(systemctl show) call). Empty means the
        enabled services (not templates), at most 64.
    type: list
    elements: str
    default: []
  ena_resets_critical:
    description:
      - C(ena_resets) is critical when an ENA interface has reset at least this many times since the driver loaded
        (C(total_resets), else C(tx_timeout) + C(wd_expired), else the kernel log's reset lines).
    type: int
    default: 3
  cpu_system_warning_pct:
    description:
      - With two samples, a C(cpu_starvation) warning for a CPU that spent at least this percentage of the interval
        in the kernel (system + irq + softirq).
      - From 0 to 100, not greater than O(cpu_system_critical_pct).
    type: float
    default: 50
  cpu_system_critical_pct:
    description:
      - With two samples, a critical C(cpu_starvation) finding for a CPU at or over this percentage (at most 100).
    type: float
    default: 90
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
  - C(id_headroom) is 65,535 minus C(id_used), the memcgs that hold an ID. Since Linux 4.7
    (73f576c04b94) a dying memcg gives its ID back when it goes offline unless swap entries still
    reference it, so page-cache zombies alone do not exhaust IDs (on a 6.18 kernel, mkdir still
    worked with 66,051 memcgs counted). So C(id_used) is the live memcgs on the host when no page
    is in swap (C(/proc/swaps), one more small read); every memcg, dying included (the worst
    case), when swap is in use, in a cgroup namespace, on an older kernel, or when C(/proc/swaps)
    cannot be read. C(id_headroom_basis) says which and why.
  - An action plugin of the same name runs the task. It validates the options on the controller, then runs the same
    detectors on the host from a copy of the collection's stdlib-only runner kept in C(~/.ansible/fleetops/runner-SHA256)
    of the remote user (sent once per runner version; refused when a symbolic link or writable by others), one command
    per host instead of an AnsiballZ payload. It runs this module instead for async or delegated tasks, become without
    pipelining, a host Python that gives no answer, a refused cache, or when C(FLEETOPS_NODE_HEALTH_MODULE=1) is set
    on the controller. The result is the same; C(fleetops_path) (V(runner) or V(module)) says which ran.
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
ansible_facts:
  description: The same data under one namespaced fact, for use as a facts module.
  returned: always
  type: dict
  contains:
    fleetops_node_health:
      description: C(facts), C(findings), C(errors), C(checks) and C(coverage), as below.
      type: dict
      returned: always
checks:
  description: The detectors that ran, in order.
  returned: always
  type: list
  elements: str
  sample: [zombie_memcg]
coverage:
  description:
    - Per detector asked for, whether it could look on this host. C(level) is C(full) (it saw everything there is
      to see), C(partial) (part of it) or C(none) (nothing, as where systemd is not PID 1, or the detector could
      not run); C(reason) says what it missed and why (null when full).
    - For example C(crashloop_unit) and C(unexpected_unit) are C(none) where systemd is not PID 1,
      C(ucx_mmap_hooks) C(partial) when the memory maps of some processes cannot be read (another user's), and
      C(zombie_memcg) C(partial) in a cgroup namespace. No docker, no ENA interface or no NVIDIA driver is C(full).
  returned: always
  type: dict
  sample:
    zombie_memcg: {level: full, reason: null}
    crashloop_unit: {level: none, reason: "systemd is not PID 1 on this host: no service to read"}
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
        - C(total), C(live), C(zombies), C(id_used) (the memcgs counted as holding an ID, the
          live ones or every memcg when dying ones may hold IDs too), C(id_headroom) (free IDs of
          65,535, against C(id_used)), C(id_headroom_pct), C(id_headroom_basis) (which memcgs
          C(id_used) counts, and why), C(basis) (how the counts were made), C(hierarchy) (the
          mount point), C(reason) (null when measured).
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
        id_used: 41
        id_headroom: 65494
        id_headroom_pct: 99.93
        id_headroom_basis: "live memcgs: no swap is active, so dying memcgs hold no ID (released at offline since Linux 4.7)"
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
        - C(journal_readable) (with the journal's rate) is false when a system journal file exists that this user
          cannot read (it then counts none of the system's restarts), null when there is no such file.
      returned: when crashloop_unit ran without error
      type: dict
    anon_rss:
      description:
        - Facts of C(anon_rss_growth). C(sampled) is false with one sample (no rates).
        - C(processes) (user processes sampled), C(kernel_threads), C(unreadable), C(sample_ms);
          with two samples C(window_seconds), C(compared), C(mem_available_kb) and C(growing),
          the processes growing at least half the warning threshold, each with C(pid), C(comm),
          C(anon_mb_per_min), C(rss_mb_per_min), C(vsz_mb_per_min), C(anon_kb) and C(rss_kb)
          (both ends), C(smaps_rollup) (C(rss_kb), C(anonymous_kb), C(swap_kb)), C(map_count),
          C(cmdline), C(unit), C(unit_manager).
        - Units. C(*_mb_per_min) are MB (10^6 bytes) per minute; C(*_kb) are the kernel's kB (1,024 bytes), as
          C(/proc) counts them.
      returned: when anon_rss_growth ran without error
      type: dict
    containers:
      description:
        - Facts of C(crashloop_container). C(docker) false (with C(reason)) without docker or a daemon;
          C(containers) keyed by name with C(id), C(image), C(status), C(restart_count),
          C(created_age_s), C(started_age_s), and with two samples C(recreated), C(restarts_per_min).
      returned: when crashloop_container ran
      type: dict
    ec2_events:
      description:
        - Facts of C(ec2_scheduled_event). C(events) (each with C(code), C(description), C(not_before),
          C(not_after), C(event_id), C(state), C(source) inventory, imds or inventory+imds), C(on_ec2),
          C(imds) (true when IMDS answered), C(imds_error).
      returned: when ec2_scheduled_event ran
      type: dict
    ucx:
      description:
        - Facts of C(ucx_mmap_hooks). C(systemd), C(processes_scanned), C(kernel_threads), C(unreadable),
          C(scan_ms) of the maps scan; C(processes) lists every process with UCX loaded, with
          C(pid), C(comm), C(cmdline), C(libraries), C(libdir), C(version), C(version_source),
          C(unit), C(unit_manager), C(cgroup), C(variables) (per variable its effective C(value),
          C(source) C(environ), C(unit), C(file) or C(default), and the raw C(environ) and C(unit)
          values), C(hooks_on), C(rcache_bounded), C(restart_pending), C(fixable_unit).
      returned: when ucx_mmap_hooks ran without error
      type: dict
    units:
      description:
        - Facts of C(unexpected_unit). C(systemd) false (with C(reason)) on a host without systemd.
        - C(enabled), the sorted names of the enabled unit files (templates as C(getty@.service)); C(unit_files)
          keyed by unit with C(state) (C(enabled) or C(enabled-runtime)) and C(preset) (the vendor preset, or null);
          C(candidates) (unit names linked from the dependency directories).
        - C(environment) keyed by service with its C(Environment=) as a dict of variable names to values (values of secret-looking
          names replaced by a digest); C(environment_units) (the services asked), C(environment_truncated);
          C(collect_ms).
      returned: when unexpected_unit ran without error
      type: dict
    host:
      description:
        - What the host is, for drift reports; always collected, no process run.
        - C(kernel) (release), C(arch), C(os) (PRETTY_NAME of os-release), C(os_id), C(os_version_id), C(boot_id).
      returned: always
      type: dict
      sample:
        kernel: 6.1.0-29-cloud-amd64
        arch: x86_64
        os: Debian GNU/Linux 12 (bookworm)
        os_id: debian
        os_version_id: "12"
        boot_id: 3c1f3c55-5d9f-4a35-9a53-4f44b6f0d0a1
    ena:
      description:
        - Facts of C(ena_resets). C(interfaces) keyed by ENA interface (empty, with C(reason), on a host without
          one; there C(ignored_log_lines) counts the ENA driver lines in the kernel log, never judged (no ENA
          device, no resets)), each with C(pci), C(counters) (the device-wide C(ethtool -S) counters the driver has),
          C(resets), C(resets_basis), C(log) (kernel-log reset lines by kind) and, with two samples, C(increase).
        - C(kernel_log) (C(source) kmsg, journal or null, C(error), C(read_ms)); C(recent) (the last reset lines);
          C(window_seconds) with two samples.
      returned: when ena_resets ran without error
      type: dict
    cpu:
      description:
        - Facts of C(cpu_starvation). C(cpus); C(sampled) false with one sample (C(reason) says a rate needs
          O(sample_seconds)).
        - With two samples C(window_seconds), C(kernel_pct) (per CPU number, system + irq + softirq percent),
          C(max_kernel_pct), C(max_cpu), and C(hot), the CPUs over half the warning mark, each with C(cpu),
          C(kernel_pct), C(system_pct), C(irq_pct), C(softirq_pct), C(user_pct), C(idle_pct), C(steal_pct) and
          C(top_softirqs) / C(top_interrupts) (C(name), C(delta)).
      returned: when cpu_starvation ran without error
      type: dict
    gpu:
      description:
        - Facts of C(gpu_health). C(nvidia_smi) (installed), C(nvidia_driver) (the kernel module is loaded), C(smi_error),
          C(gpus) (per GPU C(index), C(pci_bus_id),
          C(uuid), C(name), C(ecc_mode), C(ecc_uncorrected_volatile), C(ecc_corrected_volatile),
          C(ecc_uncorrected_aggregate), C(retired_pages_pending), C(remapped_rows_correctable),
          C(remapped_rows_uncorrectable), C(remapped_rows_pending), C(remapped_rows_failure); null where the GPU
          says N/A).
        - C(xid) keyed by Xid code with C(count), C(severity), C(pcis), C(last) (C(code), C(pci), C(pid), C(name),
          C(detail), C(recovery_action), C(time)); C(xid_events) (the last 50), C(xid_total), C(kernel_log);
          C(new_xid_events) with two samples.
      returned: when gpu_health ran without error
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
      sample: "1,523 zombie memory cgroups (warning at 1,000); 65,494 of 65,535 memcg IDs free"
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
fleetops_path:
  description: What ran the detectors, set by the action plugin - V(runner) (the staged runner) or V(module) (this module).
  returned: when the action plugin ran the task (not as a facts module)
  type: str
  sample: runner
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.fleetops.node.plugins.module_utils import health

# The detectors, their options and run_checks live in module_utils/health.py: the host timer's runner
# (playbooks/detector_timer.yml) runs the same code without Ansible. Their names here, for callers and tests.
ARGUMENT_SPEC = health.ARGUMENT_SPEC
DEFAULTS = health.DEFAULTS
DETECTORS = health.DETECTORS
run_checks = health.run_checks
_validate = health.validate


def main():
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        supports_check_mode=True,
    )
    problem = _validate(module.params)
    if problem:
        module.fail_json(msg="Failed to validate node_health options: %s" % problem)
    params = dict(module.params, _run=module.run_command, _docker=module.get_bin_path("docker"))
    # As a facts module (facts_modules / gather_facts) the same data lands under one namespaced fact.
    module.exit_json(**health.module_result(run_checks(params)))


if __name__ == "__main__":
    main()
