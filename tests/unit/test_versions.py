"""One version, and one Python and ansible-core requirement, said everywhere the same way.

galaxy.yml's version is the project's (setup.py gives it to the wheel; `fleetops --version` reads the
installed package's metadata); every module and plugin says when it came (version_added) in terms of that
version; the Python the package refuses below is pyproject's requires-python; ansible-core's lower bound
is the same in pyproject and meta/runtime.yml; what the changelog calls the release is galaxy.yml's.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import fleetops

REPO = Path(__file__).resolve().parents[2]


def _galaxy() -> dict[str, object]:
    meta: dict[str, object] = yaml.safe_load((REPO / "galaxy.yml").read_text())
    return meta


def _version() -> Version:
    return Version(str(_galaxy()["version"]))


def _documentation(path: Path) -> dict[str, object] | None:
    for node in ast.parse(path.read_text()).body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == "DOCUMENTATION"
            and isinstance(node.value, ast.Constant)
        ):
            doc: dict[str, object] = yaml.safe_load(str(node.value.value))
            return doc
    return None


def _version_added(doc: object) -> list[str]:
    """Every version_added in a DOCUMENTATION, the options' too."""
    found: list[str] = []
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += [str(value)] if key == "version_added" else _version_added(value)
    elif isinstance(doc, list):
        for item in doc:
            found += _version_added(item)
    return found


def test_pyproject_takes_its_version_and_urls_from_galaxy_yml_through_setup_py() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "version" not in project and set(project["dynamic"]) == {"version", "urls"}
    assert "galaxy.yml" in (REPO / "setup.py").read_text()
    # the installed (editable) package's metadata is what `fleetops --version` says
    assert metadata.version("fleetops") == fleetops.__version__ == str(_version())
    urls = dict(u.split(", ", 1) for u in metadata.metadata("fleetops").get_all("Project-URL") or [])
    galaxy = _galaxy()
    assert urls == {k.capitalize(): galaxy[k] for k in ("repository", "documentation", "issues")}


def test_every_plugins_version_added_is_a_released_version() -> None:
    """validate-modules (ansible-test sanity) checks version_added against the collection's version: none
    may be later than galaxy.yml's, and for the first release every one is that release."""
    seen = {}
    for path in sorted((REPO / "plugins").rglob("*.py")):
        doc = _documentation(path)
        if doc is not None:
            seen[str(path.relative_to(REPO))] = _version_added(doc)
    assert len(seen) > len(list((REPO / "plugins" / "modules").glob("*.py"))), seen
    for name, versions in seen.items():
        assert versions, f"{name}: no version_added"
        for v in versions:
            assert Version(v) <= _version(), (name, v)
    if _version() == Version("0.1.0"):
        assert {v for vs in seen.values() for v in vs} == {"0.1.0"}


def test_python_requirement_is_one() -> None:
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">={}.{}".format(*fleetops.REQUIRES_PYTHON)


def test_ansible_core_lower_bound_is_the_same_for_the_package_and_the_collection() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (core,) = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "ansible-core"]
    runtime = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())["requires_ansible"]
    lowest = lambda spec: min(Version(s.version) for s in SpecifierSet(spec) if s.operator == ">=")  # noqa: E731
    assert lowest(str(core.specifier)) == lowest(runtime)


def test_an_older_python_gets_one_line(tmp_path: Path) -> None:
    """The package's first statement refuses an older Python in one line: as the command, exit 2 and no
    traceback; imported as a library, an ImportError that says the same."""
    old = next(
        (p for p in (Path("/usr/bin/python3.11"), *Path.home().glob(".pyenv/versions/3.1[01]*/bin/python3"))
         if p.is_file()),
        None,
    )  # fmt: skip
    if old is None:  # pragma: no cover - these machines have one
        raise AssertionError("no Python < 3.12 on this machine to try")
    src = REPO / "src"
    cli = tmp_path / "fleetops"  # what pip's console script does, under that Python
    cli.write_text(f"#!{old}\nimport sys\nsys.path.insert(0, {str(src)!r})\nfrom fleetops.cli import main\n")
    cli.chmod(0o755)
    proc = subprocess.run([str(cli), "scan"], capture_output=True, text=True, timeout=30)
    version = subprocess.run([str(old), "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert proc.stderr == f"fleetops: error: fleetops needs Python >= 3.12; {old} is Python {version}\n"
    lib = subprocess.run(
        [str(old), "-c", f"import sys; sys.path.insert(0, {str(src)!r}); import fleetops.api"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert lib.returncode == 1
    assert (
        lib.stderr.splitlines()[-1]
        == f"ImportError: fleetops needs Python >= 3.12; {old} is Python {version}"
    )


def test_the_changelogs_latest_release_is_galaxy_ymls_version() -> None:
    changelog = yaml.safe_load((REPO / "changelogs" / "changelog.yaml").read_text())
    releases = sorted(changelog["releases"], key=Version)
    assert releases[-1] == str(_version())
    # CHANGELOG.md is antsibull-changelog's rendering of changelog.yaml (markdown-escaped: ## v0\.1\.0)
    heading = "## v" + str(_version()).replace(".", "\\.")
    assert heading in (REPO / "CHANGELOG.md").read_text().splitlines()


def test_the_changelog_config_takes_the_fragments_helpers_write(tmp_path: Path) -> None:
    """A fragment of minor_changes, bugfixes, security_fixes and breaking_changes lints clean; a section
    the config does not know is refused (make lint runs `antsibull-changelog lint` on the real ones)."""
    shutil.copytree(REPO / "changelogs", tmp_path / "changelogs")
    shutil.copy(REPO / "galaxy.yml", tmp_path / "galaxy.yml")
    fragment = tmp_path / "changelogs" / "fragments" / "helper.yml"
    fragment.write_text(
        "minor_changes:\n  - One sentence.\nbugfixes:\n  - Another.\n"
        "security_fixes:\n  - A third.\nbreaking_changes:\n  - A fourth.\n"
    )
    lint = [str(Path(sys.executable).parent / "antsibull-changelog"), "lint"]
    ok = subprocess.run(lint, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (ok.returncode, ok.stdout) == (0, ""), ok
    fragment.write_text("changes:\n  - Not a section.\n")
    bad = subprocess.run(lint, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "invalid section: changes" in bad.stdout, bad
