"""fleetops: find and fix the hidden faults that break GPU fleets (controller side)."""

# Written for any Python 3 (no annotations, no f-strings): the rest of the package uses 3.12's syntax,
# which an older Python cannot even parse. pip refuses the wheel there (requires-python, the same
# version: tests/unit/test_versions.py); this is the one line for the sources run some other way.
import sys

REQUIRES_PYTHON = (3, 12)

if sys.version_info < REQUIRES_PYTHON:
    _need = "fleetops needs Python >= {}.{}; {} is Python {}".format(  # noqa: UP032 (no f-string)
        REQUIRES_PYTHON[0], REQUIRES_PYTHON[1], sys.executable, sys.version.split()[0]
    )
    if sys.argv and sys.argv[0].rsplit("/", 1)[-1] == "fleetops":  # the command: one line, exit 2
        sys.stderr.write("fleetops: error: " + _need + "\n")
        raise SystemExit(2)
    raise ImportError(_need)


def _installed_version() -> str:
    """The installed package's version: galaxy.yml's, the project's one version (setup.py)."""
    from importlib import metadata

    try:
        return metadata.version(__name__)
    except metadata.PackageNotFoundError:  # the sources, not installed
        return "unknown"


def __getattr__(name: str) -> str:
    """``fleetops.__version__``, read from the package's metadata when first asked (``fleetops --version``):
    importlib.metadata costs every other command about 30 ms of its start."""
    if name == "__version__":
        version = _installed_version()
        globals()["__version__"] = version
        return version
    raise AttributeError("module {!r} has no attribute {!r}".format(__name__, name))  # noqa: UP032
