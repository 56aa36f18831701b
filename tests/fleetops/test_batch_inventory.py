"""A rollout batch's own inventory (``fleetops.ansible.batch_inventory``): ansible reads from it, for the batch's
hosts, the variables and groups it reads from the whole inventory (group_vars, host_vars, nested groups, a host
variable over a group's); a real ansible-playbook run through the batch runner sees them, and only the batch's
hosts; wherever the listing could differ (a template, an odd name, a host missing), the whole inventory."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetops.ansible import batch_inventory, listing
from fleetops.rollout.batch import PlaybookBatchRunner
from tests.fleetops.test_inventory_listing import as_in_a_fleetops_process  # noqa: F401  (autouse)

HOSTS = [f"h{i}" for i in range(1, 9)]


def _inventory(tmp_path: Path, extra: dict[str, Any] | None = None) -> Path:
    folder = tmp_path / "inv"
    (folder / "group_vars").mkdir(parents=True)
    (folder / "host_vars").mkdir()
    hosts = {h: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable} for h in HOSTS}
    hosts["h2"]["tier"] = "host's own"  # over az_a's
    hosts.update(extra or {})
    data = {
        "all": {
            "hosts": hosts,
            "children": {
                "gpu": {"children": {"az_a": {"hosts": {h: {} for h in HOSTS[:4]}}, "az_b": None}},
                "az_b": {"hosts": {h: {} for h in HOSTS[4:]}, "vars": {"tier": "b", "n": 2}},
            },
        }
    }
    (folder / "hosts.yml").write_text(yaml.safe_dump(data))
    (folder / "group_vars" / "all.yml").write_text(
        "site: one\nlist: [1, 2]\nflag: 'yes'\nmode: '0755'\nnone: null\n"
    )
    (folder / "group_vars" / "az_a.yml").write_text("tier: a\nnested: {k: [x, y]}\n")
    (folder / "host_vars" / "h5.yml").write_text("site: five\n")
    return folder


def _listed(sources: list[Path], limit: str | None = None) -> dict[str, Any]:
    found = listing.parsed(sources)
    assert found is not None
    return found.list(limit)


def _membership(data: dict[str, Any]) -> dict[str, set[str]]:
    """Each host's groups, nested ones included (what ``group_names`` holds)."""
    parents: dict[str, set[str]] = {}
    for group, body in data.items():
        for child in body.get("children") or [] if isinstance(body, dict) else []:
            parents.setdefault(child, set()).add(group)
    out: dict[str, set[str]] = {}
    for group, body in data.items():
        if group in ("_meta", "all", "ungrouped") or not isinstance(body, dict):
            continue
        for host in body.get("hosts") or []:
            todo, seen = [group], set()
            while todo:
                g = todo.pop()
                if g not in seen and g != "all":
                    seen.add(g)
                    todo.extend(parents.get(g, ()))
            out.setdefault(host, set()).update(seen)
    return out


def test_ansible_reads_the_batch_hosts_variables_and_groups_as_from_the_whole_inventory(
    tmp_path: Path,
) -> None:
    inv = _inventory(tmp_path)
    batch = ["h2", "h5", "h6"]
    path = batch_inventory.write([inv], batch, tmp_path)
    assert path is not None and path.stat().st_mode & 0o077 == 0
    whole = _listed([inv], ",".join(batch))
    own = _listed([path])
    assert sorted(own["_meta"]["hostvars"]) == batch  # the batch's hosts only
    assert own["_meta"]["hostvars"] == whole["_meta"]["hostvars"]
    assert own["_meta"]["hostvars"]["h2"]["tier"] == "host's own"  # the precedence the inventory had
    assert own["_meta"]["hostvars"]["h5"]["site"] == "five"
    assert {k: own["_meta"]["hostvars"]["h6"][k] for k in ("flag", "mode", "none")} == {
        "flag": "yes",  # strings YAML 1.1 would read as a bool or a number stay strings
        "mode": "0755",
        "none": None,
    }
    assert (
        _membership(own)
        == _membership(whole)
        == {"h2": {"gpu", "az_a"}, "h5": {"gpu", "az_b"}, "h6": {"gpu", "az_b"}}
    )


PLAY = """\
- hosts: all
  gather_facts: false
  tasks:
    - name: Say what the play sees
      ansible.builtin.debug:
        msg: "{{ {'all': groups['all'] | length, 'groups': group_names | sort, 'tier': tier | default(''),
                  'site': site, 'nested': nested | default({})} | to_json }}"
"""


def _seen(tmp_path: Path, inv: Path, hosts: list[str], whole: bool) -> dict[str, Any]:
    playbook = tmp_path / "see.yml"
    playbook.write_text(PLAY)
    runner = PlaybookBatchRunner(str(playbook), [inv], whole_inventory=whole)
    run = runner(hosts, {}, check=False, on_result=None, cancel=None)
    assert run.status == "successful", run
    return {h: json.loads(run.results_for(h)[0].result["msg"]) for h in hosts}


def test_the_batch_runner_gives_ansible_playbook_the_batch_only_and_the_play_sees_the_same(
    tmp_path: Path,
) -> None:
    inv = _inventory(tmp_path)
    batch = ["h1", "h6"]
    own = _seen(tmp_path, inv, batch, whole=False)
    whole = _seen(tmp_path, inv, batch, whole=True)
    assert {h: s["all"] for h, s in own.items()} == {
        "h1": 2,
        "h6": 2,
    }  # ansible-playbook read the batch's hosts
    assert {h: s["all"] for h, s in whole.items()} == {"h1": 8, "h6": 8}
    for seen in (own, whole):
        for h in batch:
            seen[h].pop("all")
    assert own == whole
    assert own["h1"] == {"groups": ["az_a", "gpu"], "tier": "a", "site": "one", "nested": {"k": ["x", "y"]}}


def test_a_template_in_a_batch_hosts_variables_keeps_the_whole_inventory(tmp_path: Path) -> None:
    """ansible-inventory lists a ``!unsafe`` value as a plain string: written back, it would be templated."""
    templated = {"h9": {"ansible_connection": "local", "greeting": "{{ 'hi' }}"}}
    inv = _inventory(tmp_path, templated)
    assert batch_inventory.write([inv], ["h9"], tmp_path) is None
    assert batch_inventory.write([inv], ["h1"], tmp_path) is not None  # only the batch's hosts count
    seen = _seen(tmp_path, inv, ["h9"], whole=False)
    assert seen["h9"]["all"] == 9  # the runner gave ansible-playbook the whole inventory


@pytest.mark.parametrize(
    ("listed", "hosts"),
    [
        ({"_meta": {"hostvars": {"a": {}}}, "ungrouped": {"hosts": ["a"]}}, ["a", "b"]),  # b not listed
        ({"_meta": {"hostvars": {"a": {}, "b": {}}}, "ungrouped": {"hosts": ["a", "b"]}}, ["a"]),  # b extra
        ({"_meta": {"hostvars": {"a:22": {}}}, "ungrouped": {"hosts": ["a:22"]}}, ["a:22"]),  # a port
        ({"_meta": {"hostvars": {"a[1]": {}}}, "ungrouped": {"hosts": ["a[1]"]}}, ["a[1]"]),  # a range
        ({"_meta": {"hostvars": {"a": {"x": ["{% if 1 %}"]}}}, "ungrouped": {"hosts": ["a"]}}, ["a"]),
    ],
)
def test_a_listing_that_could_differ_is_no_batch_inventory(listed: dict[str, Any], hosts: list[str]) -> None:
    assert batch_inventory.document(listed, hosts) is None


def test_an_ungrouped_host_stays_ungrouped(tmp_path: Path) -> None:
    listed = {
        "_meta": {"hostvars": {"a": {"v": 1}}},
        "all": {"children": ["ungrouped"]},
        "ungrouped": {"hosts": ["a"]},
    }
    doc = batch_inventory.document(listed, ["a"])
    assert doc == {"all": {"hosts": {"a": {"v": 1}}}}
    path = tmp_path / "one.yml"
    path.write_text(yaml.safe_dump(doc))
    assert _listed([path])["ungrouped"] == {"hosts": ["a"]}
