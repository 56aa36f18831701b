"""Where the tests find the repository and the captured inputs (real captures, see fixtures/*/README.md)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "unit" / "fixtures"
# The one kubectl stand-in every test runs (no Kubernetes API server can run on these machines).
KUBECTL_STANDIN = REPO / "tests" / "kubectl_standin" / "kubectl"
