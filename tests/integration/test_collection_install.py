"""The built artifacts, installed as a user installs them, run outside the checkout.

The tarball test: the collection, installed into an empty directory, runs its scan playbook against localhost.

Nothing of this checkout may take part: the tarball is built with `ansible-galaxy collection build`,
installed with `ansible-galaxy collection install` into an empty folder, and `ansible-playbook -i
localhost, -c local fleetops.node.scan` runs from a folder outside the repository with no ansible.cfg
and ANSIBLE_COLLECTIONS_PATH naming only that folder. At -vvv ansible names the playbook file of every
task ("task path:"), and any module file it ships ("Using module file"): node_health's action ships none, it
sends the installed runner archive (its fast path, ``fleetops_path: runner``).
The result is read from the playbook's own set_stats summary (ANSIBLE_SHOW_CUSTOM_STATS) and from the
node_health result that the json result format prints.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from fleetops_lab import Lab, host_faults
from tests.helpers import LAB_ANSWERED

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(extra)
    return env


def test_built_tarball_installs_into_an_empty_dir_and_scans_localhost(tmp_path: Path) -> None:
    version = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    dist, install, work = tmp_path / "dist", tmp_path / "collections", tmp_path / "work"
    for d in (dist, install, work):
        d.mkdir()
    env = _env(
        ANSIBLE_COLLECTIONS_PATH=str(install), ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp")
    )

    subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "build", str(REPO), "--output-path", str(dist)],
        check=True,
        capture_output=True,
        text=True,
        cwd=work,
        env=env,
    )
    tarball = dist / f"fleetops-node-{version}.tar.gz"
    assert tarball.is_file(), list(dist.iterdir())
    assert not any(install.iterdir())
    subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "install", str(tarball), "-p", str(install)],
        check=True,
        capture_output=True,
        text=True,
        cwd=work,
        env=env,
    )
    installed = install / "ansible_collections" / "fleetops" / "node"
    manifest = json.loads((installed / "MANIFEST.json").read_text())["collection_info"]
    assert (manifest["namespace"], manifest["name"], manifest["version"]) == ("fleetops", "node", version)
    assert not installed.is_symlink() and (installed / "playbooks" / "scan.yml").is_file()

    # The interpreter is named: discovery may land on a pyenv shim of another version on these machines.
    proc = subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            "fleetops.node.scan",
            "-vvv",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
        ],
        capture_output=True,
        text=True,
        cwd=work,
        timeout=300,
        stdin=subprocess.DEVNULL,
        env={**env, "ANSIBLE_SHOW_CUSTOM_STATS": "true", "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]

    # the installed copy ran: its playbook and node_health's action, whose fast path sends the installed
    # runner archive instead of the module file; nothing from the checkout
    task_paths = set(re.findall(r"^task path: (\S+?):\d+$", out, re.M))
    assert task_paths == {str(installed / "playbooks" / "scan.yml")}, task_paths
    modules = set(re.findall(r"Using module file (\S+)", out))
    assert modules == set(), modules
    for part in ("plugins", "playbooks", "collections"):
        assert str(REPO / part) not in out, part

    # what the module found, as the playbook reports it (set_stats, shown as CUSTOM STATS)
    stats = re.search(r"^\s*RUN: (\{.*\})\s*$", out, re.M)
    assert stats is not None, out[-3000:]
    summary = json.loads(stats.group(1))["fleetops_scan"]
    assert list(summary) == ["localhost"]
    entry = summary["localhost"]
    # ok, or partial with a line per check that could not look (here, where systemd is not PID 1)
    assert entry["status"] == ("partial" if entry["coverage"] else "ok"), entry
    if not os.path.isdir("/run/systemd/system"):
        assert any(
            line.startswith("crashloop_unit (none): systemd is not PID 1") for line in entry["coverage"]
        ), entry
    assert set(entry["findings"]) == {"critical", "warning", "info"}
    assert all(isinstance(n, int) and n >= 0 for n in entry["findings"].values())
    assert len(entry["summaries"]) == sum(entry["findings"].values())

    # and the module result itself (json result format): facts of the zombie_memcg detector
    result = re.search(r"^ok: \[localhost\] => (\{\n.*?\n\})$", out, re.M | re.S)
    assert result is not None, out[-3000:]
    node_health = json.loads(result.group(1))
    assert "zombie_memcg" in node_health["checks"]
    assert node_health["fleetops_path"] == "runner"
    assert isinstance(node_health["facts"]["memcg"]["total"], int)


@pytest.mark.lab
def _statuses(stdout: str) -> object:
    """Each host's status and message from a scan report (what a failed assertion should show), or the text."""
    try:
        hosts = json.loads(stdout)["hosts"]
        return {h: (r.get("status"), r.get("msg"), r.get("errors")) for h, r in hosts.items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return stdout[-2000:]


def test_the_wheel_as_a_user_installs_it_scans_and_remediates_a_lab_fleet(tmp_path: Path) -> None:
    """`make dist`, then the wheel in a fresh venv outside the checkout, driven from another folder with
    nothing of the checkout on any path: `fleetops --version`, ansible-doc, a real scan and a dry-run
    remediation of a lab fleet through its EC2 inventory, `fleetops scan` of this machine with no -i; then
    the tarball with ansible-galaxy into a collections path (which ansible-core, and so fleetops, now
    prefers over the wheel's copy) and `ansible-playbook fleetops.node.scan` from there. Python 3.11's pip
    refuses the wheel in one line."""
    started = time.monotonic()
    # a home longer than ssh's ControlMaster sockets allow under ~/.ansible/cp (as a CI workspace's may be):
    # the installed CLI must still reach the hosts (fleetops.ansible.control_path)
    dist, venv, work = tmp_path / "dist", tmp_path / "venv", tmp_path / "work"
    home = tmp_path / ("home-" + "h" * max(0, 80 - len(str(tmp_path))))
    for d in (work, home):
        d.mkdir()
    # the Makefile's own recipe; -o: never rebuild the checkout's venv from inside a test
    subprocess.run(
        ["make", "-s", "-C", str(REPO), f"VENV={BIN.parent}", "-o", f"{BIN.parent}/.installed", "dist",
         f"DIST={dist}"],
        check=True, capture_output=True, text=True, timeout=300, env=_env(),
    )  # fmt: skip
    version = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    wheel, tarball = dist / f"fleetops-{version}-py3-none-any.whl", dist / f"fleetops-node-{version}.tar.gz"
    assert sorted(p.name for p in dist.iterdir()) == sorted(
        [wheel.name, tarball.name, f"fleetops-{version}.tar.gz"]
    )
    built = time.monotonic()

    # a user's shell: no checkout anywhere (no PYTHONPATH, no ANSIBLE_*, an empty home), the pip cache kept
    cache = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True)
    user = {k: v for k, v in _env().items() if not k.startswith(("PYTHON", "FLEETOPS_", "VIRTUAL_ENV"))}
    user.update(
        HOME=str(home), PIP_CACHE_DIR=cache.stdout.strip(), FLEETOPS_STATE_DIR=str(tmp_path / "state")
    )
    user["PATH"] = os.pathsep.join(p for p in user["PATH"].split(os.pathsep) if not p.startswith(str(REPO)))
    # the venv's packages from the package index as pip resolves them (pyproject's ranges); installed by this
    # venv's pip (`pip --python`: no ensurepip into the new venv) without byte-compiling: 20 s, not 80
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, env=user, cwd=work)
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-compile",
         str(wheel)],
        capture_output=True, text=True, env=user, cwd=work, timeout=600,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stderr[-3000:]
    installed = time.monotonic()

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(venv / "bin" / args[0]), *args[1:]],
            capture_output=True, text=True, env=env or user, cwd=work, timeout=300, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    site = Path(
        run("python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    )
    in_wheel = site / "ansible_collections" / "fleetops" / "node"
    out = run("fleetops", "--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].startswith(f"fleetops {version} (Python ")
    assert out.stdout.splitlines()[1:] == [f"collection fleetops.node {version} at {in_wheel}"]
    doc = run("ansible-doc", "fleetops.node.node_health")
    assert doc.returncode == 0 and f"({in_wheel}/plugins/modules/node_health.py)" in doc.stdout, doc.stderr
    assert run("ansible-doc", "-t", "inventory", "fleetops.node.ec2").returncode == 0
    assert (in_wheel / "schemas" / "policy.schema.json").is_file()
    assert not (site / "fleetops_lab").exists() and not (in_wheel / "tests").exists()

    here = run("fleetops", "scan", "--format", "json", "-q")  # no -i: this machine, the package's inventory
    assert here.returncode in (0, 1), here.stderr
    assert list(json.loads(here.stdout)["hosts"]) == ["localhost"]

    lab = Lab()
    lab.up(2, ec2=True)
    try:
        labbed = time.monotonic()
        inventory = str(lab.ec2_inventory_path())
        scan = run("fleetops", "scan", "-i", inventory, "--format", "json", "-q")
        assert scan.returncode in (0, 1), (scan.stderr, _statuses(scan.stdout))
        assert {h: r["status"] for h, r in json.loads(scan.stdout)["hosts"].items()} == {
            "lab-01": LAB_ANSWERED,  # an nspawn guest cannot count its zombies: partial (tests/helpers.py)
            "lab-02": LAB_ANSWERED,
        }
        unit = host_faults.install_crashloop_unit(lab, "lab-02", name="stray", start=False)
        dry = run(
            "fleetops",
            "remediate",
            "disable-unit",
            "--unit",
            unit,
            "-i",
            inventory,
            "-l",
            "lab-02",
            "--format",
            "json",
        )
        assert dry.returncode == 0, dry.stderr
        assert json.loads(dry.stdout)["summary"]["changed"] == 1  # lab-02, predicted in check mode
        assert lab.run("lab-02", f"systemctl is-enabled {unit}").stdout.strip() == "enabled"

        # the tarball, for AWX projects and EEs: in a collections path, it is the one that runs
        cpath = tmp_path / "collections"
        # --force: ansible-galaxy finds the wheel's copy on sys.path and would install nothing
        galaxy = run("ansible-galaxy", "collection", "install", "--force", str(tarball), "-p", str(cpath))
        assert galaxy.returncode == 0, galaxy.stderr
        assert (cpath / "ansible_collections" / "fleetops" / "node" / "MANIFEST.json").is_file(), (
            galaxy.stdout
        )
        env = user | {"ANSIBLE_COLLECTIONS_PATH": str(cpath)}
        from_tarball = cpath / "ansible_collections" / "fleetops" / "node"
        out = run("fleetops", "--version", env=env)
        assert out.stdout.splitlines()[1:] == [
            f"collection fleetops.node {version} at {from_tarball}",
            f"  also found, not used {version} at {in_wheel}",
        ], out.stdout
        # ansible-playbook itself, with this long home, needs a short ControlMaster folder from its user (it
        # says "ControlPath too long" otherwise), as fleetops picks one for the commands it starts
        cp = Path(tempfile.mkdtemp(prefix="cp-"))
        play = run("ansible-playbook", "-i", inventory, "fleetops.node.scan", "-vv",
                   env=env | {"ANSIBLE_SSH_CONTROL_PATH_DIR": str(cp)})  # fmt: skip
        shutil.rmtree(cp, ignore_errors=True)
        assert play.returncode == 0, play.stdout[-3000:] + play.stderr[-2000:]
        task_paths = set(re.findall(r"^task path: (\S+?):\d+$", play.stdout, re.M))
        assert task_paths == {str(from_tarball / "playbooks" / "scan.yml")}, task_paths
        assert "lab-01" in play.stdout and "lab-02" in play.stdout
        recap = re.findall(
            r"^(lab-0\d)\s+: ok=\d+\s+changed=\d+\s+unreachable=0\s+failed=0", play.stdout, re.M
        )
        assert sorted(recap) == ["lab-01", "lab-02"], play.stdout[-2000:]
    finally:
        host_faults.remove_crashloop_unit(lab, "lab-02", name="stray")
        lab.down()

    # an older Python: pip refuses the wheel in one line (requires-python), as a user's `pip install` of it
    # into a 3.11 venv says it with a current pip (this venv's, `pip --python`, as above; Debian 12's own pip
    # 23 names the ansible-core it cannot find instead: the install guide says `pip install -U pip` first);
    # dependencies asked for as the user's command asks (no --no-deps), none fetched (--no-index, --dry-run)
    older = [Path("/usr/bin/python3.11"), *sorted(Path.home().glob(".pyenv/versions/3.1[01]*/bin/python3"))]
    python311 = next(p for p in older if p.is_file())
    venv311 = tmp_path / "venv311"
    subprocess.run(
        [str(python311), "-m", "venv", "--without-pip", str(venv311)], check=True, env=user, cwd=work
    )
    old = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv311 / "bin" / "python"), "install", "--dry-run",
         "--no-index", str(wheel)],
        capture_output=True, text=True, env=user, cwd=work,
    )  # fmt: skip
    assert old.returncode != 0
    errors = [line for line in old.stderr.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1, old.stderr
    assert "requires a different Python: 3.1" in errors[0] and "not in '>=3.12'" in errors[0], old.stderr
    print(
        f"install test: dist {built - started:.1f} s, venv + pip install {installed - built:.1f} s, "
        f"lab {labbed - installed:.1f} s, checks {time.monotonic() - labbed:.1f} s"
    )
