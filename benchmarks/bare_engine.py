"""The limit a benchmark measures our request path against: the engine's own call on one lane,
everything of ours (decode, checks, feed conversion) done beforehand.

Benchmark code, kept out of the backends' protocol: it reaches into each backend for the
callable its ``run`` calls on a lane (ONNX Runtime: the binding's run over both parts of a split
graph, the inputs converted once; TensorFlow: the lane's callable made from CallableOptions, the
inputs in feed order). The returned zero-argument call holds the lane's session alive while it
lives (what a test of the parameter buffers' lifetime relies on). Same thread-safety as ``run``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def bare_call(backend, lane: int, feeds: dict[str, np.ndarray],
              fetches: tuple[str, ...]) -> Callable[[], list[np.ndarray]]:
    """The engine's call on ``lane`` for these checked ``feeds``, as a zero-argument function."""
    from processor.engine.onnx.backend import OnnxRuntimeBackend
    from processor.engine.tensorflow.backend import TensorFlowBackend

    if isinstance(backend, OnnxRuntimeBackend):
        run, names, ort_feeds = backend._lane_run[lane], backend._output_list(fetches), backend._feeds(feeds)
        return lambda: run(names, ort_feeds, None)
    if isinstance(backend, TensorFlowBackend):
        fn = backend._lane_callables.get((lane, fetches)) or backend._make_lane_callable(lane, fetches)
        args = [feeds[a] for a in backend._feed_aliases]
        return lambda: fn(*args)
    raise TypeError(f"no bare engine call for {type(backend).__name__}")
