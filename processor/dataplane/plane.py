"""DataPlane: the request use-cases every edge calls (see the package doc)."""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Sequence

import numpy as np

from .. import codec, spans
from ..batching.batched_call import BatchedCall
from ..errors import ProcessorError, Unavailable, result_or_error
from ..request import (PredictCall, PredictResult, PreparedCall, Served, Work, answer_note_var, check_call,
                       check_deadline, version_number, wire_call, wire_result)
from ..served_model import ModelRegistry
from ..tracing import TraceRecorder
from . import stages
from .held import Held, converted, on_served
from .plan import INLINE, QUEUE, THREAD, WIRE, Plan

log = logging.getLogger("processor.dataplane")

_sampled = spans.current.get  # the sampled request's span, else None: the request path's one check

# _call's modes: run the call; run it only if the engine takes it natively (an event loop's:
# else a Deferred holding the version); run it on the reference path (the engine declined it)
_RUN, _NATIVE_ONLY, _REFERENCE = 0, 1, 2


class Deferred:
    """A call :meth:`DataPlane.submit` did not finish on the caller's thread: :meth:`run` it on
    a thread (the model's pool). It may hold the version it was routed to (acquired once: the
    thread runs it there); :meth:`close` releases that if it never runs (the pool refused it,
    the caller went away). :meth:`run` and :meth:`close` may race (a cancelled caller): the
    version is taken exactly once (``list.pop`` under the GIL)."""

    __slots__ = ("_plane", "_plan", "_call", "_version", "_held", "_mode")

    def __init__(self, plane: DataPlane, call, plan: Plan | None = None, version: int | None = None,
                 held: Held | None = None, mode: int = _RUN) -> None:
        self._plane, self._plan, self._call, self._version, self._mode = plane, plan, call, version, mode
        self._held = [held] if held is not None else None

    def run(self):
        """The call's result (a Work's: its function's); raises as the call does."""
        call = self._call
        if self._held is None:
            return call.fn(*call.args) if call.__class__ is Work else self._plane.predict(call)
        try:
            held = self._held.pop()
        except IndexError:
            raise Unavailable(f"model {call.model!r}: the request was cancelled") from None
        held.kept = False
        return self._plane._serve(self._plan, call, self._version, held, self._mode)

    def close(self) -> None:
        """Release the version a call that never ran holds (none when it ran)."""
        if self._held:
            try:
                self._held.pop().release()
            except IndexError:
                pass


class DataPlane:
    """Routes calls to the registry's models. See the package doc."""

    def __init__(self, models: ModelRegistry) -> None:
        self._registry = models
        self._plans: dict[str, Plan] = {}
        self._followers: dict[str, list[Callable[[Plan | None], None]]] = {}
        self._followed: weakref.WeakSet = weakref.WeakSet()  # managers and routers whose changes republish
        self._publish_lock = threading.RLock()
        self.busy = None  # the server's load signal for shadows (set_busy)
        self.refresh()

    def set_busy(self, busy) -> None:
        """``busy()``: whether the server is busy now; shadow copies are shed while it is
        (:mod:`processor.shadow`)."""
        self.busy = busy
        for model in self._registry:
            model.shadow.busy = busy

    # --- plans ------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Take the registry's models as they are now (a live model set added, replaced or
        removed one): each model's plan is published afresh, a removed model's withdrawn. A call
        that found its plan before keeps it: the version it acquired stays its own until it ends."""
        with self._publish_lock:
            models = list(self._registry)
            names = {m.name for m in models}
            for name in [n for n in self._plans if n not in names]:
                self._withdraw(name)
            for model in models:
                model.shadow.run = self._run_shadow
                model.shadow.busy = self.busy
                self._publish(model)
        for model in models:  # outside the lock: a manager tells its listener under its own lock
            self._follow(model)

    def _follow(self, model) -> None:
        """Republish ``model``'s plan when its default version or its routing changes."""
        for source in (model.manager, model.router):
            if source in self._followed:
                continue
            self._followed.add(source)
            name = model.name
            if source is model.manager:
                source.follow_default(lambda _group, name=name: self._republish(name))
            else:
                source.watch(lambda name=name: self._republish(name))

    def _republish(self, name: str) -> None:
        with self._publish_lock:
            try:
                model = self._registry.get(name)
            except ProcessorError:
                return  # removed: refresh withdraws it
            self._publish(model)

    def _publish(self, model) -> None:
        """Publish ``model``'s plan as its parts are now (under the publication lock)."""
        tracer = model.tracer
        plan = Plan(model, tracer if tracer is not None and not tracer.done else None)
        self._plans[model.name] = plan
        for listener in self._followers.get(model.name, ()):
            _tell(listener, plan, model.name)

    def _withdraw(self, name: str) -> None:
        del self._plans[name]
        for listener in self._followers.get(name, ()):
            _tell(listener, None, name)

    def follow_plan(self, name: str, listener: Callable[[Plan | None], None]) -> None:
        """Tell ``listener`` model ``name``'s plan now and at each publication (None: the model is
        no longer served): for what must follow it without a request's help (the C ABI's direct
        path). Called under the publication lock; it must be quick; its errors are logged."""
        with self._publish_lock:
            self._followers.setdefault(name, []).append(listener)
            _tell(listener, self._plans.get(name), name)

    def plan(self, name: str) -> Plan | None:
        """Model ``name``'s plan now (None: not served)."""
        return self._plans.get(name)

    @property
    def model_names(self) -> list[str]:
        return self._registry.names

    # --- calls ------------------------------------------------------------------------------

    def predict(self, call: PredictCall) -> PredictResult:
        """Run one call (see the package doc), on this thread; raises ProcessorError.

        Wire bytes may be a memoryview of the caller's buffer (the C ABI's): read during the call
        only, never kept (decoding copies). A call to a model with nothing but the call to serve
        (:attr:`Plan.hot`) takes the request path's hot loop: one acquire and the group's
        ``serve`` (the engine's native whole-request path, or the native codec around the engine
        call); every other goes through :meth:`_serve`.
        """
        plan = self._plans.get(call.model)
        if plan is None:
            self._gone(call.model)
        if call.deadline is not None:
            check_deadline(call.model, call.deadline)
        version = plan.router.route(call)
        inputs = call.inputs
        if plan.hot_wire and inputs.__class__ in WIRE and inputs and _sampled() is None:
            # the hot loop: Held's protocol spelled out (its object and the with-protocol cost
            # ~0.4 us, 2-3% of a batch-1 request on the native engine)
            handle = plan.manager.acquire_handle(version)
            try:
                group = handle.group
                note = answer_note_var.get()
                if note is not None:
                    note[0] = group.version
                if call.signature_name:
                    group = check_call(group, call.signature_name)
                return wire_result(group.serve(inputs), group.version, group.signature)
            except Exception as exc:
                raise converted(exc) from exc
            finally:
                handle.release()
        if plan.hot and _sampled() is None:
            return self._call(plan, call, version, None, None, None, _RUN)
        return self._serve(plan, call, version, None, _RUN)

    def where(self, model: str, wire: bool, size: int, inline_max: int) -> int | None:
        """Where a request to ``model`` runs when an event loop has it: :meth:`Plan.where` of the
        model's plan now (None: not served): what an edge asks (through ``ServingRuntime``)
        before a request's body arrives; :meth:`submit` decides again once it has."""
        plan = self._plans.get(model)
        return None if plan is None else plan.where(wire, size, inline_max, _sampled() is not None)

    def submit(self, call: PredictCall | Work, inline_max: int, notify_fd: int = -1):
        """For event loops: ``call`` (a wire PredictCall, or a :class:`~processor.request.Work`)
        where its model's plan puts it (:meth:`where`): run here and now (the PredictResult, or
        the Work's result); queued on its batching model's native queue without a thread to wait
        on it (a :class:`~processor.batching.batched_call.BatchedCall` whose ``ticket.done`` turns
        true, and ``notify_fd``, an eventfd, is written, once its batch ran; with no fd, -1, the
        call is deferred instead); else a :class:`Deferred` to run on a thread. A call routed and
        acquired here that cannot finish here after all (the version it names runs in Python,
        the engine declines it, the queue does not take it) is deferred holding that version:
        no call is acquired or decoded twice. ``inline_max``: the largest request run in place
        (0: none). Raises ProcessorError as :meth:`predict` does (NotFound, a version or
        signature not served, a passed deadline, the queue's refusal)."""
        sampled = _sampled() is not None
        plan = self._plans.get(call.model)
        if call.__class__ is Work:
            if plan is not None and plan.where(False, call.size, inline_max, sampled) == INLINE:
                return call.fn(*call.args)
            return Deferred(self, call)  # an unknown model's work answers NotFound itself
        if plan is None:
            self._gone(call.model)
        inputs = call.inputs
        if inputs.__class__ not in WIRE:
            return Deferred(self, call)
        where = plan.where(True, len(inputs), inline_max, sampled)
        if where == THREAD or (where == QUEUE and notify_fd < 0):
            return Deferred(self, call)
        version = self._version(call, plan)
        if where == QUEUE:
            return self._queue(plan, call, version, notify_fd)
        return self._serve(plan, call, version, None, _NATIVE_ONLY)

    def _queue(self, plan: Plan, call: PredictCall, version: int | None, notify_fd: int):
        """``call`` on its batching model's native queue (:meth:`submit`)."""
        held = Held(plan.manager, version)
        with held:
            group = held.group
            stages.note(group.version)
            if call.signature_name:
                group = check_call(group, call.signature_name)
            queued = plan.batching.queue(group, call.inputs, call.deadline, notify_fd)
            held.kept = True
        if queued is None:  # no native queue, an update running: the reference batcher, on a thread
            return Deferred(self, call, plan, version, held)
        return BatchedCall(held.handle, group, queued)

    def _serve(self, plan: Plan, call: PredictCall, version: int | None, held: Held | None, mode: int,
               shadow: bool = False):
        """``call`` with what its plan asks besides the run: the timeline's stages, OpenTelemetry's
        spans, the prediction log's record (its result or error, once answered, off the request's
        path), the shadow's copy (once answered; ``shadow``: this is such a copy, logged marked
        as one, neither traced nor copied). Raises ProcessorError."""
        rec: TraceRecorder | None = None
        if not shadow:
            if plan.tracer is not None:
                rec = self._begin_trace(plan)
            if rec is None and _sampled() is not None:  # OpenTelemetry's: each stage a span
                rec = spans.SpanRecorder()
        logger = plan.logger
        pending = None
        if logger is not None and (call.inputs or call.inputs.__class__ not in WIRE):  # not a ping
            pending = logger.begin(call)
            if pending is not None:
                pending.shadow = shadow
        result = None
        try:
            if rec is None:
                result = self._call(plan, call, version, held, None, pending, mode)
            else:
                with rec.stage("request"):
                    result = self._call(plan, call, version, held, rec, pending, mode)
        except Exception as exc:
            if pending is not None:
                pending.error = exc
            if rec is not None:
                rec.error = str(exc)
            raise
        finally:
            answered = result.__class__ is PredictResult
            if pending is not None and (answered or pending.error is not None):
                if answered:
                    pending.result = result
                logger.submit(pending)  # never raises, never blocks
            if rec is not None and rec.tracer is not None:  # a timeline's (a SpanRecorder's spans have ended)
                rec.tracer.submit(rec)  # never raises
        if not shadow and plan.routing.shadow is not None and result.__class__ is PredictResult:
            self._shadow(plan, call, result)
        return result

    def _call(self, plan: Plan, call: PredictCall, version: int | None, held: Held | None,
              rec: TraceRecorder | None, pending, mode: int):
        """The call on its version (acquired here unless ``held``), its signature checked: the
        hot path for an untraced, unbatched wire request (the group's ``serve``), else
        :func:`stages.answer`. ``mode`` :data:`_NATIVE_ONLY` (an event loop's): a Deferred
        holding the version where the engine does not take the request natively."""
        if held is None:
            if rec is None:
                held = Held(plan.manager, version)
            else:
                with rec.stage("acquire"):
                    held = Held(plan.manager, version)
        with held:
            group = held.group
            if pending is not None:
                pending.group = group
            stages.note(group.version)
            if call.signature_name:
                group = check_call(group, call.signature_name)
            inputs = call.inputs
            if rec is None and inputs.__class__ in WIRE and inputs and plan.batching is None:
                if mode == _RUN:
                    return wire_result(group.serve(inputs), group.version, group.signature)
                if mode == _REFERENCE:
                    return wire_result(group.serve_reference(inputs), group.version, group.signature)
                served = group.serve(inputs, True) if group.serves_natively else None
                if served is None:  # runs in Python after all (a one-row context...): on a thread
                    held.kept = True
                    return Deferred(self, call, plan, version, held,
                                    _REFERENCE if group.serves_natively else _RUN)
                return wire_result(served, group.version, group.signature)
            if call.prepare and rec is None and plan.prepares and inputs.__class__ not in WIRE:
                return self._prepared(plan, call, version, held.group, group)
            return stages.answer(call, group, plan.batching, rec, pending)

    def _prepared(self, plan: Plan, call: PredictCall, version: int | None, group, served) -> PredictResult:
        """:func:`stages.answer` of arrays or a decoder asking ``prepare``: the result carries the
        PreparedCall of its form (numeric inputs only), made from this one decode."""
        decoded = codec.decode_arrays(call.inputs(served.signature) if callable(call.inputs) else call.inputs,
                                      call.output_filter, served.signature, call.check_shapes)
        result = PredictResult(stages.run(served, decoded), group.version, served.signature)
        feeds = decoded.feeds
        if any(a.dtype.kind not in "biufc" for a in feeds.values()):
            return result
        return result._replace(prepared=_prepared_call(call.model, group, served, decoded, version))

    def prepare(self, call: PredictCall) -> PreparedCall | None:
        """``call`` (numeric arrays by alias or tensor name) checked against its served group as
        :meth:`predict` checks it, for :meth:`run_prepared`; runs nothing. None where the model's
        calls take another path (:attr:`Plan.prepares`) or an input is not a numeric array.
        Raises ProcessorError as :meth:`predict` does."""
        model, inputs = call.model, call.inputs
        plan = self._plans.get(model)
        if plan is None:
            self._gone(model)
        if not isinstance(inputs, dict) or not plan.prepares:
            return None
        version = self._version(call, plan)

        def check(group):
            served = check_call(group, call.signature_name) if call.signature_name else group
            decoded = codec.decode_arrays(inputs, call.output_filter, served.signature, call.check_shapes)
            if any(a.dtype.kind not in "biufc" for a in decoded.feeds.values()):
                return None
            return _prepared_call(model, group, served, decoded, version)
        return on_served(plan.manager, check, version)

    def prepares(self, model: str) -> bool:
        """Whether :meth:`prepare` may prepare ``model``'s calls (:attr:`Plan.prepares`)."""
        plan = self._plans.get(model)
        return plan is not None and plan.prepares

    def run_prepared(self, prepared: PreparedCall, feeds: dict[str, np.ndarray],
                     deadline: float | None = None) -> PredictResult | None:
        """``feeds`` (by alias, each of the dtype and shape ``prepared`` recorded: the caller's
        promise, not checked again) run on the group ``prepared`` was checked on, as
        :meth:`predict` runs them; None, having run nothing, once another version serves the
        model or its calls take another path: prepare it again. Raises ProcessorError."""
        model = prepared.model
        if deadline is not None:
            check_deadline(model, deadline)
        plan = self._plans.get(model)
        if plan is None or not plan.prepares:
            return None

        def run(group) -> PredictResult | None:
            served = prepared.served()
            if group is not prepared.group() or served is None:
                return None
            with spans.stage("engine.run"):
                arrays = served.run(feeds, prepared.aliases)
            stages.note(group.version)
            return PredictResult({key: array for (key, _), array in zip(prepared.fetches, arrays)},
                                 group.version, served.signature)
        return on_served(plan.manager, run, prepared.version)

    def predict_many(self, name: str, requests: Sequence[bytes | memoryview]) -> list[bytes | ProcessorError]:
        """:meth:`predict` of each serialized request, one result (response bytes or the error)
        per request.

        With batching, all of them go in through the model's one submit path
        (:meth:`ModelBatching.serve_many`), queued before any is awaited, so they run merged
        with each other and with concurrent :meth:`predict` calls; without (or while the model
        traces), they run one after another.
        """
        plan = self._plans.get(name)
        if plan is None or plan.batching is None or plan.tracer is not None:
            return [result_or_error(self._predict_wire, name, data) for data in requests]
        with Held(plan.manager, None) as group:
            results = plan.batching.serve_many(group, requests)
            if plan.logger is not None:
                for data, result in zip(requests, results):
                    plan.logger.log_answered(name, data, group, result)
            return results

    def predict_each(self, call: PredictCall, signature_names: Sequence[str]) -> list[PredictResult]:
        """``call`` run once per signature in ``signature_names`` (each checked as ``call``'s
        own), all on one acquire of the served version: TF Serving's MultiInference, one input
        for several signatures. Arrays and decoders only; ``call.signature_name`` is ignored.
        Raises ProcessorError (the first task's failure)."""
        plan = self._plans.get(call.model)
        if plan is None:
            self._gone(call.model)
        version = self._version(call, plan)
        with Held(plan.manager, version) as group:
            stages.note(group.version)
            return [stages.answer(call, check_call(group, name), plan.batching, None) for name in signature_names]

    def _predict_wire(self, name: str, data: bytes | memoryview) -> bytes:
        return self.predict(wire_call(name, data)).outputs

    def served(self, name: str, version: int | None = None, label: str | None = None) -> Served:
        """What serves ``name`` (metadata calls), read in one acquire: the version ``version`` (or
        ``label``) names, else the default; NOT_FOUND when that version is not served."""
        model = self._registry.get(name)
        with Held(model.manager, model.router.resolve(version, label)) as group:
            return Served(group.version, group.signature, group.backend.engine_name, group.signatures)

    # --- routing, shadows, timelines --------------------------------------------------------

    def _version(self, call: PredictCall, plan: Plan) -> int | None:
        """The version number ``call`` runs on: the one it names, its label resolved, else its
        traffic arm's (None: the default). DeadlineExceeded when its deadline passed already."""
        if call.deadline is not None:
            check_deadline(call.model, call.deadline)
        return plan.router.route(call)

    def _gone(self, model: str) -> None:
        """Raise for a call to ``model``, which this DataPlane does not serve: NotFound naming
        how many models are served, or (the registry has it: a live reload is swapping it in
        this instant) Unavailable."""
        self._registry.get(model)  # raises NotFound
        raise Unavailable(f"model {model!r} is being reloaded; try again")

    def _shadow(self, plan: Plan, call: PredictCall, result: PredictResult) -> None:
        """Let the model's ShadowRunner consider a copy of the answered ``call`` (never raising:
        the primary has its answer)."""
        if not result.introspection:
            plan.shadow.consider(plan.routing, call, version_number(result.version), plan.manager.serves)

    def _run_shadow(self, call: PredictCall) -> PredictResult:
        """A shadow copy (its ``version`` set), run as :meth:`predict` runs a call; a sampled
        one is logged marked as shadow."""
        plan = self._plans.get(call.model)
        if plan is None:
            self._gone(call.model)
        return self._serve(plan, call, call.version, None, _RUN, shadow=True)

    def _begin_trace(self, plan: Plan) -> TraceRecorder | None:
        """Count the request with the model's timeline; a recorder if it is to be traced (its
        last one republishes the plan without it: later requests skip tracing entirely)."""
        tracer = plan.tracer
        recorder = tracer.begin()
        if tracer.done:
            self._republish(plan.name)
        return recorder


def _prepared_call(model: str, group, served, decoded: codec.DecodedRequest, version: int | None) -> PreparedCall:
    return PreparedCall(model, weakref.ref(group), weakref.ref(served),
                        tuple((alias, a.dtype, a.shape) for alias, a in decoded.feeds.items()),
                        decoded.fetches, tuple(alias for _, alias in decoded.fetches), version)


def _tell(listener: Callable[[Plan | None], None], plan: Plan | None, name: str) -> None:
    try:
        listener(plan)
    except Exception:  # a follower's bug must not fail a publication (a load)
        log.exception("%s: a plan follower failed", name)
