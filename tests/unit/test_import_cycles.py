"""No import cycle in fleetops or fleetops_lab, counting the imports inside functions.

A function-level import hides a cycle from Python at start-up, not from the design: the two modules
still need each other. import-linter's acyclic_siblings contracts (pyproject.toml) find a cycle
between the children of a package; this test finds the ones they cannot, through a package's own
``__init__`` (``fleetops.cli`` imports ``fleetops.cli.app``: ``app`` importing ``fleetops.cli`` back
is a cycle between a package and its child, not between siblings). Every import statement counts,
wherever it stands (module level, a function, ``if TYPE_CHECKING:``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

from tests.paths import REPO

ROOTS = (REPO / "src" / "fleetops", REPO / "lab" / "src" / "fleetops_lab")


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package at ``root``, by dotted name (a package by its ``__init__.py``)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports(name: str, source: str, known: Iterable[str], *, package: bool = False) -> set[str]:
    """The known modules that module ``name`` imports, anywhere in ``source``.

    ``import a.b`` imports ``a.b``; ``from a import b`` imports ``a.b`` when that is a module,
    else ``a``; relative imports are resolved against ``name`` (a package against itself)."""
    known = set(known)
    base = name.split(".") if package else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                up = base[: len(base) - (node.level - 1)]
                frm = ".".join([*up, node.module] if node.module else up)
            else:
                frm = node.module or ""
            for alias in node.names:
                sub = f"{frm}.{alias.name}"
                out.add(sub if sub in known else frm)
    return {m for m in out if m in known}


def graph(sources: Mapping[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """Module -> the modules it imports, from {name: (source, is_package)}."""
    return {n: imports(n, src, sources, package=pkg) - {n} for n, (src, pkg) in sources.items()}


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def describe(component: list[str], edges: Mapping[str, set[str]]) -> str:
    inside = set(component)
    return "; ".join(f"{m} -> {', '.join(sorted(edges[m] & inside))}" for m in component)


def repository_graph() -> dict[str, set[str]]:
    sources = {}
    for root in ROOTS:
        for name, path in modules(root).items():
            sources[name] = (path.read_text(), path.name == "__init__.py")
    return graph(sources)


def test_no_import_cycle_in_fleetops_or_the_lab() -> None:
    edges = repository_graph()
    assert "fleetops.cli.app" in edges and "fleetops_lab.core" in edges
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n".join(describe(c, edges) for c in found)


def test_the_check_finds_a_cycle_hidden_in_a_function() -> None:
    sources = {
        "pkg": ("", True),
        "pkg.a": ("from pkg import b\n", False),
        "pkg.b": ("def f():\n    from . import a\n    return a\n", False),
        "pkg.c": ("import pkg.a\n", False),
    }
    edges = graph(sources)
    assert edges == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.c": {"pkg.a"}}
    assert cycles(edges) == [["pkg.a", "pkg.b"]]


def test_the_check_finds_a_cycle_through_a_package_init() -> None:
    sources = {
        "pkg": ("from pkg.app import main\n", True),
        "pkg.app": ("if False:\n    from pkg import VERSION\n", False),
        "pkg.other": ("from .app import main\n", False),
    }
    edges = graph(sources)
    assert edges["pkg"] == {"pkg.app"} and edges["pkg.app"] == {"pkg"}
    assert cycles(edges) == [["pkg", "pkg.app"]]
    assert describe(["pkg", "pkg.app"], edges) == "pkg -> pkg.app; pkg.app -> pkg"
