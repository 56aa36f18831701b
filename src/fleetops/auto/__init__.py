"""One pass of ``fleetops remediate auto``: scan, decide per host by the policy, act, remember.

The pure part is :mod:`fleetops.policy` (``decide``, ``commit``); this module runs a pass around it:

1. the policy is loaded and checked against the remediations that exist (every rung's action is a
   remediation or ``human``; every rung's ``params`` are that remediation's parameters);
2. the hosts are scanned (one ``node_health`` call per host);
3. under the ladder lock, then the ledger lock (the state directory's ``ladder.json`` and
   ``ledger.json``; another pass holding them makes this one exit 4 at once), each EC2 host's
   ``fleetops.io/ladder`` tag is merged in, and the actions its ``fleetops.io/spent`` tag records (and
   the ladder tag's latest rungs) are counted against the budgets too, so a controller with another
   state directory, an AWX job in a fresh container, spends the same budgets; then ``decide``;
4. one rollout per action (and per parameter set), through ``run_action``: the same engine, lock,
   lease, gates and audit as ``fleetops remediate <action>``, with the pass's caps;
5. with ``apply``, ``commit``: the ladders of every host an action was *attempted* on (done, failed,
   timed out, in doubt) climb and the budgets are spent (a failing action is not retried every pass
   for free); hosts the scan showed clean have their ladders reset; and each EC2 host's two tags are
   rewritten: the ladder tag (deleted when it has no ladder left) and the spent tag (every budgeted
   action on it still inside its budget's window: it outlives a ladder its action cleared). A dry
   run records nothing.

A pass limited to a few hosts decides with the whole fleet's state (:mod:`.seen`): the storm brake and
the floors count the hosts outside it as the latest passes recorded them, and a host nobody recorded
within ``SEEN_FRESH_S`` is capacity unknown. Every applying pass records what it saw.

With a shared store (``inputs.store``, :mod:`fleetops.store`), step 3 reads the ladders and the ledger
from the store under the pass's lease instead (the state directory and the tags are read once, to seed
it), a pause in the store holds the pass before it acts and before every action (exit 5) — what a dead
pass left in flight or in doubt included: nothing is finished or run again, the pass says what it would
finish (``store.would_finish``) and those hosts count against their floors —, each action's
budget is reserved in the store before its rollout starts and settled after (ladders climb then), a dead
pass's unsettled reservations count as attempted, and the tags are written as a mirror. Without one, a
disruptive EC2 step in flight is also marked on its instance (tag ``fleetops:in-flight``, written before
the batch, removed when it settles) and every applying pass finishes the marks a dead pass left with the
same finishers (:mod:`.marks`).

Ctrl-C (stop after the batch), SIGTERM or SIGHUP during an action ends that rollout as
``fleetops remediate`` would (state saved for ``--resume``); the pass then starts no further action,
records what was attempted (hosts caught mid-batch included) and exits 130 / 143 / 129. A SIGTERM
or SIGHUP outside a rollout (the scan, between actions) unwinds the same way (``api.auto``).

Exit: 130 / 143 / 129 when a signal stopped the pass; 3 when a host could not be scanned or an
action's rollout did not finish every host (or the store failed, or holds what does not parse); 5 when
automation is paused; 1 when a host needs a human (the ladder reached ``human``
or ran out); else 0 (acting, waiting, blocked by a budget, clean).

The package, by concern: :mod:`.result` (what a pass did, its document and exit code), :mod:`.actions`
(the policy against the registry, the batches), :mod:`.tags` (the EC2 ladder and spent tags),
:mod:`.state` (the state directory, the pass lock, the brakes without a store), :mod:`.seen` (the fleet
record: what each pass saw per host, for the passes limited to a few hosts), :mod:`.context` (the
inputs and what every part shares), :mod:`.guards` (the holds: unreachable, nodes, drains, the storm
brakes, the floors), :mod:`.finish` (what a dead pass left: in-flight steps, re-runs in doubt), :mod:`.marks` (without a store,
the in-flight marks on the instances a later pass finds whatever its inventory) and
:mod:`.passes` (:func:`run_pass`, with the state directory or the shared store).
"""

from fleetops.auto.actions import REASON_MAX, action_params, batches, check_policy_actions
from fleetops.auto.context import PassInputs
from fleetops.auto.passes import RESTAMP_S, run_pass
from fleetops.auto.result import (
    AUTO_SCHEMA,
    SIGNAL_CODES,
    ActionRun,
    PassLockedError,
    PassResult,
    RunAction,
    Say,
)
from fleetops.auto.state import (
    BRAKES_FILE,
    BRAKES_SCHEMA,
    LADDER_FILE,
    LEDGER_FILE,
    PASS_LOCK_TIMEOUT_S,
    lift_brake,
    load_brakes,
    save_brakes,
)
from fleetops.auto.tags import TagTarget, merge_tags, write_tags
from fleetops.auto.whatif import what_if

__all__ = [
    "AUTO_SCHEMA",
    "BRAKES_FILE",
    "BRAKES_SCHEMA",
    "LADDER_FILE",
    "LEDGER_FILE",
    "PASS_LOCK_TIMEOUT_S",
    "REASON_MAX",
    "RESTAMP_S",
    "SIGNAL_CODES",
    "ActionRun",
    "PassInputs",
    "PassLockedError",
    "PassResult",
    "RunAction",
    "Say",
    "TagTarget",
    "action_params",
    "batches",
    "check_policy_actions",
    "lift_brake",
    "load_brakes",
    "merge_tags",
    "run_pass",
    "save_brakes",
    "what_if",
    "write_tags",
]
