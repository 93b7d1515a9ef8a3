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

Where a call runs: each model has one immutable :class:`~processor.dataplane.plan.Plan`,
published afresh whenever what it reads changes (:mod:`processor.dataplane.plan`); every
decision of a call's path reads it, and nothing else decides. :meth:`DataPlane.submit` is the
event loops' door (``ServingRuntime.dispatch`` awaits what it answers): done here (a small
request the native engine runs without the GIL), queued on the batching queue (awaited on the
loop), or a :class:`~processor.dataplane.plane.Deferred` for a thread, which holds the version
when one was acquired already. Versions are held through one helper
(:class:`~processor.dataplane.held.Held`).

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
run, encode inside ``request``) and the engine's full per-op trace. Once a timeline has taken its last trace, the
model's plan is published without it.

OpenTelemetry (issue 46): a call the server's sampler picked (its edge set
:data:`processor.spans.current`) takes the same stage-by-stage path with a
:class:`~processor.spans.SpanRecorder`, each stage a span, the engine untraced; a wire request
is decoded and encoded by the native codec (as the hot path's fallback does), a batching model's
goes through the reference batcher (its queue wait and batch become spans). Every other call pays
one context variable read. A call the timeline traces gets no stage spans.
"""

from .plan import Plan
from .plane import DataPlane, Deferred

__all__ = ["DataPlane", "Deferred", "Plan"]
