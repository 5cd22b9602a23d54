"""The product's modules import one another without a circle: read from the source
(every import statement, also those inside functions), so a lazy import that closes
a loop counts too. A module importing its own package (`from . import x` in a
package's child) is not a circle."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, Path]:
    found = {}
    for top in ("imgfilter", "kernels"):
        for path in (ROOT / top).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported(name: str, path: Path, node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    base = base[: len(base) - node.level + 1] if node.level else []
    prefix = ".".join(base + ([node.module] if node.module else []))
    return [f"{prefix}.{a.name}" if prefix else a.name for a in node.names] + [prefix]


def import_graph() -> dict[str, set[str]]:
    """module -> the product modules it imports anywhere in its source."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _imported(name, path, node):
                    while target and target not in modules:
                        target = target.rpartition(".")[0]
                    if target and target != name and not name.startswith(target + "."):
                        deps.add(target)
        graph[name] = deps
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_in_the_product():
    assert circles(import_graph()) == []


def test_the_check_finds_a_lazy_circle():
    graph = import_graph()
    graph["imgfilter.io"] = graph["imgfilter.io"] | {"imgfilter.prefetch"}
    graph["imgfilter.prefetch"] = graph["imgfilter.prefetch"] | {"imgfilter.io"}
    assert ["imgfilter.io", "imgfilter.prefetch"] in circles(graph)
