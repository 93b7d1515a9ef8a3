"""server.http.json_stream's structural scan fuzzed: 500 derandomized documents whose strings are
full of quotes, backslashes and brackets, cut anywhere by small scan blocks (seconds of pure
Python: a bounded fuzz test beside tests/integration/test_fuzz_inputs.py, not a unit test)."""

from __future__ import annotations

import json
import random

from server.http import json_stream


def _random_value(rng: random.Random, depth: int = 0):
    alphabet = ["\\", '"', ",", "]", "[", "{", "}", ":", "a", " ", "é", "\n"]

    def text() -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))

    r = rng.random()
    if depth > 3 or r < 0.3:
        return rng.choice([text(), 1, 2.5, None, True])
    if r < 0.65:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {text(): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def test_scan_finds_elements_and_members(monkeypatch):
    """Strings full of quotes, backslashes and brackets, cut anywhere by small scan blocks."""
    rng = random.Random(1)
    for _ in range(500):
        monkeypatch.setattr(json_stream, "BLOCK", rng.randint(1, 40))
        array = [_random_value(rng) for _ in range(rng.randint(0, 12))]
        text = json.dumps(array, ensure_ascii=rng.random() < 0.5).encode()
        doc = json_stream.Document(text, 64)
        root = doc.root()
        index = doc.scan(root, 1, every=rng.randint(1, 30))
        assert index.count == len(array)
        got = [v for run in doc.runs(index) for v in doc.load_run(run)] if array else []
        assert got == array
        obj = {str(i): v for i, v in enumerate(array)}
        text = json.dumps(obj).encode()
        doc = json_stream.Document(text, 64)
        assert {k: json.loads(text[s.lo:s.hi]) for k, s in doc.members(doc.root(), 1, 100)} == obj
