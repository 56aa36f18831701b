"""Failure budgets: failed (or unreachable) hosts tolerated, as a count or a percent of the planned hosts."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class FailureBudget:
    """``--max-failures`` / ``--preflight-max-unreachable``: a count, or a percent rounded down."""

    count: int | None = None
    percent: Fraction | None = None

    @classmethod
    def parse(cls, text: str) -> FailureBudget:
        """``"3"`` or ``"10%"``; ValueError for anything else (negative, over 100%, not a number)."""
        raw = text.strip()
        try:
            if raw.endswith("%"):
                pct = Fraction(raw[:-1].strip())
                if not 0 <= pct <= 100:
                    raise ValueError
                return cls(percent=pct)
            count = int(raw)
            if count < 0:
                raise ValueError
            return cls(count=count)
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"not a host count >= 0 or a percentage 0-100%: {text!r}") from None

    def tolerated(self, hosts: int) -> int:
        if self.count is not None:
            return self.count
        return math.floor((self.percent or Fraction(0)) * hosts / 100)
