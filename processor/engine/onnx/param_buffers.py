"""Parameter buffers: the weights in memory the processor owns, handed to every ONNX Runtime session.

One :class:`BufferSet` holds the parameters one place needs: the host (numpy arrays) or one GPU
(CUDA tensors of PyTorch, the ``gpu`` extra's array library). Its life, the same in both places:

1. allocation: ``BufferSet(arrays, memory)`` puts the parameters read from the cache entry into
   that memory (host: the numpy arrays themselves, no copy; GPU: one device copy each);
2. hand-over: :meth:`BufferSet.add_to` adds every parameter a session needs to its
   ``SessionOptions`` as an initializer over that memory (a DLPack tensor, no copy), and
   :meth:`BufferSet.attach` registers the session: N sessions in one place share one copy;
3. in-place writes: :meth:`BufferSet.write` replaces a parameter's value or some of its rows, and
   every session sees it on its next run (the caller holds runs back meanwhile: the
   SessionGroup's update gate);
4. release: :meth:`BufferSet.release` frees the memory once the last attached session is gone
   (at once if none is alive, else when the last one is collected): ONNX Runtime does not own an
   added initializer, which must outlive every session that uses it.

The places differ only in their memory class, :class:`HostMemory` or :class:`CudaMemory`
(allocate, write, export a DLPack capsule, read back, free). The hand-over is
:func:`ortvalue_from_dlpack` for both, so the CPU tests run the GPU's code path.
DLPack: ONNX Runtime's ``OrtValue.from_dlpack`` takes the legacy ``dltensor`` capsule, which
numpy's ``__dlpack__()`` and ``torch.utils.dlpack.to_dlpack`` make; CuPy 14's versioned capsule
was refused (onnxruntime-gpu 1.31 on an H100), hence PyTorch on the GPU.

Thread-safety: :meth:`BufferSet.write` from one thread at a time (the update path, with no run in
flight); the rest from the owning backend. The release may complete on whichever thread drops
the last session.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ...errors import ConfigError, Internal


def ortvalue_from_dlpack(make_capsule: Callable[[], Any]):
    """An ``onnxruntime.OrtValue`` over the memory of a legacy DLPack capsule (no copy).

    ``make_capsule`` makes a fresh capsule (a capsule is consumed by a failed attempt too).
    onnxruntime 1.32 takes ``from_dlpack(capsule)``; 1.31 took ``from_dlpack(capsule, is_bool)``;
    standard (non-training) builds have it since 1.21, the floor of the extras.
    """
    import onnxruntime
    from onnxruntime.capi import _pybind_state

    try:
        value = _pybind_state.OrtValue.from_dlpack(make_capsule())
    except TypeError:
        value = _pybind_state.OrtValue.from_dlpack(make_capsule(), False)
    return onnxruntime.OrtValue(value)


class HostMemory:
    """Host memory: the numpy arrays themselves (what CPU sessions always used)."""

    location = "cpu"

    def place(self, array: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(array)

    def capsule(self, buffer: np.ndarray):
        return buffer.__dlpack__()

    def write(self, buffer: np.ndarray, values: np.ndarray, rows: np.ndarray | None) -> None:
        if rows is None:
            np.copyto(buffer, values.reshape(buffer.shape))
        else:
            buffer[rows] = values

    def read(self, buffer: np.ndarray) -> np.ndarray:
        return buffer.copy()

    def free(self) -> None:
        """Nothing beyond dropping the arrays."""


class CudaMemory:
    """Memory of one GPU, allocated and written through PyTorch (``pip install .[gpu]``)."""

    def __init__(self, gpu: int) -> None:
        try:
            import torch
            import torch.utils.dlpack
        except ImportError as exc:
            raise ConfigError(f"gpu_ids_list: ONNX Runtime's GPU lanes keep their weights in one device "
                              f"buffer allocated with PyTorch, which is not installed ({exc}); install "
                              f"the gpu extra (pip install '.[gpu]')") from None
        if not torch.cuda.is_available():
            raise ConfigError(f"gpu_ids_list: PyTorch {torch.__version__} sees no CUDA device, so GPU "
                              f"{gpu} cannot hold the weights (a CPU-only torch wheel?)")
        self._torch = torch
        self.device = torch.device("cuda", gpu)
        self.location = f"cuda:{gpu}"

    def place(self, array: np.ndarray):
        tensor = self._torch.from_numpy(np.ascontiguousarray(array)).to(self.device)
        self._torch.cuda.synchronize(self.device)
        return tensor

    def capsule(self, buffer):
        return self._torch.utils.dlpack.to_dlpack(buffer)

    def write(self, buffer, values: np.ndarray, rows: np.ndarray | None) -> None:
        torch = self._torch
        source = torch.from_numpy(np.array(values, copy=True)).to(self.device)
        if rows is None:
            buffer.copy_(source.reshape(buffer.shape))
        else:
            buffer.index_copy_(0, torch.from_numpy(np.array(rows, np.int64)).to(self.device), source)
        # ONNX Runtime's runs use their own streams: the write must be complete before any starts.
        torch.cuda.synchronize(self.device)

    def read(self, buffer) -> np.ndarray:
        return buffer.cpu().numpy()

    def free(self) -> None:
        """Give PyTorch's cached blocks back to the driver (what ``nvidia-smi`` shows)."""
        self._torch.cuda.empty_cache()


def why_no_gpu() -> str:
    """Why ONNX Runtime's GPU lanes cannot run on this host ("" when they can): no CUDA provider,
    no CUDA device, or no PyTorch with CUDA for the parameter buffers."""
    from ..device_plan import ort_visible_gpus

    count, why = ort_visible_gpus()
    if not count:
        return why
    try:
        import torch
    except ImportError:
        return "PyTorch (the gpu extra's array library) is not installed"
    return "" if torch.cuda.is_available() else f"PyTorch {torch.__version__} sees no CUDA device"


def memory_for(gpu: int | None) -> HostMemory | CudaMemory:
    """The memory class of a place: the host (``None``) or GPU ``gpu``."""
    return HostMemory() if gpu is None else CudaMemory(gpu)


class BufferSet:
    """The parameters of one place, shared by the sessions there (see the module doc)."""

    def __init__(self, arrays: dict[str, np.ndarray], memory: HostMemory | CudaMemory) -> None:
        self.memory = memory
        self._buffers = {name: memory.place(array) for name, array in arrays.items()}
        self._shapes = {name: tuple(array.shape) for name, array in arrays.items()}
        self._dtypes = {name: array.dtype for name, array in arrays.items()}
        self.nbytes = sum(array.nbytes for array in arrays.values())
        self._values = {name: ortvalue_from_dlpack(lambda b=buffer: memory.capsule(b))
                        for name, buffer in self._buffers.items()}
        self._lock = threading.Lock()
        self._live = 0
        self._release_asked = False
        self.released = False

    @property
    def location(self) -> str:
        return self.memory.location

    def __contains__(self, name: str) -> bool:
        return name in self._shapes

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]

    def dtype(self, name: str) -> np.dtype:
        return self._dtypes[name]

    def add_to(self, options, names: Iterable[str]) -> None:
        """Add ``names`` (all of this set's) to ``options`` as initializers over this memory."""
        if self.released:
            raise Internal(f"parameter buffers on {self.location} were released")
        for name in names:
            options.add_initializer(name, self._values[name])

    def attach(self, session: Any) -> None:
        """Count ``session`` (any weak-referenceable object) as a user until it is collected."""
        with self._lock:
            self._live += 1
        weakref.finalize(session, self._session_gone)

    @property
    def live_sessions(self) -> int:
        return self._live

    def host_arrays(self) -> dict[str, np.ndarray]:
        """The numpy arrays themselves (host memory only: the native engine reads them)."""
        if not isinstance(self.memory, HostMemory):
            raise Internal(f"parameters on {self.location} have no host arrays")
        return dict(self._buffers)

    def write(self, name: str, values: np.ndarray, rows: np.ndarray | None = None) -> None:
        """Write a checked value (``rows`` None) or checked rows of parameter ``name`` in place."""
        if self.released:
            raise Internal(f"parameter buffers on {self.location} were released")
        self.memory.write(self._buffers[name], values, rows)

    def read(self, name: str) -> np.ndarray:
        """A host copy of parameter ``name``'s current value."""
        return self.memory.read(self._buffers[name])

    def release(self) -> None:
        """Free the memory now if no attached session is alive, else when the last one goes."""
        with self._lock:
            self._release_asked = True
            ready = self._live == 0
        if ready:
            self._free()

    def _session_gone(self) -> None:
        with self._lock:
            self._live -= 1
            ready = self._live == 0 and self._release_asked
        if ready:
            self._free()

    def _free(self) -> None:
        with self._lock:
            if self.released:
                return
            self.released = True
            # The OrtValues first: each holds its DLPack capsule's reference to a buffer.
            self._values = {}
            self._buffers = {}
        self.memory.free()

    def describe(self) -> dict[str, Any]:
        return {"location": self.location, "parameters": len(self._shapes),
                "mib": round(self.nbytes / 2**20, 1), "sessions": self._live,
                "released": self.released}


class Parameters:
    """Every parameter of a model, in each place some session needs it: one BufferSet per place.

    ``needs`` maps a place (``None``: the host, else a GPU id) to the parameter names sessions
    there read. A parameter two places need is held in both; :meth:`write` writes every copy.
    The host set takes the arrays themselves; ``arrays`` is not used after construction.
    """

    def __init__(self, arrays: dict[str, np.ndarray], needs: dict[int | None, Iterable[str]]) -> None:
        self._shapes = {name: tuple(array.shape) for name, array in arrays.items()}
        self._dtypes = {name: array.dtype for name, array in arrays.items()}
        self.sets: dict[int | None, BufferSet] = {}
        try:
            for place, names in sorted(needs.items(), key=lambda item: (item[0] is not None, item[0] or 0)):
                self.sets[place] = BufferSet({n: arrays[n] for n in sorted(set(names))}, memory_for(place))
        except BaseException:
            self.release()
            raise

    def names(self) -> list[str]:
        return sorted(self._shapes)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]

    def dtype(self, name: str) -> np.dtype:
        return self._dtypes[name]

    def location_of(self, name: str) -> list[str]:
        return [s.location for s in self.sets.values() if name in s]

    def write(self, name: str, values: np.ndarray, rows: np.ndarray | None = None) -> None:
        """Write a checked value or checked rows into every copy of ``name``."""
        for buffers in self.sets.values():
            if name in buffers:
                buffers.write(name, values, rows)

    def read(self, name: str) -> np.ndarray:
        """A host copy of ``name`` (from its first place); KeyError for an unknown name."""
        for buffers in self.sets.values():
            if name in buffers:
                return buffers.read(name)
        raise KeyError(name)

    def release(self) -> None:
        """Release every place's buffers (each once its last session is gone)."""
        for buffers in self.sets.values():
            buffers.release()

    def describe(self) -> list[dict[str, Any]]:
        return [s.describe() for s in self.sets.values()]
