"""execution-environment.yml: `ansible-builder create` writes a build context that holds what it says.

`make ee` really builds the image (ee/build.sh, podman) and tests/integration/test_ee.py runs jobs in it;
these tests need no container engine. `create` is everything up to the engine: it validates the file
against the v3 schema and writes the Containerfile plus `_build/` (requirements, bindep, the collection
tarball, the fleetops wheel, the apt wrapper, the host's pip trust, the builder's scripts). These tests
check that context,
run two of its steps that need no engine: the builder's own dependency introspection
(`_build/scripts/introspect.py`) on the collection installed from the tarball, and bindep on bindep.txt
for both package families; and ee/trust.sh on a pip configuration made for the test.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from bindep.depends import Depends
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
EE_FILES = ("execution-environment.yml", "requirements.txt", "constraints.txt", "bindep.txt", "ee/pkgmgr")


def _clean_env() -> dict[str, str]:
    """This environment without the Makefile's ANSIBLE_CONFIG / collections path (they name the repo's copy)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}


def _galaxy_version() -> str:
    version: str = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    return version


def _requirements(path: Path) -> dict[str, Requirement]:
    return {r.name.lower(): r for r in _requirements_text(path.read_text())}


def _requirements_text(text: str) -> list[Requirement]:
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [Requirement(line) for line in lines if line and line != "---"]


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The EE definition copied beside a freshly built tarball, and `ansible-builder create` run on it."""
    work = tmp_path_factory.mktemp("ee")
    for name in EE_FILES:
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, work / name)
    subprocess.run(
        ["bash", str(REPO / "ee" / "trust.sh"), str(work / "build" / "ee-trust"), sys.executable],
        check=True,
        capture_output=True,
        text=True,
    )
    subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "build", str(REPO), "--output-path", str(work / "build")],
        check=True,
        capture_output=True,
        text=True,
    )
    subprocess.run(
        ["bash", str(REPO / "ee" / "wheel.sh"), str(work / "build" / "ee-wheel"), sys.executable],
        check=True,
        capture_output=True,
        text=True,
    )
    out = work / "context"
    proc = subprocess.run(
        [
            str(BIN / "ansible-builder"),
            "create",
            "--file",
            str(work / "execution-environment.yml"),
            "--context",
            str(out),
            "--output-filename",
            "Containerfile",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # A glob in additional_build_files that matches nothing is only a warning for ansible-builder.
    assert "No matches" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return out


def test_definition_is_schema_v3_with_only_the_collection_and_its_requirements() -> None:
    ee: dict[str, Any] = yaml.safe_load((REPO / "execution-environment.yml").read_text())
    assert ee["version"] == 3
    deps = ee["dependencies"]
    assert set(deps) == {"python_interpreter", "ansible_core", "ansible_runner", "python", "system", "galaxy"}
    assert deps["python"] == "requirements.txt" and deps["system"] == "bindep.txt"
    # the only collection is ours, from the tarball this checkout builds (its name carries galaxy.yml's version)
    assert deps["galaxy"]["collections"] == [
        {"name": f"collections/fleetops-node-{_galaxy_version()}.tar.gz", "type": "file"}
    ]
    assert not deps["galaxy"].get("roles")
    # Debian trixie: Python 3.13 (ansible-core 2.21 needs >= 3.12); apt behind ansible-builder's dnf calls;
    # Debian's pip, since Debian disables ensurepip for the system Python
    assert ee["images"]["base_image"]["name"] == "docker.io/library/debian:trixie-slim"
    assert deps["python_interpreter"]["package_system"].split() == ["python3", "python3-pip"]
    assert ee["options"]["skip_pip_install"] is True
    assert ee["options"]["package_manager_path"] == "/usr/local/bin/fleetops-pkgmgr"
    assert "localhost/fleetops-ee:latest" in ee["options"]["tags"]


def test_ansible_ranges_match_pyproject() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = {r.name: r for r in map(Requirement, project["dependencies"])}
    deps = yaml.safe_load((REPO / "execution-environment.yml").read_text())["dependencies"]
    for key in ("ansible_core", "ansible_runner"):
        req = Requirement(deps[key]["package_pip"])
        assert req.specifier == wanted[req.name].specifier, key


def test_requirements_txt_lists_the_inventory_plugins_needs_with_pyprojects_ranges() -> None:
    reqs = _requirements(REPO / "requirements.txt")
    assert set(reqs) == {"boto3", "tenacity"}  # the modules themselves need only the standard library
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = {r.name.lower(): r for r in map(Requirement, project["dependencies"])}
    for name, req in reqs.items():
        assert req.specifier == wanted[name].specifier, name
    # and the EC2 layer the plugin (and the lease) use really imports them
    layer = (REPO / "plugins" / "module_utils" / "aws.py").read_text()
    assert re.search(r"^\s*import boto3", layer, re.M) and re.search(
        r"^\s*import tenacity|from tenacity", layer, re.M
    )
    plugin = (REPO / "plugins" / "inventory" / "ec2.py").read_text()
    assert "module_utils.aws import" in plugin or "module_utils import aws" in plugin


def test_bindep_installs_the_ssh_client_on_both_package_families() -> None:
    deps = Depends((REPO / "bindep.txt").read_text())
    rpm = [r[0] for r in deps.active_rules(["platform:rpm", "platform:redhat", "platform:centos"])]
    dpkg = [r[0] for r in deps.active_rules(["platform:dpkg", "platform:debian", "platform:ubuntu"])]
    assert rpm == ["openssh-clients"]
    assert dpkg == ["openssh-client"]


def test_containerfile_installs_core_runner_collection_and_requirements(context: Path) -> None:
    text = (context / "Containerfile").read_text()
    ee = yaml.safe_load((REPO / "execution-environment.yml").read_text())
    assert f'ARG EE_BASE_IMAGE="{ee["images"]["base_image"]["name"]}"' in text
    refs = re.search(r'^ARG ANSIBLE_INSTALL_REFS="(.*)"$', text, re.M)
    assert refs is not None
    assert refs.group(1) == " ".join(
        (
            ee["dependencies"]["ansible_core"]["package_pip"],
            ee["dependencies"]["ansible_runner"]["package_pip"],
        )
    )
    # galaxy stage installs requirements.yml (our tarball); builder stage introspects the collections plus
    # the user requirements; the final stage installs the system packages bindep names.
    assert "ansible-galaxy collection install" in text and "-r requirements.yml" in text
    assert "introspect.py introspect --user-pip=requirements.txt --user-bindep=bindep.txt" in text
    assert "COPY _build/requirements.txt requirements.txt" in text
    assert "COPY _build/bindep.txt bindep.txt" in text
    assert "/output/scripts/install-from-bindep" in text
    assert "LABEL ansible-execution-environment=true" in text
    assert 'ARG PKGMGR="/usr/local/bin/fleetops-pkgmgr"' in text
    # the apt wrapper and pip's trust are in place before the first package or pip install
    first_install = text.index("RUN $PKGMGR install $PYPKG")
    for step in (
        "COPY _build/ee/pkgmgr /usr/local/bin/fleetops-pkgmgr",
        "COPY _build/trust/pip.conf /etc/pip.conf",
        "COPY _build/trust/ca-bundle.crt /etc/fleetops-ee/ca-bundle.crt",
        # the lock pins every pip install of every stage (they all start FROM base)
        "COPY _build/lock/constraints.txt /etc/fleetops-ee/constraints.txt",
        "ENV PIP_CONSTRAINT=/etc/fleetops-ee/constraints.txt",
    ):
        assert -1 < text.index(step) < first_install, step
    assert text.index("ENV PIP_CONSTRAINT=") < text.index("pip install")
    assert "pip_install $PYCMD" not in text


def _lock() -> dict[str, str]:
    """constraints.txt: name -> pinned version (every line a name==version; comments only besides)."""
    pins: dict[str, str] = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==" and not req.marker and not req.url, line
            pins[req.name.lower().replace("_", "-")] = spec.version
    return pins


def test_the_lock_pins_every_dependency_within_pyprojects_ranges() -> None:
    """make venv and the EE install from the lock; the wheel keeps ranges for users. The lock must pin
    each dependency of the product, its test extra and the lab to a version its range accepts, and hold
    none of our own packages (they are installed from this checkout)."""
    pins = _lock()
    assert not {"fleetops", "fleetops-lab"} & set(pins)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lab = tomllib.loads((REPO / "lab" / "pyproject.toml").read_text())["project"]
    reqs = [*project["dependencies"], *project["optional-dependencies"]["test"], *lab["dependencies"]]
    for req in map(Requirement, reqs):
        name = req.name.lower().replace("_", "-")
        if name == "fleetops":
            continue
        assert name in pins, f"{name} is not in constraints.txt: run make lock"
        assert req.specifier.contains(pins[name], prereleases=True), (name, str(req.specifier), pins[name])


def test_build_folder_holds_requirements_bindep_and_the_tarball(context: Path) -> None:
    build = context / "_build"
    assert (build / "requirements.txt").read_text() == (REPO / "requirements.txt").read_text()
    assert (build / "bindep.txt").read_text() == (REPO / "bindep.txt").read_text()
    assert (build / "ee" / "pkgmgr").read_text() == (REPO / "ee" / "pkgmgr").read_text()
    assert {p.name for p in (build / "trust").iterdir()} == {"pip.conf", "ca-bundle.crt"}
    galaxy = yaml.safe_load((build / "requirements.yml").read_text())
    (entry,) = galaxy["collections"]
    tarball = build / entry["name"]  # the galaxy stage runs in /build, a copy of _build
    assert tarball.is_file(), sorted(p.name for p in (build / "collections").iterdir())
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
        manifest = json.loads(tar.extractfile("MANIFEST.json").read())  # type: ignore[union-attr]
    info = manifest["collection_info"]
    assert (info["namespace"], info["name"], info["version"]) == ("fleetops", "node", _galaxy_version())
    # the collection carries its own requirements (ansible-builder introspects them), not the repo's tooling
    assert {"requirements.txt", "bindep.txt", "playbooks/scan.yml", "plugins/modules/node_health.py"} <= names
    for outside in ("execution-environment.yml", "ee", "awx", "src", "tests", "pyproject.toml", "build"):
        assert not any(n == outside or n.startswith(outside + "/") for n in names), outside


def test_builder_introspection_finds_the_collections_requirements(context: Path, tmp_path: Path) -> None:
    """The builder stage's own script, run on the collection installed from the context's tarball."""
    build = context / "_build"
    (entry,) = yaml.safe_load((build / "requirements.yml").read_text())["collections"]
    # --force and a cwd outside the repo: ansible.cfg's collections_path (./collections) already holds
    # fleetops.node, and ansible-galaxy would otherwise say "already installed" and install nothing.
    subprocess.run(
        [
            str(BIN / "ansible-galaxy"),
            "collection",
            "install",
            "--force",
            str(build / entry["name"]),
            "-p",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_clean_env(),
    )
    assert (tmp_path / "ansible_collections" / "fleetops" / "node" / "requirements.txt").is_file()
    pip_out, bindep_out = tmp_path / "pip.txt", tmp_path / "bindep.txt"
    subprocess.run(
        [
            sys.executable,
            str(build / "scripts" / "introspect.py"),
            "introspect",
            str(tmp_path),
            f"--user-pip={build / 'requirements.txt'}",
            f"--user-bindep={build / 'bindep.txt'}",
            f"--write-pip={pip_out}",
            f"--write-bindep={bindep_out}",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    pip_lines = pip_out.read_text().splitlines()
    assert any("boto3" in line and "from collection fleetops.node" in line for line in pip_lines), pip_lines
    assert {r.name for r in _requirements_text(pip_out.read_text())} == {"boto3", "tenacity"}
    assert "openssh-client [platform:dpkg]  # from collection fleetops.node" in bindep_out.read_text()


def test_trust_keeps_what_means_something_in_a_container_and_the_ca_pip_trusts(tmp_path: Path) -> None:
    """ee/trust.sh on a pip configuration like an enterprise's: a proxy CA, an internal index, local paths."""
    ca = tmp_path / "proxy-ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nnot a real one\n-----END CERTIFICATE-----\n")
    conf = tmp_path / "pip.conf"
    conf.write_text(
        "[global]\n"
        "index-url = https://pypi.corp.example/simple\n"
        "extra-index-url = file:///opt/pypi/simple https://mirror.corp.example/simple\n"
        "find-links = /opt/wheels\n"
        f"cert = {ca}\n"
        "trusted-host = pypi.corp.example\n"
        "[install]\n"
        "constraint = /etc/xdg/pip/constraints.txt\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env |= {"PIP_CONFIG_FILE": str(conf), "PIP_PROXY": "http://proxy.corp.example:3128"}
    out = tmp_path / "out"
    subprocess.run(
        ["bash", str(REPO / "ee" / "trust.sh"), str(out), sys.executable],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    text = (out / "pip.conf").read_text()
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    # pip also reads this machine's /etc/pip.conf (a timeout there may pass through); ours win over it
    assert lines[0] == "[global]" and len({line.split(" = ")[0] for line in lines}) == len(lines), lines
    assert set(lines) >= {
        "cert = /etc/fleetops-ee/ca-bundle.crt",
        "index-url = https://pypi.corp.example/simple",
        "extra-index-url = https://mirror.corp.example/simple",
        "trusted-host = pypi.corp.example",
        "proxy = http://proxy.corp.example:3128",
    }
    # nothing that names this machine's disk: local indexes, wheel folders, constraint files
    for local in ("file://", "/opt/", "constraint", "find-links"):
        assert local not in text, local
    assert (out / "ca-bundle.crt").read_text() == ca.read_text()


# ------------------------------------------------------------------ the controller package (fleetops)


def _project() -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return project


def _wheel_name() -> str:
    return f"fleetops-{_galaxy_version()}-py3-none-any.whl"  # galaxy.yml: the one version (setup.py)


def _record(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as z:
        return z.read(next(n for n in z.namelist() if n.endswith(".dist-info/RECORD")))


def test_the_ee_installs_the_fleetops_wheel_as_root_after_everything_else(context: Path) -> None:
    """`fleetops` runs in the EE (playbooks/remediate_auto.yml): the final stage copies the wheel built
    from this checkout and pip-installs it, as root, before the image's USER 1000."""
    ee = yaml.safe_load((REPO / "execution-environment.yml").read_text())
    assert {"src": "build/ee-wheel/fleetops-*.whl", "dest": "wheels"} in ee["additional_build_files"]
    text = (context / "Containerfile").read_text()
    final = text[text.index("FROM base AS final") :]
    copy = f"COPY _build/wheels/{_wheel_name()} /tmp/fleetops-wheel/"
    install = f"RUN $PYCMD -m pip install --no-cache-dir /tmp/fleetops-wheel/{_wheel_name()} && rm -rf /tmp/fleetops-wheel"
    link = "RUN ln -s /usr/local/bin/ansible-inventory /usr/bin/ansible-inventory"
    # the build fails unless the CLI runs, pip's dependencies are consistent and the CLI finds ansible-inventory
    check = (
        "RUN fleetops --help >/dev/null && $PYCMD -m pip check && $PYCMD -c 'from fleetops.ansible.inventory"
        " import ansible_inventory_bin as b; assert b().is_file(), b()'"
    )
    steps = [line for line in final.splitlines() if line.startswith(("COPY", "RUN", "USER"))]
    assert [steps.index(s) for s in (copy, install, link, check)] == list(
        range(steps.index(copy), steps.index(copy) + 4)
    ), steps
    assert steps.index("RUN /output/scripts/install-from-bindep && rm -rf /output/wheels") < steps.index(copy)
    assert steps.index(check) < steps.index("USER 1000")
    # the build context holds exactly that wheel
    assert sorted(p.name for p in (context / "_build" / "wheels").iterdir()) == [_wheel_name()]


def test_the_wheel_holds_the_cli_the_default_policy_the_collection_and_pyprojects_dependencies(
    context: Path,
) -> None:
    wheel = context / "_build" / "wheels" / _wheel_name()
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        info = f"fleetops-{_galaxy_version()}.dist-info"
        metadata = z.read(f"{info}/METADATA").decode()
        entry_points = z.read(f"{info}/entry_points.txt").decode()
    assert {
        "fleetops/cli/auto.py",
        "fleetops/auto/__init__.py",
        "fleetops/policy/__init__.py",
        "fleetops/policies/default.yml",
        "fleetops/localhost.yml",
    } <= names
    # everything under src/fleetops that is not a cache, the collection tarball's files under
    # ansible_collections/fleetops/node (setup.py), and nothing else (no lab, no tests)
    sources = {
        str(p.relative_to(REPO / "src"))
        for p in (REPO / "src" / "fleetops").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    (entry,) = yaml.safe_load((context / "_build" / "requirements.yml").read_text())["collections"]
    with tarfile.open(context / "_build" / entry["name"]) as tar:
        collection = {f"ansible_collections/fleetops/node/{m.name}" for m in tar.getmembers() if m.isfile()}
    assert "ansible_collections/fleetops/node/schemas/policy.schema.json" in collection
    assert {n for n in names if not n.startswith(info)} == sources | collection
    assert "fleetops = fleetops.cli:main" in entry_points
    requires = {
        str(Requirement(line.split(":", 1)[1]))
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    }
    wanted = {str(Requirement(r)) for r in _project()["dependencies"]}
    assert {r for r in requires if "extra ==" not in r} == wanted
    assert f"Version: {_galaxy_version()}" in metadata.splitlines()


def test_the_wheels_record_is_the_build_cache_key_same_sources_same_record(tmp_path: Path) -> None:
    """ee/build.sh rebuilds the image only when the hash of its inputs changes; for the wheel that is
    its RECORD (every file's sha256): the same for the same sources, another for a changed source."""
    assert ".dist-info/RECORD" in (REPO / "ee" / "build.sh").read_text()
    copy = tmp_path / "checkout"
    shutil.copytree(
        REPO,
        copy,
        symlinks=True,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "lab", "tests", "bench", "build", "dist", "collections", "docs", "__pycache__",
            "*.egg-info", ".*_cache", ".ansible", ".hypothesis",
        ),
    )  # fmt: skip

    def build(out: str) -> Path:
        proc = subprocess.run(
            ["bash", str(copy / "ee" / "wheel.sh"), str(tmp_path / out), sys.executable],
            check=True,
            capture_output=True,
            text=True,
        )
        return Path(proc.stdout.strip())

    first, second = build("a"), build("b")
    assert first.name == second.name == _wheel_name()
    assert _record(first) == _record(second)
    policy = copy / "src" / "fleetops" / "policies" / "default.yml"
    policy.write_text(policy.read_text() + "# changed\n")
    # a module deleted from the sources is gone from the next wheel (no stale setuptools build/ reused)
    (copy / "src" / "fleetops" / "drift.py").unlink()
    changed = build("c")
    assert _record(changed) != _record(first)
    with zipfile.ZipFile(changed) as z:
        assert "fleetops/drift.py" not in z.namelist() and "fleetops/policy/__init__.py" in z.namelist()
