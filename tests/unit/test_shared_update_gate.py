"""processor/engine/shared_update_gate.py: a delta written once for every process mapping the
segment, requests of every process held while it is written, a writer waiting not starved, a
holder killed with SIGKILL blocking nobody, half a delta never served; and map_parameters'
generations (a segment holding a newer delta than the version loading is not used).

Two gates over one file in one process are two open file descriptions, so their locks exclude
each other as two processes' do; the killed holder is a real child process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from processor import shared_segments
from processor.engine.onnx.weights import map_parameters
from processor.engine.shared_update_gate import (APPLIED, DIRTY, STATE_BYTES, WAITING, SharedUpdateGate,
                                                 state_words)
from processor.errors import Unavailable

ROOT = Path(__file__).resolve().parents[2]


def open_gate(name: str = "g") -> tuple[shared_segments.Segment, SharedUpdateGate, np.ndarray]:
    """A segment of 1024 float32 + the state page, as a worker maps it: (segment, gate, values)."""
    size = 4096 + STATE_BYTES
    segment = shared_segments.Segment.open(name, size, lambda path: Path(path).write_bytes(bytes(size)),
                                           shared_writes=True)
    gate = SharedUpdateGate(segment.fd, state_words(segment.buffer, 4096), segment.path.name)
    return segment, gate, np.frombuffer(segment.buffer, np.float32, 1024)


def test_a_delta_is_written_once_and_seen_by_every_mapping(shm_worker):
    (sa, a, va), (sb, b, vb) = open_gate(), open_gate()
    written = []
    with a.exclusive():
        assert a.apply(5, lambda: (va.__setitem__(slice(None), 5.0), written.append("a")))
    with b.exclusive():  # the other worker gets to the same delta: already there
        assert not b.apply(5, lambda: written.append("b"))
    assert written == ["a"] and vb[0] == 5.0
    assert b.state() == {"applied_delta": 5, "half_written_delta": None, "deltas_written_here": 0}
    with b.exclusive():  # an older one (a worker behind): skipped too
        assert not b.apply(3, lambda: written.append("b"))
    with b.exclusive():
        assert b.apply(6, lambda: written.append("b6"))
    assert written == ["a", "b6"]
    sa.release()
    sb.release()


def test_requests_of_another_process_wait_while_a_delta_is_written(shm_worker):
    (_, a, va), (_, b, vb) = open_gate(), open_gate()
    events: list[str] = []
    b.enter_shared()  # a request in flight in "worker b"

    def write() -> None:
        with a.exclusive():
            events.append("writing")
            a.apply(1, lambda: va.__setitem__(slice(None), 1.0))
        events.append("written")

    writer = threading.Thread(target=write)
    writer.start()
    time.sleep(0.2)
    assert events == []  # b's request holds the writer back
    events.append("request done")
    b.exit_shared()
    writer.join(5)
    assert events == ["request done", "writing", "written"]
    b.enter_shared()  # after it: b reads the new rows
    assert vb[0] == 1.0
    b.exit_shared()


def test_a_waiting_writer_is_not_starved_by_overlapping_requests(shm_worker):
    (_, a, _), (_, b, _) = open_gate(), open_gate()
    stop = threading.Event()
    served = [0]

    def requests() -> None:  # two threads of "worker b" whose requests always overlap
        while not stop.is_set():
            b.enter_shared()
            time.sleep(0.002)
            served[0] += 1
            b.exit_shared()

    threads = [threading.Thread(target=requests) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    started = time.monotonic()
    with a.exclusive():
        a.apply(1, lambda: None)
    waited = time.monotonic() - started
    before = served[0]
    time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join(5)
    assert waited < 2.0, f"the writer waited {waited:.2f} s"
    assert served[0] > before  # and requests went on after it
    assert b.state()["applied_delta"] == 1


def test_an_event_loop_request_is_not_admitted_while_another_worker_writes(shm_worker):
    """try_enter_shared (the event loop's form): False at once while any worker's update holds
    or waits for the gate, never waiting; admitted again once it is done."""
    (_, a, _), (_, b, _) = open_gate(), open_gate()
    assert b.try_enter_shared()
    b.exit_shared()
    b.enter_shared()  # a request in flight in "worker b": a's writer waits for it
    writing = threading.Event()
    done = threading.Event()

    def write() -> None:
        with a.exclusive():
            writing.set()
            a.apply(1, lambda: None)
            done.wait(5)

    writer = threading.Thread(target=write)
    writer.start()
    deadline = time.monotonic() + 5
    while not a._words[WAITING]:
        assert time.monotonic() < deadline, "the writer never raised WAITING"
        time.sleep(0.01)
    started = time.monotonic()
    assert not b.try_enter_shared()  # a writer waits: refused at once
    assert time.monotonic() - started < 0.5
    b.exit_shared()
    assert writing.wait(5)
    assert not b.try_enter_shared()  # a writer writes
    done.set()
    writer.join(5)
    assert b.try_enter_shared()
    b.exit_shared()


CHILD = """
import sys, time
sys.path.insert(0, {root!r})
from processor import shared_segments
from processor.engine.shared_update_gate import SharedUpdateGate, state_words
shared_segments.enable("424242", {dir!r})
seg = shared_segments.Segment.open("g", 4096 + 4096, lambda p: None, shared_writes=True)
gate = SharedUpdateGate(seg.fd, state_words(seg.buffer, 4096), "g")
{body}
"""


def run_child(directory: Path, body: str) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(root=str(ROOT), dir=str(directory), body=body)],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "holding", "the child did not get the lock"
    return child


def test_a_writer_killed_mid_write_blocks_nobody_and_half_a_delta_is_never_served(shm_worker):
    seg, a, va = open_gate()
    child = run_child(shm_worker, """
import numpy as np
values = np.frombuffer(seg.buffer, np.float32, 1024)
def half():
    values[:512] = 9.0  # half of delta 9, then killed
    print("holding", flush=True)
    time.sleep(60)
with gate.exclusive():
    gate.apply(9, half)
""")
    words = state_words(seg.buffer, 4096)
    assert words[DIRTY] == 10 and words[WAITING] == 1
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    with pytest.raises(Unavailable, match="part of delta 9"):  # not blocked, and not served half
        a.enter_shared()
    with a.exclusive():  # the next worker to apply delta 9 repairs it
        assert a.apply(9, lambda: va.__setitem__(slice(None), 9.0))
    a.enter_shared()
    assert (va == 9.0).all() and a.state()["applied_delta"] == 9 and a.state()["half_written_delta"] is None
    assert words[WAITING] == 0
    a.exit_shared()


def test_a_reader_killed_holding_the_lock_blocks_no_writer(shm_worker):
    seg, a, _ = open_gate()
    child = run_child(shm_worker, """
gate.enter_shared()
print("holding", flush=True)
time.sleep(60)
""")
    done = threading.Event()

    def write() -> None:
        with a.exclusive():
            a.apply(2, lambda: None)
        done.set()

    writer = threading.Thread(target=write)
    writer.start()
    assert not done.wait(0.3)  # the child's request holds it back
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    assert done.wait(5)
    writer.join()


def test_a_stale_waiting_flag_of_a_dead_writer_is_cleared(shm_worker):
    seg, a, _ = open_gate()
    words = state_words(seg.buffer, 4096)
    words[WAITING] = 1  # as a writer killed between raising it and taking the data lock leaves it
    a.enter_shared()
    a.exit_shared()
    assert words[WAITING] == 0


def test_map_parameters_generations_and_a_pins_own_segment(shm_worker, tmp_path_factory):
    """A segment holding a newer delta than the version loading is not reused (the next
    generation is); a pinned load maps a segment of the pin's own, which a follower's newer
    delta never reaches; a private mapping's writes stay in it."""
    entry = tmp_path_factory.mktemp("entry")
    values = np.arange(2048, dtype=np.float32)
    (entry / "weights.bin").write_bytes(values.tobytes())
    table = {"w": {"offset": 0, "length": values.nbytes, "dtype": "<f4", "shape": [2048], "variable": "w"}}
    params, seg0, gate0 = map_parameters(entry, table, shared_writes=True, delta_step=-1)
    with gate0.exclusive():
        gate0.apply(3, lambda: params["w"].__setitem__(0, 3.0))
    same, seg_same, _ = map_parameters(entry, table, shared_writes=True, delta_step=4)  # 3 then 4: usable
    assert seg_same.path == seg0.path and same["w"][0] == 3.0
    older, seg1, gate1 = map_parameters(entry, table, shared_writes=True, delta_step=2)  # a pin to 2
    assert seg1.path.name.endswith(".weights.1") and older["w"][0] == 0.0 and gate1.state()["applied_delta"] is None
    pinned, seg_pin, gate_pin = map_parameters(entry, table, shared_writes=True, delta_step=3, pinned=True)
    assert seg_pin.path.name.endswith(".weights.pin4") and pinned["w"][0] == 0.0  # its own, from the full
    with gate_pin.exclusive():  # the pin's own deltas (up to 3) are written into it once
        gate_pin.apply(3, lambda: pinned["w"].__setitem__(0, 3.0))
    with gate0.exclusive():  # a worker still following writes a newer delta: not under the pin
        gate0.apply(5, lambda: params["w"].__setitem__(0, 5.0))
    assert pinned["w"][0] == 3.0 and same["w"][0] == 5.0
    private, seg_p, gate_p = map_parameters(entry, table, shared_writes=False, delta_step=-1)
    assert gate_p is None
    private["w"][1] = -1.0  # copy-on-write: not seen by the shared mapping
    assert params["w"][1] == 1.0
    for seg in (seg0, seg_same, seg1, seg_pin, seg_p):
        seg.release()
    assert not [p for p in shm_worker.iterdir() if ".weights" in p.name]
