"""Warmup: requests replayed on every lane of a new SessionGroup before it serves.

Sources, first found wins:

1. ``warmup_file_name``: one serialized ``tensorflow.eas.PredictRequest`` (DeepRec's format);
   read and checked when the model starts, so a broken file fails ``initialize``;
2. TF Serving's ``<savedmodel_dir>/assets.extra/tf_serving_warmup_requests``: a TFRecord file of
   ``PredictionLog`` records (at most 1000), when the ``tensorflow-serving-api`` protos are
   installed;
3. synthetic inputs from the signature: every free dimension 1, numbers 1, strings ``b"1"``.

DeepRec replays a request 5 times on every session; so does :func:`warm_up`. Pure functions;
``warm_up`` is called on a group nobody else uses yet.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import numpy as np

from .. import codec
from ..dtypes import DT_STRING, WIRE_TYPES
from ..errors import ConfigError, ProcessorError
from ..signature import Signature

log = logging.getLogger(__name__)

ROUNDS = 5
TFS_WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
TFS_MAX_RECORDS = 1000


@dataclass(frozen=True)
class WarmupPlan:
    """Where warmup requests come from; ``requests`` hold serialized eas PredictRequests."""

    source: str
    requests: tuple[bytes, ...]


def read_warmup_file(path: str) -> bytes:
    """Read and parse-check a ``warmup_file_name``; ConfigError naming the key on failure."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ConfigError(f"warmup_file_name: cannot read {path!r}: {exc.strerror}") from None
    try:
        codec.parse_request(data)
    except ProcessorError:
        raise ConfigError(f"warmup_file_name: {path!r} is not a serialized PredictRequest") from None
    return data


def plan_warmup(signature: Signature, savedmodel_dir: str, warmup_file: bytes | None) -> WarmupPlan:
    """Pick the warmup source for a version (see the module doc)."""
    if warmup_file is not None:
        return WarmupPlan("warmup_file_name", (warmup_file,))
    tfs_path = os.path.join(savedmodel_dir, TFS_WARMUP_FILE)
    if os.path.exists(tfs_path):
        records = _tf_serving_records(tfs_path)
        if records:
            return WarmupPlan(TFS_WARMUP_FILE, records)
    synthetic = synthetic_request(signature)
    if synthetic is None:
        return WarmupPlan("none (an input has unknown rank)", ())
    return WarmupPlan("synthetic", (synthetic,))


def synthetic_request(signature: Signature) -> bytes | None:
    inputs = {}
    for alias, spec in signature.inputs.items():
        if spec.shape is None or spec.dtype not in WIRE_TYPES:
            return None
        shape = tuple(1 if d < 0 else d for d in spec.shape)
        if spec.dtype == DT_STRING:
            inputs[alias] = np.full(shape, b"1", dtype=object)
        else:
            inputs[alias] = np.ones(shape, dtype=WIRE_TYPES[spec.dtype].numpy)
    return codec.encode_request(inputs)


def _tf_serving_records(path: str) -> tuple[bytes, ...]:
    """PredictionLog records -> serialized eas PredictRequests (predict logs only)."""
    try:
        import tensorflow as tf
        from tensorflow_serving.apis import prediction_log_pb2
    except ImportError:
        log.warning("%s found but tensorflow-serving-api is not installed; using synthetic warmup", path)
        return ()
    out = []
    for raw in tf.compat.v1.io.tf_record_iterator(path):
        entry = prediction_log_pb2.PredictionLog.FromString(raw)
        if entry.WhichOneof("log_type") != "predict_log":
            continue
        request = entry.predict_log.request
        inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
        out.append(codec.encode_request(inputs, list(request.output_filter)))
        if len(out) >= TFS_MAX_RECORDS:
            break
    return tuple(out)


def warm_up(group, plan: WarmupPlan, rounds: int = ROUNDS) -> dict:
    """Replay the plan's requests ``rounds`` times on every lane; raise on the first failure."""
    started = time.monotonic()
    decoded = [codec.decode_request(r, group.signature) for r in plan.requests]
    runs = 0
    for _ in range(rounds):
        for lane in range(group.lanes):
            for data, request in zip(plan.requests, decoded):
                group.run_on(lane, request.feeds, tuple(alias for _, alias in request.fetches))
                group.serve_on(lane, data)  # the native whole-request path, where the engine has one
                runs += 1
    return {"source": plan.source, "runs": runs, "seconds": round(time.monotonic() - started, 3)}
