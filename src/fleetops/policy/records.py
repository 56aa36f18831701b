"""The records the state files and the EC2 tags hold: where a ladder stands, and an action taken."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field


@dataclass
class RungRecord:
    """Where one ladder of one host stands: the rung last tried, and when."""

    check: str
    rung: int
    action: str
    first_tried: float  # when the ladder's first rung was taken (this episode)
    last_tried: float  # when this rung was taken
    tries: int = 1  # rungs taken in this episode
    quarantined: bool = False  # a quarantine rung was taken in this episode (the taint stays until released)


@dataclass(frozen=True)
class LedgerEntry:
    action: str
    host: str
    group: str
    at: float
    controller: str = ""
    id: str = field(default_factory=lambda: secrets.token_hex(8))
    # reserved before its batch, not yet settled (``at``: when it was reserved): whatever its time, every
    # budget counts it as spent until it is settled (``at`` moved to when its host was acted on) or released
    reserved: bool = False
