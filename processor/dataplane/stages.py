"""A call's stages off the request path's hot loop, on an acquired group: the introspection
ping, arrays and decoders, batched requests, requests a timeline traces (every stage timed) or
OpenTelemetry sampled (every stage a span). Used by :class:`~processor.dataplane.DataPlane`."""

from __future__ import annotations

import json

import numpy as np

from .. import codec, spans
from ..batching import merge
from ..batching.model_batching import ModelBatching
from ..prediction_log.record import Pending
from ..request import PredictCall, PredictResult, answer_note_var
from ..tracing import TraceRecorder
from ..tracing.tracer import UNTIMED, now_us
from .plan import WIRE


def answer(call: PredictCall, group, batching: ModelBatching | None, rec: TraceRecorder | None,
           pending: Pending | None = None) -> PredictResult:
    """``call`` on the acquired ``group`` (see the module doc), merged by ``batching`` when the
    model batches; stages timed into ``rec``; a logged call's ``pending`` gets the decoded
    inputs. Raises ProcessorError (or any exception, which the caller's ``Held`` converts)."""
    inputs = call.inputs
    signature = group.signature
    wire = isinstance(inputs, WIRE)
    if wire and not inputs:  # DeepRec's introspection ping
        return PredictResult(json.dumps(signature.describe()).encode(), group.version, signature, True)
    if wire and rec is None:
        return PredictResult(batching.serve(group, inputs, call.deadline), group.version, signature)
    if wire and not rec.engine_trace:
        return spanned(call, group, rec, batching, pending)
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
            outputs = run(group, decoded, batching, call.deadline, rec)
        finally:
            # batched runs set the merged call's window; an OpenTelemetry run has its span
            if rec is not None and rec.engine_trace and rec.run_window is None:
                rec.run_window = (timed.start, now_us())
    if wire:
        with stage("encode"):
            outputs = codec.encode_response(outputs)
    return PredictResult(outputs, group.version, signature)


def spanned(call: PredictCall, group, rec: spans.SpanRecorder, batching: ModelBatching | None,
            pending: Pending | None) -> PredictResult:
    """A wire request OpenTelemetry sampled, on the acquired ``group``: on the group's native
    whole-request path where it takes it (an unbatched, unlogged call: the stages' spans made
    from the times it reports, the request costing what an unsampled one costs), else decoded
    and encoded by the group's codec (the native one, as ``SessionGroup.serve``'s fallback),
    run untraced (a batching model's through the reference batcher, which makes its queue and
    batch spans), each stage a span of ``rec``; a logged call's ``pending`` gets the inputs."""
    if batching is None and pending is None:
        timed = group.serve_timed(call.inputs)
        if timed is not None:
            outputs, (start, decoded, ran, encoded, rows), lane = timed
            attributes = {"sp.backend": spans.backend_name(group), "sp.lane": lane}
            if rows >= 0:
                attributes["sp.rows"] = rows
            spans.finished("decode", start, decoded)
            spans.finished("engine.run", decoded, ran, attributes)
            spans.finished("encode", ran, encoded)
            return PredictResult(outputs, group.version, group.signature)
    with rec.stage("decode"):
        feeds, keys, aliases = group.codec.decode(call.inputs)
    if pending is not None:
        pending.feeds = feeds
    with rec.stage("run"):
        if batching is not None:
            arrays = batching.batcher.run(group, feeds, aliases, call.deadline, rec)
        else:
            rec.lane, arrays, _ = group.run_traced(feeds, aliases, False)
        engine_attributes(group, feeds, rec.lane)
    with rec.stage("encode"):
        outputs = group.codec.encode(keys, arrays)
    return PredictResult(outputs, group.version, group.signature)


def run(group, decoded: codec.DecodedRequest, batching: ModelBatching | None = None,
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
        engine_attributes(group, decoded.feeds, rec.lane)
    return {key: array for (key, _), array in zip(decoded.fetches, arrays)}


def engine_attributes(group, feeds: dict[str, np.ndarray], lane: int | None) -> None:
    """The ``engine.run`` span's attributes (a sampled request's, inside that span)."""
    attributes = {"sp.backend": spans.backend_name(group)}
    rows = merge.request_rows(feeds)
    if rows is not None:
        attributes["sp.rows"] = rows
    if lane is not None:
        attributes["sp.lane"] = lane
    spans.annotate(attributes)


def note(version) -> None:
    """Tell the edge's note (``answer_note_var``), if it set one, which version answered."""
    slot = answer_note_var.get()
    if slot is not None:
        slot[0] = version
