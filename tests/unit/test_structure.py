"""How the code is laid out, checked (docs/architecture.md).

``server/`` by protocol: each protocol's modules (its REST routes, gRPC services and codecs) live
in its package (``server/eas``, ``server/tfserving``, ``server/kserve``), the transports
(``server/http``, ``server/grpc``) import no protocol package (the composition root hands them
the protocols' registrations, server/protocols.py), and the modules of ``server`` import each
other without a cycle. Every module is parsed (not imported) and every import counts, at module
level and inside functions alike, as in tests/unit/test_import_graph.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "server"
PROTOCOL_PACKAGES = ("server.eas", "server.tfserving", "server.kserve")
TRANSPORTS = ("server.http", "server.grpc")


def _server_modules() -> dict[str, Path]:
    """Module name -> file, for every ``.py`` file under ``server/``."""
    out = {}
    for path in sorted(SERVER.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _server_imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``server`` that module ``name`` imports, anywhere in its body (relative
    imports resolved; ``from pkg import name`` is an edge to ``pkg.name`` when that is a module,
    else to ``pkg``); the edge to its own parent packages is left out."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
    edges = set()
    for target in found:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target.split(".")[0] == "server" and target != name:
            edges.add(target)
    parents = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    return edges - parents


def _server_graph() -> dict[str, set[str]]:
    modules = _server_modules()
    return {name: _server_imports(name, path, modules) for name, path in modules.items()}


def _first_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (its modules in import order, the first repeated last), or None."""
    white, grey, black = 0, 1, 2
    color = dict.fromkeys(graph, white)
    for start in sorted(graph):
        if color[start] != white:
            continue
        stack = [(start, iter(sorted(graph[start])))]
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
                stack.append((child, iter(sorted(graph[child]))))
    return None


def _inside(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_each_protocols_modules_live_in_its_package():
    misplaced = []
    for name in _server_modules():
        leaf = name.rpartition(".")[2]
        if leaf.startswith("tfs") and not _inside(name, "server.tfserving"):
            misplaced.append(f"{name}: TF Serving's, belongs under server/tfserving/")
        if (leaf.startswith("v2") or leaf.startswith("open_inference")) and not _inside(name, "server.kserve"):
            misplaced.append(f"{name}: KServe v2's, belongs under server/kserve/")
    assert not misplaced, "protocol modules outside their package:\n" + "\n".join(misplaced)
    # the packages are there, each with its registration (server/protocols.py)
    for package in PROTOCOL_PACKAGES:
        init = SERVER / package.split(".")[1] / "__init__.py"
        assert "PROTOCOL = Protocol(" in init.read_text(), package


def test_transports_import_no_protocol_package():
    graph = _server_graph()
    offenders = {name: sorted(t for t in targets if any(_inside(t, p) for p in PROTOCOL_PACKAGES))
                 for name, targets in graph.items() if any(_inside(name, t) for t in TRANSPORTS)}
    offenders = {name: targets for name, targets in offenders.items() if targets}
    assert not offenders, f"transport modules import a protocol package: {offenders}"
    # the check sees what it looks for: a protocol's routes import the HTTP transport, relatively
    assert "server.http.predict" in graph["server.kserve.rest_routes"]
    assert "server.grpc.interceptor" in graph["server.tfserving.grpc_service"]


def test_no_import_cycle_between_server_modules():
    graph = _server_graph()
    assert "server.tfserving.rest_routes" in graph["server.tfserving"]  # deferred imports count
    cycles = []
    while (cycle := _first_cycle(graph)) is not None:  # report every cycle, not just the first
        cycles.append(" -> ".join(cycle))
        graph[cycle[-2]].discard(cycle[-1])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
