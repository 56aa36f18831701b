"""fleetops: find and fix the hidden faults that break GPU fleets (controller side)."""

__version__ = "0.1.0"
