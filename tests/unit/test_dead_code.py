"""Dead code: vulture over the shipped packages, the tools and the benchmarks.

Fails listing every function, class, method, attribute or variable nothing uses. Uses are
looked for in those directories, in ``tests/`` (a test that reads an accessor is a user of it)
and in ``vulture_allowlist.py`` (names that frameworks, C and protocol buffers reach). Generated
protocol-buffer modules are not checked. Unused code is deleted, not allow-listed; a name goes
into the allow-list only when something outside our Python calls it (say what, there).
"""

from __future__ import annotations

from pathlib import Path

import vulture

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("processor", "server", "demo", "tools", "benchmarks")
ALLOWLIST = Path(__file__).with_name("vulture_allowlist.py")
GENERATED = ["*_pb2.py", "*_pb2_grpc.py"]
# FastAPI routes and exception handlers, pydantic validators: the framework calls them.
FRAMEWORK_DECORATORS = ["@app.*", "@router.*", "@field_validator", "@model_validator"]


def test_no_unused_code():
    checker = vulture.Vulture(ignore_decorators=FRAMEWORK_DECORATORS)
    checker.scavenge([str(ROOT / d) for d in CHECKED] + [str(ROOT / "tests"), str(ALLOWLIST)],
                     exclude=GENERATED)
    roots = tuple(ROOT / d for d in CHECKED)
    unused = [item.get_report(add_size=False) for item in checker.get_unused_code()
              if any(Path(item.filename).is_relative_to(r) for r in roots)]
    assert not unused, ("unused code (delete it; or, if a framework or C calls it, add the name to "
                        "tests/unit/vulture_allowlist.py saying what calls it):\n" + "\n".join(unused))
