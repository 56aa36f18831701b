"""What every command parsed, from its kept copy (fleetops.ansible.parse_cache): ansible.builtin's routing table,
ansible's configuration definitions, the collection's code and constants. Each is what ansible's own parse
gives, read from a private file only, parsed as before whenever the copy cannot be trusted or read, and used
by a real command (the redirections still apply, the collection's modules run)."""

from __future__ import annotations

import json
import marshal
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import ansible
import pytest
from ansible.utils.collection_loader._collection_meta import _meta_yml_to_dict

from fleetops.ansible import parse_cache

RAW = (Path(ansible.__file__).parent / "config" / "ansible_builtin_runtime.yml").read_bytes()


class Parse:
    """ansible's parse, counted."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def __call__(self, data: Any, content_id: Any) -> Any:
        self.calls.append(content_id)
        return _meta_yml_to_dict(data, content_id)


def _copies(folder: Path) -> list[Path]:
    return sorted(folder.glob("ansible-builtin-runtime-*"))


def test_the_copy_is_the_parsed_table_and_the_second_read_parses_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    parse = Parse()
    read = parse_cache.cached(parse, folder)
    first = read(RAW, parse_cache.BUILTIN)
    assert first == _meta_yml_to_dict(RAW, None) and parse.calls == [parse_cache.BUILTIN]
    (copy,) = _copies(folder)
    assert oct(copy.stat().st_mode & 0o777) == "0o600" and oct(folder.stat().st_mode & 0o777) == "0o700"
    second = read(RAW, parse_cache.BUILTIN)
    assert second == first and parse.calls == [parse_cache.BUILTIN]  # from the copy
    assert second["import_redirection"]["ansible.module_utils.known_hosts"]["redirect"].startswith(
        "ansible_collections.community.general."
    )
    # another ansible-core's table is another copy, parsed; it replaces the older one
    other = RAW.replace(b"# test entry", b"# test entry, changed")
    read(other, parse_cache.BUILTIN)
    assert len(parse.calls) == 2 and len(_copies(folder)) == 1 and _copies(folder) != [copy]


def test_other_collections_are_parsed_as_before(tmp_path: Path) -> None:
    parse = Parse()
    read = parse_cache.cached(parse, tmp_path)
    assert read(b"plugin_routing: {}\n", ("fleetops.node", "runtime.yml")) == {"plugin_routing": {}}
    assert parse.calls == [("fleetops.node", "runtime.yml")] and _copies(tmp_path) == []


@pytest.mark.parametrize("attack", ["file-writable", "folder-writable", "symlink", "corrupt", "not-a-dict"])
def test_a_copy_that_cannot_be_trusted_is_not_read(tmp_path: Path, attack: str) -> None:
    """The table decides where imports go: a copy another user could have written, a link, or one that is
    not a table is ignored and the YAML parsed (a corrupt or foreign one of ours is written again)."""
    folder = tmp_path / "cache"
    parse_cache.cached(Parse(), folder)(RAW, parse_cache.BUILTIN)
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
    table = parse_cache.cached(parse, folder)(RAW, parse_cache.BUILTIN)
    assert parse.calls == [parse_cache.BUILTIN]
    assert table == _meta_yml_to_dict(RAW, None)
    if attack in ("corrupt", "not-a-dict"):  # ours, private: written again, read next time
        assert json.loads(copy.read_bytes()) == table


def test_the_cache_folder_is_xdgs_and_none_without_a_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert parse_cache.cache_dir() == tmp_path / "xdg" / "fleetops"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # the XDG spec: ignored
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert parse_cache.cache_dir() == tmp_path / "home" / ".cache" / "fleetops"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setattr(os.path, "expanduser", lambda path: path)  # no home: "~" stays "~"
    assert parse_cache.cache_dir() is None
    parse = Parse()
    monkeypatch.chdir(tmp_path)
    assert parse_cache.cached(parse)(RAW, parse_cache.BUILTIN) == _meta_yml_to_dict(RAW, None)
    assert parse.calls == [parse_cache.BUILTIN] and sorted(p.name for p in tmp_path.iterdir()) == []


def test_no_cache_folder_is_no_copy_and_no_error(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the folder would be
    parse = Parse()
    table = parse_cache.cached(parse, blocked / "fleetops")(RAW, parse_cache.BUILTIN)
    assert table == _meta_yml_to_dict(RAW, None) and parse.calls == [parse_cache.BUILTIN]


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


# ------------------------------------------------------------- ansible's configuration definitions


BASE = Path(ansible.__file__).parent / "config" / "base.yml"


def test_the_configuration_definitions_are_ansibles_and_read_from_the_copy(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from ansible.config.manager import ConfigManager
    from ansible.module_utils.common.yaml import yaml_load

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls: list[Any] = []

    def read(manager: Any, yml_file: Any) -> Any:
        calls.append(yml_file)
        return ConfigManager._read_config_yaml_file(manager, yml_file)

    kept = parse_cache._definitions(read)
    first = kept(None, str(BASE).encode())
    second = kept(None, str(BASE).encode())
    assert first == second == yaml_load(BASE.read_bytes()) and len(calls) == 1
    assert first["DEFAULT_FORKS"]["default"] == 5
    (copy,) = (tmp_path / "fleetops").glob("ansible-config-*")
    assert oct(copy.stat().st_mode & 0o777) == "0o600"
    # a definitions file that is not there: ansible's own error, nothing kept
    with pytest.raises(Exception, match="Missing base YAML definition file"):
        kept(None, str(tmp_path / "nowhere.yml").encode())


# ------------------------------------------------------------------- the collection's code, constants


CODE = """
import json, sys
from fleetops.ansible import collection
health = collection.module_utils("health")
print(json.dumps({"detectors": list(health.DETECTORS), "file": health.__file__,
                  "ttl": collection.constant("lease", "DEFAULT_TTL_S")}))
"""


def _run(code: str, env: dict[str, str], *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_the_collections_code_and_constants_are_kept_once_and_follow_an_edit(tmp_path: Path) -> None:
    """Two processes import the collection's health module and read a constant: the first keeps the code of
    every collection module it imported and the lease module's constants, the second reads them (the same
    results); an edited module is compiled again and its copy replaces the older."""
    from fleetops.ansible import collection

    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    folder = tmp_path / "fleetops"
    first = _run(CODE, env)
    codes = {p: p.stat().st_mtime_ns for p in folder.glob("code-*")}
    (constants,) = folder.glob("constants-*")
    assert len(codes) >= 2  # health and what it imports
    assert _run(CODE, env) == first
    assert {p: p.stat().st_mtime_ns for p in folder.glob("code-*")} == codes  # read, not written again
    assert first["ttl"] == collection.constant("lease", "DEFAULT_TTL_S")
    assert first["detectors"] == list(collection.module_utils("health").DETECTORS)
    kept = [p for p in codes if marshal.loads(p.read_bytes()).co_filename == first["file"]]
    assert len(kept) == 1
    source = Path(first["file"]).read_bytes()
    assert marshal.loads(kept[0].read_bytes()) == compile(source, first["file"], "exec", dont_inherit=True)
    assert marshal.loads(constants.read_bytes())["DEFAULT_TTL_S"] == first["ttl"]


def test_a_kept_copy_is_derived_again_when_it_is_not_what_was_kept(tmp_path: Path) -> None:
    derived: list[int] = []

    def derive() -> dict[str, Any]:
        derived.append(1)
        return {"a": (1, 2), "b": frozenset({"x"})}

    value = parse_cache.keep("t", "src", b"raw", derive, marshal.dumps, marshal.loads, tmp_path)
    (copy,) = tmp_path.glob("t-*")
    assert parse_cache.keep("t", "src", b"raw", derive, marshal.dumps, marshal.loads, tmp_path) == value
    assert len(derived) == 1
    copy.write_bytes(b"\x00garbage")  # marshal refuses it: derived again, kept again
    assert parse_cache.keep("t", "src", b"raw", derive, marshal.dumps, marshal.loads, tmp_path) == value
    assert len(derived) == 2 and marshal.loads(copy.read_bytes()) == value
    # what does not read back as it was is not kept
    parse_cache.keep(
        "u", "src", b"raw", lambda: {1: "int key"}, parse_cache._json_dump, parse_cache._json_dict, tmp_path
    )
    assert list(tmp_path.glob("u-*")) == []


def test_past_the_cap_the_oldest_copies_go_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(parse_cache, "MAX_COPIES", 3)
    other = tmp_path / "collections-index.json"  # not a copy: the folder is shared
    other.write_text("{}")
    for n in range(5):
        parse_cache.keep("t", f"src{n}", b"raw", lambda: {"n": 1}, marshal.dumps, marshal.loads, tmp_path)
        os.utime(next(tmp_path.glob(f"t-{parse_cache.hashlib.sha256(f'src{n}'.encode()).hexdigest()[:16]}-*")),
                 ns=(n * 10**9, n * 10**9))  # fmt: skip
    left = sorted(tmp_path.glob("t-*"))
    assert len(left) == 3 and other.exists()
    kept_sources = {p.name.split("-")[1] for p in left}
    assert kept_sources == {
        parse_cache.hashlib.sha256(f"src{n}".encode()).hexdigest()[:16] for n in (2, 3, 4)
    }
