"""A cache entry's parameters: moved out of the ONNX graph into ``weights.bin`` and read back.

``weights.bin`` holds every parameter, 64-byte aligned; the graph refers to it as ONNX external
data, and the manifest's parameter table gives each one's offset, length, dtype, shape and the
TF variable it holds (if any). Functions only; thread-safe.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import Internal

log = logging.getLogger(__name__)

ALIGN = 64
EXTERNAL_MIN_BYTES = 4096


def externalize_parameters(model, work: Path, variables: dict[str, str]) -> dict[str, Any]:
    """Move the parameters into ``work/weights.bin``; return the parameter table.

    Parameters are the initializers holding a TF variable unchanged (``variables`` maps their
    names to the variable) and every numeric initializer of at least :data:`EXTERNAL_MIN_BYTES`.
    Small constants stay in the graph: ONNX shape inference must read them (axes, shapes).
    """
    from onnx import TensorProto, numpy_helper

    table: dict[str, Any] = {}
    offset = 0
    with open(work / "weights.bin", "wb") as f:
        for tensor in model.graph.initializer:
            if tensor.data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
                continue
            array = np.ascontiguousarray(numpy_helper.to_array(tensor))
            if tensor.name not in variables and array.nbytes < EXTERNAL_MIN_BYTES:
                continue
            offset = (offset + ALIGN - 1) // ALIGN * ALIGN
            f.seek(offset)
            data = array.tobytes()
            f.write(data)
            table[tensor.name] = {"offset": offset, "length": len(data), "dtype": array.dtype.str,
                                  "shape": list(array.shape), "variable": variables.get(tensor.name)}
            for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
                tensor.ClearField(field)
            del tensor.external_data[:]
            for key, value in (("location", "weights.bin"), ("offset", str(offset)), ("length", str(len(data)))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            tensor.data_location = TensorProto.EXTERNAL
            offset += len(data)
    return table


def read_parameters(directory: Path, table: dict[str, Any]) -> dict[str, np.ndarray]:
    """Read every parameter of ``table`` from ``directory/weights.bin`` into fresh numpy memory."""
    out: dict[str, np.ndarray] = {}
    with open(directory / "weights.bin", "rb", buffering=0) as f:
        for name, p in table.items():
            array = np.empty(p["shape"], np.dtype(p["dtype"]))
            f.seek(p["offset"])
            view = memoryview(array).cast("B") if array.size else memoryview(b"")
            if array.size and f.readinto(view) != p["length"]:
                raise Internal(f"ONNX cache entry {directory} is truncated at {name!r}")
            out[name] = array
    return out


GENERATIONS = 8  # segments of one cache entry at most (see map_parameters)


def host_parameters(directory: Path, table: dict[str, Any], *, on_gpu: bool, delta_step: int, pinned: bool):
    """A version's host parameters, ``(arrays, segment or None, gate or None)``: in a worker
    process, over the server's shared segment (:func:`map_parameters`; CPU lanes share its
    writes, GPU lanes keep device copies a write in another worker never reaches, so each worker
    writes its own private pages); else, or when no segment can be had (``/dev/shm`` full:
    Docker's 64 MB default; logged), read into this process's own memory."""
    from ...shared_segments import active

    if active() is not None:
        try:
            return map_parameters(directory, table, shared_writes=not on_gpu, delta_step=delta_step,
                                  pinned=pinned)
        except OSError as exc:
            log.warning("parameters of %s not in shared memory (%s): this worker holds its own copy",
                        directory.name, exc)
    return read_parameters(directory, table), None, None


def map_parameters(directory: Path, table: dict[str, Any], *, shared_writes: bool, delta_step: int,
                   pinned: bool = False):
    """The parameters of ``table`` as arrays over a shared-memory segment (workers > 1).

    The first worker copies ``directory/weights.bin`` into the segment named after the cache
    entry; the others map it (:class:`processor.shared_segments.Segment`): one copy in memory
    for every worker. A state page follows the data (:mod:`..shared_update_gate`).

    ``shared_writes``: the mapping is shared and a delta is written once, for every worker,
    under the returned :class:`~..shared_update_gate.SharedUpdateGate`. The segment may then
    hold deltas already: the version loading (``delta_step``, -1 for the bare full) applies the
    ones after them. A segment holding a newer delta than ``delta_step`` (workers serving a
    newer delta of this full while this one loads an older version: a pin, a rollback) is not
    used; the next generation of the entry is (``<entry>.weights.1`` ...). ``pinned``: the
    version is loaded to be pinned; it maps a segment of that pin's own
    (``<entry>.weights.pin<delta_step + 1>``), shared by the workers that pin it, so a worker still
    following the newest version (the admin journal reaches the workers one after another)
    never writes a newer delta under it. Without
    ``shared_writes`` the mapping is private: each worker's deltas go to its own copy-on-write
    pages, and no gate is returned.

    Returns ``(arrays, segment, gate)``; the caller releases the segment once its sessions are
    gone. OSError when no segment can be had (``/dev/shm`` full, every generation ahead).
    """
    import shutil

    from ...shared_segments import Segment
    from ..shared_update_gate import APPLIED, DIRTY, STATE_BYTES, SharedUpdateGate, state_words

    source = directory / "weights.bin"
    size = source.stat().st_size
    if not size:  # nothing to share (a graph whose constants all stay inside it)
        return read_parameters(directory, table), None, None
    state_at = -(-size // STATE_BYTES) * STATE_BYTES
    total = state_at + STATE_BYTES

    def fill(path: Path) -> None:
        shutil.copyfile(source, path)
        os.truncate(path, total)  # the state page: zeros, no delta written

    for generation in range(GENERATIONS):
        name = (f"{directory.name}.weights" + (f".pin{delta_step + 1}" if pinned else "")
                + (f".{generation}" if generation else ""))
        segment = Segment.open(name, total, fill, shared_writes=shared_writes)
        gate = None
        if shared_writes:
            words = state_words(segment.buffer, state_at)
            if max(words[APPLIED], words[DIRTY]) > delta_step + 1:  # holds a newer delta
                words.release()
                segment.release()
                continue
            gate = SharedUpdateGate(segment.fd, words, segment.path.name)
        break
    else:
        raise OSError(f"every shared segment of {directory.name} holds a newer delta than {delta_step}")
    out: dict[str, np.ndarray] = {}
    for name, p in table.items():
        dtype = np.dtype(p["dtype"])
        count = int(np.prod(p["shape"], dtype=np.int64))
        if p["offset"] + count * dtype.itemsize > size:
            segment.release()
            raise Internal(f"ONNX cache entry {directory} is truncated at {name!r}")
        out[name] = np.frombuffer(segment.buffer, dtype, count, p["offset"]).reshape(p["shape"])
    return out, segment, gate
