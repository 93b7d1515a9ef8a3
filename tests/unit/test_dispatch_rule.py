"""One rule for where a request runs (issue 49): a model's plan decides
(:mod:`processor.dataplane.plan`), the DataPlane alone reads its decision, and
``ServingRuntime`` alone acts on it (in place, the batching queue or the pool). Checked over the
source (parsed, not imported), so a new edge that decides for itself fails here."""

from __future__ import annotations

import ast
import functools
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE = ("processor", "server")


def _owner(node: ast.AST) -> str | None:
    """The name an attribute is taken of: ``x`` of ``x.attr``, ``b`` of ``a.b.attr``."""
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)


@functools.cache
def _uses() -> tuple[tuple[str, str, str, str | None], ...]:
    """Every attribute call and read in processor/ and server/, parsed once: (path from the
    root, "call" or "read", the attribute, the name it is taken of)."""
    out = []
    for folder in CODE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            where = str(path.relative_to(ROOT))
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    out.append((where, "call", node.func.attr, _owner(node.func.value)))
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                    out.append((where, "read", node.attr, _owner(node.value)))
    return tuple(out)


def _calls(attr: str, owner: str | None = None) -> Counter:
    """Where ``<anything>.attr(...)`` (``owner``: ``<...>.owner.attr(...)`` or
    ``owner.attr(...)``) is called in processor/ and server/: file -> count."""
    return Counter(path for path, kind, name, of in _uses()
                   if kind == "call" and name == attr and (owner is None or of == owner))


def _reads(attr: str, owner: str | None = None) -> set[str]:
    """The files of processor/ and server/ that read ``<anything>.attr`` (``owner``: only
    ``owner.attr`` / ``<...>.owner.attr``)."""
    return {path for path, kind, name, of in _uses()
            if kind == "read" and name == attr and (owner is None or of == owner)}


def test_the_plan_decides_in_one_place_and_the_dataplane_alone_reads_its_decision():
    # DataPlane.where (an edge asking before a body arrives) and submit (a wire call, a Work)
    assert _calls("where", "plan") == {"processor/dataplane/plane.py": 3}
    # the plan's other derived facts: the DataPlane's paths, and the direct path's followers
    # (the C ABI's; the native gRPC server's)
    assert _reads("prepares", "plan") == {"processor/dataplane/plane.py"}
    assert "processor/processor.py" in _reads("plain", "plan") <= {"processor/processor.py",
                                                                     "server/grpc/native_server.py"}
    assert _reads("hot", "plan") == {"processor/dataplane/plane.py"}


def test_the_runtime_alone_chooses_between_the_loop_the_batch_waiter_and_the_pool():
    assert set(_calls("submit", "dataplane")) == {"server/runtime.py"}
    assert set(_calls("where", "dataplane")) == {"server/runtime.py"}  # runs_here, for the lean path
    assert set(_calls("run", "rt")) <= set()  # an edge never picks the pool itself: it dispatches


def test_the_old_path_deciders_are_gone():
    names = ("try_inline", "queue_batched", "runs_in_place", "inline_hint", "predict_wire", "in_place")
    for name in names:
        assert not _calls(name) and not _reads(name), name
