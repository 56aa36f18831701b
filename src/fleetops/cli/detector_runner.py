"""``python -m fleetops.cli.detector_runner --write | --check``: the detector timer's runner archive
(:mod:`fleetops.detector_runner` builds it; its command line lives here, with the CLI's argparse)."""

from __future__ import annotations

import argparse
import sys

from fleetops import detector_runner


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fleetops.cli.detector_runner",
        description=(detector_runner.__doc__ or "").split("\n\n")[0],
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--write",
        action="store_true",
        help=f"rebuild {detector_runner.ARCHIVE.relative_to(detector_runner.REPO)}",
    )
    what.add_argument(
        "--check", action="store_true", help="exit 1 when the archive is not what --write makes"
    )
    args = parser.parse_args(argv)
    if args.write:
        print(detector_runner.write())
        return 0
    why = detector_runner.stale()
    if why is not None:
        print(why, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
