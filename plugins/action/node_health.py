# -*- coding: utf-8 -*-

# Copyright: (c) 2026, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""node_health's fast path: the same detectors and the same result, one command per host.

A module call sends an AnsiballZ payload: Ansible's own module_utils (``basic`` and what it imports) with the
collection's, zipped, which the host's Python unpacks and compiles again on every call. On a lab host that is
about two thirds of a scan's CPU on the host (design §7; ``bench/scan_floor.py`` measures it). This action
validates the options on the controller against the module's own ``ARGUMENT_SPEC`` (the same validator
AnsibleModule uses), then runs ``module_utils/scan_stage.py`` on the host with ``python3 -I -S -c``: the
stdlib-only runner the host timer uses (``playbooks/files/fleetops-detector.tar``) is staged once per archive
in ``~/.ansible/fleetops/runner-<sha256>`` and imported from there, compiled. The first scan of a host sends
the archive (a second command); every later scan is one command.

The module runs instead, as Ansible always runs it, when the fast path cannot serve: the connection cannot
send standard input (or ``ANSIBLE_KEEP_REMOTE_FILES``), become is in use without pipelining (sudo may want a
tty), the task is async or delegated, the archive is not in the collection, ``FLEETOPS_NODE_HEALTH_MODULE=1``
is set on the controller, the host's Python gives no answer (none where the inventory says, or one that cannot
run ``-I -S``), or the cache is refused (a symbolic link or a folder other users can write: a warning).
Either way the result is node_health's (``RETURN`` in its documentation), with ``fleetops_path`` saying which
ran: ``runner`` or ``module``.
"""

from __future__ import annotations

import gc
import hashlib
import os
import shlex

from ansible import constants as C
from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible.utils.vars import merge_hash
from ansible_collections.fleetops.node.plugins.module_utils import health, scan_stage

display = Display()

MODULE = "fleetops.node.node_health"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARCHIVE = os.path.join(ROOT, "playbooks", "files", "fleetops-detector.tar")
STAGE = os.path.join(ROOT, "plugins", "module_utils", "scan_stage.py")
# Set on the controller to run the module as Ansible always does (the fast path's own A/B switch).
FORCE_MODULE_ENV = "FLEETOPS_NODE_HEALTH_MODULE"


def _load():
    """(archive bytes, its sha256, the stage's source), read once per controller process (the strategy
    loads this plugin before it forks its workers), or None when the collection lacks them."""
    try:
        with open(ARCHIVE, "rb") as f:
            blob = f.read()
        with open(STAGE, encoding="utf-8") as f:
            source = f.read()
    except OSError:
        return None
    return blob, hashlib.sha256(blob).hexdigest(), source


PAYLOAD = _load()


# Keep ansible-playbook's forked workers from copying its heap: freeze the garbage collector's objects just before
# each fork and unfreeze them in the parent just after (as Python's gc.freeze documentation advises for a process
# that forks without exec). The strategy imports this plugin in ansible-playbook's main process before it forks a
# worker per host, and that process holds every host's variables and results: a worker whose collector walks what
# it inherited writes to every page holding an object, copying a heap that grows with the fleet (at 2,500 hosts, a
# worker's private memory went from 21 MiB, 60 at the 99th percentile and 82 at most, to 21-22 MiB with this hook).
# Both calls are idempotent, so a second import registering them again changes nothing; a worker that forks again
# (ssh, through subprocess) does not run these hooks.
os.register_at_fork(before=gc.freeze, after_in_parent=gc.unfreeze)


def _inject_invocation(task_vars):
    """Whether the module would add ``invocation`` to its result (ansible-core 2.21's INJECT_INVOCATION;
    before it, always)."""
    try:
        return bool(C.config.get_config_value("INJECT_INVOCATION", variables=task_vars))
    except (AnsibleError, KeyError):
        return True


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = True  # by running the module

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        del tmp
        _validation, params = self.validate_argument_spec(argument_spec=health.ARGUMENT_SPEC)
        problem = health.validate(params)
        if problem:
            result.update(failed=True, msg="Failed to validate node_health options: %s" % problem)
            return result
        why = self._module_instead()
        reply = None if why else self._runner(params, task_vars)
        if reply is None or reply.get("fleetops_runner") not in ("ok", "failed"):
            if reply is not None:
                why = "the runner answered %s: %s" % (reply.get("fleetops_runner"), reply.get("msg", ""))
                if reply.get("fleetops_runner") == "unusable":
                    display.warning("fleetops.node.node_health: %s; running the module instead" % why)
            display.vvv("node_health: running the module (%s)" % (why or "the runner did not answer"))
            return self._module(result, task_vars)
        if reply["fleetops_runner"] == "failed":
            result.update(failed=True, msg=reply.get("msg", "the runner failed"))
            if reply.get("exception"):
                result["exception"] = reply["exception"]
            return result
        result.update(health.module_result(reply["result"]), fleetops_path="runner")
        if _inject_invocation(task_vars):
            result["invocation"] = {"module_args": params}
        return result

    def _module(self, result, task_vars):
        """Run the module as ansible.builtin.normal would (async included)."""
        wrap_async = self._task.async_val
        result = merge_hash(result, self._execute_module(module_name=MODULE, task_vars=task_vars, wrap_async=wrap_async))
        if not wrap_async:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        result["fleetops_path"] = "module"
        return result

    def _module_instead(self):
        """Why the module must run instead of the runner, or None."""
        if PAYLOAD is None:
            return "the runner archive is not in the collection"
        if os.environ.get(FORCE_MODULE_ENV) == "1":
            return "%s=1" % FORCE_MODULE_ENV
        if self._task.async_val or self._task.delegate_to:
            return "an async or delegated task"
        connection = self._connection
        if C.DEFAULT_KEEP_REMOTE_FILES or not getattr(connection, "has_pipelining", False):
            return "the connection cannot send standard input"
        # with become, standard input needs what pipelining needs (no tty for sudo): the user's setting says
        if connection.become and not connection.is_pipelining_enabled(False):
            return "become without pipelining"
        return None

    def _interpreter(self, task_vars):
        """The host's Python as the module would use it: ``ansible_python_interpreter``, else the configured
        interpreter, else the one discovered earlier, else "" (``scan_stage.command``: ``python3`` on the PATH;
        no discovery round trip: a host without it gets the module, which discovers)."""
        name = task_vars.get("ansible_python_interpreter")
        if name is None:
            name = C.config.get_config_value("INTERPRETER_PYTHON", variables=task_vars)
        name = str(self._templar.template(name)) if name else ""
        if not name or name.startswith("auto"):
            facts = task_vars.get("ansible_facts") or {}
            name = str(facts.get("discovered_interpreter_python") or "")
        return name

    def _runner(self, params, task_vars):
        """The stage's reply (a dict), sending the archive when the host lacks it; None when no reply."""
        blob, sha, source = PAYLOAD
        header = scan_stage.request(sha, params)
        environment = self._compute_environment_string()
        argv = scan_stage.command(self._interpreter(task_vars), source)
        cmd = (environment + " " if environment else "") + " ".join(shlex.quote(part) for part in argv)
        reply = self._call(cmd, header)
        if reply is not None and reply.get("fleetops_runner") == "missing":
            reply = self._call(cmd, header + blob)
        return reply

    def _call(self, cmd, data):
        out = self._low_level_execute_command(cmd, in_data=data)
        reply = scan_stage.parse_reply(out["stdout"])
        if reply is None:
            display.vvv("node_health: no reply from the runner (rc %s): %s" % (out["rc"], out["stderr"][-500:]))
            return None
        if reply["fleetops_runner"] == "failed" and out["stderr"]:
            reply["msg"] = "%s (stderr: %s)" % (reply.get("msg", ""), out["stderr"][-500:])
        return reply
