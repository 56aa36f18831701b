"""``python -m fleetops.schemas --write DIR`` (:func:`fleetops.schemas.main`)."""

from fleetops.schemas import main

if __name__ == "__main__":
    raise SystemExit(main())
