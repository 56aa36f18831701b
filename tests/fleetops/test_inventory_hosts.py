"""load_hosts against real inventories on disk, resolved by the venv's real ansible-inventory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetops.ansible.inventory import InventoryHost, ansible_inventory_bin, hosts_from_list, load_hosts
from fleetops.errors import UsageError

INVENTORY = """\
all:
  vars:
    ansible_connection: local
  children:
    gpu:
      hosts:
        gpu-1: {ec2_az: us-east-1a}
        gpu-2: {ec2_az: us-east-1b, fleetops_az: ignored-when-ec2_az-is-set}
        gpu-10: {fleetops_az: lab-az-2}
        gpu-3:
      vars:
        rack: r1
    cpu:
      hosts:
        cpu-1:
          ec2_az: us-east-1a
          rack: r7
        cpu-2:
"""


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "hosts.yml"
    path.write_text(INVENTORY)
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "cpu-2.yml").write_text("fleetops_az: from-host-vars\n")
    return path


def by_name(hosts: list[InventoryHost]) -> dict[str, InventoryHost]:
    return {h.name: h for h in hosts}


def test_the_venv_ansible_inventory_is_used() -> None:
    assert ansible_inventory_bin().is_file()


def test_default_group_key_is_ec2_az_then_fleetops_az(inventory: Path) -> None:
    hosts = by_name(load_hosts([inventory], None, None))
    assert set(hosts) == {"gpu-1", "gpu-2", "gpu-3", "gpu-10", "cpu-1", "cpu-2"}
    assert (hosts["gpu-1"].group, hosts["gpu-1"].group_var) == ("us-east-1a", "ec2_az")
    assert (hosts["gpu-2"].group, hosts["gpu-2"].group_var) == ("us-east-1b", "ec2_az")
    assert (hosts["gpu-10"].group, hosts["gpu-10"].group_var) == ("lab-az-2", "fleetops_az")
    assert (hosts["gpu-3"].group, hosts["gpu-3"].group_var) == (None, None)
    assert hosts["cpu-2"].group == "from-host-vars"  # host_vars/ beside the inventory count
    assert hosts["gpu-3"].hostvars["rack"] == "r1"  # group vars merged in
    assert hosts["gpu-3"].hostvars["ansible_connection"] == "local"


def test_group_by_a_chosen_hostvar(inventory: Path) -> None:
    hosts = by_name(load_hosts([inventory], None, "rack"))
    assert hosts["gpu-1"].group == "r1"
    assert hosts["cpu-1"].group == "r7"
    assert hosts["cpu-2"].group is None  # no rack: the planner calls it "ungrouped"
    assert hosts["cpu-1"].group_var == "rack"


def test_limit_is_applied_by_ansible(inventory: Path) -> None:
    assert sorted(h.name for h in load_hosts([inventory], "gpu:!gpu-1*", None)) == ["gpu-2", "gpu-3"]
    assert [h.name for h in load_hosts([inventory], "cpu-2", None)] == ["cpu-2"]
    assert sorted(h.name for h in load_hosts([inventory], "gpu[0:1]", None)) == ["gpu-1", "gpu-2"]


def test_limit_that_matches_nothing_gives_no_hosts(inventory: Path) -> None:
    assert load_hosts([inventory], "nothing-here", None) == []


def test_several_inventories_merge(inventory: Path, tmp_path: Path) -> None:
    extra = tmp_path / "extra.ini"
    extra.write_text("[web]\nweb-1 ec2_az=us-east-1c\n")
    hosts = by_name(load_hosts([inventory, extra], None, None))
    assert hosts["web-1"].group == "us-east-1c"
    assert len(hosts) == 7


def test_missing_inventory_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"inventory not found: .*/nope\.yml"):
        load_hosts([tmp_path / "nope.yml"], None, None)
    with pytest.raises(UsageError, match="no inventory given"):
        load_hosts([], None, None)


def test_unparsable_inventory_is_a_usage_error_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("all:\n  hosts: [oops\n")
    with pytest.raises(UsageError) as info:
        load_hosts([bad], None, None)
    msg = str(info.value)
    assert msg.startswith("Failed to read inventory: ")
    assert "\n" not in msg
    assert "bad.yml" in msg


def test_templated_group_key_is_a_usage_error(tmp_path: Path) -> None:
    inv = tmp_path / "t.yml"
    inv.write_text('all:\n  hosts:\n    h1:\n      ec2_az: "{{ region }}a"\n')
    with pytest.raises(UsageError, match=r"host h1: ec2_az is a template"):
        load_hosts([inv], None, None)


def test_non_scalar_group_key_is_a_usage_error(tmp_path: Path) -> None:
    inv = tmp_path / "t.yml"
    inv.write_text("all:\n  hosts:\n    h1:\n      ec2_az: [a, b]\n")
    with pytest.raises(UsageError, match="host h1: ec2_az must be a string to group by, got list"):
        load_hosts([inv], None, None)


def test_numbers_group_as_text(tmp_path: Path) -> None:
    inv = tmp_path / "t.yml"
    inv.write_text("all:\n  hosts:\n    h1:\n      fleetops_az: 3\n")
    assert load_hosts([inv], None, None) == [InventoryHost("h1", "3", "fleetops_az")]


def test_hosts_from_list_reads_every_group_and_the_hostvars() -> None:
    data = {
        "_meta": {"hostvars": {"a": {"ec2_az": "z1"}, "orphan": {"fleetops_az": "z2"}}},
        "all": {"children": ["ungrouped", "g"]},
        "g": {"hosts": ["a", "b"]},
        "ungrouped": {"hosts": ["c"]},
    }
    hosts = hosts_from_list(data)
    assert [(h.name, h.group) for h in hosts] == [("a", "z1"), ("b", None), ("c", None), ("orphan", "z2")]


def test_plugin_strings_marked_unsafe_are_read_as_plain_values() -> None:
    from fleetops.ansible.listing import unwrap_unsafe as _unwrap_unsafe

    text = '{"h": {"ec2_az": {"__ansible_unsafe": "us-east-1a"}, "n": 1, "other": {"a": 1, "b": 2}}}'
    assert json.loads(text, object_hook=_unwrap_unsafe) == {
        "h": {"ec2_az": "us-east-1a", "n": 1, "other": {"a": 1, "b": 2}}
    }
