"""Processor: one model behind DeepRec's processor API (``initialize`` / ``process`` /
``get_serving_model_info``), with status codes instead of exceptions.

Built once by :meth:`Processor.create`, which validates the config, loads and warms the model and
raises ProcessorError on failure. ``process`` and ``serving_model_info`` never raise and are
thread-safe.

The direct path (a batching model, with the native extension): the C shim queues a request on
the default version's native batching queue and waits for its batch without Python and without
the GIL (``native/src/direct_front.h``), where the GIL changing hands per request would cost more
than the batch saves; :meth:`process` from Python threads takes it too. Python keeps every
decision: the front follows the model's plan (``DataPlane.follow_plan``, published afresh with
each default version) and is given the default version's lane only while the model's calls need
nothing else (:attr:`~processor.dataplane.plan.Plan.plain`: no timeline, no prediction log, no
shadow, no traffic split); whatever it does not take (an empty ping, a request the queue
does not take or hands back, an update writing, a refusal) is served by :meth:`process`.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from typing import Any

from .config import ModelConfig
from .config_text import parse_json
from .dataplane import DataPlane
from .errors import STATUS_TABLE, ProcessorError, StatusCode, edge_error
from .proto import predict_pb2
from .request import wire_call
from .served_model import ModelRegistry

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "default"

EDGE = "c_abi"  # the status-code methods (process, process_many, serving_model_info) serve processor/abi.py
OK = STATUS_TABLE[StatusCode.OK].c_abi


class Processor:
    """One served model (a :class:`~processor.served_model.ServedModel`, the one of ``models``)
    and its DataPlane. See the module doc; :meth:`create` builds and starts one from a config."""

    def __init__(self, models: ModelRegistry) -> None:
        (self.model,) = models
        self.name = self.model.name
        self.config = self.model.config
        self.models = models
        self.dataplane = DataPlane(self.models)
        self._direct = None  # the native DirectFront of the direct path (see the module doc)

    @property
    def manager(self):
        """The model's ModelManager (tests and tools drive updates through it)."""
        return self.model.manager

    @property
    def tracer(self):
        return self.model.tracer

    @classmethod
    def create(cls, model_entry: str, model_config: str) -> Processor:
        """Validate ``model_config`` (JSON text), load the model; raise ProcessorError on failure.

        ``model_entry`` names the model (DeepRec stores it unused); empty means "default".
        """
        raw = parse_json(model_config, "model_config")  # ConfigError when not UTF-8 or not JSON
        config = ModelConfig.from_dict(raw)
        processor = cls(ModelRegistry.single(model_entry or DEFAULT_MODEL_NAME, config, raw))  # ConfigError: timeline_path
        try:
            processor.model.start()
        except BaseException:
            processor.close()  # stops the watcher, feature-store probes and the tracer's writer
            raise
        processor._open_direct()
        _close_at_exit(processor)
        return processor

    def _open_direct(self) -> None:
        """The direct path's front, kept on the default version's lane (see the module doc)."""
        from . import native

        if native.MODULE is None or self.model.batching is None:
            return
        front = self._direct = native.MODULE.DirectFront()

        def follow(plan) -> None:
            plain = plan is not None and plan.plain and plan.group is not None
            front.publish(plan.group.open_direct_lane() if plain else None)
        self.dataplane.follow_plan(self.name, follow)

    def direct_capsule(self) -> Any | None:
        """The direct path's front as a capsule for the C shim (it keeps the front alive), or
        None: every call goes through :meth:`process`."""
        return self._direct.capsule() if self._direct is not None else None

    def process(self, data: bytes, direct: bool = True) -> tuple[int, bytes]:
        """Serialized PredictRequest in; (200, PredictResponse) or (status, UTF-8 message) out.

        An empty request returns 200 and the signature as JSON (DeepRec's introspection ping).
        A batching model's request takes the direct path first (see the module doc): Python
        callers too then wait for their batch without the GIL. ``direct`` False: it was tried
        (the C shim's) and did not take this request.
        """
        front = self._direct if direct else None
        if front is not None and data:
            answer = front.serve(data)
            if answer is not None:
                return OK, answer
        try:
            return OK, self.dataplane.predict(wire_call(self.name, data)).outputs
        except Exception as exc:
            return _answer(edge_error(exc, EDGE, log))

    def process_many(self, requests: list[bytes | memoryview]) -> list[tuple[int, bytes]]:
        """:meth:`process` for each request; with batching they are all queued before any is
        awaited, on the model's one queue (:meth:`DataPlane.predict_many`), so they run merged
        with each other and with concurrent :meth:`process` calls."""
        try:
            results = self.dataplane.predict_many(self.name, [data for data in requests if data])
        except Exception as exc:
            return [_answer(edge_error(exc, EDGE, log))] * len(requests)
        answers = iter(results)
        out = []
        for data in requests:
            if not data:  # the introspection ping
                out.append(self.process(data))
                continue
            result = next(answers)
            if isinstance(result, ProcessorError):
                out.append(_answer(edge_error(result, EDGE, log)))
            else:
                out.append((OK, result))
        return out

    def serving_model_info(self) -> tuple[int, bytes]:
        """(200, ServingModelInfo{model_path}): the served full checkpoint prefix, or the served
        version directory of TF Serving's layout; "" when the SavedModel's own variables serve."""
        try:
            path = self.model.model_path()
            return OK, predict_pb2.ServingModelInfo(model_path=path).SerializeToString()
        except Exception as exc:
            return _answer(edge_error(exc, EDGE, log))

    def model_info(self) -> dict[str, Any]:
        """Everything a user may want to know: version, signature, sessions, pinning, settings;
        ``direct``: the direct path's counts (calls answered, and not taken), when it exists."""
        info = self.model.info()
        if self._direct is not None:
            info["direct"] = self._direct.stats()
        return info

    def close(self) -> None:
        self.models.drain()  # runs the requests still queued for a batch
        self.models.close()


_open: weakref.WeakSet[Processor] = weakref.WeakSet()
_open_lock = threading.Lock()


def _close_at_exit(processor: Processor) -> None:
    """Close ``processor`` when the interpreter exits if nobody finalized it.

    A script that initializes a model and exits without ``finalize`` would otherwise leave the
    engines' native objects (ONNX Runtime sessions, the native engine's plans) to interpreter
    teardown, whose order nanobind reports as leaks; closing first releases them in order and
    stops the model's threads. Registered on the first create, so importing does nothing.
    """
    with _open_lock:
        if not _open:
            atexit.unregister(_close_open_processors)  # at most one registration
            atexit.register(_close_open_processors)
        _open.add(processor)


def _close_open_processors() -> None:
    with _open_lock:
        left = list(_open)
        _open.clear()
    for processor in left:
        try:
            processor.close()  # idempotent: finalize may have run already
        except Exception:  # exiting anyway: report, never mask the exit
            log.exception("closing model %r at exit failed", processor.name)


def _answer(err: ProcessorError) -> tuple[int, bytes]:
    """A failed call as the C ABI answers it: STATUS_TABLE's c_abi status and the message."""
    return err.edge.c_abi, err.message.encode()
