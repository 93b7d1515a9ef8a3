"""import_guard: blocks that may import TensorFlow first run one at a time until it is imported
whole, then run freely."""

from __future__ import annotations

import sys
import threading
import time
import types

from processor.import_guard import first_tensorflow_import, tensorflow_imported


def _overlap(holders: int) -> int:
    """The most blocks inside the guard at once when ``holders`` threads enter it together."""
    inside = peak = 0
    lock = threading.Lock()

    def enter() -> None:
        nonlocal inside, peak
        with first_tensorflow_import():
            with lock:
                inside += 1
                peak = max(peak, inside)
            time.sleep(0.05)
            with lock:
                inside -= 1

    threads = [threading.Thread(target=enter) for _ in range(holders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return peak


def _module(initializing: bool) -> types.ModuleType:
    module = types.ModuleType("tensorflow")
    module.__spec__ = types.SimpleNamespace(_initializing=initializing)
    return module


def test_blocks_take_turns_until_tensorflow_is_imported_whole(monkeypatch):
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    assert not tensorflow_imported() and _overlap(3) == 1
    monkeypatch.setitem(sys.modules, "tensorflow", _module(initializing=True))  # an import under way
    assert not tensorflow_imported() and _overlap(3) == 1
    monkeypatch.setitem(sys.modules, "tensorflow", _module(initializing=False))
    assert tensorflow_imported()
    together = threading.Barrier(3, timeout=10)  # broken (an error) if the blocks took turns
    errors: list[BaseException] = []

    def enter() -> None:
        try:
            with first_tensorflow_import():
                together.wait()
        except BaseException as exc:  # asserted below
            errors.append(exc)

    threads = [threading.Thread(target=enter) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors


def test_an_error_in_a_block_releases_the_guard(monkeypatch):
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    try:
        with first_tensorflow_import():
            raise ValueError("load failed")
    except ValueError:
        pass
    assert _overlap(2) == 1  # would hang (and report 0) if the first block had kept the lock
