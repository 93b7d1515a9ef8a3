"""ServingRuntime: what both transports share (models, DataPlane, threads, drain, metrics, admin).

Built once by :mod:`server.app` from a :class:`~server.settings.DeploymentConfig`: its
models are a :class:`~processor.served_model.ModelRegistry` (each model composed once, as the C
ABI's Processor composes its one), its requests go through one
:class:`~processor.dataplane.DataPlane`. Transports stay thin: they parse their wire
format, wrap the call in :meth:`ServingRuntime.track` (drain gate, metrics, access log), run the
DataPlane call under the one concurrency rule of every edge (:meth:`ServingRuntime.dispatch`: in
place on the edge's event loop, on the batching queue, or on the model's own pool,
:mod:`server.model_pool`), and map
a :class:`~processor.errors.ProcessorError` once through ``STATUS_TABLE``.

Model loading happens on background threads: a model that fails to load is reported unready
(state ``failed`` and its error in model info, 503 on its requests) while the others serve.
Thread-safe.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from processor.echo import cut
from processor.batching.batched_call import BatchedCall
from processor.dataplane import DataPlane, Deferred
from processor.dataplane.plan import INLINE
from processor.errors import ProcessorError, as_processor_error, edge_error
from processor.request import PredictCall, Work, answer_note_var, version_number
from processor.memory_budget import MemoryBudget
from processor.served_model import ModelRegistry, ServedModel

from .access_log import AccessLog
from .batch_waiter import BatchWaiter
from .cpu_meter import CpuMeter
from .drain import DrainGate
from .logs import request_id_var
from .metrics import UNKNOWN_MODEL, ServerMetrics
from .model_pool import ModelPool
from .model_set import ModelSet
from .otel import Tracing
from .settings import DeploymentConfig

log = logging.getLogger("server")


class ServingRuntime:
    """See the module doc. ``models``: the served models (default: the deployment's, composed;
    tests give ServedModels built over fakes)."""

    def __init__(self, deployment: DeploymentConfig, models: ModelRegistry | None = None) -> None:
        self.deployment = deployment
        # the environment is applied first (from_entries), before TensorFlow starts
        # one memory budget for the server's loads: every model's, a live reload's too
        self.budget = MemoryBudget(deployment.memory_limit)
        self.models = models if models is not None else ModelRegistry.from_entries(deployment.models, self.budget)
        self.dataplane = DataPlane(self.models)
        self.gate = DrainGate()
        # shadow copies are shed while the machine's CPUs are busy (processor/shadow.py)
        self.cpu_meter = CpuMeter()  # the edges' event loops register their threads (watch)
        self.dataplane.set_busy(self.cpu_meter.busy)
        self.metrics = ServerMetrics(lambda: self.models, self._batching_info)
        # OpenTelemetry traces (server/otel.py); None: off, and the request path checks only this
        self.otel = Tracing.from_deployment(deployment, self.metrics.count_spans)
        self.admin_token = deployment.resolved_admin_token()
        self.access_log = AccessLog(deployment.access_log, deployment.access_log_sample_rate)
        entries = {e.name: e for e in deployment.models}
        self._pools = {m.name: ModelPool(m.name, m.threads or 2, _max_queued(entries.get(m.name)))
                       for m in self.models}
        self._waiters: dict[asyncio.AbstractEventLoop, BatchWaiter] = {}  # per event loop
        self._inline_max = deployment.inline_max_request_bytes  # the largest request run on a loop
        self._update_lock = threading.Lock()
        self._loaders: list[threading.Thread] = []
        self.on_model_ready: list[Callable[[str], None]] = []  # called with the model name
        self.admin_journal = None  # workers > 1: a server/admin_journal.AdminJournal
        # the live model set: load, unload and reload models while serving (a file-following one
        # when the server was started from a file: python -m server replaces this one)
        self.model_set = ModelSet(self)

    def model(self, name: str) -> ServedModel:
        """The served model; NotFound naming the served ones."""
        return self.models.get(name)

    def _batching_info(self) -> dict[str, dict | None]:
        return {m.name: m.batching_info() for m in self.models}

    # --- model lifecycle --------------------------------------------------------------------

    def start_models(self) -> None:
        """Load every model on its own background thread; failures are logged, not raised."""
        for model in self.models:
            thread = threading.Thread(target=self.start_model, args=(model,), daemon=True,
                                      name=f"sp-load-{model.name}")
            thread.start()
            self._loaders.append(thread)

    def start_model(self, model: ServedModel) -> ProcessorError | None:
        """Load ``model`` (on the caller's thread); None once it serves, else its error (logged
        and counted, never raised); ``on_model_ready`` callbacks run on success."""
        name = model.name
        started = time.monotonic()
        try:
            model.start()
        except Exception as exc:
            err = edge_error(exc, "model start", log)  # an internal error's traceback, once
            self.metrics.observe_update(name, "start", time.monotonic() - started, ok=False)
            log.error("model %s failed to load: %s", name, err.message,
                      extra={"model": name, "code": err.code.name})
            return err
        self.metrics.observe_update(name, "start", time.monotonic() - started, ok=True)
        self._drop_unavailable_labels(model)
        served = model.served_version()
        log.info("model %s ready, version %s (%.2f s)", name, served.label if served else "?",
                 time.monotonic() - started, extra={"model": name})
        for callback in self.on_model_ready:
            try:
                callback(name)
            except Exception:
                log.exception("on_model_ready callback failed")
        return None

    def _drop_unavailable_labels(self, model: ServedModel) -> None:
        """With ``allow_version_labels_for_unavailable_models`` false (TF Serving's default), a
        label naming a version that does not serve once ``model`` has loaded is not applied:
        dropped, with TF Serving's error logged (TF Serving refuses such a config)."""
        if getattr(self.deployment, "allow_version_labels_for_unavailable_models", True):
            return
        served = {version_number(v) for v in model.served_versions()}
        labels = dict(model.version_labels)
        dropped = {label: n for label, n in labels.items() if n not in served}
        if not dropped:
            return
        for label, number in dropped.items():
            log.error("Request to assign label to version %d of model %s, which is not currently available "
                      "for inference (label %r not applied: allow_version_labels_for_unavailable_models is "
                      "false)", number, model.name, label, extra={"model": model.name})
        model.update_routing({"version_labels": {k: v for k, v in labels.items() if k not in dropped}},
                             require_served=False)

    # --- the live model set (server/model_set.py) -------------------------------------------

    def put_model(self, model: ServedModel, entry) -> ServedModel | None:
        """Serve ``model`` (started) under its name, with its deployment ``entry``'s pool
        settings; returns the model it replaced, still open (:meth:`retire_model` it). Requests
        admitted before keep what they found; the next ones find ``model``."""
        old_pool = self._pools.get(model.name)
        threads, queued = model.threads or 2, _max_queued(entry)
        if old_pool is None or (old_pool.threads, old_pool.max_queued) != (threads, queued):
            self._pools = {**self._pools, model.name: ModelPool(model.name, threads, queued)}
            if old_pool is not None:
                old_pool.retire()
        old = self.models.put(model)
        self.dataplane.refresh()
        return old

    def drop_model(self, name: str) -> ServedModel | None:
        """Stop serving model ``name``: from now on its requests are NOT_FOUND; returns it,
        still open (:meth:`retire_model` it)."""
        old = self.models.pop(name)
        self.dataplane.refresh()
        pools = dict(self._pools)
        pool = pools.pop(name, None)
        self._pools = pools
        if pool is not None:
            pool.retire()
        return old

    def retire_model(self, model: ServedModel) -> None:
        """Close a model no longer served: its batching queue runs what it holds, its versions
        are freed as their in-flight requests end."""
        model.drain(timeout=self.deployment.drain_timeout_seconds)
        model.close()

    def wait_models(self, timeout: float | None = None) -> None:
        """Wait until every start attempt has finished (loaded or failed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._loaders:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def readiness(self) -> dict[str, bool]:
        """Per model: it serves a version and the server is not draining. The one rule every
        readiness API answers by (HTTP ``/readyz`` and ``/v2/models/{m}/ready``, KServe v2
        ServerReady / ModelReady, gRPC health)."""
        draining = self.gate.draining
        return {m.name: m.ready and not draining for m in self.models}

    def model_ready(self, name: str) -> bool:
        """:meth:`readiness` of one model; NotFound for an unknown one."""
        return self.models.get(name).ready and not self.gate.draining

    @property
    def ready(self) -> bool:
        """Every model ready (:meth:`readiness`), and the server not draining."""
        return not self.gate.draining and all(self.readiness().values())

    def states(self) -> dict[str, str]:
        return {m.name: m.state for m in self.models}

    # --- request path -----------------------------------------------------------------------

    def pool(self, name: str) -> ModelPool:
        """The model's inference pool; NotFound for an unknown model."""
        pool = self._pools.get(name)
        if pool is None:
            self.models.get(name)  # raises NotFound with the list of served models
        return pool

    async def run(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the model's pool (keeps the event loop free), context copied;
        QueueFull (503) when the model's ``max_queued_requests`` requests already wait."""
        return await self.pool(name).run(fn, *args)

    async def dispatch(self, call: PredictCall | Work) -> Any:
        """A request from an event loop, where its model's plan puts it (``DataPlane.submit``):
        here and now (a small request the native engine runs without the GIL, or a
        :class:`~processor.request.Work` the edge decodes, small enough that the hop to a pool
        costs more than the work); queued on its batching model's native queue and awaited on
        this loop (:mod:`server.batch_waiter`); else on the model's own pool (:meth:`run`), so
        one slow model's queue never holds another model's requests. The only code choosing
        among the three: every edge awaits it (the HTTP lean path's :meth:`dispatch_here` too,
        when its answer cannot be given at once). A wire call's PredictResult, a Work's
        result; raises ProcessorError."""
        waiter = self._waiter()
        out = self.dataplane.submit(call, self._inline_max, waiter.fd)
        kind = out.__class__
        if kind is Deferred:
            return await self._on_pool(call.model, out)
        if kind is BatchedCall:
            result = await waiter.result(out)
            if result is None:  # the queue handed it back (closing for an update): the pool's turn
                return await self.run(call.model, self.dataplane.predict, call)
            return result
        return out

    def dispatch_here(self, call: PredictCall | Work) -> Any:
        """:meth:`dispatch` for a caller that has asked :meth:`runs_here` (the HTTP lean path,
        which answers without a task when it can): the result when it ran here; else an
        awaitable of it (on the model's pool: the plan changed since, or the engine declined
        this request), which the caller awaits in a task of its own. Raises ProcessorError."""
        out = self.dataplane.submit(call, self._inline_max)
        if out.__class__ is Deferred:
            return self._on_pool(call.model, out)
        return out

    async def _on_pool(self, model: str, deferred: Deferred) -> Any:
        try:
            return await self.run(model, deferred.run)
        finally:
            deferred.close()  # one the pool refused (or whose caller went away) holds its version

    def runs_here(self, model: str, size: int, wire: bool) -> bool:
        """Whether a request of ``size`` bytes to ``model`` runs on the event loop that has it
        (``DataPlane.where``; ``wire``: our format's bytes, else a
        :class:`~processor.request.Work`): asked by the HTTP lean path before the body arrives,
        to answer without a task; :meth:`dispatch_here` decides again once it has."""
        return self.dataplane.where(model, wire, size, self._inline_max) == INLINE

    def _waiter(self) -> BatchWaiter:
        """The running loop's BatchWaiter (made on first use, by that loop's own thread: no
        other thread ever makes this loop's)."""
        loop = asyncio.get_running_loop()
        waiter = self._waiters.get(loop)
        if waiter is None:
            waiter = self._waiters[loop] = BatchWaiter(loop)
        return waiter

    def track(self, model: str, protocol: str, api: str) -> RequestTrack:
        """Around one request (``with rt.track(...)``): refuse when draining, count in flight,
        record metrics and the access log (see :class:`RequestTrack`)."""
        return RequestTrack(self, model, protocol, api)

    def version_label(self, name: str) -> str:
        served = self.models.get(name).served_version() if name in self.models else None
        return served.label if served is not None else "none"

    def memory(self) -> dict[str, Any]:
        """What the served models hold, counted per model, version and part, their total beside
        the process's resident memory, and the fit check's limit and learned factors."""
        models = {m.name: m.memory() for m in self.models}
        counted = sum(sum(parts.values()) for versions in models.values() for parts in versions.values())
        return {"counted_bytes": counted, "budget": self.budget.describe(), "models": models}

    def routes_versions(self, name: str) -> bool:
        """Whether a call to ``name`` naming no version may be answered by another version than
        the default: several are served, or the model splits its traffic. Metrics and the access
        log then name the version that answered (a request's note, ``answer_note_var``)."""
        return name in self.models and self.models.get(name).routes_versions

    # --- admin ------------------------------------------------------------------------------

    # ``caller`` (the client's address) goes into the admin log lines

    def reload(self, name: str, caller: str = "-") -> dict[str, Any]:
        """Load the version the store names now."""
        return self.admin("reload", name, None, caller)

    def rollback(self, name: str, version: int | None, caller: str = "-") -> dict[str, Any]:
        """Serve the previously served version, or full checkpoint ``version``; both pin it."""
        return self.admin("rollback", name, version, caller)

    def pin(self, name: str, version: int, caller: str = "-") -> dict[str, Any]:
        """Serve full checkpoint ``version`` and stop following newer ones."""
        return self.admin("pin", name, version, caller)

    def unpin(self, name: str, caller: str = "-") -> dict[str, Any]:
        """Follow the newest version again."""
        return self.admin("unpin", name, None, caller)

    def route(self, name: str, changes: dict[str, Any], caller: str = "-") -> dict[str, Any]:
        """Change model ``name``'s labels, traffic split and shadow (any of ``version_labels``,
        ``traffic``, ``shadow``; each given replaces that part), in every worker."""
        return self.admin("routing", name, None, caller, changes)

    def admin(self, kind: str, name: str, version: int | None, caller: str = "-",
              routing: dict[str, Any] | None = None) -> dict[str, Any]:
        """One admin action; with workers > 1 through the server's admin journal, which applies
        it here and then in every other worker (server/admin_journal.py)."""
        if self.admin_journal is not None:
            return self.admin_journal.submit(kind, name, version, caller, routing)
        return self.apply_admin(kind, name, version, caller, routing)

    def apply_admin(self, kind: str, name: str, version: int | None, caller: str = "-",
                    routing: dict[str, Any] | None = None) -> dict[str, Any]:
        """Apply admin action ``kind`` (reload, rollback, pin, unpin, routing) in this process."""
        model = self.models.get(name)
        if kind == "routing":
            routed = model.update_routing(routing or {})
            log.info("admin routing of %s by %s: %s", name, caller, routed, extra={"model": name, "client": caller})
            return {"model": name, "action": kind, "routing": routed}
        actions = {"reload": model.reload, "rollback": lambda: model.rollback(version),
                   "pin": lambda: model.pin(version), "unpin": model.unpin}
        return self._update(name, kind, actions[kind], caller)

    def _update(self, name: str, kind: str, action: Callable[[], Any], caller: str = "-") -> dict[str, Any]:
        with self._update_lock:  # one admin update at a time
            started = time.monotonic()
            try:
                action()
            except Exception as exc:
                err = as_processor_error(exc)
                self.metrics.observe_update(name, kind, time.monotonic() - started, ok=False)
                log.error("admin %s of %s by %s failed: %s", kind, name, caller, err.message,
                          extra={"model": name, "client": caller})
                raise err from exc
            seconds = time.monotonic() - started
            self.metrics.observe_update(name, kind, seconds, ok=True)
            log.info("admin %s of %s by %s done in %.2f s, serving %s", kind, name, caller, seconds,
                     self.version_label(name), extra={"model": name, "client": caller})
            info = self.models.get(name).info()
            return {"model": name, "action": kind, "seconds": round(seconds, 3),
                    "state": info.get("state"), "version": info.get("version"),
                    "versions": info.get("versions"), "pinned": info.get("pinned")}

    # --- shutdown ---------------------------------------------------------------------------

    def close(self) -> None:
        self.model_set.stop()
        self.models.drain(timeout=self.deployment.drain_timeout_seconds)  # runs what is still queued
        for pool in self._pools.values():
            pool.shutdown()
        try:
            self.models.close()  # every batching queue closed: every ticket answered
        finally:
            for waiter in list(self._waiters.values()):
                waiter.close()
            self.access_log.close()
            if self.otel is not None:
                self.otel.close()


class RequestTrack:
    """One request's bookkeeping, as a context manager (a class, not a generator: this runs on
    every request). On enter: the drain gate (Unavailable once draining) and the in-flight
    gauge. On exit: the request's metrics (pre-bound children, :meth:`ServerMetrics.request`),
    and its access-log line: a failure at once with its code and message, a success through
    :class:`~server.access_log.AccessLog`'s writer thread when sampled. With tracing on, the
    request's edge span when sampled (``traced``, a :class:`~server.otel.RequestSpan`, else
    None; the edge sets its response size), ended on exit with the outcome, its trace id the
    latency histogram's exemplar."""

    __slots__ = ("rt", "model", "protocol", "api", "started", "entered", "note", "token", "traced")

    def __init__(self, rt: ServingRuntime, model: str, protocol: str, api: str) -> None:
        self.rt, self.model, self.protocol, self.api = rt, model, protocol, api

    def __enter__(self) -> RequestTrack:
        self.started = time.perf_counter()
        self.entered = False
        rt = self.rt
        self.note = None
        if rt.routes_versions(self.model):  # the DataPlane writes the version that answered here
            self.note = [None, None]
            self.token = answer_note_var.set(self.note)
        otel = rt.otel
        self.traced = otel.begin(self.protocol, self.api, self.model) if otel is not None else None
        rt.metrics.in_flight_of(self.protocol).inc()
        try:
            rt.gate.enter()
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        self.entered = True
        return self

    def detach(self) -> RequestTrack:
        """Leave this thread's context now: the request goes on in a task of its own (the HTTP
        lean path's answer that must wait after all), which calls :meth:`resume` first and
        exits the track as usual."""
        if self.note is not None:
            answer_note_var.reset(self.token)
        if self.traced is not None:
            self.traced.leave()
        return self

    def resume(self) -> None:
        """Enter the task's context that goes on with a :meth:`detach`-ed request."""
        if self.note is not None:
            self.token = answer_note_var.set(self.note)
        if self.traced is not None:
            self.traced.enter()

    def __exit__(self, kind, exc, tb) -> None:
        rt, model = self.rt, self.model
        if self.entered:
            rt.gate.exit()
        metrics = rt.metrics
        metrics.in_flight_of(self.protocol).dec()
        seconds = time.perf_counter() - self.started
        known = model in rt.models
        label = model if known else UNKNOWN_MODEL
        note = self.note
        if note is not None:
            answer_note_var.reset(self.token)
        if note is not None and note[0] is not None:
            version = note[0].label
        else:
            version = rt.version_label(model) if known else "none"
        # the access log names the traffic arm that chose the version too: "2/canary"
        logged = version if note is None or note[1] is None else f"{version}/{note[1]}"
        traced = self.traced
        if exc is None:
            span = traced.end(version) if traced is not None else None
            metrics.request(label, version, self.protocol, self.api, "OK").observe(seconds, span)
            rt.access_log.ok(self.protocol, self.api, model, logged, seconds, request_id_var.get())
            return
        if not isinstance(exc, Exception):  # cancelled, exiting: nothing to count
            if traced is not None:
                traced.end(version, cancelled=True)
            return
        err = as_processor_error(exc)
        code = err.code.name
        span = traced.end(version, err) if traced is not None else None
        metrics.request(label, version, self.protocol, self.api, code).observe(seconds, span)
        # a client's model name cut as error messages cut it
        AccessLog.error(self.protocol, self.api, cut(model), label, logged, code, err.message, seconds,
                        request_id_var.get())


def _max_queued(entry) -> int | None:
    """A deployment entry's ``max_queued_requests`` (None: unbounded, and for models the
    deployment does not list: tests' registries)."""
    return entry.max_queued_requests if entry is not None else None


def tune_gc() -> None:
    """Keep Python's garbage collector off the request path's tail.

    TensorFlow and a loaded model leave millions of long-lived objects; every full collection
    walks them all (100+ ms pauses that show up as p99 on JSON requests, which allocate many
    short-lived objects). Freezing moves what exists now out of the collector's reach; a larger
    first-generation threshold makes collections rarer. The server process calls it after each
    model loads (``python -m server``); it changes process-wide state, so a library user opts in.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
