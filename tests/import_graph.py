"""The import graph of one of the repo's packages, read from its source (parsed, not imported),
for the structure tests (tests/unit/test_import_graph.py, tests/unit/test_structure.py).

Every import counts, at module level and inside functions alike: an import deferred into a
function still ties the two modules together, it only hides a cycle from the interpreter.
Relative imports are resolved; ``from pkg import name`` is an edge to ``pkg.name`` when that is
a module, else to ``pkg``. Only the package's own modules count, and the edge from a module to
its own parent packages (which Python imports first anyway) is left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def modules(package: str) -> dict[str, Path]:
    """Module name -> file, for every ``.py`` file under the package's folder."""
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` (one package's) that module ``name`` imports, anywhere in its body."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                if not is_package:
                    base = base[:-1]  # a module's ``.`` is its package
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    package = name.split(".")[0]
    edges = set()
    for target in found:
        # ``import pkg.a.b`` is the module pkg.a.b (a name that is no module: its nearest enclosing module)
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target.split(".")[0] == package and target != name:
            edges.add(target)
    parents = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    return edges - parents


def graph(package: str) -> dict[str, set[str]]:
    """Each module of ``package`` -> the modules of it that it imports."""
    known = modules(package)
    return {name: imports(name, path, known) for name, path in known.items()}


def first_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``edges`` (its modules in import order, the first repeated last), or None."""
    white, grey, black = 0, 1, 2
    color = dict.fromkeys(edges, white)
    for start in sorted(edges):
        if color[start] != white:
            continue
        stack = [(start, iter(sorted(edges[start])))]
        path = [start]
        color[start] = grey
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                color[node] = black
            elif color.get(child, black) == grey:
                return path[path.index(child):] + [child]
            elif color.get(child) == white:
                color[child] = grey
                path.append(child)
                stack.append((child, iter(sorted(edges[child]))))
    return None


def cycles(edges: dict[str, set[str]]) -> list[str]:
    """Every cycle of ``edges``, each as ``a -> b -> a`` (each found drops its last edge and the
    search goes on, so all are reported, not just the first)."""
    edges = {name: set(targets) for name, targets in edges.items()}
    found = []
    while (cycle := first_cycle(edges)) is not None:
        found.append(" -> ".join(cycle))
        edges[cycle[-2]].discard(cycle[-1])
    return found
