"""``python -m fleetops.policy --write DIR | --check FILE...`` (:func:`fleetops.policy.schema.main`)."""

from fleetops.policy.schema import main

if __name__ == "__main__":
    raise SystemExit(main())
