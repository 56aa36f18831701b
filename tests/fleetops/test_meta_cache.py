"""ansible.builtin's routing table from its JSON copy (fleetops.ansible.meta_cache): the same table ansible's
own parse gives, read from a private file only, parsed as before whenever the copy cannot be trusted or
read, and used by a real command (the redirections still apply)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import ansible
import pytest
from ansible.utils.collection_loader._collection_meta import _meta_yml_to_dict

from fleetops.ansible import meta_cache

RAW = (Path(ansible.__file__).parent / "config" / "ansible_builtin_runtime.yml").read_bytes()


class Parse:
    """ansible's parse, counted."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def __call__(self, data: Any, content_id: Any) -> Any:
        self.calls.append(content_id)
        return _meta_yml_to_dict(data, content_id)


def _copies(folder: Path) -> list[Path]:
    return sorted(folder.glob("ansible-builtin-runtime-*.json"))


def test_the_copy_is_the_parsed_table_and_the_second_read_parses_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    parse = Parse()
    read = meta_cache.cached(parse, folder)
    first = read(RAW, meta_cache.BUILTIN)
    assert first == _meta_yml_to_dict(RAW, None) and parse.calls == [meta_cache.BUILTIN]
    (copy,) = _copies(folder)
    assert oct(copy.stat().st_mode & 0o777) == "0o600" and oct(folder.stat().st_mode & 0o777) == "0o700"
    second = read(RAW, meta_cache.BUILTIN)
    assert second == first and parse.calls == [meta_cache.BUILTIN]  # from the copy
    assert second["import_redirection"]["ansible.module_utils.known_hosts"]["redirect"].startswith(
        "ansible_collections.community.general."
    )
    # another ansible-core's table is another file, parsed
    other = RAW.replace(b"# test entry", b"# test entry, changed")
    read(other, meta_cache.BUILTIN)
    assert len(parse.calls) == 2 and len(_copies(folder)) == 2


def test_other_collections_are_parsed_as_before(tmp_path: Path) -> None:
    parse = Parse()
    read = meta_cache.cached(parse, tmp_path)
    assert read(b"plugin_routing: {}\n", ("fleetops.node", "runtime.yml")) == {"plugin_routing": {}}
    assert parse.calls == [("fleetops.node", "runtime.yml")] and _copies(tmp_path) == []


@pytest.mark.parametrize("attack", ["file-writable", "folder-writable", "symlink", "corrupt", "not-a-dict"])
def test_a_copy_that_cannot_be_trusted_is_not_read(tmp_path: Path, attack: str) -> None:
    """The table decides where imports go: a copy another user could have written, a link, or one that is
    not a table is ignored and the YAML parsed (a corrupt or foreign one of ours is written again)."""
    folder = tmp_path / "cache"
    meta_cache.cached(Parse(), folder)(RAW, meta_cache.BUILTIN)
    (copy,) = _copies(folder)
    forged = {"import_redirection": {"ansible.module_utils.basic": {"redirect": "evil"}}}
    if attack == "file-writable":
        copy.write_text(json.dumps(forged))
        copy.chmod(0o622)
    elif attack == "folder-writable":
        copy.write_text(json.dumps(forged))
        folder.chmod(0o777)
    elif attack == "symlink":
        elsewhere = tmp_path / "forged.json"
        elsewhere.write_text(json.dumps(forged))
        copy.unlink()
        copy.symlink_to(elsewhere)
    elif attack == "corrupt":
        copy.write_bytes(b'{"import_redirection": ')
    else:
        copy.write_text("[]")
    parse = Parse()
    table = meta_cache.cached(parse, folder)(RAW, meta_cache.BUILTIN)
    assert parse.calls == [meta_cache.BUILTIN]
    assert table == _meta_yml_to_dict(RAW, None)
    if attack in ("corrupt", "not-a-dict"):  # ours, private: written again, read next time
        assert json.loads(copy.read_bytes()) == table


def test_the_cache_folder_is_xdgs_and_none_without_a_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert meta_cache.cache_dir() == tmp_path / "xdg" / "fleetops"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # the XDG spec: ignored
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert meta_cache.cache_dir() == tmp_path / "home" / ".cache" / "fleetops"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setattr(os.path, "expanduser", lambda path: path)  # no home: "~" stays "~"
    assert meta_cache.cache_dir() is None
    parse = Parse()
    monkeypatch.chdir(tmp_path)
    assert meta_cache.cached(parse)(RAW, meta_cache.BUILTIN) == _meta_yml_to_dict(RAW, None)
    assert parse.calls == [meta_cache.BUILTIN] and sorted(p.name for p in tmp_path.iterdir()) == []


def test_no_cache_folder_is_no_copy_and_no_error(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the folder would be
    parse = Parse()
    table = meta_cache.cached(parse, blocked / "fleetops")(RAW, meta_cache.BUILTIN)
    assert table == _meta_yml_to_dict(RAW, None) and parse.calls == [meta_cache.BUILTIN]


LISTED = """
import json, sys
from ansible.utils.collection_loader import _collection_finder
from fleetops.ansible import listing
parsed = listing.parsed([__import__("pathlib").Path(sys.argv[1])])
import ansible_collections.ansible.builtin as builtin
meta = builtin._collection_meta
print(json.dumps({"hosts": sorted(parsed.list(None)["_meta"]["hostvars"]),
                  "redirect": meta["import_redirection"]["ansible.module_utils.known_hosts"]["redirect"],
                  "wrapped": bool(getattr(_collection_finder._meta_yml_to_dict, "fleetops_cached", False))}))
"""


def test_a_real_listing_writes_the_copy_then_reads_it(tmp_path: Path) -> None:
    """Two processes list an inventory in process (ansible's finder installed as the CLIs install it): the
    first writes the copy to $XDG_CACHE_HOME/fleetops, the second reads it; both get ansible's table."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts: {h1: {a: 1}, h2: {a: 2}}\n")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    runs = []
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, "-c", LISTED, str(inventory)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        (copy,) = _copies(tmp_path / "xdg" / "fleetops")
        if not runs[1:]:
            written = copy.stat().st_mtime_ns
    assert copy.stat().st_mtime_ns == written  # read, not written again
    expected = _meta_yml_to_dict(RAW, None)["import_redirection"]["ansible.module_utils.known_hosts"][
        "redirect"
    ]
    assert runs[0] == runs[1] == {"hosts": ["h1", "h2"], "redirect": expected, "wrapped": True}
