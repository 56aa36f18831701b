"""Stand-in for pip's get-pip.py, which ansible-test downloads from a host this network cannot reach.

ansible-test runs it as ``python get_pip_X_Y.py [pip install options] pip==X.Y --no-setuptools --no-wheel``
inside an empty virtual environment. We do the same thing get-pip.py does: run pip from the wheel that
this interpreter bundles (ensurepip), and let it install the requested pip from the package index.
"""

import ensurepip
import glob
import os
import sys

bundled = sorted(glob.glob(os.path.join(os.path.dirname(ensurepip.__file__), "_bundled", "pip-*.whl")))
if not bundled:
    sys.exit("get_pip stub: this Python has no bundled pip wheel (ensurepip/_bundled)")
sys.path.insert(0, bundled[-1])

from pip._internal.cli.main import main as pip_main  # noqa: E402

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.exit(pip_main(["install", *args]))
