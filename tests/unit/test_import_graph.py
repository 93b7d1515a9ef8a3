"""The modules of ``processor`` import each other without a cycle.

Every module under ``processor/`` is parsed (not imported) and every import it holds counts, at
module level and inside functions alike: an import deferred into a function still ties the two
modules together, it only hides the cycle from the interpreter. Relative imports are resolved;
``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``. Only
modules of ``processor`` count, and the edge from a module to its own parent package (which
Python imports first anyway) is left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "processor"


def _modules() -> dict[str, Path]:
    """Module name -> file, for every ``.py`` file under ``processor/``."""
    out = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``processor`` that module ``name`` imports, anywhere in its body."""
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
                found.add(sub if sub in modules else target)
    edges = set()
    for target in found:
        # ``import processor.a.b`` is the module processor.a.b (a name that is no module: its
        # nearest enclosing module).
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target.split(".")[0] == PACKAGE and target != name:
            edges.add(target)
    parents = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    return edges - parents


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (its modules in import order, the first repeated last), or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = dict.fromkeys(graph, WHITE)
    for start in sorted(graph):
        if color[start] != WHITE:
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        color[start] = GREY
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                color[node] = BLACK
            elif color.get(child, BLACK) == GREY:
                return path[path.index(child):] + [child]
            elif color.get(child) == WHITE:
                color[child] = GREY
                path.append(child)
                stack.append((child, iter(sorted(graph[child]))))
    return None


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_the_parser_sees_deferred_and_relative_imports():
    graph = _graph()
    assert "processor.engine.open_group" in graph
    # open_group imports its backends inside open_session_group, relatively
    assert "processor.engine.onnx.backend" in graph["processor.engine.open_group"]
    assert "processor.engine.tensorflow_backend" in graph["processor.engine.open_group"]
    # ``from .. import native`` is the module processor.native
    assert "processor.native" in graph["processor.engine.onnx.native_engine"]


def test_no_import_cycle_between_processor_modules():
    graph = _graph()
    cycles = []
    while (cycle := _cycle(graph)) is not None:  # report every cycle, not just the first
        cycles.append(" -> ".join(cycle))
        graph[cycle[-2]].discard(cycle[-1])  # drop its last edge and look again
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


# The edges' packages: processor/ is the core they call, never the other way. The generated gRPC
# stubs in processor/proto/ (``*_pb2_grpc.py``) are the one exception: only the server imports them.
EDGE_PACKAGES = {"server", "fastapi", "starlette", "uvicorn", "grpc"}


def _top_level_imports(path: Path) -> set[str]:
    """The top-level package of every absolute import in ``path``, anywhere in its body."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_processor_imports_no_edge():
    offenders = {name: sorted(found) for name, path in _modules().items()
                 if not path.name.endswith("_pb2_grpc.py") and (found := _top_level_imports(path) & EDGE_PACKAGES)}
    assert not offenders, f"processor/ modules import an edge's package: {offenders}"
    # the check sees what it looks for: the stubs import grpc
    assert "grpc" in _top_level_imports(ROOT / PACKAGE / "proto" / "processor_service_pb2_grpc.py")


def _reads_manager(path: Path) -> bool:
    return any(isinstance(node, ast.Attribute) and node.attr == "manager"
               for node in ast.walk(ast.parse(path.read_text(), str(path))))


def test_edges_never_touch_a_model_manager():
    """The edges (server/, the C ABI's processor/abi.py) reach a model through the DataPlane and
    the ServedModel, never its ModelManager (docs/architecture.md)."""
    edges = sorted((ROOT / "server").rglob("*.py")) + [ROOT / PACKAGE / "abi.py"]
    offenders = [str(p.relative_to(ROOT)) for p in edges if _reads_manager(p)]
    assert not offenders, f"edge modules read a ModelManager (.manager): {offenders}"
    assert _reads_manager(ROOT / PACKAGE / "dataplane.py")  # the check sees what it looks for
