"""``moto_server`` with the DescribeInstanceStatus filters EC2 documents and moto 5 ignores.

``python -m fleetops_lab.motoserver [moto_server arguments]`` is moto's own server (``moto.server.main``)
after ``install()``, which ``MotoServer`` starts by default. moto answers DescribeInstanceStatus with
every instance whatever its ``Filters`` say (it applies ``instance-state-name`` and
``instance-state-code`` only) and reports every running instance's checks ``ok``. After
``install()``, as on EC2:

* ``instance-status.status`` and ``system-status.status`` keep the instances whose check has one of
  the values given (``ok``, ``impaired``, ``initializing``, ``insufficient-data``, ``not-applicable``);
* ``event.code`` keeps the instances with a scheduled event of one of the codes given: moto does not
  model events, so an instance's events are the codes of its ``fleetops:event`` tag (comma separated),
  the tag ``fleetops_lab.ec2sim.Ec2Proxy`` writes as ``<eventsSet>`` items into the answers;
* a running instance tagged ``fleetops:instance-status=<status>`` or ``fleetops:system-status=<status>``
  reports that status for that check (an instance that is not running: ``not-applicable``, as moto
  says).

Filter values are matched exactly (no wildcards); other filter names are left to moto, as before.
"""

from __future__ import annotations

import sys
from typing import Any

EVENT_TAG = "fleetops:event"  # the same tag as ec2sim.EVENT_TAG (ec2sim imports nothing of moto)
INSTANCE_STATUS_TAG = "fleetops:instance-status"
SYSTEM_STATUS_TAG = "fleetops:system-status"


def _tags(instance: Any) -> dict[str, str]:
    # the backend's own index (a defaultdict: .get does not add an entry); get_tags() scans every tag
    tags: dict[str, str] = instance.ec2_backend.tags.get(instance.id, {})
    return tags


def _check(instance: Any, tag: str) -> dict[str, Any]:
    if instance.state_code != 16:
        return {"Status": "not-applicable"}
    status = _tags(instance).get(tag) or "ok"
    reachability = {"ok": "passed", "impaired": "failed"}.get(status, status)
    return {"Details": [{"Name": "reachability", "Status": reachability}], "Status": status}


def _event_codes(instance: Any) -> set[str]:
    return {code.strip() for code in (_tags(instance).get(EVENT_TAG) or "").split(",") if code.strip()}


def install() -> None:
    """Teach moto's Instance the status filters and the tagged statuses (see the module's doc)."""
    from moto.ec2.models.instances import Instance

    if getattr(Instance, "_fleetops_status_filters", False):
        return
    moto_applies = Instance.applies

    def applies(self: Any, filters: list[dict[str, Any]]) -> bool:
        for f in filters or ():
            name, values = f["name"], set(f["values"])
            if name == "instance-status.status" and self.instance_status["Status"] not in values:
                return False
            if name == "system-status.status" and self.system_status["Status"] not in values:
                return False
            if name == "event.code" and not _event_codes(self) & values:
                return False
        return bool(moto_applies(self, filters))

    Instance.applies = applies  # type: ignore[method-assign]
    Instance.instance_status = property(lambda self: _check(self, INSTANCE_STATUS_TAG))  # type: ignore[assignment,method-assign]
    Instance.system_status = property(lambda self: _check(self, SYSTEM_STATUS_TAG))  # type: ignore[assignment,method-assign]
    Instance._fleetops_status_filters = True  # type: ignore[attr-defined]


def main() -> None:
    install()
    from moto.server import main as moto_main

    sys.argv[0] = "moto_server"
    moto_main()


if __name__ == "__main__":
    main()
