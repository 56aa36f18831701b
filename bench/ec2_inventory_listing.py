"""Bench: fleetops.node.ec2 listing 500 and 5,000 instances from a real moto_server, and from its cache.

The baseline is the 500-instance listing of the same run: the 5,000 listing should cost 10x
(linear). Wall time includes moto's own work (another process, on the same CPUs), so the bench
also prints this process's CPU time, which is the plugin's (boto3 parsing, inventory building).
A listing from the cache makes no API call; its target is < 0.5 s.

Each size gets a fresh moto_server (fleetops_lab.ec2sim), filled with untagged instances in
reservations of 100 (see launch_many), listed in-process through Ansible's InventoryManager with
the jsonfile cache on, as `ansible-inventory --list` builds it (InventoryManager with cache=True,
the plugin's parse() reading a warm cache; imports done, JSON output not included): once from the
API (which writes the cache), then, with moto stopped (a listing that made any call would fail),
from the cache, REPEAT times (the median is printed). A second baseline, from the same run and
cache: the plugin's cached listing with one inventory.set_variable per variable (its batch path
off), which is what any plugin pays for these hosts through Ansible's per-variable API.

With --aws-ec2 PATH, the bench instead compares listings from the API (no cache) with
amazon.aws.aws_ec2's, on one moto_server filled with --instances instances (default 1,200): both
list the running instances in one region, named by instance ID; fleetops.node.ec2 also asks
DescribeInstanceStatus (its include_events default: scheduled events and status checks; the fleet is
healthy, so the region-wide calls for what is not ok answer nothing), which aws_ec2 does not. One
warm-up listing each (imports, plugin loading: printed apart), then COMPARE_REPEAT rounds,
interleaved, the order alternating; the medians' ratio has the target COMPARE_TARGET. moto_server's
own CPU during each listing (from /proc) is printed beside it, and the ratio of the listings' wall
time less moto's CPU (what the plugins themselves and their waiting cost). PATH is a collections folder holding ansible_collections/amazon/aws, or the
``ansible`` package's wheel (which holds amazon.aws): ``pip download --no-deps -d DIR ansible``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
COLLECTIONS = ROOT / "collections"
REGION = "eu-west-1"
CACHED_TARGET_S = 0.5
REPEAT = 3
COMPARE_INSTANCES = 1200
COMPARE_REPEAT = 5
COMPARE_TARGET = 0.5  # fleetops.node.ec2's listing at most this share of amazon.aws.aws_ec2's
AMAZON_AWS = Path("ansible_collections", "amazon", "aws")


@dataclass
class Result:
    count: int
    fill_s: float
    api_s: float
    api_cpu_s: float
    cached_s: float
    cached_cpu_s: float
    per_variable_s: float
    per_variable_cpu_s: float


def _environment() -> None:
    """Point Ansible at this collection and boto3 at dummy credentials, before either is imported."""
    os.environ["ANSIBLE_COLLECTIONS_PATH"] = str(COLLECTIONS)
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION=REGION,
        AWS_EC2_METADATA_DISABLED="true",
    )
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_EC2"):
        os.environ.pop(name, None)


def _list(source: Path, expected: int) -> tuple[float, float]:
    """Build an inventory from source in-process; (wall seconds, CPU seconds of this process)."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    wall, cpu = time.perf_counter(), time.process_time()
    inventory: Any = InventoryManager(loader=DataLoader(), sources=[str(source)])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    hosts = len(inventory.get_hosts())
    if hosts != expected:
        raise RuntimeError(f"{source.name}: listed {hosts} hosts, expected {expected}")
    return wall, cpu


def _process_cpu(pid: int | None) -> float:
    """CPU seconds (user + system) process pid has used so far; 0.0 where /proc cannot tell."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError, TypeError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _list_against(source: Path, expected: int, server_pid: int | None) -> tuple[float, float, float]:
    """_list, and the CPU seconds the server (moto_server) used meanwhile."""
    before = _process_cpu(server_pid)
    wall, cpu = _list(source, expected)
    return wall, cpu, _process_cpu(server_pid) - before


def measure(count: int, workdir: Path) -> Result:
    from fleetops_lab.ec2sim import MotoServer, launch_many

    with MotoServer() as moto:
        started = time.perf_counter()
        launch_many(moto.url, REGION, count)
        fill_s = time.perf_counter() - started
        source = workdir / f"bench{count}.fleet_ec2.yml"
        source.write_text(
            "plugin: fleetops.node.ec2\n"
            f"regions: [{REGION}]\n"
            f"endpoint_url: {moto.url}\n"
            "cache: true\n"
            "cache_plugin: ansible.builtin.jsonfile\n"
            f"cache_connection: {workdir / 'cache'}\n"
            "cache_timeout: 3600\n"
        )
        api_s, api_cpu_s = _list(source, count)
    # moto is gone: from here on, a listing that asked the API would fail instead of listing
    writer = _plugin_module()._HostvarsWriter
    cached = []
    per_variable = []
    for _ in range(REPEAT):  # interleaved, so that both see the same machine load
        cached.append(_list(source, count))
        writer.batch = False
        try:
            per_variable.append(_list(source, count))
        finally:
            writer.batch = True
    cached_s, cached_cpu_s = _median(cached)
    per_variable_s, per_variable_cpu_s = _median(per_variable)
    return Result(count, fill_s, api_s, api_cpu_s, cached_s, cached_cpu_s, per_variable_s, per_variable_cpu_s)


@dataclass
class Comparison:
    count: int
    first: dict[str, tuple[float, float, float]]  # plugin -> the warm-up listing (imports included)
    samples: dict[str, list[tuple[float, float, float]]]  # plugin -> (wall, CPU, moto's CPU) per round


OURS, THEIRS = "fleetops.node.ec2", "amazon.aws.aws_ec2"


def compare(count: int, workdir: Path, repeat: int) -> Comparison:
    """API listings of the same moto fleet by both plugins, interleaved (see the module's doc)."""
    from fleetops_lab.ec2sim import MotoServer, launch_many

    with MotoServer() as moto:
        launch_many(moto.url, REGION, count)
        common = f"regions: [{REGION}]\nendpoint_url: {moto.url}\n"
        sources = {
            OURS: workdir / "compare.fleet_ec2.yml",
            THEIRS: workdir / "compare.aws_ec2.yml",
        }
        sources[OURS].write_text(f"plugin: {OURS}\n{common}")
        sources[THEIRS].write_text(
            f"plugin: {THEIRS}\n{common}filters:\n  instance-state-name: running\nhostnames: [instance-id]\n"
        )
        pid = moto.proc.pid if moto.proc else None
        first = {name: _list_against(source, count, pid) for name, source in sources.items()}
        samples: dict[str, list[tuple[float, float, float]]] = {OURS: [], THEIRS: []}
        for n in range(repeat):
            order = [OURS, THEIRS] if n % 2 == 0 else [THEIRS, OURS]
            for name in order:
                samples[name].append(_list_against(sources[name], count, pid))
    return Comparison(count, first, samples)


def _amazon_aws(given: Path, workdir: Path) -> Path:
    """A collections folder holding amazon.aws: given, or made in workdir from the ansible wheel given."""
    if given.is_dir():
        if not (given / AMAZON_AWS).is_dir():
            raise SystemExit(f"--aws-ec2: {given} holds no {AMAZON_AWS}")
        return given
    if given.suffix != ".whl" or not given.is_file():
        raise SystemExit(f"--aws-ec2: {given} is neither a collections folder nor the ansible wheel")
    prefix = AMAZON_AWS.as_posix() + "/"
    with zipfile.ZipFile(given) as wheel:
        members = [m for m in wheel.namelist() if m.startswith(prefix)]
        if not members:
            raise SystemExit(f"--aws-ec2: {given} holds no {AMAZON_AWS}")
        wheel.extractall(workdir / "amazon", members)
    return workdir / "amazon"


def _report_comparison(c: Comparison) -> None:
    print(
        f"API listings of {c.count} instances, {COMPARE_REPEAT} interleaved rounds (after one warm-up each):"
    )
    print(
        f"{'plugin':<20}  {'median':>7}  {'its CPU':>7}  {'moto CPU':>8}  {'less moto':>9}  {'min':>6}  "
        f"{'max':>6}  {'warm-up':>7}"
    )
    medians = {}
    moto_cpu = {}
    less_moto = {}
    for name, samples in c.samples.items():
        medians[name] = _median([(w, cpu) for w, cpu, _ in samples])
        moto_cpu[name] = statistics.median(m for _, _, m in samples)
        less_moto[name] = statistics.median(w - m for w, _, m in samples)
        walls = [w for w, _, _ in samples]
        print(
            f"{name:<20}  {medians[name][0]:>6.2f}s  {medians[name][1]:>6.2f}s  {moto_cpu[name]:>7.2f}s  "
            f"{less_moto[name]:>8.2f}s  {min(walls):>5.2f}s  {max(walls):>5.2f}s  {c.first[name][0]:>6.2f}s"
        )
    ratio = medians[OURS][0] / medians[THEIRS][0]
    verdict = "ok" if ratio <= COMPARE_TARGET else "over"
    print(
        f"{OURS} / {THEIRS}: {ratio:.2f}x wall (events included), "
        f"{medians[OURS][1] / medians[THEIRS][1]:.2f}x CPU, {less_moto[OURS] / less_moto[THEIRS]:.2f}x wall "
        f"less moto's CPU (target <= {COMPARE_TARGET}x wall: {verdict})"
    )


def _median(samples: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(w for w, _ in samples), statistics.median(c for _, c in samples)


def _plugin_module() -> Any:
    from ansible.plugins.loader import inventory_loader

    return sys.modules[type(inventory_loader.get("fleetops.node.ec2")).__module__]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--small", type=int, default=500, help="baseline fleet size (default 500)")
    parser.add_argument("--large", type=int, default=5000, help="large fleet size (default 5000)")
    parser.add_argument(
        "--aws-ec2",
        type=Path,
        metavar="PATH",
        help="compare with amazon.aws.aws_ec2 instead: a collections folder holding it, or the ansible wheel",
    )
    parser.add_argument(
        "--instances",
        type=int,
        default=COMPARE_INSTANCES,
        help=f"fleet size of the comparison (default {COMPARE_INSTANCES})",
    )
    args = parser.parse_args(argv)

    _environment()
    with tempfile.TemporaryDirectory(prefix="fleetops-bench-") as tmp:
        if args.aws_ec2 is not None:
            paths = [str(COLLECTIONS), str(_amazon_aws(args.aws_ec2, Path(tmp)))]
            os.environ["ANSIBLE_COLLECTIONS_PATH"] = os.pathsep.join(paths)
            from ansible.plugins.loader import init_plugin_loader

            init_plugin_loader(paths)
            _report_comparison(compare(args.instances, Path(tmp), COMPARE_REPEAT))
            load = os.getloadavg()
            print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
            return 0
        from ansible.plugins.loader import init_plugin_loader

        init_plugin_loader([str(COLLECTIONS)])
        results = [measure(n, Path(tmp)) for n in (args.small, args.large)]

    print(
        f"{'instances':>9}  {'fill':>7}  {'API listing':>11}  {'plugin CPU':>10}  {'cached':>7}  {'cached CPU':>10}"
        f"  {'per-variable':>12}  {'its CPU':>7}"
    )
    for r in results:
        print(
            f"{r.count:>9}  {r.fill_s:>6.2f}s  {r.api_s:>10.2f}s  {r.api_cpu_s:>9.2f}s  "
            f"{r.cached_s:>6.3f}s  {r.cached_cpu_s:>9.3f}s  {r.per_variable_s:>11.3f}s  {r.per_variable_cpu_s:>6.3f}s"
        )
    small, large = results
    size_ratio = large.count / small.count
    print(
        f"ratio {large.count}/{small.count} ({size_ratio:.0f}x the instances; linear = {size_ratio:.0f}x): "
        f"API listing {large.api_s / small.api_s:.1f}x wall, {large.api_cpu_s / small.api_cpu_s:.1f}x plugin CPU; "
        f"cached {large.cached_s / small.cached_s:.1f}x"
    )
    for r in results:
        print(
            f"cached/per-variable at {r.count}: {r.cached_s / r.per_variable_s:.2f}x wall, "
            f"{r.cached_cpu_s / r.per_variable_cpu_s:.2f}x CPU; cached/API listing: {r.cached_s / r.api_s:.3f}x wall"
        )
    load = os.getloadavg()
    for r in results:
        verdict = "ok" if r.cached_s < CACHED_TARGET_S else "over"
        print(
            f"cached listing of {r.count}: {r.cached_s:.3f}s, median of {REPEAT} "
            f"(target < {CACHED_TARGET_S}s: {verdict})"
        )
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
