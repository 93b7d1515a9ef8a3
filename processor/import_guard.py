"""The first import of TensorFlow, one thread at a time.

Models load on threads of their own (the server starts them in parallel; hot updates run on
each model's watcher). TensorFlow is imported lazily, by whichever load needs it first: the
TensorFlow backend, a SavedModel converted for ONNX Runtime, warmup records, checkpoint readers.
Two threads importing it for the first time at once can deadlock on Python's per-module import
locks, which Python breaks by handing one of them a partially initialized module
(``AttributeError: partially initialized module 'tensorflow.core.protobuf.meta_graph_pb2'``).
A server of ``.onnx`` models never imports TensorFlow at all, so it cannot be imported up
front. :func:`first_tensorflow_import` serializes the sections that may import it until it has
been imported whole; after that it costs one dictionary lookup.

Thread-safe.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

_lock = threading.Lock()


def tensorflow_imported() -> bool:
    """Whether ``tensorflow`` is in ``sys.modules`` and done initializing."""
    module = sys.modules.get("tensorflow")
    return module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False)


@contextlib.contextmanager
def first_tensorflow_import() -> Iterator[None]:
    """Run the block alone among such blocks while TensorFlow is not imported whole yet; free
    once it is. For code that may import TensorFlow (a model's load, a delta's)."""
    if tensorflow_imported():
        yield
        return
    with _lock:
        yield
