"""The command line: argparse and rich live only here. Parse, call the library API, render."""

from __future__ import annotations

from fleetops.cli.app import main

__all__ = ["main"]
