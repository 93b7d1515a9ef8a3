"""A cache entry's parameters: moved out of the ONNX graph into ``weights.bin`` and read back.

``weights.bin`` holds every parameter, 64-byte aligned; the graph refers to it as ONNX external
data, and the manifest's parameter table gives each one's offset, length, dtype, shape and the
TF variable it holds (if any). Functions only; thread-safe.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ...errors import Internal

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


def map_parameters(directory: Path, table: dict[str, Any]):
    """The parameters of ``table`` as arrays over a shared-memory segment (workers > 1).

    The first worker copies ``directory/weights.bin`` into the segment named after the cache
    entry; the others map it (:class:`processor.shared_segments.Segment`): one copy in memory
    for every worker. Returns ``(arrays, segment)``; the caller releases the segment once its
    sessions are gone. The arrays are writable (private pages for what a delta writes).
    """
    import shutil

    from ...shared_segments import Segment

    source = directory / "weights.bin"
    size = source.stat().st_size
    if not size:  # nothing to share (a graph whose constants all stay inside it)
        return read_parameters(directory, table), None
    segment = Segment.open(f"{directory.name}.weights", size, lambda path: shutil.copyfile(source, path))
    out: dict[str, np.ndarray] = {}
    for name, p in table.items():
        dtype = np.dtype(p["dtype"])
        count = int(np.prod(p["shape"], dtype=np.int64))
        if p["offset"] + count * dtype.itemsize > size:
            segment.release()
            raise Internal(f"ONNX cache entry {directory} is truncated at {name!r}")
        out[name] = np.frombuffer(segment.buffer, dtype, count, p["offset"]).reshape(p["shape"])
    return out, segment
