"""Quarantine backends chosen per host (``fleetops_quarantine_backend``) through the real rollout engine and
real ansible-playbook (local connection): kubectl is the stand-in of tests/fleetops/test_quarantine.py (no
Kubernetes API server can run here), scontrol is Debian's real one (slurm-client), run where no cluster
answers it: missing, or talking to a controller that accepts and never answers. The Slurm cluster itself
is tested with real daemons in tests/integration/test_slurm_lab.py.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetops.errors import UsageError
from fleetops.remediations.backends import BACKENDS, DEFAULT_BACKEND
from tests.fleetops.test_quarantine import _cluster, _inventory, _read, _run
from tests.paths import REPO


@pytest.fixture
def kube(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The kubectl stand-in's state file (as tests/fleetops/test_quarantine.py's fixture)."""
    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(tmp_path / "home"))
    monkeypatch.setenv("FLEETOPS_AUDIT_LOG", str(tmp_path / "audit.jsonl"))
    path = tmp_path / "kube.json"
    monkeypatch.setenv("FLEETOPS_KUBECTL_STATE", str(path))
    return path


@pytest.mark.parametrize(
    ("hostvars", "error"),
    [
        (
            {"fleetops_quarantine_backend": "slurmm"},
            "fleetops_quarantine_backend 'slurmm' is not a quarantine backend",
        ),
        ({"fleetops_quarantine_backend": "slurm", "fleetops_slurm_node": "gpu 1"}, "Slurm node name 'gpu 1'"),
        ({"fleetops_quarantine_backend": "slurm", "fleetops_slurm_node": "a=b"}, "has '='"),
        ({"fleetops_quarantine_backend": "slurm", "fleetops_slurm_node": "-gpu1"}, "starts with '-'"),
        ({"fleetops_quarantine_backend": "slurm", "fleetops_slurm_node": "gpu[1-9]"}, "has '\\[', '\\]'"),
        ({"fleetops_quarantine_backend": "slurm", "fleetops_slurm_node": "gpu1,gpu2"}, "has ','"),
    ],
)
def test_a_bad_backend_or_slurm_node_name_is_refused_before_anything_runs(
    tmp_path: Path, kube: Path, hostvars: dict[str, str], error: str
) -> None:
    _cluster(kube, {"n1": {}})
    inv = _inventory(tmp_path, {"n1": {}, "n2": hostvars})
    with pytest.raises(UsageError, match=error) as caught:
        _run(inv, "quarantine", True, finding="gpu_health")
    assert "\n" not in str(caught.value)
    assert _read(kube).get("calls") is None  # kubectl never ran for the good host either


def test_unquarantine_refuses_the_same_names(tmp_path: Path, kube: Path) -> None:
    _cluster(kube, {"n1": {}})
    inv = _inventory(
        tmp_path, {"n1": {}, "n2": {"fleetops_quarantine_backend": "slurm", "fleetops_slurm_node": "-all"}}
    )
    with pytest.raises(UsageError, match="Slurm node name '-all' \\(of host 'n2'\\) starts with '-'"):
        _run(inv, "unquarantine", True, sample_seconds=0.1)
    assert _read(kube).get("calls") is None


def test_evict_is_refused_for_a_host_without_a_scheduler(tmp_path: Path, kube: Path) -> None:
    """--evict moves a node's work off (Kubernetes: drain; Slurm: requeue, tests/integration/test_slurm_lab.py);
    a host whose backend is none has no work to move: refused before anything runs."""
    _cluster(kube, {"n1": {}})
    inv = _inventory(tmp_path, {"n1": {}, "n2": {"fleetops_quarantine_backend": "none"}})
    with pytest.raises(
        UsageError, match=r"host 'n2': --evict moves a node's work off .* its none quarantine does nothing"
    ):
        _run(inv, "quarantine", True, finding="gpu_health", evict=True)
    assert _read(kube).get("calls") is None
    assert BACKENDS["slurm"].evicts and BACKENDS["kubernetes"].evicts and not BACKENDS["none"].evicts


def test_each_host_uses_its_own_backend_and_a_missing_scontrol_fails_only_its_host(
    tmp_path: Path, kube: Path
) -> None:
    _cluster(kube, {"k1": {}})
    inv = _inventory(
        tmp_path,
        {
            "k1": {},
            "s1": {
                "fleetops_quarantine_backend": "slurm",
                "fleetops_scontrol": str(tmp_path / "no-scontrol"),
            },
            "x1": {"fleetops_quarantine_backend": "none"},
        },
    )
    result = _run(inv, "quarantine", True, finding="gpu_health")  # one batch: every host runs
    assert result.rollout is not None
    outcomes = result.rollout.results
    assert outcomes["k1"].status == "ok" and outcomes["k1"].changed
    assert outcomes["s1"].status == "failed"
    assert f"Failed to drain Slurm node s1: {tmp_path / 'no-scontrol'} not found" in outcomes["s1"].msg
    assert outcomes["x1"].status == "ok" and not outcomes["x1"].changed
    assert any("quarantine backend none: nothing to do" in n for n in outcomes["x1"].notes)
    node = _read(kube)["nodes"]["k1"]
    assert node["unschedulable"] is True  # the Kubernetes host was quarantined all the same
    assert set(_read(kube)["nodes"]) == {"k1"}  # kubectl was never asked about s1 or x1


@pytest.fixture
def silent_controller(tmp_path: Path) -> Iterator[Path]:
    """A slurm.conf whose slurmctld is a loopback socket that accepts and never answers (a hung controller)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=silent\nSlurmctldHost=silent(127.0.0.1)\n"
        f"SlurmctldPort={server.getsockname()[1]}\nAuthType=auth/munge\nNodeName=s1 CPUs=1\n"
        "PartitionName=p Nodes=ALL\n"
    )
    try:
        yield conf
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


def test_a_scontrol_that_does_not_answer_in_time_fails_its_host_with_the_cause(
    tmp_path: Path, kube: Path, silent_controller: Path
) -> None:
    _cluster(kube, {})
    slurm = {
        "fleetops_quarantine_backend": "slurm",
        "fleetops_slurm_conf": str(silent_controller),
        "fleetops_scontrol_timeout": 2,
    }
    inv = _inventory(tmp_path, {"s1": slurm})
    result = _run(inv, "quarantine", True, finding="gpu_health")
    assert result.rollout is not None
    outcome = result.rollout.results["s1"]
    assert outcome.status == "failed"
    # scontrol waits on a controller that never answers (it would retry for minutes): the module's limit
    # ends it, the host fails with the cause, and no update was sent
    assert outcome.msg == "Failed to drain Slurm node s1: scontrol show node: no answer within 2 s"


def test_the_playbooks_branch_on_the_declared_backends() -> None:
    """The backends live once (fleetops.remediations.backends); the playbooks' checks name the same list."""
    listed = "[" + ", ".join(f"'{name}'" for name in BACKENDS) + "]"
    for playbook in ("quarantine.yml", "unquarantine.yml"):
        text = (REPO / "playbooks" / playbook).read_text()
        assert f"in {listed}" in text, playbook
        assert f"fleetops_quarantine_backend | default('{DEFAULT_BACKEND}')" in text, playbook
        for name in BACKENDS:
            assert f"== '{name}'" in text, (playbook, name)
