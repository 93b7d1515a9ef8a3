"""DataPlane: the request use-cases every edge calls (HTTP, gRPC, KServe v2, TF Serving, the C ABI).

:meth:`DataPlane.predict` takes a :class:`~processor.request.PredictCall` (model, version or
label, signature name, inputs as wire bytes, numpy arrays or a decoder of the served signature,
output filter, deadline), does one acquire of the served version, checks what the call names
against it, decodes once, runs on a lane and encodes; it returns the outputs with the version and
signature that served them (:class:`~processor.request.PredictResult`). :meth:`served` answers
metadata calls the same way. Every failure is a :class:`~processor.errors.ProcessorError`
(an unexpected exception becomes INTERNAL with the original as its ``__cause__``); edges map it
once. Thread-safe: any number of threads may call any method at once.

Prepared calls: :meth:`DataPlane.prepare` checks a call of numeric arrays against the served
group once (nothing runs); :meth:`DataPlane.run_prepared` runs other arrays of that form on that
group without the checks, until another version serves (it then answers None: prepare again).
For edges whose clients send one request form over and over (KServe v2's raw tensors).

Batching: a model with ``batching`` settings has one
:class:`~processor.batching.model_batching.ModelBatching` (its
:class:`~processor.served_model.ServedModel` owns it): one row budget bounds all its queues.
Wire requests, from :meth:`DataPlane.predict` and :meth:`DataPlane.predict_many` alike, go in
through its one submit path: the served version's native queue, else the reference
:class:`~processor.batching.batcher.Batcher`; arrays, decoders and traced requests are decoded
and checked on the caller's thread and go to the reference. Either way they merge with the
model's concurrent requests. A call's ``deadline`` drops a request that waited too long, with
DeadlineExceeded.

Prediction logging: a model with a :class:`~processor.prediction_log.PredictionLogger` draws
one random number per predict call; a sampled call is logged once answered (its inputs as
decoded, its outputs or its error, the version and signature that served it) through the
logger's queue, off the request's path (wire bytes are decoded on the writer thread; a view of
the caller's buffer is copied first). Models without logging pay one truthiness check.

Versions: a call naming a version (or a label, resolved by the model's
:class:`~processor.routing.VersionRouter`) runs on that served version's group (NOT_FOUND when it
is not served); one naming neither runs on the default (the newest) unless the model splits its
traffic, when the router picks the arm by the call's ``routing_key``. A model with a shadow gets
a copy of such calls offered to its :class:`~processor.shadow.ShadowRunner` once the primary has
answered (never before, never waited for); the copy runs through :meth:`DataPlane.predict` on
the shadow version, and a sampled one is logged marked as shadow. The version that answered
(and the arm) is written into the edge's ``answer_note_var`` note, when it set one.

Timeline tracing: a model with a :class:`~processor.tracing.Tracer` has each predict request
counted; the requests it picks run the same path with every stage timed (parse, acquire, decode,
run, encode inside ``request``) and the engine's full per-op trace. Untraced requests pay one
truthiness check of a dict that is empty unless some model still has traces to take.

OpenTelemetry (issue 46): a call the server's sampler picked (its edge set
:data:`processor.spans.current`) takes the same stage-by-stage path with a
:class:`~processor.spans.SpanRecorder`, each stage a span, the engine untraced; a wire request
is decoded and encoded by the native codec (as the hot path's fallback does), a batching model's
goes through the reference batcher (its queue wait and batch become spans). Every other call pays
one context variable read. A call the timeline traces gets no stage spans.
"""

from __future__ import annotations

import json
import logging
import weakref
from collections.abc import Sequence

import numpy as np

from . import codec, spans
from .batching import merge
from .batching.model_batching import ModelBatching
from .prediction_log import PredictionLogger
from .prediction_log.record import Pending
from .errors import ProcessorError, Unavailable, as_processor_error, result_or_error
from .request import (PredictCall, PredictResult, PreparedCall, Served, answer_note_var, check_call, check_deadline,
                      version_number, wire_call, wire_result)
from .routing import VersionRouter
from .served_model import ModelRegistry
from .batching.batched_call import BatchedCall
from .tracing import TraceRecorder
from .tracing.tracer import UNTIMED, now_us

log = logging.getLogger(__name__)

_WIRE = (bytes, bytearray, memoryview)
_sampled = spans.current.get  # the sampled request's span, else None: the request path's one check


class DataPlane:
    """Routes calls to the registry's models. See the module doc."""

    def __init__(self, models: ModelRegistry) -> None:
        self._registry = models
        self._inlined: dict[str, bool] = {}  # model -> whether its last try_inline ran in place
        self.busy = None  # the server's load signal for shadows (set_busy)
        self.refresh()

    def set_busy(self, busy) -> None:
        """``busy()``: whether the server is busy now; shadow copies are shed while it is
        (:mod:`processor.shadow`)."""
        self.busy = busy
        for model in self._registry:
            model.shadow.busy = busy

    def refresh(self) -> None:
        """Take the registry's models as they are now (a live model set added, replaced or
        removed one). Each lookup table is swapped in whole: a call sees one model's parts from
        before or after, never a mix of two models' (a call that looked its model up before
        keeps it: its handle holds that model's version until it ends)."""
        models = list(self._registry)
        for model in models:
            model.shadow.run = self._run_shadow
            model.shadow.busy = self.busy
        managers = {m.name: m.manager for m in models}
        # a call finds its model by its manager: a removed model's goes first, an added one's last,
        # so whoever finds a manager finds the model's other parts too
        if not set(getattr(self, "_managers", ())) <= set(managers):
            self._managers = managers
        self._routers: dict[str, VersionRouter] = {m.name: m.router for m in models}
        self._shadows = {m.name: m.shadow for m in models}
        self._batching = {m.name: m.batching for m in models if m.batching is not None}
        # Only tracers with traces left; emptied as they finish, so the hot path stays one check.
        self._tracers = {m.name: m.tracer for m in models if m.tracer is not None and not m.tracer.done}
        self._loggers = {m.name: m.prediction_log for m in models if m.prediction_log is not None}
        self._managers = managers

    @property
    def model_names(self) -> list[str]:
        return self._registry.names

    def plain(self, model: str) -> bool:
        """Whether a call to ``model`` naming no version needs nothing of this DataPlane but the
        default version's group: no timeline, no prediction log, no shadow copy, no traffic
        split (the C ABI's direct path may then bypass Python: :mod:`processor.processor`)."""
        router = self._routers.get(model)
        return (router is not None and model not in self._tracers and model not in self._loggers
                and router.routing.shadow is None and not router.routing.arms)

    def predict(self, call: PredictCall) -> PredictResult:
        """Run one call (see the module doc); raises ProcessorError.

        Wire bytes may be a memoryview of the caller's buffer (the C ABI's): read during the call
        only, never kept (decoding copies). Untraced, unbatched wire requests take the request
        path's hot loop: one handle acquire and the group's ``serve`` (the engine's native
        whole-request path, or the native codec around the engine call); every other call
        goes through :meth:`_answer`.
        """
        model = call.model
        manager = self._managers.get(model)
        router = self._routers.get(model)
        if manager is None or router is None:
            self._gone(model)
        version = self._version(call, router)
        rec = self._begin_trace(model) if self._tracers else None
        if rec is None and _sampled() is not None:  # OpenTelemetry's: each stage a span
            rec = spans.SpanRecorder()
        result = None
        if self._loggers:
            logger = self._loggers.get(model)
            if logger is not None and (call.inputs or call.inputs.__class__ not in _WIRE):  # not a ping
                pending = logger.begin(call)
                if pending is not None:
                    result = self._logged(logger, pending, manager, call, version, rec)
        if result is None:
            if rec is not None:
                result = self._traced(manager, call, version, rec)
            else:
                result = self._call(manager, call, version, None)
        if router.routing.shadow is not None:
            self._shadow(router, call, result)
        return result

    def try_inline(self, call: PredictCall, max_bytes: int) -> PredictResult | None:
        """:meth:`predict` of ``call`` here and now when it is a small request the engine
        serves without the GIL; None when it is not (run :meth:`predict` on a thread instead).
        A call OpenTelemetry sampled runs here too, stage by stage (its spans), unless its
        model logs predictions.

        For event loops: a thread-pool hop costs more CPU than a batch-1 request on the native
        ONNX Runtime engine, so the HTTP and gRPC edges call this first. Taken: untraced,
        unbatched wire bytes of at most ``max_bytes`` whose served group runs the whole
        request natively (``SessionGroup.serves_natively``); it blocks the caller for the
        engine's time, tens of microseconds at that size. A logged model's call is sampled
        here; when it is not taken after all (the group does not serve natively), nothing is
        logged and :meth:`predict` samples it afresh, so each call is logged with the model's
        sampling rate. Raises ProcessorError as :meth:`predict` does.
        """
        model, inputs = call.model, call.inputs
        if (inputs.__class__ not in _WIRE or not inputs or len(inputs) > max_bytes or model in self._batching
                or model in self._tracers):
            return None
        manager = self._managers.get(model)
        router = self._routers.get(model)
        if manager is None or router is None:
            return None
        version = self._version(call, router)
        rec = spans.SpanRecorder() if _sampled() is not None else None
        logger = self._loggers.get(model) if self._loggers else None
        if rec is not None and logger is not None:
            return None  # spans and a log record: predict() on a thread
        pending = logger.begin(call) if logger is not None else None
        if pending is not None:
            result = self._logged(logger, pending, manager, call, version, None, inline=True)
        else:
            result = self._call(manager, call, version, rec, inline=True)
        if self._inlined.get(model) is not (result is not None):
            self._inlined[model] = result is not None
        if result is not None and router.routing.shadow is not None:
            self._shadow(router, call, result)
        return result

    def prepare(self, call: PredictCall) -> PreparedCall | None:
        """``call`` (numeric arrays by alias or tensor name) checked against its served group as
        :meth:`predict` checks it, for :meth:`run_prepared`; runs nothing. None where the model's
        calls take another path (batching, tracing, prediction logging) or an input is not a
        numeric array. Raises ProcessorError as :meth:`predict` does."""
        model, inputs = call.model, call.inputs
        if not isinstance(inputs, dict) or not self.prepares(model):
            return None
        manager = self._managers.get(model)
        if manager is None:
            self._registry.get(model)  # raises NotFound with the list of models
        version = self._version(call)

        def check(group):
            served = check_call(group, call.signature_name) if call.signature_name else group
            return group, served, codec.decode_arrays(inputs, call.output_filter, served.signature, call.check_shapes)
        group, served, decoded = _on_served(manager, check, version)
        feeds = decoded.feeds
        if any(a.dtype.kind not in "biufc" for a in feeds.values()):
            return None
        return PreparedCall(model, weakref.ref(group), weakref.ref(served),
                            tuple((alias, a.dtype, a.shape) for alias, a in feeds.items()),
                            decoded.fetches, tuple(alias for _, alias in decoded.fetches), version)

    def prepares(self, model: str) -> bool:
        """Whether :meth:`prepare` may prepare ``model``'s calls: none of them takes another
        path (batching, tracing, prediction logging, a traffic split or a shadow)."""
        if model in self._batching or model in self._tracers or model in self._loggers:
            return False
        router = self._routers.get(model)
        return router is None or (not router.routing.arms and router.routing.shadow is None)

    def run_prepared(self, prepared: PreparedCall, feeds: dict[str, np.ndarray],
                     deadline: float | None = None) -> PredictResult | None:
        """``feeds`` (by alias, each of the dtype and shape ``prepared`` recorded: the caller's
        promise, not checked again) run on the group ``prepared`` was checked on, as
        :meth:`predict` runs them; None, having run nothing, once another version serves the
        model or its calls take another path: prepare it again. Raises ProcessorError."""
        model = prepared.model
        if deadline is not None:
            check_deadline(model, deadline)
        if (self._tracers and model in self._tracers) or not self.prepares(model):
            return None

        def run(group) -> PredictResult | None:
            served = prepared.served()
            if group is not prepared.group() or served is None:
                return None
            with spans.stage("engine.run"):
                arrays = served.run(feeds, prepared.aliases)
            _note(group.version)
            return PredictResult({key: array for (key, _), array in zip(prepared.fetches, arrays)},
                                 group.version, served.signature)
        manager = self._managers.get(model)
        return None if manager is None else _on_served(manager, run, prepared.version)

    def batches(self, model: str) -> bool:
        """Whether ``model`` batches its requests (``batching`` in its model_config)."""
        return model in self._batching

    def queue_batched(self, call: PredictCall, notify_fd: int) -> BatchedCall | None:
        """For event loops: ``call`` queued on its batching model's native queue without a
        thread to wait on it (``ModelBatching.queue``); the BatchedCall, whose ``ticket.done``
        turns true, and ``notify_fd`` (an eventfd) is written, once its batch ran. None where
        nothing was queued: not untraced, unlogged, non-empty wire bytes to a batching model, a
        version with no native queue, an update running, a request the queue does not take
        (then run :meth:`predict` on a thread). Raises ProcessorError as :meth:`predict` does
        (NotFound, a version or signature not served, the queue's refusal)."""
        model, inputs = call.model, call.inputs
        batching = self._batching.get(model)
        if (batching is None or inputs.__class__ not in _WIRE or not inputs or model in self._tracers
                or model in self._loggers or _sampled() is not None):
            return None
        manager = self._managers.get(model)
        router = self._routers.get(model)
        if manager is None or router is None or router.routing.shadow is not None:
            return None  # predict answers (NotFound), or offers the shadow its copy
        version = self._version(call, router)
        handle = manager.acquire_handle(version)
        try:
            group = handle.group
            _note(group.version)
            if call.signature_name:
                group = check_call(group, call.signature_name)
            queued = batching.queue(group, inputs, call.deadline, notify_fd)
        except ProcessorError:
            handle.release()
            raise
        except Exception as exc:
            handle.release()
            raise as_processor_error(exc) from exc
        if queued is None:
            handle.release()
            return None
        return BatchedCall(handle, group, queued)

    def _version(self, call: PredictCall, router: VersionRouter | None = None) -> int | None:
        """The version number ``call`` runs on: the one it names, its label resolved, else its
        traffic arm's (None: the default). DeadlineExceeded when its deadline passed already (a
        served model's call)."""
        if call.deadline is not None:
            check_deadline(call.model, call.deadline)
        if router is None:
            router = self._routers.get(call.model)
            if router is None:
                self._gone(call.model)
        return router.route(call)

    def _gone(self, model: str) -> None:
        """Raise for a call to ``model``, which this DataPlane does not serve: NotFound naming the
        served models, or (the registry has it: a live reload is swapping it in this instant)
        Unavailable."""
        self._registry.get(model)  # raises NotFound with the list of models
        raise Unavailable(f"model {model!r} is being reloaded; try again")

    def _shadow(self, router: VersionRouter, call: PredictCall, result: PredictResult) -> None:
        """Let the model's ShadowRunner consider a copy of the answered ``call`` (never raising:
        the primary has its answer)."""
        manager = self._managers.get(call.model)
        if manager is not None and not result.introspection:
            self._shadows[call.model].consider(router.routing, call, version_number(result.version), manager.serves)

    def _run_shadow(self, call: PredictCall) -> PredictResult:
        """A shadow copy (its ``version`` set), run as :meth:`predict` runs a call; a sampled
        one is logged marked as shadow."""
        manager = self._managers.get(call.model)
        if manager is None:
            self._gone(call.model)
        logger = self._loggers.get(call.model) if self._loggers else None
        pending = logger.begin(call) if logger is not None else None
        if pending is not None:
            pending.shadow = True
            return self._logged(logger, pending, manager, call, call.version, None)
        return self._call(manager, call, call.version, None)

    def runs_in_place(self, model: str) -> bool:
        """Whether ``model``'s small requests may run on the caller's own thread, an event loop:
        its served group runs the engine natively (fast, without the GIL while it runs) and
        nothing makes a request wait (batching) or slow (tracing). For edges that decode on the
        caller's thread (KServe v2, TF Serving REST): there a small request costs less than
        the hop to a pool. False for an unknown or unserved model. A hint: the served version is
        read without a reference, and may be replaced the next moment."""
        if model in self._batching or model in self._tracers:
            return False
        manager = self._managers.get(model)
        return manager is not None and manager.serves_natively()

    def inline_hint(self, model: str) -> bool:
        """Whether the last :meth:`try_inline` of ``model`` ran in place: a hint for an edge
        that must decide before the request's body arrives (the HTTP connection's own fast
        path); :meth:`try_inline` still decides."""
        return self._inlined.get(model, False)

    def _logged(self, logger: PredictionLogger, pending: Pending, manager, call: PredictCall,
                version: int | None, rec: TraceRecorder | None, inline: bool = False) -> PredictResult | None:
        """:meth:`predict` of a call its model's logger sampled: ``pending`` gets the group that
        served, the decoded inputs and the result or the error, then goes to the logger's queue
        (never raising, never blocking). ``inline``: :meth:`try_inline`'s; a call it does not
        take (None) is not logged."""
        try:
            if rec is not None:
                pending.result = self._traced(manager, call, version, rec, pending)
            else:
                pending.result = self._call(manager, call, version, None, pending, inline)
            return pending.result
        except Exception as exc:
            pending.error = exc
            raise
        finally:
            if pending.result is not None or pending.error is not None:
                logger.submit(pending)

    def _traced(self, manager, call: PredictCall, version: int | None, rec: TraceRecorder,
                pending: Pending | None = None) -> PredictResult:
        """:meth:`predict` of a request its model's tracer picked: every stage timed into ``rec``,
        which is submitted (never raising) whether the call succeeds or fails."""
        try:
            with rec.stage("request"):
                return self._call(manager, call, version, rec, pending)
        except Exception as exc:
            rec.error = str(exc)
            raise
        finally:
            if rec.tracer is not None:  # a timeline's (a SpanRecorder's spans have ended)
                rec.tracer.submit(rec)  # never raises

    def _call(self, manager, call: PredictCall, version: int | None, rec: TraceRecorder | None,
              pending: Pending | None = None, inline: bool = False) -> PredictResult | None:
        """One acquire of the served group, the call's checks against it, then the hot path (an
        untraced, unbatched wire request: the group's ``serve``) or :meth:`_answer`; a logged
        call's ``pending`` learns the group. ``inline``: None, having run nothing, unless the
        group serves natively and its native path takes the request (:meth:`try_inline`)."""
        if rec is None:
            handle = manager.acquire_handle(version)
        else:
            with rec.stage("acquire"):
                handle = manager.acquire_handle(version)
        try:
            group = handle.group
            if inline and not group.serves_natively:
                return None
            if pending is not None:
                pending.group = group
            note = answer_note_var.get()
            if note is not None:
                note[0] = group.version
            if call.signature_name:
                group = check_call(group, call.signature_name)
            inputs = call.inputs
            if rec is None and inputs.__class__ in _WIRE and inputs and call.model not in self._batching:
                if inline:
                    served = group.serve(inputs, True)
                    if served is None:  # not taken natively (a one-row context...): run it on a thread
                        return None
                    return wire_result(served, group.version, group.signature)
                return wire_result(group.serve(inputs), group.version, group.signature)
            return self._answer(call, group, rec, pending)
        except ProcessorError:
            raise
        except Exception as exc:
            raise as_processor_error(exc) from exc
        finally:
            handle.release()

    def _answer(self, call: PredictCall, group, rec: TraceRecorder | None,
                pending: Pending | None = None) -> PredictResult:
        """``call`` on the acquired ``group``, off the hot path: the introspection ping, arrays and
        decoders, batched requests, traced requests (stages timed into ``rec``); a logged call's
        ``pending`` gets the decoded inputs."""
        inputs = call.inputs
        signature = group.signature
        wire = isinstance(inputs, _WIRE)
        if wire and not inputs:  # DeepRec's introspection ping
            return PredictResult(json.dumps(signature.describe()).encode(), group.version, signature, True)
        batching = self._batching.get(call.model)
        if wire and rec is None:
            return PredictResult(batching.serve(group, inputs, call.deadline), group.version, signature)
        if wire and not rec.engine_trace:
            return self._spanned(call, group, rec, batching, pending)
        stage = rec.stage if rec is not None else UNTIMED
        with stage("parse"):
            if wire:
                parsed = codec.parse_request(inputs)
            else:
                parsed = inputs(signature) if callable(inputs) else inputs
        with stage("decode"):
            if wire:
                decoded = codec.decode_message(parsed, signature)
            else:
                decoded = codec.decode_arrays(parsed, call.output_filter, signature, call.check_shapes)
            del parsed
        if pending is not None:
            pending.feeds = decoded.feeds
        with stage("run") as timed:
            try:
                outputs = _run(group, decoded, batching, call.deadline, rec)
            finally:
                # batched runs set the merged call's window; an OpenTelemetry run has its span
                if rec is not None and rec.engine_trace and rec.run_window is None:
                    rec.run_window = (timed.start, now_us())
        if wire:
            with stage("encode"):
                outputs = codec.encode_response(outputs)
        return PredictResult(outputs, group.version, signature)

    def _spanned(self, call: PredictCall, group, rec: spans.SpanRecorder, batching: ModelBatching | None,
                 pending: Pending | None) -> PredictResult:
        """A wire request OpenTelemetry sampled, on the acquired ``group``: decoded and encoded
        by the group's codec (the native one, as ``SessionGroup.serve``'s fallback), run
        untraced (a batching model's through the reference batcher, which makes its queue and
        batch spans), each stage a span of ``rec``; a logged call's ``pending`` gets the inputs."""
        with rec.stage("decode"):
            feeds, keys, aliases = group.codec.decode(call.inputs)
        if pending is not None:
            pending.feeds = feeds
        with rec.stage("run"):
            if batching is not None:
                arrays = batching.batcher.run(group, feeds, aliases, call.deadline, rec)
            else:
                rec.lane, arrays, _ = group.run_traced(feeds, aliases, False)
            _engine_attributes(group, feeds, rec.lane)
        with rec.stage("encode"):
            outputs = group.codec.encode(keys, arrays)
        return PredictResult(outputs, group.version, group.signature)

    def predict_many(self, name: str, requests: Sequence[bytes | memoryview]) -> list[bytes | ProcessorError]:
        """:meth:`predict` of each serialized request, one result (response bytes or the error)
        per request.

        With batching, all of them go in through the model's one submit path
        (:meth:`ModelBatching.serve_many`), queued before any is awaited, so they run merged
        with each other and with concurrent :meth:`predict` calls; without (or while the model
        traces), they run one after another.
        """
        batching = self._batching.get(name)
        if batching is None or self._tracers:
            return [result_or_error(self._predict_wire, name, data) for data in requests]
        handle = self._registry.get(name).manager.acquire_handle()
        try:
            group = handle.group
            results = batching.serve_many(group, requests)
            logger = self._loggers.get(name)
            if logger is not None:
                for data, result in zip(requests, results):
                    logger.log_answered(name, data, group, result)
            return results
        finally:
            handle.release()

    def predict_each(self, call: PredictCall, signature_names: Sequence[str]) -> list[PredictResult]:
        """``call`` run once per signature in ``signature_names`` (each checked as ``call``'s
        own), all on one acquire of the served version: TF Serving's MultiInference, one input
        for several signatures. Arrays and decoders only; ``call.signature_name`` is ignored.
        Raises ProcessorError (the first task's failure)."""
        model = self._registry.get(call.model)
        version = self._version(call)
        handle = model.manager.acquire_handle(version)
        try:
            _note(handle.group.version)
            return [self._answer(call, check_call(handle.group, name), None)
                    for name in signature_names]
        except ProcessorError:
            raise
        except Exception as exc:
            raise as_processor_error(exc) from exc
        finally:
            handle.release()

    def _predict_wire(self, name: str, data: bytes | memoryview) -> bytes:
        return self.predict(wire_call(name, data)).outputs

    def served(self, name: str, version: int | None = None, label: str | None = None) -> Served:
        """What serves ``name`` (metadata calls), read in one acquire: the version ``version`` (or
        ``label``) names, else the default; NOT_FOUND when that version is not served."""
        model = self._registry.get(name)
        with model.manager.acquire(model.router.resolve(version, label)) as group:
            return Served(group.version, group.signature, group.backend.engine_name, group.signatures)

    # --- timeline tracing -------------------------------------------------------------------

    def _begin_trace(self, name: str) -> TraceRecorder | None:
        """Count the request with the model's tracer; a recorder if it is to be traced."""
        tracer = self._tracers.get(name)
        if tracer is None:
            return None
        recorder = tracer.begin()
        if tracer.done:
            self._tracers.pop(name, None)  # no traces left: later requests skip tracing entirely
        return recorder


def _note(version) -> None:
    """Tell the edge's note (``answer_note_var``), if it set one, which version answered."""
    note = answer_note_var.get()
    if note is not None:
        note[0] = version


def _on_served(manager, work, version: int | None = None):
    """``work(group)`` on the model's served group ``version`` (None: the default), referenced
    for the call (one acquire); anything it raises is a ProcessorError. (:meth:`DataPlane._call`,
    the hot path, spells this out: no closure made per request.)"""
    handle = manager.acquire_handle(version)
    try:
        return work(handle.group)
    except ProcessorError:
        raise
    except Exception as exc:
        raise as_processor_error(exc) from exc
    finally:
        handle.release()


def _run(group, decoded: codec.DecodedRequest, batching: ModelBatching | None = None,
         deadline: float | None = None, rec: TraceRecorder | None = None) -> dict[str, np.ndarray]:
    """Run a decoded request, merged by the model's reference batcher when it batches, traced
    into ``rec`` when given; its outputs by response key."""
    aliases = tuple(alias for _, alias in decoded.fetches)
    if batching is not None:
        arrays = batching.batcher.run(group, decoded.feeds, aliases, deadline, rec)
    elif rec is not None:
        rec.lane, arrays, rec.engine = group.run_traced(decoded.feeds, aliases, rec.engine_trace)
    else:
        arrays = group.run(decoded.feeds, aliases)
    if rec is not None and not rec.engine_trace:
        _engine_attributes(group, decoded.feeds, rec.lane)
    return {key: array for (key, _), array in zip(decoded.fetches, arrays)}


def _engine_attributes(group, feeds: dict[str, np.ndarray], lane: int | None) -> None:
    """The ``engine.run`` span's attributes (a sampled request's, inside that span)."""
    attributes = {"sp.backend": spans.backend_name(group)}
    rows = merge.request_rows(feeds)
    if rows is not None:
        attributes["sp.rows"] = rows
    if lane is not None:
        attributes["sp.lane"] = lane
    spans.annotate(attributes)
