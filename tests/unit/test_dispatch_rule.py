"""One rule for where a request runs (issue 49): a model's plan decides
(:mod:`processor.dataplane.plan`), the DataPlane alone reads its decision, and
``ServingRuntime`` alone acts on it (in place, the batching queue or the pool). Checked over the
source (parsed, not imported), so a new edge that decides for itself fails here."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE = ("processor", "server")


def _calls(attr: str, owner: str | None = None) -> Counter:
    """Where ``<anything>.attr(...)`` (``owner``: ``<...>.owner.attr(...)`` or
    ``owner.attr(...)``) is called in processor/ and server/: file -> count."""
    found: Counter = Counter()
    for folder in CODE:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == attr):
                    continue
                target = node.func.value
                name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
                if owner is None or name == owner:
                    found[str(path.relative_to(ROOT))] += 1
    return found


def _reads(attr: str, owner: str | None = None) -> set[str]:
    """The files of processor/ and server/ that read ``<anything>.attr`` (``owner``: only
    ``owner.attr`` / ``<...>.owner.attr``)."""
    found = set()
    for folder in CODE:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.ctx, ast.Load):
                    target = node.value
                    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
                    if owner is None or name == owner:
                        found.add(str(path.relative_to(ROOT)))
    return found


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
