"""The in-process inventory listing (``fleetops.ansible.listing``) against the venv's real
``ansible-inventory --list`` on real inventories: YAML and INI with group_vars and host_vars, a folder of
both, several sources, limits, and the collection's ``fleetops.node.ec2`` plugin against a real
moto_server (loopback only). Then what it keeps across commands, and what it leaves as it found it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from fleetops.ansible import inventory as inventory_mod
from fleetops.ansible import listing
from fleetops.ansible.runner import ansible_env
from fleetops.errors import UsageError
from fleetops_lab.ec2sim import MotoServer, launch_many
from tests.fleetops.test_inventory_hosts import INVENTORY

INI = """\
[web]
web-1 ec2_az=us-east-1c port_list="[1, 2]"
web-2 ansible_host=10.0.0.2

[db:children]
web

[db:vars]
tier=data
"""


def _plainly_imported() -> dict[str, object]:
    return {
        n: m
        for n, m in sys.modules.items()
        if n == "ansible_collections" or n.startswith("ansible_collections.")
    }


@pytest.fixture(autouse=True, scope="module")
def as_in_a_fleetops_process() -> Iterator[None]:
    """The in-process listing needs what a `fleetops` process has: no collection imported before ansible's
    collection finder (it rightly falls back to ansible-inventory otherwise: a test of its own says so).
    Other test modules of this pytest process import ``ansible_collections.*`` through pytest's pythonpath,
    with no finder; so these tests set those imports aside, and after them take the finder away and put
    the imports back, as the other modules had them."""
    from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder

    saved = _plainly_imported() if _AnsibleCollectionFinder._find_existing_finder() is None else {}
    for name in saved:
        del sys.modules[name]
    listing.forget()
    yield
    if saved:
        _AnsibleCollectionFinder._remove()
        for name in _plainly_imported():
            del sys.modules[name]
        sys.modules.update(saved)  # type: ignore[arg-type]
    listing.forget()


def _subprocess(inventories: list[Path], limit: str | None) -> dict[str, object]:
    return inventory_mod._run_ansible_inventory(inventories, limit)


def _in_process(inventories: list[Path], limit: str | None) -> dict[str, object]:
    found = listing.parsed(inventories)
    assert found is not None, "this checkout lists in process"
    return found.list(limit)


@pytest.fixture
def static(tmp_path: Path) -> list[Path]:
    (tmp_path / "hosts.yml").write_text(INVENTORY)
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "cpu-2.yml").write_text(
        "fleetops_az: from-host-vars\nnested: {a: [1, {b: c}]}\n"
    )
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "gpu.yml").write_text("gpu_driver: '550'\ntemplated: '{{ rack }}-x'\n")
    (tmp_path / "web.ini").write_text(INI)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.yml").write_text(
        "all:\n  children:\n    edge:\n      hosts:\n        edge-1: {fleetops_az: z1}\n"
    )
    (folder / "b.ini").write_text("[edge]\nedge-2\n[core]\ncore-1\n")
    (folder / "group_vars").mkdir()
    (folder / "group_vars" / "all.yml").write_text("site: folder\n")
    return [tmp_path / "hosts.yml", tmp_path / "web.ini", folder]


@pytest.mark.parametrize(
    "limit", [None, "gpu", "gpu:!gpu-1*", "cpu-2", "gpu[0:1]", "web:&db", "nothing-here", "edge,core-1"]
)
def test_the_listing_is_ansible_inventorys(static: list[Path], limit: str | None) -> None:
    for sources in ([static[0]], [static[1]], [static[2]], static):
        assert _in_process(sources, limit) == _subprocess(sources, limit), (sources, limit)


def test_a_limit_file_is_ansible_inventorys(static: list[Path], tmp_path: Path) -> None:
    limit = tmp_path / "limit"
    limit.write_text("gpu-1\ncpu-1\nweb-2\n")
    assert _in_process(static, f"@{limit}") == _subprocess(static, f"@{limit}")


def test_a_static_inventory_is_parsed_once_until_a_file_changes(static: list[Path]) -> None:
    listing.forget()
    first = listing.parsed(static)
    assert listing.parsed(static) is first
    assert listing.parsed(static[:1]) is not first  # other sources, another parse
    host_vars = static[0].parent / "host_vars" / "cpu-2.yml"
    host_vars.write_text("fleetops_az: changed\n")
    os.utime(host_vars, ns=(1, 1))  # a different mtime whatever the clock's tick
    again = listing.parsed(static)
    assert again is not first
    hosts = {h.name: h for h in inventory_mod.load_hosts(static)}
    assert hosts["cpu-2"].group == "changed"


def test_an_unparsable_source_is_one_line_naming_it(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("all:\n  hosts: [oops\n")
    with pytest.raises(UsageError) as info:
        _in_process([bad], None)
    msg = str(info.value)
    assert msg.startswith("Failed to read inventory: ") and "\n" not in msg and "bad.yml" in msg
    assert capfd.readouterr().err == ""  # ansible's warnings are the message, not printed


def test_listing_leaves_the_environment_as_ansible_env_sets_it(static: list[Path]) -> None:
    """The listing sets this checkout's ANSIBLE_* settings (what every ansible-runner call gets anyway)
    and changes nothing else; ansible_env gives the same settings after it (no path added twice)."""
    before_env = ansible_env()
    _in_process(static, None)
    after = dict(os.environ)
    assert {k: v for k, v in ansible_env().items() if k.startswith("ANSIBLE_")} == {
        k: v for k, v in before_env.items() if k.startswith("ANSIBLE_")
    }
    _in_process(static, "gpu")
    assert dict(os.environ) == after


# --------------------------------------------------------------------------- EC2, against moto


@pytest.fixture(scope="module")
def moto() -> Iterator[str]:
    server = MotoServer()
    url = server.start()
    try:
        launch_many(url, "us-east-1", 6, per_reservation=3)
        yield url
    finally:
        server.stop()


def test_the_ec2_plugins_listing_is_ansible_inventorys(tmp_path: Path, moto: str) -> None:
    folder = tmp_path / "inventory"
    folder.mkdir()
    (folder / "hosts.yml").write_text("all:\n  hosts:\n    localhost:\n      ansible_connection: local\n")
    config = {
        "plugin": "fleetops.node.ec2",
        "regions": ["us-east-1"],
        "endpoint_url": moto,
        "aws_access_key": "testing",
        "aws_secret_key": "testing",
    }
    source = folder / "fleet.fleet_ec2.yml"
    source.write_text(yaml.safe_dump(config))
    listed = _in_process([folder], None)
    assert listed == _subprocess([folder], None)
    assert len(listed["_meta"]["hostvars"]) == 7  # type: ignore[index]
    zone = next(k for k in listed if k.startswith("az_"))
    assert _in_process([source], zone) == _subprocess([source], zone)
    # a plugin's source is listed again by every caller: its instances change without a file changing
    assert listing.parsed([folder]) is not listing.parsed([folder])


def test_a_scan_lists_its_inventory_without_ansible_inventory(static: list[Path]) -> None:
    """No ansible-inventory process: the scan's start (here: the listing a scan makes) runs none."""
    code = (
        "import subprocess, sys\n"
        "from pathlib import Path\n"
        "started = []\n"
        "real = subprocess.Popen.__init__\n"
        "def spy(self, args, *a, **k):\n"
        "    started.append(str(args[0] if isinstance(args, (list, tuple)) else args))\n"
        "    real(self, args, *a, **k)\n"
        "subprocess.Popen.__init__ = spy\n"
        "from fleetops.ansible.inventory import load_targets\n"
        "found = load_targets([Path(p) for p in sys.argv[1:]], 'gpu')\n"
        "assert sorted(h.name for h in found.hosts) == ['gpu-1', 'gpu-10', 'gpu-2', 'gpu-3'], found.hosts\n"
        "print(started)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, *map(str, static)], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "ansible-inventory" not in proc.stdout, proc.stdout


def test_a_rollouts_listings_parse_a_static_inventory_once(
    static: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listings of one rollout or pass (the plan's, with a --limit's second; each batch's gate scan;
    the group names) parse the inventory once; each is still the listing of its own limit."""
    listing.forget()
    parses: list[tuple[str, ...]] = []
    real = listing.Parsed.__init__

    def counted(self: listing.Parsed, sources: tuple[str, ...]) -> None:
        parses.append(tuple(sources))
        real(self, sources)

    monkeypatch.setattr(listing.Parsed, "__init__", counted)
    targets = inventory_mod.load_targets(static, "gpu")
    assert sorted(h.name for h in targets.hosts) == ["gpu-1", "gpu-10", "gpu-2", "gpu-3"]
    assert len(targets.every) == 11
    for batch in ("gpu-1", "gpu-2,gpu-3", "web"):
        names = [h.name for h in inventory_mod.load_hosts(static, batch)]
        assert names == [h.name for h in inventory_mod.hosts_from_list(_subprocess(static, batch))]
    assert "edge" in inventory_mod.load_groups(static)
    assert len(parses) == 1


def test_collections_imported_without_a_finder_list_through_ansible_inventory(static: list[Path]) -> None:
    """A process that imported the collection from its PYTHONPATH before any finder (ansible's loaders
    would refuse it there) lists with ansible-inventory, the same hosts, and its imports keep working."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "import ansible_collections.fleetops.node.plugins.module_utils.findings\n"
        "from fleetops.ansible import listing\n"
        "from fleetops.ansible.inventory import load_hosts\n"
        "assert listing.parsed([Path(sys.argv[1])]) is None\n"
        "print(sorted(h.name for h in load_hosts([Path(p) for p in sys.argv[1:]], 'gpu')))\n"
        "from fleetops.ansible.collection import load\n"
        "load('plugins.action.node_health')\n"
    )
    collections = Path(inventory_mod.__file__).resolve().parents[3] / "collections"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(collections), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code, *map(str, static)], capture_output=True, text=True,
                          timeout=120, env=env, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['gpu-1', 'gpu-10', 'gpu-2', 'gpu-3']"
