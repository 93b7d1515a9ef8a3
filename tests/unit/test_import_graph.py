"""The structure of ``processor``: its modules import each other without a cycle, never the
packages built around it (the edges, the tools, the demo, the benchmarks, the tests), and its
TensorFlow engine is a package of its own that imports TensorFlow only when a model needs it.

Every module under ``processor/`` is parsed (not imported) and every import it holds counts, at
module level and inside functions alike (tests/import_graph.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

import import_graph

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "processor"


def _modules() -> dict[str, Path]:
    return import_graph.modules(PACKAGE)


def _graph() -> dict[str, set[str]]:
    return import_graph.graph(PACKAGE)


def test_the_parser_sees_deferred_and_relative_imports():
    graph = _graph()
    assert "processor.engine.open_group" in graph
    # open_group imports its backends inside open_session_group, relatively
    assert "processor.engine.onnx.backend" in graph["processor.engine.open_group"]
    assert "processor.engine.tensorflow.backend" in graph["processor.engine.open_group"]
    # ``from .. import native`` is the module processor.native
    assert "processor.native" in graph["processor.engine.onnx.native_engine"]


def test_no_import_cycle_between_processor_modules():
    cycles = import_graph.cycles(_graph())
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


# The edges' packages: processor/ is the core they call, never the other way. The generated gRPC
# stubs in processor/proto/ (``*_pb2_grpc.py``) are the one exception: only the server imports them.
EDGE_PACKAGES = {"server", "fastapi", "starlette", "uvicorn", "grpc"}
# What is built around the core and never imported by it: the developer tools (tools/, with the
# local redis-server of tests), the demo models and the trainer side of checkpoints
# (demo/trainer/), the benchmarks, the tests (and the names they import each other by).
OUTER_PACKAGES = {"tools", "demo", "benchmarks", "tests", "conftest", "fakes", "sp_checks"}


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


def test_processor_imports_nothing_built_around_it():
    offenders = {name: sorted(found) for name, path in _modules().items()
                 if (found := _top_level_imports(path) & OUTER_PACKAGES)}
    assert not offenders, f"processor/ modules import tools, demo, benchmarks or tests: {offenders}"
    # the check sees what it looks for: the demo imports itself by its package name
    assert "demo" in _top_level_imports(ROOT / "demo" / "checkpoint_publish.py")


# The TensorFlow engine is a package, as ONNX Runtime's is (processor/engine/onnx/).
TF_ENGINE = "processor.engine.tensorflow"
TF_ENGINE_MODULES = {"backend", "context", "signature", "variables", "lane_graphs", "placement",
                     "embedding_lookup", "key_replay", "op_libraries"}
# Outside it, what imports it: the engine factory (it picks the backend and the context part) and
# the conversion of SavedModels for ONNX Runtime (it reads their signature and variables).
TF_ENGINE_USERS = {"processor.engine.open_group", "processor.engine.onnx.from_tensorflow"}
# Loose in processor/engine/ and importing TensorFlow all the same: the device plan both engines
# share (it asks TensorFlow, or ONNX Runtime, how many GPUs it sees).
SHARED_WITH_TENSORFLOW = {"processor.engine.device_plan"}


def _eager_imports(path: Path) -> set[str]:
    """The top-level package of every absolute import that runs when ``path`` is imported: not
    inside a function, not under ``if TYPE_CHECKING:``."""
    found = set()

    def visit(nodes) -> None:
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.add(node.module.split(".")[0])
            visit(ast.iter_child_nodes(node))

    visit(ast.parse(path.read_text(), str(path)).body)
    return found


def _in_tf_engine(name: str) -> bool:
    return name == TF_ENGINE or name.startswith(TF_ENGINE + ".")


def test_the_tensorflow_engine_is_a_package_of_its_own():
    modules = _modules()
    graph = _graph()
    missing = {f"{TF_ENGINE}.{m}" for m in TF_ENGINE_MODULES} - set(modules)
    assert not missing, f"TensorFlow engine modules not under processor/engine/tensorflow/: {sorted(missing)}"
    loose = {name for name, path in modules.items()
             if name.rpartition(".")[0] == "processor.engine" and path.name != "__init__.py"}
    importing_tf = {name for name in loose if "tensorflow" in _top_level_imports(modules[name])}
    assert importing_tf == SHARED_WITH_TENSORFLOW, (
        f"modules loose in processor/engine/ that import TensorFlow (TensorFlow-only: move them to "
        f"processor/engine/tensorflow/): {sorted(importing_tf - SHARED_WITH_TENSORFLOW)}")
    users = {name for name, edges in graph.items() if not _in_tf_engine(name) and any(map(_in_tf_engine, edges))}
    assert users == TF_ENGINE_USERS, f"modules outside the TensorFlow engine that import it: {sorted(users)}"
    # none of it imports TensorFlow when imported: a server of .onnx models never imports it
    eager = sorted(name for name in modules if _in_tf_engine(name) and "tensorflow" in _eager_imports(modules[name]))
    assert not eager, f"TensorFlow engine modules importing TensorFlow at import time: {eager}"
    # the checks see what they look for: the backend imports TensorFlow, inside a function
    backend = modules[f"{TF_ENGINE}.backend"]
    assert "tensorflow" in _top_level_imports(backend) and "tensorflow" not in _eager_imports(backend)
    assert "tensorflow" in _eager_imports(ROOT / "demo" / "streaming_trainer.py")


def _reads_manager(path: Path) -> bool:
    return any(isinstance(node, ast.Attribute) and node.attr == "manager"
               for node in ast.walk(ast.parse(path.read_text(), str(path))))


def test_edges_never_touch_a_model_manager():
    """The edges (server/, the C ABI's processor/abi.py) reach a model through the DataPlane and
    the ServedModel, never its ModelManager (docs/architecture.md)."""
    edges = sorted((ROOT / "server").rglob("*.py")) + [ROOT / PACKAGE / "abi.py"]
    offenders = [str(p.relative_to(ROOT)) for p in edges if _reads_manager(p)]
    assert not offenders, f"edge modules read a ModelManager (.manager): {offenders}"
    assert _reads_manager(ROOT / PACKAGE / "dataplane" / "plan.py")  # the check sees what it looks for
