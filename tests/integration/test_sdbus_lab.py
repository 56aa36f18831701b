"""crashloop_unit and unexpected_unit over D-Bus (module_utils/sdbus.py) read what systemctl reads, on a lab
host's real systemd (252 in the lab image).

The runner archive the scan stages is unpacked on the host and its own Python runs both ways, one after the
other: the detectors' facts (timings aside) must be equal, the D-Bus way must start no systemctl, and where
it cannot answer as systemctl's text would (a value with a control character systemctl prints in octal, no
socket) it must run systemctl and still give the same facts. The units cover what the answers hold: a failed
service, one between restarts, an enabled service whose Environment= has spaces, quotes, backslashes, ``$``,
``%``, a tab, a newline, a carriage return, ``=`` and non-ASCII text, its alias, a link to no unit.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest

from fleetops_lab import Lab
from tests.paths import REPO

pytestmark = pytest.mark.lab
HOST = "lab-01"
RUNNER = "/run/fleetops-sdbus-test"
UNITS = "/etc/systemd/system"
ENV_UNIT = """[Unit]
Description=fleetops sdbus test: an environment
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/true
Environment="SPACE=a b  c" "QUOTE=say \\"hi\\"" 'SQ=it'"'"'s' "BS=back\\\\slash\\\\n" DOLLAR=$HOME "TAB=x\\ty"
Environment="NL=line1\\nline2" "CR=a\\rb" "UNI=caf\\xc3\\xa9 \\u2713" "EQ=a=b=c" "EMPTY=" "PCT=100%%" "GLOB=*?[x]"
[Install]
WantedBy=multi-user.target
Alias=sdbus-alias.service
"""
CTRL_UNIT = """[Unit]
Description=fleetops sdbus test: a control character
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/true
Environment="CTRL=a\\x01b"
[Install]
WantedBy=multi-user.target
"""
FAILED_UNIT = "[Service]\nType=oneshot\nExecStart=/bin/false\n"
LOOP_UNIT = "[Service]\nExecStart=/bin/false\nRestart=always\nRestartSec=1h\n"  # stays in auto-restart

# Run on the host by its Python (-I -S): the facts both ways, and the systemctl processes each started.
COMPARE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.fleetops.node.plugins.module_utils import crashloop, health, sdbus, textfile, units
calls = []
def run(argv):
    if argv[0] == "systemctl":  # which question: list-units, unexpected_unit's show, crashloop_unit's candidates
        calls.append("units-show" if "Id,UnitFileState,UnitFilePreset,Environment" in argv else argv[1])
    return textfile.run_command(argv)
def clean(value):
    if isinstance(value, dict):
        return dict((k, clean(v)) for k, v in value.items() if not k.endswith("_ms") and k not in ("sampled_at", "read_at"))
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value
def both(label, sample):
    del calls[:]
    plain = clean(sample(None))
    by_systemctl = sorted(calls)
    del calls[:]
    bus = sdbus.Systemd(sys.argv[2])
    over_bus = clean(sample(bus))
    out[label] = {"same": plain == over_bus, "plain": plain, "bus": over_bus, "systemctl_plain": by_systemctl,
                  "systemctl_bus": sorted(calls), "failed": bus.failed}
out = {}
env_units = ["sdbus-env", "sdbus-alias.service", "ssh", "sdbus-ctrl"]
both("list_services", lambda bus: crashloop.list_services(run, bus))
both("crashloop", lambda bus: crashloop.collect(run, bus=bus))
both("units", lambda bus: units.collect(run, env_units, bus=bus))
params = dict(health.DEFAULTS, checks=["crashloop_unit", "unexpected_unit"], unit_allowlist=["ssh.service"],
              env_units=env_units, _run=run)
both("run_checks", lambda bus: health.run_checks(dict(params, _bus=bus)))
print(json.dumps(out))
print(json.dumps(sorted(m for m in ("socket", "subprocess", "contextlib", "signal") if m in sys.modules)))
"""


def _put(lab: Lab, path: str, text: str) -> None:
    lab.run(HOST, f"cat > {path}", input=text, check=True)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab()
    lab.up(1)
    try:
        archive = base64.b64encode(
            (REPO / "playbooks" / "files" / "fleetops-detector.tar").read_bytes()
        ).decode()
        lab.run(HOST, f"rm -rf {RUNNER} && mkdir -p {RUNNER} && base64 -d | tar -x -C {RUNNER}", input=archive,
                check=True)  # fmt: skip
        _put(lab, f"{RUNNER}/compare.py", COMPARE)
        for name, text in (("sdbus-env", ENV_UNIT), ("sdbus-failed", FAILED_UNIT), ("sdbus-loop", LOOP_UNIT)):
            _put(lab, f"{UNITS}/{name}.service", text)
        lab.run(HOST, f"ln -sf {UNITS}/sdbus-missing.service {UNITS}/multi-user.target.wants/sdbus-missing.service; "
                "systemctl daemon-reload && systemctl enable --now sdbus-env.service && "
                "systemctl start sdbus-loop.service; systemctl start sdbus-failed.service; true", check=True)  # fmt: skip
        yield lab
    finally:
        try:
            lab.run(HOST, "systemctl disable --now sdbus-env.service sdbus-ctrl.service sdbus-loop.service; "
                    f"rm -rf {RUNNER} {UNITS}/sdbus-* {UNITS}/multi-user.target.wants/sdbus-*; systemctl daemon-reload; "
                    "systemctl reset-failed")  # fmt: skip
        finally:
            lab.down()


def _compare(lab: Lab, socket: str = "/run/systemd/private") -> dict[str, Any]:
    proc = lab.run(HOST, f"python3 -I -S {RUNNER}/compare.py {RUNNER} {socket}", check=True, timeout=120)
    compared, loaded = proc.stdout.splitlines()
    assert json.loads(loaded) == []  # sdbus talks through _socket: not socket's 6 ms of imports
    result: dict[str, Any] = json.loads(compared)
    return result


def test_dbus_reads_what_systemctl_reads_and_starts_no_systemctl(lab: Lab) -> None:
    out = _compare(lab)
    for label, seen in out.items():
        assert seen["same"], (label, seen["plain"], seen["bus"])
        assert seen["failed"] is None, (label, seen["failed"])
    # list-units and unexpected_unit's show asked over D-Bus; crashloop_unit's show of its candidates (a
    # failed or restarting service: a sick host's) is still systemctl's
    assert out["list_services"]["systemctl_plain"] == ["list-units"]
    assert out["crashloop"]["systemctl_plain"] == ["list-units", "show"]
    assert out["units"]["systemctl_plain"] == ["units-show"]
    assert out["run_checks"]["systemctl_plain"] == ["list-units", "show", "units-show"]
    assert [
        out[label]["systemctl_bus"] for label in ("list_services", "crashloop", "units", "run_checks")
    ] == [[], ["show"], [], ["show"]]
    services = out["list_services"]["bus"]
    assert services["sdbus-failed.service"] == ["loaded", "failed", "failed"]
    assert services["sdbus-loop.service"] == ["loaded", "activating", "auto-restart"]
    assert set(out["crashloop"]["bus"]["units"]) == {"sdbus-failed.service", "sdbus-loop.service"}
    facts = out["units"]["bus"]
    assert "sdbus-env.service" in facts["enabled"]
    assert "sdbus-missing.service" not in facts["enabled"]
    env = facts["environment"]["sdbus-env.service"]
    assert env == {
        "SPACE": "a b  c", "QUOTE": 'say "hi"', "SQ": "it's", "BS": "back\\slash\\n", "DOLLAR": "$HOME",
        "TAB": "x\ty", "NL": "line1\nline2", "CR": "a\rb", "UNI": "café ✓", "EQ": "a=b=c", "EMPTY": "",
        "PCT": "100%", "GLOB": "*?[x]",
    }  # fmt: skip
    # asked by its alias: systemd answers for the unit it names (Id sdbus-env.service), as systemctl does
    assert "sdbus-alias.service" not in facts["environment"]
    findings = out["run_checks"]["bus"]["findings"]
    assert "sdbus-env.service" in [f["data"]["unit"] for f in findings if f["check"] == "unexpected_unit"]


def test_a_value_systemctl_prints_in_octal_is_read_by_systemctl(lab: Lab) -> None:
    _put(lab, f"{UNITS}/sdbus-ctrl.service", CTRL_UNIT)
    lab.run(HOST, "systemctl daemon-reload && systemctl enable sdbus-ctrl.service", check=True)
    try:
        out = _compare(lab)
    finally:
        lab.run(
            HOST,
            f"systemctl disable sdbus-ctrl.service; rm -f {UNITS}/sdbus-ctrl.service; systemctl daemon-reload",
        )
    assert out["units"]["same"], out["units"]
    assert out["units"]["systemctl_bus"] == ["units-show"]  # the one answer systemctl's text must give
    assert out["units"]["bus"]["environment"]["sdbus-ctrl.service"] == {"CTRL": "a001b"}  # as it always read
    assert out["list_services"]["systemctl_bus"] == []  # the connection still serves the rest


def test_without_the_socket_systemctl_gives_the_same(lab: Lab) -> None:
    out = _compare(lab, socket="/run/systemd/no-such-socket")
    for label, seen in out.items():
        assert seen["same"], label
        assert seen["systemctl_bus"] == seen["systemctl_plain"] != [], label
        assert "no-such-socket" in seen["failed"], label
