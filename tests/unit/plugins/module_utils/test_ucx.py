"""ucx_mmap_hooks on real captures: a lab host running the real UCX 1.22 (libucx-cu12) under systemd."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.fleetops.node.plugins.module_utils import ucx
from ansible_collections.fleetops.node.plugins.module_utils.procs import parse_cgroup_unit
from ansible_collections.fleetops.node.plugins.module_utils.systemd import parse_show

from tests.localrun import run_command
from tests.paths import FIXTURES

FIXTURES = FIXTURES / "ucx"
LIBDIR = "/opt/fleetops-lab/ucx/site-packages/libucx/lib"
HOOK, RCACHE = ucx.HOOK_VAR, ucx.RCACHE_VAR


def _read(name: str) -> str:
    return (FIXTURES / name).read_text()


def _bytes(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


# ------------------------------------------------------------------------------------- parsers


def test_finds_the_wheel_libraries_in_a_real_worker() -> None:
    assert ucx.find_ucx_libraries(_bytes("worker_maps.txt")) == [
        f"{LIBDIR}/libucm.so.0",
        f"{LIBDIR}/libucs.so.0",
    ]


def test_finds_renamed_wheel_copies() -> None:
    assert ucx.find_ucx_libraries(_bytes("renamed_wheel_maps.txt")) == [
        "/tmp/ucxdev/site/nixl.libs/libucs-3d5b2c1a.so.0.0.0",
        "/tmp/ucxdev/site/nixl.libs/libucm-e091ff91.so.0.0.0",
    ]


def test_either_core_library_alone_is_a_hit() -> None:
    maps = _bytes("worker_maps.txt").splitlines(keepends=True)
    only_ucm = b"".join(line for line in maps if b"/libucs" not in line)
    only_ucs = b"".join(line for line in maps if b"/libucm" not in line)
    assert ucx.find_ucx_libraries(only_ucm) == [f"{LIBDIR}/libucm.so.0"]
    assert ucx.find_ucx_libraries(only_ucs) == [f"{LIBDIR}/libucs.so.0"]


def test_deleted_libraries_are_still_found_without_the_marker() -> None:
    found = ucx.find_ucx_libraries(_bytes("deleted_library_maps.txt"))
    assert found == ["/tmp/ucxdev/del/libucs.so.0", "/tmp/ucxdev/del/libucm.so.0"]


def test_no_ucx_no_hit() -> None:
    assert ucx.find_ucx_libraries(_bytes("python_no_ucx_maps.txt")) == []
    # libucp, libuct and the transport modules alone are not the core libraries the hooks live in
    others = b"".join(
        line
        for line in _bytes("worker_maps.txt").splitlines(keepends=True)
        if b"/libucm" not in line and b"/libucs" not in line
    )
    assert b"libucp.so.0" in others and b"libuct_cma.so.0" in others
    assert ucx.find_ucx_libraries(others) == []


def test_environ_keeps_ucx_variables_only() -> None:
    assert ucx.parse_environ(_bytes("worker_environ.bin")) == {}  # systemd started it: defaults
    env = ucx.parse_environ(_bytes("environ_quoting.bin"), names=("A", "C", "D", "E", "F", "H"))
    assert env == {
        "A": "x y",
        "C": 'q"uote',
        "D": "back\\slash",
        "E": "dollar$HOME",
        "F": "per%cent",
        "H": "tab\tX",
    }
    assert ucx.parse_environ(b"UCX_MEM_MMAP_HOOK_MODE=none\0HOME=/root\0PATH=/bin\0") == {
        HOOK: "none",
        "HOME": "/root",
    }


def test_unit_environment_as_systemctl_show_prints_it() -> None:
    (block,) = parse_show(_read("systemctl_show_environment_quoting.txt"))
    # what systemd 252 printed, against what the process really got (environ_quoting.bin)
    environ = ucx.parse_environ(_bytes("environ_quoting.bin"), names=tuple("ABCDEFGH"))
    assert ucx.parse_unit_environment(block["Environment"]) == environ
    worker, _ssh = parse_show(_read("systemctl_show_worker.txt"))
    assert ucx.parse_unit_environment(worker["Environment"]) == {}
    (fixed,) = parse_show(_read("systemctl_show_worker_fixed.txt"))
    assert fixed["Id"] == "ucx-worker.service"
    assert ucx.parse_unit_environment(fixed["Environment"]) == {HOOK: "none"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (_read("worker_cgroup.txt"), ("ucx-worker.service", "system", "/system.slice/ucx-worker.service")),
        (_read("cgroup_lab_service.txt"), ("envprobe.service", "system", "/system.slice/envprobe.service")),
        # The layouts systemd gives other owners (src/basic/cgroup-util.c), written by hand:
        (
            "0::/user.slice/user-1000.slice/user@1000.service/app.slice/vllm.service\n",
            ("vllm.service", "user", "/user.slice/user-1000.slice/user@1000.service/app.slice/vllm.service"),
        ),
        (
            "0::/system.slice/docker-4f1c2d3e.scope\n",
            ("docker-4f1c2d3e.scope", "system", "/system.slice/docker-4f1c2d3e.scope"),
        ),
        (
            "12:memory:/\n1:name=systemd:/system.slice/worker.service\n",
            ("worker.service", "system", "/system.slice/worker.service"),
        ),
        ("0::/kubepods/burstable/pod1234/abcdef\n", (None, None, "/kubepods/burstable/pod1234/abcdef")),
        ("0::/\n", (None, None, None)),
    ],
)
def test_owning_unit_from_cgroup(text: str, expected: tuple[Any, ...]) -> None:
    assert parse_cgroup_unit(text) == expected


def test_ucx_info_and_version_sources() -> None:
    assert ucx.parse_ucx_info_version(_read("ucx_info_v.txt")) == "1.22.0"
    assert ucx.parse_pkgconfig_version(_read("wheel/ucx.pc")) == "1.22.0"
    assert ucx.parse_version(_read("wheel/UCX_WHEEL_VERSION.txt")) == (1, 22, 0)
    assert ucx.parse_version("1.20") == (1, 20, 0)
    assert ucx.parse_version("garbage") is None
    assert ucx.version_from_path("/opt/ucx-1.19.0/lib") == "1.19.0"
    assert ucx.version_from_path("/opt/conda/pkgs/ucx-1.15.0-h1234/lib") == "1.15.0"
    assert ucx.version_from_path("/usr/local/ucx/1.20.1/lib") == "1.20.1"
    assert ucx.version_from_path(LIBDIR) is None
    assert ucx.version_from_path("/opt/hpcx-v2.18-gcc/ucx/lib") is None  # an HPC-X version, not UCX's


def test_ucx_defaults_are_what_real_ucx_reports() -> None:
    # UCX 1.22 printed its own configuration (no UCX_* in its environment)
    printed = ucx.parse_ucx_conf(_read("worker_ucx_config.txt"))
    assert {name: printed[name] for name in ucx.VARIABLES} == ucx.UCX_DEFAULTS


def test_ucx_conf_global_settings_only() -> None:
    wheel_conf = _read("wheel/ucx.conf")
    assert "[Grace Hopper]" in wheel_conf
    assert ucx.parse_ucx_conf(wheel_conf) == {}  # everything in it is for Grace CPUs only
    conf = "# site\nUCX_MEM_MMAP_HOOK_MODE = none\nUCX_TLS=tcp\n\n" + wheel_conf
    assert ucx.parse_ucx_conf(conf) == {HOOK: "none", "UCX_TLS": "tcp"}


@pytest.mark.parametrize(
    ("value", "bounded"),
    [
        ("inf", False),
        ("INF", False),
        ("infinity", False),
        ("", False),
        ("1024", True),
        ("1K", True),
        ("0", True),
        ("lots", False),
    ],
)
def test_rcache_bound(value: str, bounded: bool) -> None:
    assert ucx.rcache_is_bounded(value) is bounded


def test_hooks() -> None:
    assert ucx.hooks_are_on("bistro") and ucx.hooks_are_on("reloc")
    assert not ucx.hooks_are_on("none") and not ucx.hooks_are_on("NONE ")


# ------------------------------------------------------------------------------------- policy


def _vars(hook: str = "bistro", rcache: str = "inf") -> dict[str, dict[str, Any]]:
    return ucx.effective_values({HOOK: hook, RCACHE: rcache}, None, {})


@pytest.mark.parametrize(
    ("version", "variables", "growing", "expected"),
    [
        ("1.19.0", _vars(), None, "warning"),
        ("1.19.0", _vars(), {"anon_mb_per_min": 400.0}, "critical"),
        ("1.20.9", _vars(), None, "warning"),
        (None, _vars(), None, "warning"),  # unknown: cannot rule the leak out
        (None, _vars(), {"anon_mb_per_min": 400.0}, "critical"),
        ("1.21.0", _vars(), None, "info"),  # openucx/ucx#11248
        ("1.22.0", _vars(), {"anon_mb_per_min": 400.0}, "info"),  # growing, but not this cause
        ("1.19.0", _vars(hook="none"), {"anon_mb_per_min": 400.0}, None),
        ("1.19.0", _vars(rcache="1024"), None, None),
        ("1.16.0", _vars(hook="reloc"), None, "warning"),
    ],
)
def test_version_aware_policy(
    version: str | None, variables: dict[str, Any], growing: dict[str, Any] | None, expected: str | None
) -> None:
    assert ucx.classify(version, variables, growing)[0] == expected


def test_effective_values_and_where_they_come_from() -> None:
    # the process got it from its unit
    v = ucx.effective_values({HOOK: "none"}, {HOOK: "none"}, {})
    assert v[HOOK] == {"value": "none", "source": "unit", "environ": "none", "unit": "none"}
    assert v[RCACHE] == {"value": "inf", "source": "default", "environ": None, "unit": None}
    # the unit says none, the running process still has the default: a restart is pending
    v = ucx.effective_values({}, {HOOK: "none"}, {})
    assert v[HOOK]["value"] == "bistro" and v[HOOK]["source"] == "default" and v[HOOK]["unit"] == "none"
    # set by something else than the unit (a wrapper script, EnvironmentFile=)
    assert ucx.effective_values({HOOK: "reloc"}, {}, {})[HOOK]["source"] == "environ"
    # environ unreadable: the unit's Environment= stands in
    assert ucx.effective_values(None, {RCACHE: "1024"}, {})[RCACHE]["source"] == "unit"
    # a config file, and the environment beating it
    v = ucx.effective_values({}, None, {HOOK: "none"}, {HOOK: "/etc/ucx/ucx.conf"})
    assert v[HOOK] == {
        "value": "none",
        "source": "file",
        "environ": None,
        "unit": None,
        "file": "/etc/ucx/ucx.conf",
    }
    assert ucx.effective_values({HOOK: "bistro"}, None, {HOOK: "none"})[HOOK]["value"] == "bistro"


# ------------------------------------------------------------------------------------- collect


def _fake_proc(
    tmp_path: Path,
    *,
    pc_version: str = "1.22.0",
    environ: bytes | None = None,
    show: str | None = None,
) -> tuple[Path, Path, Any]:
    """A /proc tree holding the real lab captures for pid 105, with the wheel's files under its root."""
    proc = tmp_path / "proc"
    pid = proc / "105"
    pid.mkdir(parents=True)
    (pid / "maps").write_bytes(_bytes("worker_maps.txt"))
    (pid / "cgroup").write_bytes(_bytes("worker_cgroup.txt"))
    (pid / "environ").write_bytes(_bytes("worker_environ.bin") if environ is None else environ)
    (pid / "comm").write_text("python3\n")
    (pid / "cmdline").write_bytes(b"/usr/bin/python3\0/usr/local/libexec/fleetops-lab/worker.py\0")
    kthread = proc / "2"
    kthread.mkdir()
    (kthread / "maps").write_bytes(b"")
    other = proc / "300"
    other.mkdir()
    (other / "maps").write_bytes(_bytes("python_no_ucx_maps.txt"))
    # another mount namespace than "self" (absent here): files are read through /proc/PID/root
    lib = pid / "root" / LIBDIR.lstrip("/")
    (lib / "pkgconfig").mkdir(parents=True)
    (lib / "pkgconfig" / "ucx.pc").write_text(_read("wheel/ucx.pc").replace("1.22.0", pc_version))
    shutil.copy(FIXTURES / "wheel" / "ucx.conf", lib.parent / "ucx.conf")
    systemd_dir = tmp_path / "run-systemd-system"
    systemd_dir.mkdir()
    calls: list[list[str]] = []
    show_text = _read("systemctl_show_worker.txt") if show is None else show

    def run(argv: list[str]) -> tuple[int, str, str]:
        calls.append(argv)
        assert argv[:4] == ["systemctl", "show", "-p", "Id,Environment"]
        return 0, show_text, ""

    run.calls = calls  # type: ignore[attr-defined]
    return proc, systemd_dir, run


def test_collect_finds_the_worker_with_its_unit_version_and_defaults(tmp_path: Path) -> None:
    proc, systemd_dir, run = _fake_proc(tmp_path)
    facts = ucx.collect(run, proc=str(proc), systemd_dir=str(systemd_dir))
    assert facts["processes_scanned"] == 2 and facts["kernel_threads"] == 1
    assert run.calls == [["systemctl", "show", "-p", "Id,Environment", "--", "ucx-worker.service"]]
    (entry,) = facts["processes"]
    assert entry["pid"] == 105 and entry["comm"] == "python3"
    assert entry["unit"] == "ucx-worker.service" and entry["unit_manager"] == "system"
    assert entry["fixable_unit"] is True
    assert entry["libdir"] == LIBDIR
    assert entry["version"] == "1.22.0"
    assert entry["version_source"] == f"pkg-config file {LIBDIR}/pkgconfig/ucx.pc"
    assert entry["variables"][HOOK]["value"] == "bistro" and entry["variables"][HOOK]["source"] == "default"
    assert entry["variables"][RCACHE]["value"] == "inf"
    assert entry["hooks_on"] is True and entry["rcache_bounded"] is False
    assert entry["restart_pending"] is False
    assert not any(key.startswith("_") for key in entry)
    (finding,) = ucx.evaluate(facts)
    assert finding["severity"] == "info"  # UCX 1.22 has the upstream fix
    assert finding["data"]["fixed_upstream"] is True
    assert "pid 105 (python3) in ucx-worker.service runs UCX 1.22.0" in finding["summary"]
    assert "UCX_MEM_MMAP_HOOK_MODE=bistro, UCX default" in finding["summary"]
    assert "UCX_RCACHE_MAX_UNRELEASED=inf, UCX default" in finding["summary"]
    assert (
        "it no longer leaks on UCX 1.22.0, which has the upstream fix (openucx/ucx#11248"
        in finding["summary"]
    )
    (growing,) = ucx.evaluate(facts, {105: {"pid": 105, "anon_mb_per_min": 300.0}})
    assert growing["severity"] == "info"
    assert growing["summary"].endswith("UCX >= 1.21): the growth has another cause")


def test_the_same_worker_on_ucx_1_19_is_the_mistral_leak(tmp_path: Path) -> None:
    proc, systemd_dir, run = _fake_proc(tmp_path, pc_version="1.19.0")
    facts = ucx.collect(run, proc=str(proc), systemd_dir=str(systemd_dir))
    (finding,) = ucx.evaluate(facts)
    assert finding["severity"] == "warning"
    assert "the setup that leaks anonymous memory on UCX < 1.21" in finding["summary"]
    assert "in ucx-worker.service's environment, then restart it" in finding["summary"]
    growth = {"pid": 105, "anon_mb_per_min": 412.5, "rss_mb_per_min": 412.5, "map_count": 900}
    (finding,) = ucx.evaluate(facts, {105: growth})
    assert finding["severity"] == "critical"
    assert "anonymous memory growing at 412.5 MB/min" in finding["summary"]
    assert finding["data"]["growth"]["anon_mb_per_min"] == 412.5


def test_fixed_unit_and_restarted_process_gives_no_finding(tmp_path: Path) -> None:
    proc, systemd_dir, run = _fake_proc(
        tmp_path,
        pc_version="1.19.0",
        environ=_bytes("worker_environ.bin") + b"UCX_MEM_MMAP_HOOK_MODE=none\0",
        show=_read("systemctl_show_worker_fixed.txt"),
    )
    facts = ucx.collect(run, proc=str(proc), systemd_dir=str(systemd_dir))
    (entry,) = facts["processes"]
    assert entry["variables"][HOOK] == {"value": "none", "source": "unit", "environ": "none", "unit": "none"}
    assert entry["hooks_on"] is False
    assert ucx.evaluate(facts) == []


def test_fixed_unit_but_process_not_restarted_is_still_reported(tmp_path: Path) -> None:
    proc, systemd_dir, run = _fake_proc(
        tmp_path, pc_version="1.19.0", show=_read("systemctl_show_worker_fixed.txt")
    )
    facts = ucx.collect(run, proc=str(proc), systemd_dir=str(systemd_dir))
    (entry,) = facts["processes"]
    assert entry["restart_pending"] is True
    (finding,) = ucx.evaluate(facts)
    assert finding["severity"] == "warning"
    assert (
        "ucx-worker.service already sets UCX_MEM_MMAP_HOOK_MODE=none but the process predates it: restart the unit"
        in finding["summary"]
    )


def test_no_systemd_no_unit_query(tmp_path: Path) -> None:
    proc, _systemd_dir, run = _fake_proc(tmp_path, pc_version="1.19.0")
    facts = ucx.collect(run, proc=str(proc), systemd_dir=str(tmp_path / "absent"))
    assert run.calls == []
    assert facts["systemd"] is False
    (entry,) = facts["processes"]
    assert entry["variables"][HOOK]["unit"] is None


def test_a_ucx_conf_beside_the_library_counts(tmp_path: Path) -> None:
    proc, systemd_dir, run = _fake_proc(tmp_path, pc_version="1.19.0")
    conf = proc / "105" / "root" / LIBDIR.lstrip("/") / ".." / "etc" / "ucx" / "ucx.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("UCX_RCACHE_MAX_UNRELEASED=1024\n" + _read("wheel/ucx.conf"))
    facts = ucx.collect(run, proc=str(proc), systemd_dir=str(systemd_dir))
    (entry,) = facts["processes"]
    expected_path = os.path.normpath(LIBDIR + "/../etc/ucx/ucx.conf")
    assert entry["variables"][RCACHE] == {
        "value": "1024", "source": "file", "environ": None, "unit": None, "file": expected_path,
    }  # fmt: skip
    assert ucx.evaluate(facts) == []


def test_a_ucx_conf_in_the_working_directory_counts(tmp_path: Path) -> None:
    proc, systemd_dir, run = _fake_proc(tmp_path, pc_version="1.19.0")
    workdir = tmp_path / "srv" / "vllm"
    workdir.mkdir(parents=True)
    (workdir / "ucx.conf").write_text("UCX_MEM_MMAP_HOOK_MODE=none\n")
    (proc / "105" / "cwd").symlink_to(workdir)
    facts = ucx.collect(run, proc=str(proc), systemd_dir=str(systemd_dir))
    (entry,) = facts["processes"]
    assert entry["variables"][HOOK]["source"] == "file"
    assert entry["variables"][HOOK]["file"] == f"{workdir}/ucx.conf"
    assert ucx.evaluate(facts) == []


def test_unit_query_failure_is_a_detector_error(tmp_path: Path) -> None:
    proc, systemd_dir, _run = _fake_proc(tmp_path)

    def broken(argv: list[str]) -> tuple[int, str, str]:
        return 1, "", "Failed to connect to bus: No such file or directory"

    with pytest.raises(ucx.UcxError, match="Failed to run systemctl show: Failed to connect to bus"):
        ucx.collect(broken, proc=str(proc), systemd_dir=str(systemd_dir))


# ------------------------------------------------------------------------------------- ucx_info


def _ucx_info_tree(tmp_path: Path, version: str) -> tuple[Path, Path]:
    """A UCX prefix with only bin/ucx_info to tell the version (no pkg-config file, not a wheel)."""
    prefix = tmp_path / "ucx"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "lib").mkdir(parents=True)
    binary = prefix / "bin" / "ucx_info"
    output = _read("ucx_info_v.txt").replace("1.22.0", version)
    binary.write_text("#!/bin/sh\ncat <<'EOF'\n" + output + "EOF\n")
    binary.chmod(0o755)
    for path in (tmp_path, prefix, prefix / "bin", prefix / "lib"):
        path.chmod(0o755)
    return prefix / "lib", binary


@pytest.mark.skipif(os.geteuid() != 0, reason="ucx_info is only run when root owns it; these files are ours")
def test_ucx_info_beside_the_library_is_run_only_when_root_owns_it(tmp_path: Path) -> None:
    libdir, binary = _ucx_info_tree(tmp_path, "1.19.1")
    probe = ucx._VersionProbe(run_command)
    assert probe.version(str(libdir), "/", True) == ("1.19.1", f"ucx_info -v ({binary})")
    # the same tree, but anyone may replace the binary: never run it
    binary.parent.chmod(0o777)
    assert ucx._VersionProbe(run_command).version(str(libdir), "/", True) == (None, None)
    binary.parent.chmod(0o755)
    binary.chmod(0o757)
    assert ucx._safe_to_run(str(binary), str(libdir)) is False
    binary.chmod(0o755)
    os.chown(binary, 65534, 65534)
    assert ucx._safe_to_run(str(binary), str(libdir)) is False
    assert stat.S_IMODE(binary.stat().st_mode) == 0o755


def test_files_come_before_ucx_info(tmp_path: Path) -> None:
    libdir, _binary = _ucx_info_tree(tmp_path, "1.19.1")
    (libdir / "pkgconfig").mkdir()
    (libdir / "pkgconfig" / "ucx.pc").write_text(_read("wheel/ucx.pc"))
    calls: list[list[str]] = []

    def run(argv: list[str]) -> tuple[int, str, str]:
        calls.append(argv)
        return 0, "", ""

    probe = ucx._VersionProbe(run)
    assert probe.version(str(libdir), "/", True) == ("1.22.0", f"pkg-config file {libdir}/pkgconfig/ucx.pc")
    assert calls == []  # no exec when a file names the version


def test_ucx_info_is_never_run_in_another_mount_namespace(tmp_path: Path) -> None:
    libdir, _binary = _ucx_info_tree(tmp_path, "1.19.1")
    calls: list[list[str]] = []

    def run(argv: list[str]) -> tuple[int, str, str]:
        calls.append(argv)
        return 0, "", ""

    probe = ucx._VersionProbe(run)
    assert probe.version(str(libdir).replace(str(tmp_path), ""), str(tmp_path), False) == (None, None)
    assert calls == []


def test_wheel_version_file_and_dist_info(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    lib = site / "libucx" / "lib"
    lib.mkdir(parents=True)
    shutil.copy(FIXTURES / "wheel" / "UCX_WHEEL_VERSION.txt", site / "libucx")
    probe = ucx._VersionProbe(None)
    assert probe.version(str(lib), "/", True) == (
        "1.22.0",
        f"wheel version file {site}/libucx/UCX_WHEEL_VERSION.txt",
    )
    (site / "libucx" / "UCX_WHEEL_VERSION.txt").unlink()
    (site / "libucx_cu12-1.19.0.post1.dist-info").mkdir()
    probe = ucx._VersionProbe(None)
    assert probe.version(str(lib), "/", True) == (
        "1.19.0",
        f"wheel dist-info {site}/libucx_cu12-1.19.0.post1.dist-info",
    )
