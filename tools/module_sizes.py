#!/usr/bin/env python3
"""Fail (exit 1), naming each file, when a module of the controller package passes its size limit.

``make lint`` runs it: a module of ``src/fleetops`` holds at most ``MAX_LINES`` lines (the rule in the
design's conventions: under 500 where it can, never over 700), so a size kept for one change is kept for
the next. ``python3 tools/module_sizes.py [ROOT]`` (ROOT: ``src/fleetops`` beside this file's folder).
"""

from __future__ import annotations

import sys
from pathlib import Path

MAX_LINES = 700
ROOT = Path(__file__).resolve().parents[1] / "src" / "fleetops"


def too_long(root: Path, limit: int = MAX_LINES) -> list[tuple[Path, int]]:
    """Each ``*.py`` under ``root`` with more than ``limit`` lines, and its count, sorted by path."""
    out = []
    for path in sorted(root.rglob("*.py")):
        with path.open("rb") as f:
            lines = sum(1 for _ in f)
        if lines > limit:
            out.append((path, lines))
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0]) if args else ROOT
    if not root.is_dir():
        print(f"{root}: not a folder", file=sys.stderr)
        return 2
    bad = too_long(root)
    for path, lines in bad:
        print(
            f"{path}: {lines} lines, over the {MAX_LINES} a module of fleetops may have: split it by concern",
            file=sys.stderr,
        )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
