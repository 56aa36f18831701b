"""fleetops' remediations, one declaration each (``declare.Remediation``): everything the CLI, the policy,
the auto pass, the rollout, the docs site's option tables and the AWX surveys know of a remediation is here
or derived from here. What a remediation does beyond its parameters is in ``behaviour.py``.

A parameter whose default is None is passed only when given: the module's own default (its
``argument_spec``) applies, and the help reads it from the collection (``{module}``).
"""

from __future__ import annotations

from dataclasses import replace

from fleetops import values
from fleetops.ansible import facts
from fleetops.remediations import behaviour as b
from fleetops.remediations.declare import (
    REQUIRED,
    Fixes,
    Param,
    Remediation,
    as_true,
    falsy,
    register,
    resolved_path,
)
from fleetops.rollout.guards import DEFAULT_REBOOT_MAX_UNHEALTHY
from fleetops.util import DAY_S

REBOOT_HOST_TIMEOUT_S = 1800  # drain (600) + reboot (600) + hooks, with room to spare
STOP_START_HOST_TIMEOUT_S = 1800  # stop (600) + start (600), with room for ssh and the boot id reads
REPLACE_HOST_TIMEOUT_S = 1800  # the group's replacement (600) + the new instance's ssh (600) + its scan
QUARANTINE_HOST_TIMEOUT_S = 900  # --evict: the drain (600) with room to spare
WAIT_S = 600  # what a reboot or a drain may take by default (the modules' waits are their own defaults)

_seconds = values.whole_seconds(1, DAY_S)

# ------------------------------------------------------------------------------ shared parameters

KUBECTL = Param(
    "kubectl",
    "kubectl to run (default: {default})",
    default="kubectl",
    metavar="PATH",
    extravars=("fleetops_kubectl",),
)
KUBECONFIG = Param(
    "kubeconfig",
    "kubeconfig for kubectl (default: $KUBECONFIG, else ~/.kube/config, else in-cluster)",
    metavar="FILE",
    extravars=("fleetops_kubeconfig",),
    convert=resolved_path,
    omit=falsy,
)
DRAIN_TIMEOUT = Param(
    "drain_timeout",
    f"kubectl drain --timeout (1..{DAY_S}; 0 would mean forever; default: {{default}})",
    default=WAIT_S,
    parse=_seconds,
    metavar="S",
    extravars=("fleetops_drain_timeout",),
    waits=True,
)
PROTECTED = Param(
    "protected",
    "more units to refuse, on top of the built-in protected list (repeatable)",
    default=(),
    kind="repeat",
    metavar="PATTERN",
    extravars=("fleetops_protected",),
    check=b.check_protected,
    convert=list,
)
_zombies = values.int_range(0)
MIN_ZOMBIES = Param(
    "min_zombies",
    "do nothing on hosts with fewer zombies (>= 0; default: the module's{module}, the scan's warning level: "
    "dropping the page cache costs every workload on the host its cached files)",
    parse=_zombies,
    metavar="N",
    extravars=("fleetops_min_zombies",),
    module_default=facts.zombie_warning_default,
)
REBOOT_THRESHOLD = Param(
    "reboot_threshold",
    "zombies left after the reclaim that mark a host as needing a reboot (>= 0; default: the module's{module})",
    parse=_zombies,
    metavar="N",
    extravars=("fleetops_reboot_threshold",),
    module_default=facts.zombie_warning_default,
)
METHOD = Param(
    "method",
    "how to reclaim: drop_caches (default, the module's): every clean page cache page on the host; "
    "memory_reclaim (cgroup v2, Linux >= 5.19): memory.reclaim of the cgroups the zombies hang under, what "
    "they pin and little else; both: memory_reclaim, then drop_caches where zombies remain (docs/development/lab.md: "
    "memory.reclaim)",
    choices=facts.module_choices("reclaim_memcg", "method"),
    extravars=("fleetops_reclaim_method",),
    module_default=facts.module_default("reclaim_memcg", "method"),
)
SAMPLE_SECONDS = Param(
    "sample_seconds",
    "the scan before the fix takes two samples S seconds apart, for restart and growth rates (default: {default})",
    default=10.0,
    parse=values.sample_seconds,
    metavar="S",
)

# ------------------------------------------------------------------------------ the remediations

register(
    Remediation(
        name="disable-unit",
        examples=(
            "fleetops remediate disable-unit --unit ecs.service -i inventory/example.fleet_ec2.yml -l gpu-01",
            "fleetops remediate disable-unit --unit ecs.service --container ecs-agent -i inventory/example.fleet_ec2.yml --apply",
        ),
        playbook="fleetops.node.remediate_disable_unit",
        actions=("fleetops.node.disable_unit",),
        help="stop, disable and mask a unit (and remove its container)",
        ladder=20,
        parameters=(
            Param(
                "unit",
                "the unit to stop, disable and mask",
                default=REQUIRED,
                metavar="NAME",
                extravars=("fleetops_unit",),
                check=b.check_unit,
            ),
            Param(
                "containers",
                "a docker container the unit ran, removed too when docker is present (repeatable)",
                default=(),
                kind="repeat",
                flag="--container",
                metavar="NAME",
                extravars=("fleetops_containers",),
                check=b.check_containers,
                convert=list,
            ),
            PROTECTED,
            Param(
                "allow_protected",
                "override the protected-unit refusal (think twice)",
                default=False,
                kind="flag",
                extravars=("fleetops_allow_protected",),
                convert=bool,
            ),
        ),
        gate=b.disable_unit_gate,
        fixes=(
            Fixes("crashloop_unit", params={"unit": "unit"}, acts=b.unit_not_protected("unit")),
            Fixes(
                "crashloop_container",
                params={"unit": "owner_unit", "containers": "name"},
                when={"owner_protected": False},
                acts=b.unit_not_protected("owner_unit"),
            ),
            Fixes("unexpected_unit", params={"unit": "unit"}, acts=b.unit_not_protected("unit")),
        ),
    )
)
register(
    Remediation(
        name="reclaim",
        examples=(
            "fleetops remediate reclaim -i inventory/example.fleet_ec2.yml --min-zombies 10000",
            "fleetops remediate reclaim -i inventory/example.fleet_ec2.yml --max-parallel 20% --apply",
        ),
        playbook="fleetops.node.remediate_reclaim",
        actions=("fleetops.node.reclaim_memcg",),
        help="free zombie memory cgroups by dropping the page cache that pins them",
        ladder=40,
        parameters=(MIN_ZOMBIES, REBOOT_THRESHOLD, METHOD),
        fixes=(Fixes("zombie_memcg"),),
    )
)
register(
    Remediation(
        name="fix",
        examples=(
            "fleetops remediate fix -i inventory/example.fleet_ec2.yml -l gpu-01",
            "fleetops remediate fix -i inventory/example.fleet_ec2.yml --ucx-fix hooks-off --apply",
        ),
        playbook="fleetops.node.remediate_fix",
        actions=("fleetops.node.disable_unit", "fleetops.node.reclaim_memcg", "fleetops.node.set_env"),
        help="scan, then fix what was found: turn off crash-looping units, set the UCX fix, reclaim zombie memcgs",
        ladder=10,
        parameters=(
            SAMPLE_SECONDS,
            replace(
                PROTECTED,
                help="more units never to turn off, on top of the built-in protected list (repeatable)",
            ),
            replace(
                MIN_ZOMBIES,
                help="reclaim only on hosts with at least N zombies, as reclaim does (>= 0; "
                "default: the module's{module}, the scan's warning level)",
            ),
            replace(REBOOT_THRESHOLD, help="see reclaim (>= 0; default: the module's{module})"),
            METHOD,
            Param(
                "ucx_fix",
                "the environment fix for services running UCX with leaking memory hooks: "
                "UCX_RCACHE_MAX_UNRELEASED=1024 (rcache-bound) or UCX_MEM_MMAP_HOOK_MODE=none (hooks-off; it also "
                "turns the registration cache off); default: {module_value} (docs/guides/fixing.md: the UCX fix)",
                choices=facts.ucx_fixes,
                module_default=facts.ucx_default_fix,
            ),
        ),
        prepare=b.fix_prepare,
        gate=b.fix_gate,
        fixes=tuple(
            Fixes(check, acts=b.fix_acts_on)
            for check in ("zombie_memcg", "crashloop_unit", "crashloop_container", "ucx_mmap_hooks")
        ),
    )
)
register(
    Remediation(
        name="reboot",
        examples=(
            "fleetops remediate reboot -i inventory/example.fleet_ec2.yml -l gpu-01,gpu-02",
            "fleetops remediate reboot -i inventory/example.fleet_ec2.yml --kube-drain --max-unhealthy 10% --not-after 2h --apply",
        ),
        playbook="fleetops.node.rolling_reboot",
        actions=("ansible.builtin.reboot",),
        help="reboot hosts a few at a time; each must come back with a new boot id",
        ladder=60,
        disruptive=True,
        parameters=(
            Param(
                "reboot_timeout",
                f"seconds to wait for a host to come back (1..{DAY_S}; default: {{default}})",
                default=WAIT_S,
                parse=_seconds,
                metavar="S",
                extravars=("fleetops_reboot_timeout",),
                waits=True,
            ),
            Param(
                "pre_hook",
                "command run on the controller before each host's reboot, no shell ({{host}}: the inventory "
                "name, {{node}}: the k8s_node_name hostvar, else the inventory name); failing, the host fails "
                "and is not rebooted",
                metavar="CMD",
                extravars=("fleetops_pre_hook",),
                omit=falsy,
            ),
            Param(
                "post_hook",
                "command run on the controller after each host came back and passed its gate (same {{host}}, "
                "{{node}}); failing, the host fails",
                metavar="CMD",
                extravars=("fleetops_post_hook",),
                omit=falsy,
            ),
            Param(
                "kube_drain",
                "before each reboot kubectl cordon + drain the host's node (--ignore-daemonsets "
                "--delete-emptydir-data; evictions respect PodDisruptionBudgets), uncordon it after the gate; "
                "skipped with a note when the controller has no kubectl or no kubeconfig; a failing drain "
                "fails the host, which is not rebooted",
                default=False,
                kind="flag",
                extravars=("fleetops_kube_drain",),
                convert=as_true,
                omit=falsy,
            ),
            replace(DRAIN_TIMEOUT, when="kube_drain"),
            replace(KUBECTL, when="kube_drain"),
            replace(
                KUBECONFIG,
                when="kube_drain",
                help="kubeconfig for --kube-drain (default: $KUBECONFIG, "
                "else ~/.kube/config, else in-cluster)",
            ),
        ),
        more_vars=b.reboot_phase,
        gate=b.reboot_gate,
        # a reboot reloads the NIC driver, and is how an instance-reboot event is done on our own time
        fixes=(Fixes("ena_resets"), Fixes("ec2_scheduled_event", when={"code": "instance-reboot"})),
        probe_vars={"fleetops_probe_only": True},
        post_vars=b.reboot_post_vars,
        cooldown=10.0,
        host_timeout=REBOOT_HOST_TIMEOUT_S,
        max_unhealthy=DEFAULT_REBOOT_MAX_UNHEALTHY,
    )
)
register(
    Remediation(
        name="set-env",
        examples=(
            "fleetops remediate set-env --unit vllm.service --env UCX_RCACHE_MAX_UNRELEASED=1024 -i inventory/example.fleet_ec2.yml -l gpu-01",
            "fleetops remediate set-env --unit vllm.service --env UCX_MEM_MMAP_HOOK_MODE=none --restart -i inventory/example.fleet_ec2.yml --apply",
        ),
        playbook="fleetops.node.remediate_set_env",
        actions=("fleetops.node.set_env",),
        help="set environment variables of a service (a systemd drop-in), restart it if asked",
        ladder=30,
        parameters=(
            Param(
                "unit",
                "the service whose environment to set",
                default=REQUIRED,
                metavar="NAME",
                extravars=("fleetops_unit",),
                check=b.check_unit,
            ),
            Param(
                "env",
                "a variable to set (repeatable); names and values are validated on the host",
                default=REQUIRED,
                kind="repeat",
                parse=values.key_value,
                metavar="KEY=VALUE",
                extravars=("fleetops_env",),
                check=b.check_env,
                convert=dict,
            ),
            Param(
                "restart",
                "restart the service when its environment changed (the batches stagger the restarts)",
                default=False,
                kind="flag",
                extravars=("fleetops_restart",),
                convert=bool,
            ),
            Param(
                "drop_in",
                "the drop-in under /etc/systemd/system/UNIT.d/ (default: {default})",
                default=facts.module_default("set_env", "drop_in"),  # read from the module's argument spec
                metavar="FILE",
                extravars=("fleetops_drop_in",),
                check=b.check_drop_in,
            ),
            Param(
                "show_values",
                "keep the values as given in results, state, audit log and reports (default: only a digest, "
                "sha256:<12 hex>, as they may be secrets; a rollout without them cannot be resumed: run it again)",
                default=False,
                kind="flag",
                # values digested in results, state, audit and reports unless shown (fleetops.rollout.state)
                extravars=("fleetops_show_values",),
                convert=as_true,
                omit=falsy,
            ),
        ),
        gate=b.set_env_gate,
    )
)
register(
    Remediation(
        name="quarantine",
        examples=(
            "fleetops remediate quarantine --finding gpu_xid --reason 'Xid 79' -i inventory/example.fleet_ec2.yml -l gpu-01",
            "fleetops remediate quarantine --finding gpu_xid --evict -i inventory/example.fleet_ec2.yml -l gpu-01 --apply",
        ),
        playbook="fleetops.node.quarantine",
        # debug: a dry run's note; slurm_node: the Slurm backend (fleetops.remediations.backends)
        actions=("ansible.builtin.command", "ansible.builtin.debug", "fleetops.node.slurm_node"),
        help="take hosts out of scheduling for a finding, by each host's fleetops_quarantine_backend: "
        "kubernetes (default: cordon, taint fleetops.io/quarantine=<check>:NoSchedule, annotate; --evict "
        "drains too), slurm (scontrol DRAIN with reason 'fleetops: <check>: <reason>'; jobs finish, or are "
        "requeued with --evict) or none",
        ladder=50,
        disruptive=True,
        protects=True,  # a storm brake lets it go on: it keeps new work off a host, within its budget
        kubernetes="cordon",
        rerun_in_doubt="evict",  # a drain a dead pass cut off is drained again (the playbook is idempotent)
        parameters=(
            Param(
                "finding",
                "the finding's check name (e.g. crashloop_unit): the taint's value and the annotation's check",
                default=REQUIRED,
                metavar="CHECK",
                extravars=("fleetops_quarantine_check",),
                check=b.check_taint_value,
                from_finding="check",
            ),
            Param(
                "reason",
                f"why (one line, up to {values.QUARANTINE_REASON_MAX} characters): kept in the node's annotation "
                "(kubernetes), the drain reason's last part (slurm)",
                default="",
                parse=values.quarantine_reason,
                metavar="TEXT",
                extravars=("fleetops_quarantine_reason",),
                from_finding="reason",
            ),
            Param(
                "evict",
                "also move the node's work off: kubernetes, kubectl drain the node (--ignore-daemonsets "
                "--delete-emptydir-data; evictions respect PodDisruptionBudgets; a drain that does not finish "
                "in --drain-timeout fails the host, which stays quarantined); slurm, requeue the jobs running "
                "on a node fleetops drained (Slurm kills them and queues them again; a job it will not requeue "
                "fails the host, which stays drained)",
                default=False,
                kind="flag",
                extravars=("fleetops_quarantine_evict",),
                convert=bool,
            ),
            replace(
                DRAIN_TIMEOUT,
                when="evict",
                help=f"kubectl drain --timeout with --evict (1..{DAY_S}; default: {{default}})",
            ),
            KUBECTL,
            KUBECONFIG,
        ),
        host_timeout=QUARANTINE_HOST_TIMEOUT_S,
        fixes=(Fixes("gpu_health", severities=("critical",)),),  # keeps work off a broken GPU
    )
)
register(
    Remediation(
        name="stop-start",
        examples=(
            "fleetops remediate stop-start -i inventory/example.fleet_ec2.yml -l gpu-01",
            "fleetops remediate stop-start --finding ec2_scheduled_event -i inventory/example.fleet_ec2.yml -l gpu-01 --apply",
        ),
        playbook="fleetops.node.stop_start",
        actions=("fleetops.node.ec2_stop_start",),
        help="move EC2 instances to other hardware: stop, wait, start, wait, then ssh and a new boot id "
        "(for scheduled retirement/maintenance events and hardware faults a reboot cannot fix)",
        ladder=70,
        disruptive=True,
        in_flight="ec2_stop_start",
        parameters=(
            Param(
                "stop_timeout",
                f"seconds to wait for an instance to be stopped (1..{DAY_S}; default: {{default}})",
                default=facts.module_default("ec2_stop_start", "stop_timeout"),
                parse=_seconds,
                metavar="S",
                extravars=("fleetops_stop_timeout",),
                waits=True,
            ),
            Param(
                "start_timeout",
                f"seconds to wait for it to be running again, and then for ssh (1..{DAY_S}; "
                "default: {default})",
                default=facts.module_default("ec2_stop_start", "start_timeout"),
                parse=_seconds,
                metavar="S",
                extravars=("fleetops_start_timeout",),
                waits=True,
            ),
            Param(
                "finding",
                "the check the stop-start should clear (e.g. gpu_health): the gate fails a host whose scan still "
                "finds it at warning or critical (the boot id and scheduled EC2 events are always checked)",
                metavar="CHECK",
                extravars=("fleetops_stop_start_finding",),
                check=b.check_check_name,
                from_finding="check",
            ),
        ),
        gate=b.stop_start_gate,
        refuse=b.refuse_group_member,
        # other hardware: a scheduled retirement, stop or maintenance done on our time
        fixes=(Fixes("ec2_scheduled_event"),),
        probe_vars={"fleetops_probe_only": True},
        cooldown=10.0,
        host_timeout=STOP_START_HOST_TIMEOUT_S,
        max_unhealthy=DEFAULT_REBOOT_MAX_UNHEALTHY,
    )
)
register(
    Remediation(
        name="unquarantine",
        examples=(
            "fleetops remediate unquarantine -i inventory/example.fleet_ec2.yml -l gpu-01",
            "fleetops remediate unquarantine -i inventory/example.fleet_ec2.yml -l gpu-01 --apply",
        ),
        playbook="fleetops.node.unquarantine",
        actions=("ansible.builtin.command", "ansible.builtin.debug", "fleetops.node.slurm_node"),
        help="scan, then give nodes back to scheduling unless the scan still finds their quarantine's "
        "check: remove our taint, uncordon if we cordoned, drop the annotation (kubernetes); resume a node "
        "fleetops drained (slurm); a node someone else took out is left alone",
        kubernetes="uncordon",
        parameters=(
            replace(
                SAMPLE_SECONDS,
                help="the scan first (a host it still finds failing its quarantine's check is "
                "refused): seconds between its two samples (default: {default})",
            ),
            KUBECTL,
            KUBECONFIG,
        ),
        more_vars=b.unquarantine_findings,
        prepare=b.unquarantine_prepare,
    )
)
register(
    Remediation(
        name="replace",
        examples=(
            "fleetops remediate replace -i inventory/example.fleet_ec2.yml -l gpu-01",
            "fleetops remediate replace -i inventory/example.fleet_ec2.yml -l gpu-01 --apply",
        ),
        playbook="fleetops.node.replace",
        actions=("fleetops.node.ec2_asg_replace", "fleetops.node.node_health"),
        help="have each host's EC2 Auto Scaling group replace its instance (terminate in group keeping the "
        "desired capacity, or mark it Unhealthy), then reach and scan the new one: it must scan clean",
        ladder=80,
        disruptive=True,
        in_flight="ec2_asg_replace",
        parameters=(
            Param(
                "timeout",
                "seconds to wait for the group to be back at its desired capacity with the new instance InService "
                f"and Healthy, and then for the new instance to answer ssh (1..{DAY_S}; default: {{default}})",
                default=facts.module_default("ec2_asg_replace", "timeout"),
                parse=_seconds,
                metavar="S",
                extravars=("fleetops_replace_timeout", "fleetops_replace_connect_timeout"),
                waits=("--timeout", "--timeout (ssh)"),
            ),
            Param(
                "method",
                "terminate (default): TerminateInstanceInAutoScalingGroup without lowering the desired capacity; "
                "unhealthy: SetInstanceHealth Unhealthy, the group replaces it on its next health check",
                default=facts.module_default("ec2_asg_replace", "method"),
                choices=facts.module_choices("ec2_asg_replace", "method"),
                extravars=("fleetops_replace_method",),
            ),
        ),
        gate=b.replace_gate,
        host_timeout=REPLACE_HOST_TIMEOUT_S,
        replaces_host=True,
        one_per_batch=(
            b.auto_scaling_group,
            "one replacement per Auto Scaling group at a time (two at once could not tell their new "
            "instances apart)",
        ),
    )
)
