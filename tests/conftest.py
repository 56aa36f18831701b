"""Shared pytest set-up. `tests.*` and `ansible_collections.fleetops.node.*` are importable through
pytest's `pythonpath` setting (pyproject.toml): the repository root and `collections/`."""
