"""Plan: how one model's calls run, decided in one place.

A :class:`~processor.dataplane.DataPlane` publishes one immutable :class:`Plan` per model each
time a fact it depends on changes: the model set (``DataPlane.refresh``), the default version
(a load, a rollback, a pin: ``ModelManager.follow_default``), the routing (labels, traffic split,
shadow: ``VersionRouter.watch``), a timeline taking its last trace. Every way a call can go is
read from the plan, and the conditions combine here only (``tests/unit/test_structure.py`` counts
the readers):

- :meth:`Plan.where`: for an edge on an event loop, whether a request runs right there
  (:data:`INLINE`), goes on the model's batching queue (:data:`QUEUE`) or needs a thread
  (:data:`THREAD`) — ``DataPlane.submit`` and ``ServingRuntime.dispatch`` act on it;
- :attr:`Plan.hot`, :attr:`Plan.hot_wire`: ``DataPlane.predict``'s hot loop (no timeline, log
  or shadow to serve; and, for a wire request's hottest, no batching);
- :attr:`Plan.plain`: the C ABI's direct path may bypass Python;
- :attr:`Plan.prepares`: prepared calls (KServe v2's and TF Serving's raw forms).

A plan reads the default version's group without a reference: a call still acquires the version
it runs on, and a plan that is one swap old at worst runs one request on a thread that could
have run in place (or the reverse, which the acquired group's own check catches).
"""

from __future__ import annotations

from typing import Any

INLINE, QUEUE, THREAD = 0, 1, 2
WIRE = (bytes, bytearray, memoryview)  # our wire format's request bytes


class Plan:
    """One model's plan (see the module doc). Immutable; thread-safe."""

    __slots__ = ("name", "manager", "router", "routing", "batching", "tracer", "logger", "shadow", "group",
                 "native", "hot", "hot_wire", "plain", "prepares", "_queues", "_in_place")

    def __init__(self, model, tracer) -> None:
        """``model``: a :class:`~processor.served_model.ServedModel`; ``tracer``: its timeline
        tracer while it has traces left, else None."""
        self.name = model.name
        self.manager = model.manager
        self.router = model.router
        self.routing = routing = model.router.routing
        self.batching = batching = model.batching
        self.tracer = tracer
        self.logger = logger = model.prediction_log
        self.shadow = model.shadow
        self.group: Any = self.manager.default_group()  # no reference: the direct path's lane, a hint
        self.native = native = self.group is not None and self.group.serves_natively
        shadowed = routing.shadow is not None
        self.hot = tracer is None and logger is None and not shadowed
        self.hot_wire = self.hot and batching is None  # a wire request: one acquire, the group's serve
        self.plain = self.hot and not routing.arms
        self.prepares = self.plain and batching is None
        self._in_place = native and batching is None and tracer is None
        self._queues = batching is not None and tracer is None and logger is None and not shadowed

    def where(self, wire: bool, size: int, inline_max: int, sampled: bool) -> int:
        """Where a request of ``size`` bytes runs when an event loop has it (see the module doc).

        ``wire``: our format's bytes (the engine decodes them; none: DeepRec's introspection
        ping), else work the edge decodes itself (JSON, protos) on whichever thread runs it. Run
        in place: a request of at most ``inline_max`` bytes whose default version runs it
        natively, with no batching and no timeline (and, when OpenTelemetry ``sampled`` it, no
        prediction log to write as well), and the ping; queued: a batching model's wire request
        that is neither traced, logged, sampled nor shadowed; anything else needs a thread.
        """
        if wire:
            if not size:
                return INLINE if self.tracer is None else THREAD
            if self._queues:
                return THREAD if sampled else QUEUE
        if size <= inline_max and self._in_place and not (sampled and self.logger is not None):
            return INLINE
        return THREAD
