"""Per-host "hardware" of a lab host: a GPU that exists only as a file, and an ``nvidia-smi`` STAND-IN.

There is no GPU on the lab's machine, and nspawn hosts share one kernel, so a GPU fault cannot be real
here. What can be per host is the answer to the one query node_health's gpu_health detector makes
(``plugins/module_utils/gpu.py`` ``SMI_ARGS``): each host gets a small program at
``/usr/local/bin/nvidia-smi`` (``install_gpu``) that is NOT NVIDIA's: it prints the ``--query-gpu``
CSV (``--format=csv,noheader,nounits``) the real tool prints, field for field as captured on an H200
(tests/unit/fixtures/gpu/smi_csv.txt), from the host's hardware file
``/var/lib/fleetops-lab/hw/gpu.json`` on the host's own persistent disk (its overlay, or a VM's disk).

- ``inject_ecc(lab, host, uncorrected=N)``: the GPU reports N uncorrectable volatile ECC errors
  (gpu_health: critical), also added to the aggregate count.
- ``clear_hardware(lab, host)``: "other hardware": a fresh GPU (new UUID, zero error counts). The lab's
  EC2 process (``fleetops_lab.ec2_server``) does this when an instance is stopped through the EC2 API:
  EC2 starts a stopped EBS instance on another host. A plain reboot keeps the file, and so the fault,
  as it keeps a faulty GPU.

nspawn hosts are written through their mounted root from outside (also while powered off); VM hosts,
whose disk is their own, over ssh (they must be up).
"""

from __future__ import annotations

import json
import shlex
import uuid
from pathlib import Path
from typing import Any

from fleetops_lab import _system as system
from fleetops_lab.core import Lab
from fleetops_lab.errors import LabError

HW_DIR = "var/lib/fleetops-lab/hw"
GPU_FILE = f"{HW_DIR}/gpu.json"
SMI_PATH = "usr/local/bin/nvidia-smi"

# The fields the stand-in knows, in nvidia-smi's names, with an H200's values as captured
# (tests/unit/fixtures/gpu/smi_csv.txt); "[N/A]": the real tool's "not applicable" (an H200 has no
# page retirement).
HEALTHY_GPU: dict[str, Any] = {
    "index": 0,
    "pci.bus_id": "00000000:00:06.0",
    "uuid": "GPU-d254dc1a-7a4f-8b4b-f3a7-a20e7146e4d1",
    "name": "NVIDIA H200",
    "ecc.mode.current": "Enabled",
    "ecc.errors.uncorrected.volatile.total": 0,
    "ecc.errors.corrected.volatile.total": 0,
    "ecc.errors.uncorrected.aggregate.total": 0,
    "retired_pages.pending": "[N/A]",
    "remapped_rows.correctable": 0,
    "remapped_rows.uncorrectable": 0,
    "remapped_rows.pending": "No",
    "remapped_rows.failure": "No",
}

_STANDIN = r"""#!/usr/bin/python3
# fleetops lab STAND-IN for nvidia-smi (fleetops_lab.hardware): there is NO GPU on this lab host. It answers
# `nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits` as NVIDIA's tool does, from this host's
# "hardware" file /var/lib/fleetops-lab/hw/gpu.json; anything else is refused.
import json
import sys

HW = "/var/lib/fleetops-lab/hw/gpu.json"
args = sys.argv[1:]
query = [a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")]
fmt = [a.split("=", 1)[1] for a in args if a.startswith("--format=")]
if len(query) != 1 or len(args) != 1 + len(fmt):
    sys.stderr.write("fleetops lab nvidia-smi stand-in: only --query-gpu=... [--format=...] is supported\n")
    sys.exit(2)
try:
    with open(HW) as f:
        gpus = json.load(f).get("gpus", [])
except FileNotFoundError:
    gpus = []
if not gpus:
    print("No devices were found")
    sys.exit(6)
fields = [f.strip() for f in query[0].split(",") if f.strip()]
for field in fields:
    if field not in gpus[0]:
        print('Field "%s" is not a valid field to query.' % field)
        sys.exit(2)
header = "noheader" not in (fmt[0].split(",") if fmt else [])
if header:
    print(", ".join(fields))
for gpu in gpus:
    print(", ".join(str(gpu[field]) for field in fields))
"""


def _write(lab: Lab, host: str, rel: str, text: str, mode: int) -> None:
    """Write ``rel`` (relative to the host's /) on the host's disk: through the mounted root from outside
    for an nspawn host (powered on or off), over ssh for a VM host."""
    if lab.is_vm(host):
        path = "/" + rel
        lab.run(
            host,
            f"mkdir -p {shlex.quote(str(Path(path).parent))} && cat > {shlex.quote(path)}.tmp && "
            f"chmod {mode:o} {shlex.quote(path)}.tmp && mv -f {shlex.quote(path)}.tmp {shlex.quote(path)}",
            input=text,
            check=True,
        )
        return
    root = lab.host_root(host)
    target = root / rel
    for parent in [target.parent, *target.parent.parents]:
        if parent == root:
            break
        if parent.is_symlink():
            raise LabError(f"Failed to write /{rel} on {host}: {parent} is a symlink")
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink():
        target.unlink()
    system.write_text_atomic(target, text, mode)


def _read(lab: Lab, host: str, rel: str) -> str | None:
    if lab.is_vm(host):
        proc = lab.run(host, f"cat {shlex.quote('/' + rel)}", check=False)
        return proc.stdout if proc.returncode == 0 else None
    target = lab.host_root(host) / rel
    if target.is_symlink():
        raise LabError(f"Failed to read /{rel} on {host}: it is a symlink")
    try:
        return target.read_text()
    except FileNotFoundError:
        return None


def read_gpus(lab: Lab, host: str) -> list[dict[str, Any]]:
    """The GPUs in the host's hardware file (empty: none installed)."""
    text = _read(lab, host, GPU_FILE)
    if not text:
        return []
    gpus = json.loads(text).get("gpus", [])
    return gpus if isinstance(gpus, list) else []


def _write_gpus(lab: Lab, host: str, gpus: list[dict[str, Any]]) -> None:
    _write(lab, host, GPU_FILE, json.dumps({"gpus": gpus}, indent=1) + "\n", 0o644)


def _fresh_gpu(index: int) -> dict[str, Any]:
    return {
        **HEALTHY_GPU,
        "index": index,
        "pci.bus_id": f"00000000:00:{6 + index:02X}.0",
        "uuid": f"GPU-{uuid.uuid4()}",
    }


def install_gpu(lab: Lab, host: str, count: int = 1) -> None:
    """Give a lab host ``count`` healthy stand-in GPUs and the ``nvidia-smi`` stand-in that reports them."""
    if not 1 <= count <= 16:
        raise LabError(f"Failed to install GPUs on {host}: 1 .. 16 GPUs, not {count}")
    _write(lab, host, SMI_PATH, _STANDIN, 0o755)
    _write_gpus(lab, host, [_fresh_gpu(i) for i in range(count)])


def inject_ecc(lab: Lab, host: str, uncorrected: int = 1, gpu: int = 0) -> None:
    """GPU ``gpu`` of the host reports ``uncorrected`` uncorrectable volatile ECC errors (gpu_health:
    critical), added to its aggregate count too; installs the stand-in GPU first when there is none."""
    if uncorrected < 1:
        raise LabError(f"Failed to inject ECC errors on {host}: at least 1, not {uncorrected}")
    gpus = read_gpus(lab, host)
    if not gpus:
        install_gpu(lab, host, count=gpu + 1)
        gpus = read_gpus(lab, host)
    if not 0 <= gpu < len(gpus):
        raise LabError(f"Failed to inject ECC errors on {host}: it has {len(gpus)} GPU(s), no GPU {gpu}")
    entry = gpus[gpu]
    entry["ecc.errors.uncorrected.volatile.total"] = (
        int(entry["ecc.errors.uncorrected.volatile.total"]) + uncorrected
    )
    entry["ecc.errors.uncorrected.aggregate.total"] = (
        int(entry["ecc.errors.uncorrected.aggregate.total"]) + uncorrected
    )
    _write_gpus(lab, host, gpus)


def clear_hardware(lab: Lab, host: str) -> bool:
    """ "Other hardware": the host's stand-in GPUs are replaced by fresh ones (new UUIDs, no errors).
    False when the host has no stand-in GPU (nothing to clear)."""
    gpus = read_gpus(lab, host)
    if not gpus:
        return False
    _write_gpus(lab, host, [_fresh_gpu(i) for i in range(len(gpus))])
    return True
