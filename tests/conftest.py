from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# tests import helpers as `tests.helpers`; module_utils as ansible_collections.fleetops.node...
for p in (ROOT, ROOT / "collections"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
