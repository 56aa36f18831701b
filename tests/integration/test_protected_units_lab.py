"""Protection by identity, on a real systemd (a Debian 12 lab host), through ansible.

``fleetops.node.disable_unit`` must resolve a name the way systemd does before any check: the
alias ``dbus-org.freedesktop.login1`` is ``systemd-logind.service`` (protected), targets and slices
are never turned off (not even with ``allow_protected``), and a ``sshd@`` template instance is
protected. A refusal fails with one line and leaves the host exactly as it was: nothing stopped,
nothing disabled, no mask symlink.

``fleetops.node.set_env`` must not rewrite an ``override.conf`` that ``systemctl edit`` wrote (it
holds ``ExecStart=`` and limits), and must keep a secret value out of everything ansible prints and
logs, while the service still gets it.

The modules run as ansible ad-hoc commands against the lab inventory (ssh), as an operator would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetops_lab import Lab
from tests.paths import REPO

pytestmark = pytest.mark.lab
HOST = "lab-01"
TEMPLATE = "/etc/systemd/system/sshd@.service"
INSTANCE = "sshd@h3test.service"
ENV_UNIT = "h3-env.service"
SECRET = "s3cr3t-H3-value"


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab()
    lab.up(1)
    try:
        # A template like the sshd@.service other distributions ship (socket-activated sshd);
        # Debian 12 has none, so the test brings one (a harmless sleeper) and starts an instance.
        lab.run(
            HOST,
            f"printf '[Unit]\\nDescription=fleetops test sshd@ template\\n[Service]\\nExecStart=/bin/sleep infinity\\n'"
            f" > {TEMPLATE} && systemctl daemon-reload && systemctl start {INSTANCE}",
            check=True,
        )
        yield lab
    finally:
        lab.down()


def adhoc(
    tmp_path: Path, lab: Lab, module: str, args: dict[str, Any], *extra: str
) -> tuple[int, dict[str, Any], str]:
    """``ansible lab-01 -m MODULE -a ARGS``: rc, the result (tree callback) and everything ansible printed."""
    tree = tmp_path / "tree"
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections"),
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        "ANSIBLE_CALLBACKS_ENABLED": "ansible.builtin.tree",
        "ANSIBLE_CALLBACK_TREE_DIR": str(tree),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_INJECT_INVOCATION": "1",  # the module's arguments come back too: they must not hold a secret
    }
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("ansible")), HOST, "-i", str(lab.inventory_path()), "-m", module,
         "-a", json.dumps(args), *extra],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    result_file = tree / HOST
    assert result_file.exists(), proc.stdout + proc.stderr
    result: dict[str, Any] = json.loads(result_file.read_text())
    return proc.returncode, result, proc.stdout + proc.stderr


def host_state(lab: Lab) -> dict[str, str]:
    """What a wrong disable would change: activity and enablement of the units involved, every mask
    symlink, every unit file's state, and the default target."""
    units = (
        "systemd-logind.service dbus-org.freedesktop.login1.service multi-user.target system.slice "
        + INSTANCE
    )
    commands = {
        "active": f"systemctl is-active {units} ssh.service; true",
        "enabled": f"systemctl is-enabled {units}; true",
        "masks": "find /etc/systemd/system /run/systemd/system -lname /dev/null | sort",
        "unit_files": "systemctl list-unit-files --no-legend | sort | md5sum",
        "default": "systemctl get-default",
        "logind_pid": "systemctl show -p MainPID --value systemd-logind.service",
    }
    return {key: lab.run(HOST, cmd, check=True).stdout for key, cmd in commands.items()}


@pytest.mark.parametrize(
    ("name", "allow", "unit", "needle", "refusal"),
    [
        (
            "dbus-org.freedesktop.login1", False, "systemd-logind.service",
            "Failed to disable systemd-logind.service: it is protected by 'systemd-*'", "protected",
        ),
        (
            "multi-user.target", False, "multi-user.target",
            "Failed to disable multi-user.target: it is a target unit; only service, socket, timer, path", "type",
        ),
        (
            "multi-user.target", True, "multi-user.target",
            "Failed to disable multi-user.target: it is a target unit", "type",
        ),
        ("system.slice", True, "system.slice", "Failed to disable system.slice: it is a slice unit", "type"),
        (
            "sshd@h3test", False, INSTANCE,
            f"Failed to disable {INSTANCE}: it is protected by 'sshd@*.service'", "protected",
        ),
        ("sshd", False, "ssh.service", "Failed to disable ssh.service: it is protected by 'ssh.service'", "protected"),
    ],
)  # fmt: skip
def test_disable_unit_refuses_by_identity_and_changes_nothing(
    lab: Lab, tmp_path: Path, name: str, allow: bool, unit: str, needle: str, refusal: str
) -> None:
    before = host_state(lab)
    assert before["active"].split() == ["active"] * 6, before  # the premise: all of them run
    args = {"name": name, "allow_protected": allow}
    rc, result, output = adhoc(tmp_path, lab, "fleetops.node.disable_unit", args, "--diff")
    assert rc != 0, output
    assert result["msg"].startswith(needle), result["msg"]
    assert "\n" not in result["msg"]
    assert result["refusal"] == refusal
    assert result["unit"] == unit
    assert unit in result["names"]
    assert "actions" not in result and result.get("changed", False) is False
    assert host_state(lab) == before


def test_alias_names_come_back_for_the_controller(lab: Lab, tmp_path: Path) -> None:
    rc, result, output = adhoc(
        tmp_path, lab, "fleetops.node.disable_unit", {"name": "dbus-org.freedesktop.login1"}
    )
    assert rc != 0, output
    assert result["requested"] == "dbus-org.freedesktop.login1.service"
    assert result["names"] == ["systemd-logind.service", "dbus-org.freedesktop.login1.service"]


def test_an_unprotected_service_is_still_turned_off_by_its_id(lab: Lab, tmp_path: Path) -> None:
    # ecs.service with an alias: asking by the alias masks the unit itself, not the alias name
    lab.run(
        HOST,
        "printf '[Service]\\nExecStart=/bin/sleep infinity\\n[Install]\\nWantedBy=multi-user.target\\n"
        "Alias=ecs-alias.service\\n' > /etc/systemd/system/ecs.service && systemctl daemon-reload && "
        "systemctl enable --now ecs.service",
        check=True,
    )
    try:
        rc, result, output = adhoc(
            tmp_path, lab, "fleetops.node.disable_unit", {"name": "ecs-alias"}, "--diff"
        )
        assert rc == 0, output
        assert result["changed"] is True
        assert result["unit"] == "ecs.service"
        assert result["names"] == ["ecs.service", "ecs-alias.service"]
        assert lab.run(HOST, "systemctl is-enabled ecs.service").stdout.strip() == "masked"
        assert lab.run(HOST, "systemctl is-active ecs.service").stdout.strip() == "inactive"
        rc, again, output = adhoc(tmp_path, lab, "fleetops.node.disable_unit", {"name": "ecs.service"})
        assert rc == 0 and again["changed"] is False, output
    finally:
        lab.run(
            HOST,
            "systemctl unmask ecs.service; rm -f /etc/systemd/system/ecs.service /etc/systemd/system/ecs-alias.service "
            "/var/lib/fleetops/disabled-units/ecs.service; systemctl daemon-reload",
        )


def test_set_env_leaves_a_systemctl_edit_override_alone(lab: Lab, tmp_path: Path) -> None:
    override = f"/etc/systemd/system/{ENV_UNIT}.d/override.conf"
    text = "[Service]\nExecStart=\nExecStart=/bin/sleep infinity\nLimitNOFILE=65536\nEnvironment=A=1\n"
    lab.run(
        HOST,
        f"printf '[Service]\\nExecStart=/bin/sleep 1000\\n' > /etc/systemd/system/{ENV_UNIT} && "
        f"mkdir -p /etc/systemd/system/{ENV_UNIT}.d && cat > {override} && systemctl daemon-reload && "
        f"systemctl start {ENV_UNIT}",
        check=True,
        input=text,
    )
    try:
        args = {"name": ENV_UNIT, "env": {"UCX_MEM_MMAP_HOOK_MODE": "none"}, "drop_in": "override.conf"}
        rc, result, output = adhoc(tmp_path, lab, "fleetops.node.set_env", args)
        assert rc != 0, output
        assert "was not written by fleetops and holds more than Environment= lines" in result["msg"]
        assert "line 2: ExecStart=" in result["msg"]
        assert lab.run(HOST, f"cat {override}", check=True).stdout == text
        assert lab.run(HOST, f"systemctl show -p LimitNOFILE --value {ENV_UNIT}").stdout.strip() == "65536"
    finally:
        lab.run(HOST, f"rm -rf {override}; systemctl daemon-reload")


def test_set_env_keeps_a_secret_out_of_results_diffs_and_logs(lab: Lab, tmp_path: Path) -> None:
    drop_in = f"/etc/systemd/system/{ENV_UNIT}.d/50-fleetops-env.conf"
    args = {"name": ENV_UNIT, "env": {"H3_TOKEN": SECRET, "H3_ONE": "1"}, "restart": True}
    lab.run(HOST, f"systemctl start {ENV_UNIT}", check=True)
    try:
        rc, result, output = adhoc(tmp_path, lab, "fleetops.node.set_env", args, "--diff", "-vvv")
        assert rc == 0, output
        everything = output + json.dumps(result)
        assert SECRET not in everything
        assert result["changed"] is True and result["restarted"] is True
        assert result["changed_vars"] == ["H3_ONE", "H3_TOKEN"]
        assert result["env_after"]["H3_TOKEN"].startswith("sha256:")
        assert result["env_after"]["H3_ONE"].startswith("sha256:")  # a short value does not garble the rest
        assert result["invocation"]["module_args"]["env"] == result["env_after"]
        assert result["path"] == drop_in
        # the service has it, the drop-in holds it, the host's journal does not (ansible logs the call there)
        assert f'Environment="H3_TOKEN={SECRET}"' in lab.run(HOST, f"cat {drop_in}", check=True).stdout
        pid = lab.run(HOST, f"systemctl show -p MainPID --value {ENV_UNIT}", check=True).stdout.strip()
        assert (
            f"H3_TOKEN={SECRET}" in lab.run(HOST, f"tr '\\0' '\\n' < /proc/{pid}/environ", check=True).stdout
        )
        journal = lab.run(HOST, "journalctl -q -o cat --no-pager", check=True).stdout
        assert "env=NOT_LOGGING_PARAMETER" in journal  # ansible logged the call, without the values
        assert SECRET not in journal

        rc, again, output = adhoc(tmp_path, lab, "fleetops.node.set_env", args, "--diff")
        assert rc == 0 and again["changed"] is False, output
        assert again["changed_vars"] == []

        shown = dict(args, show_values=True, env={"H3_ONE": "2"})
        rc, shown_result, output = adhoc(tmp_path, lab, "fleetops.node.set_env", shown, "--check", "--diff")
        assert rc == 0, output
        assert shown_result["env_after"]["H3_ONE"] == "2"
        assert shown_result["changed_vars"] == ["H3_ONE"]
    finally:
        lab.run(
            HOST,
            f"systemctl stop {ENV_UNIT}; rm -rf /etc/systemd/system/{ENV_UNIT}*; systemctl daemon-reload",
        )
