"""The engine factory: :func:`open_session_group` loads a model version into a new
:class:`~processor.engine.session_group.SessionGroup` on the backend the config names.

It is the one module that knows both backends; it imports each only when chosen (so a machine
without ONNX Runtime, or a process serving only ONNX models, never imports the other), and the
group itself knows only the :class:`~processor.engine.backend.Backend` protocol.
"""

from __future__ import annotations

import logging
import time

from ..config import ModelConfig, shorten
from ..context.cache import ContextCache
from ..context.rows import RowPlan
from ..context.runner import ContextRunner
from ..errors import ConfigError
from ..store.model_version import ModelVersion
from .backend import Backend
from .session_group import SessionGroup
from .splitting import RowSplitter

log = logging.getLogger(__name__)


def open_session_group(config: ModelConfig, version: ModelVersion, features=None, batching=None,
                       pinned: bool = False) -> SessionGroup:
    """Load ``version`` into a new SessionGroup with the engine the config names.

    ``features``: the model's :class:`~processor.features.FeatureStore` when its embeddings are
    served from one (TensorFlow only); the group opens ``version``'s tables in it.
    ``batching``: the model's :class:`~processor.batching.model_batching.ModelBatching`, through
    which the group opens its native batching queue (None: no queue).
    ``pinned``: the version is loaded to be pinned (with workers, ONNX parameters in a segment of
    the pin's own: :func:`~processor.engine.onnx.weights.map_parameters`).

    The engine is ``config.backend``, or with ``auto`` ONNX Runtime when ``savedmodel_dir`` holds a
    ``.onnx`` model and TensorFlow otherwise. Raises ProcessorError (ConfigError for settings this
    machine cannot honour, e.g. a GPU it does not have; Internal for a model that does not load).
    """
    from . import device_plan
    from .onnx.convert import find_onnx_file

    engine = config.backend
    if engine == "auto":
        engine = "onnxruntime" if find_onnx_file(version.savedmodel_dir) else "tensorflow"
    started = time.monotonic()
    if engine == "onnxruntime":
        from .onnx.backend import OnnxRuntimeBackend

        if features is not None:
            raise ConfigError("feature_store_type / ev_storage_type: embeddings served from a feature "
                              "store need the TensorFlow backend")
        if config.row_ttl_steps is not None:
            raise ConfigError("row_ttl_steps: needs the embedding tables in the DRAM or DRAM+SSD store, "
                              "which serve TensorFlow models; ONNX Runtime's initializers keep no row's step")

        try:
            import onnxruntime  # noqa: F401
        except ImportError as exc:
            raise ConfigError(f"backend: onnxruntime is not installed ({exc}); install the 'cpu' "
                              f"(onnxruntime) or 'gpu' (onnxruntime-gpu) extra") from None
        backend: Backend = OnnxRuntimeBackend.open(config, version, device_plan.plan_for(config, engine), pinned)
    else:
        from .tensorflow.backend import TensorFlowBackend

        plan = device_plan.plan_for(config, engine)
        backend = TensorFlowBackend.open(config, version, lanes=len(plan.lanes), devices=plan, features=features)
    try:
        context = _context_runner(config, backend, engine)
    except BaseException:
        backend.close()
        raise
    return SessionGroup(backend, config.select_session_policy, version, time.monotonic() - started,
                        batching, RowSplitter.from_config(config, backend.lanes), context)


def _context_runner(config: ModelConfig, backend: Backend, engine: str) -> ContextRunner:
    """The group's context runner (:mod:`processor.context`): the config's ``context_inputs``
    checked against the signature (ConfigError), their part of the graph on ``engine`` and the
    ``context_cache``. A part that cannot be made is reported, not fatal: broadcast requests are
    then tiled, which is always exact."""
    rows = RowPlan.for_config(backend.signature, config.context_inputs)
    part, report = None, {}
    if rows.declared is not None:
        if engine == "onnxruntime":
            from .onnx.context_part import open_context_part
        else:
            from .tensorflow.context import open_context_part
        try:
            part, report = open_context_part(backend, rows.declared)
        except Exception as exc:  # an analysis or part session that fails must not fail the load
            log.warning("context part of %s not made: %s: %s", config.savedmodel_dir, type(exc).__name__, exc)
            report = {"not_partitioned": f"{type(exc).__name__}: {shorten(str(exc), 300)}; broadcast requests are tiled"}
    settings = config.context_cache
    cache = ContextCache(settings.max_entries, settings.ttl_ms) if settings is not None and part is not None else None
    if settings is not None and part is None:
        report["cache_off"] = "context_cache has nothing to keep: no context part"
    return ContextRunner(rows, backend.run, part, cache, report)
