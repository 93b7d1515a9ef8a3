"""Warmup: requests replayed on every lane of a new SessionGroup before it serves.

Sources, first found wins:

1. ``warmup_file_name``: one serialized ``tensorflow.eas.PredictRequest`` (DeepRec's format);
   read and checked when the model starts, so a broken file fails ``initialize``;
2. TF Serving's ``<savedmodel_dir>/assets.extra/tf_serving_warmup_requests``: a TFRecord file of
   ``PredictionLog`` records (at most 1000), when the ``tensorflow-serving-api`` protos are
   installed;
3. synthetic inputs from the signature: every free dimension 1, numbers 1, strings ``b"1"``,
   except a string input that feeds a ``tf.Example`` parse op (``ParseExampleV2``,
   ``ParseExample``, ``ParseSingleExample``, as an Estimator's
   ``build_parsing_serving_input_receiver_fn`` exports): that one gets a minimal serialized
   ``tf.Example`` holding every key the op parses (zeros for numbers, ``b"1"`` for strings),
   read from the SavedModel's graph.

DeepRec replays a request 5 times on every session; so does :func:`warm_up`. A failure replaying
a warmup file or TF Serving records rejects the version; a synthetic request that the model
itself rejects (an InvalidArgument: an assert, a parse error) does not: the version serves and
the report says warmup was skipped and why.

Then every lane runs the request at several batch sizes (rows repeated), so that the first real
request at a larger batch is not a cold one: ``warmup_batch_sizes`` when configured, else the
``batching`` config's ``allowed_batch_sizes`` (or powers of two up to its ``max_batch_size``),
else 1, powers of two and the largest batch of the warmup requests (8 for synthetic ones). A
failure there never rejects the version (the report says where it stopped and why).

Functions, no state of their own. They do I/O: :func:`read_warmup_file` and :func:`plan_warmup`
read the warmup file, TF Serving's records and the SavedModel's graph; :func:`warm_up` runs the
group's lanes (and logs a skipped warmup). ``warm_up`` is called on a group nobody else uses
yet, by the thread loading it.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import numpy as np

from .. import codec
from ..dtypes import DT_FLOAT, DT_INT64, DT_STRING, WIRE_TYPES
from ..errors import ConfigError, InvalidArgument, ProcessorError
from ..signature import Signature

log = logging.getLogger(__name__)

ROUNDS = 5
SIZE_ROUNDS = 2  # replays of each extra batch size on every lane
SYNTHETIC_LARGEST_BATCH = 8
TFS_WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
TFS_MAX_RECORDS = 1000
PARSE_OPS = ("ParseExampleV2", "ParseExample", "ParseSingleExample")
# ops between an input and its parse op (tf.io.parse_single_example reshapes its input)
_PASS_THROUGH_OPS = ("Identity", "Snapshot", "StopGradient", "Reshape", "ExpandDims", "Squeeze")


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
    synthetic = synthetic_request(signature, savedmodel_dir)
    if synthetic is None:
        return WarmupPlan("none (an input has unknown rank)", ())
    return WarmupPlan("synthetic", (synthetic,))


def synthetic_request(signature: Signature, savedmodel_dir: str | None = None) -> bytes | None:
    """A request valid for the signature (see the module doc); None if an input has unknown rank."""
    examples: dict[str, bytes] = {}
    if savedmodel_dir and any(s.dtype == DT_STRING for s in signature.inputs.values()):
        examples = parse_op_examples(signature, savedmodel_dir)
    inputs = {}
    for alias, spec in signature.inputs.items():
        if spec.shape is None or spec.dtype not in WIRE_TYPES:
            return None
        shape = tuple(1 if d < 0 else d for d in spec.shape)
        if spec.dtype == DT_STRING:
            # fill(), not np.full: that goes through a bytes array, which drops trailing NULs
            inputs[alias] = np.empty(shape, dtype=object)
            inputs[alias].fill(examples.get(alias, b"1"))
        else:
            inputs[alias] = np.ones(shape, dtype=WIRE_TYPES[spec.dtype].numpy)
    return codec.encode_request(inputs)


# --- tf.Example inputs ---------------------------------------------------------------------

def parse_op_examples(signature: Signature, savedmodel_dir: str) -> dict[str, bytes]:
    """For each string input that feeds a tf.Example parse op: a minimal serialized Example
    holding every key the op parses. Empty when the graph cannot be read (TensorFlow missing, a
    ``.pbtxt`` or an ONNX model): the plain synthetic strings are used then."""
    try:
        graph_def = _serving_graph_def(savedmodel_dir)
    except Exception as exc:  # noqa: BLE001 - any unreadable graph: plain synthetic inputs
        log.debug("warmup: cannot read the graph in %s (%s)", savedmodel_dir, exc)
        return {}
    if graph_def is None:
        return {}
    nodes = {n.name: n for n in graph_def.node}
    consumers: dict[str, list] = {}
    for node in graph_def.node:
        for position, inp in enumerate(node.input):
            if not inp.startswith("^"):
                consumers.setdefault(inp.split(":")[0], []).append((node, position, inp))
    out = {}
    for alias, spec in signature.inputs.items():
        if spec.dtype != DT_STRING:
            continue
        parse = _find_parse_op(spec.name, consumers)
        if parse is not None:
            example = _minimal_example(parse, nodes)
            if example is not None:
                out[alias] = example
    return out


def _serving_graph_def(savedmodel_dir: str):
    path = os.path.join(savedmodel_dir, "saved_model.pb")
    if not os.path.exists(path):
        return None
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    with open(path, "rb") as f:
        saved.ParseFromString(f.read())
    for meta in saved.meta_graphs:
        if "serve" in meta.meta_info_def.tags:
            return meta.graph_def
    return None


def _find_parse_op(tensor_name: str, consumers: dict[str, list]):
    """The parse op whose ``serialized`` input is ``tensor_name`` (through Identity ops)."""
    wanted = {tensor_name if ":" in tensor_name else tensor_name + ":0"}
    frontier = [tensor_name.split(":")[0]]
    seen = set()
    while frontier:
        name = frontier.pop()
        if name in seen:
            continue
        seen.add(name)
        for node, position, inp in consumers.get(name, ()):
            full = inp if ":" in inp else inp + ":0"
            if full not in wanted:
                continue
            if node.op in PARSE_OPS and position == 0:
                return node
            if node.op in _PASS_THROUGH_OPS and position == 0:
                wanted.add(node.name + ":0")
                frontier.append(node.name)
    return None


def _const_strings(nodes: dict, inp: str) -> list[bytes] | None:
    node = nodes.get(inp.split(":")[0])
    if node is None or node.op != "Const":
        return None
    return list(node.attr["value"].tensor.string_val)


def _minimal_example(parse, nodes: dict) -> bytes | None:
    """A serialized tf.Example with one value per sparse/ragged key and a full dense value per
    dense key; None when the keys are not constants of the graph."""
    from tensorflow.core.example import example_pb2

    attr = parse.attr
    dense_types = list(attr["Tdense"].list.type)
    dense_shapes = [[max(d.size, 1) for d in s.dim] for s in attr["dense_shapes"].list.shape]
    sparse_types = list(attr["sparse_types"].list.type)
    ragged_types = list(attr["ragged_value_types"].list.type) if "ragged_value_types" in attr else []
    if parse.op == "ParseExampleV2":
        sparse_keys = _const_strings(nodes, parse.input[2])
        dense_keys = _const_strings(nodes, parse.input[3])
        ragged_keys = _const_strings(nodes, parse.input[4])
    elif parse.op == "ParseExample":
        n_sparse, n_dense = attr["Nsparse"].i, attr["Ndense"].i
        keys = [_const_strings(nodes, i) for i in parse.input[2:2 + n_sparse + n_dense]]
        if any(k is None or len(k) != 1 for k in keys):
            return None
        sparse_keys, dense_keys, ragged_keys = [k[0] for k in keys[:n_sparse]], [k[0] for k in keys[n_sparse:]], []
    else:  # ParseSingleExample: keys are attributes
        sparse_keys = list(attr["sparse_keys"].list.s)
        dense_keys = list(attr["dense_keys"].list.s)
        ragged_keys = []
    if sparse_keys is None or dense_keys is None or ragged_keys is None:
        return None
    example = example_pb2.Example()
    features = example.features.feature
    plan = ([(k, t, 1) for k, t in zip(sparse_keys, sparse_types)]
            + [(k, t, int(np.prod(s)) if s else 1) for k, t, s in zip(dense_keys, dense_types, dense_shapes)]
            + [(k, t, 1) for k, t in zip(ragged_keys, ragged_types)])
    for key, dtype, count in plan:
        feature = features[key.decode("utf-8", "replace") if isinstance(key, bytes) else key]
        if dtype == DT_STRING:
            feature.bytes_list.value.extend([b"1"] * count)
        elif dtype == DT_FLOAT:
            feature.float_list.value.extend([0.0] * count)
        elif dtype == DT_INT64:
            feature.int64_list.value.extend([0] * count)
        else:
            return None
    return example.SerializeToString(deterministic=True)  # keys sorted: the same bytes every time


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


# --- batch sizes ---------------------------------------------------------------------------

def _powers_up_to(largest: int) -> list[int]:
    sizes, b = [], 1
    while b < largest:
        sizes.append(b)
        b *= 2
    return sizes + [largest]


def warmup_batch_sizes(config, largest_seen: int | None) -> list[int]:
    """The batch sizes to warm up at (see the module doc); ``largest_seen``: the largest batch
    among the warmup requests, None for synthetic ones."""
    configured = getattr(config, "warmup_batch_sizes", None) if config is not None else None
    if configured:
        return sorted(configured)
    batching = getattr(config, "batching", None) if config is not None else None
    if batching is not None:
        if batching.allowed_batch_sizes:
            return sorted({1, *batching.allowed_batch_sizes})
        return _powers_up_to(batching.max_batch_size)
    return _powers_up_to(max(1, largest_seen if largest_seen is not None else SYNTHETIC_LARGEST_BATCH))


def _batch_of(signature: Signature, feeds: dict[str, np.ndarray]) -> tuple[int | None, str | None]:
    """The request's batch (the shared first dimension of every input), or None and why not."""
    batch = None
    for alias, spec in signature.inputs.items():
        value = feeds.get(alias)
        if value is None:
            return None, f"input {alias!r} is not in the warmup request"
        if spec.shape is None or not spec.shape or spec.shape[0] != -1 or value.ndim == 0:
            return None, f"input {alias!r} has no free batch dimension"
        if batch is not None and value.shape[0] != batch:
            return None, "the inputs' first dimensions differ"
        batch = value.shape[0]
    if not batch:
        return None, "the warmup request is empty"
    return batch, None


def _resized(feeds: dict[str, np.ndarray], batch: int, size: int) -> dict[str, np.ndarray]:
    rows = np.arange(size) % batch
    return {alias: value[rows] for alias, value in feeds.items()}


# --- replay --------------------------------------------------------------------------------

def warm_up(group, plan: WarmupPlan, rounds: int = ROUNDS, config=None) -> dict:
    """Replay the plan's requests ``rounds`` times on every lane, then every batch size.

    Raises on the first failure of a warmup file or TF Serving record; a synthetic request the
    model rejects (InvalidArgument) is reported as ``skipped`` instead (see the module doc).
    """
    started = time.monotonic()
    signature = group.signature
    report: dict = {"source": plan.source, "runs": 0}
    decoded = [codec.decode_request(r, signature) for r in plan.requests]
    try:
        for _ in range(rounds):
            for lane in range(group.lanes):
                for data in plan.requests:
                    _replay(group, lane, data)
                    report["runs"] += 1
    except InvalidArgument as err:
        if plan.source != "synthetic":
            raise
        log.warning("warmup skipped: the model rejected the synthetic request: %s", err.message)
        report.update(skipped=f"the model rejected the synthetic warmup request: {err.message}; "
                              f"serving without warmup (give a warmup_file_name to warm it up)",
                      batch_sizes=[], batch_runs=0, seconds=round(time.monotonic() - started, 3))
        return report
    report.update(_warm_batch_sizes(group, plan, decoded, config))
    report["seconds"] = round(time.monotonic() - started, 3)
    return report


def _replay(group, lane: int, data: bytes) -> None:
    """One warmup request the way ``process()`` runs it: the request path's decoder (native where
    built), the engine call, the response encoder; then the engine's whole-request native path,
    where it has one. So the first real request finds every piece warm, not just the engine."""
    feeds, keys, aliases = group.codec.decode(data)
    group.codec.encode(keys, group.run_on(lane, feeds, aliases))
    group.serve_on(lane, data)


def _warm_batch_sizes(group, plan: WarmupPlan, decoded: list, config) -> dict:
    out: dict = {"batch_sizes": [], "batch_runs": 0}
    if not decoded:
        return out
    sized = [(_batch_of(group.signature, r.feeds), r, data) for r, data in zip(decoded, plan.requests)]
    usable = [(batch, r, data) for (batch, _), r, data in sized if batch is not None]
    if not usable:
        out["batch_sizes_skipped"] = sized[0][0][1]
        return out
    batch, template, _ = max(usable, key=lambda item: item[0])
    largest = None if plan.source == "synthetic" else batch
    # a declared context's part (processor/context) runs on requests sending it as one row: warm
    # those runs too, at every size, so a ranking request never meets a cold part
    context = getattr(group, "context", None)
    part = context.part if context is not None else None
    for size in warmup_batch_sizes(config, largest):
        feeds = _resized(template.feeds, batch, size)
        output_filter = [key for key, _ in template.fetches]
        aliases = tuple(alias for _, alias in template.fetches)
        once = ({a: (v[:1] if a in part.context_inputs else v) for a, v in feeds.items()}
                if part is not None and size > 1 else None)
        try:
            data = codec.encode_request(feeds, output_filter)
            for _ in range(SIZE_ROUNDS):
                for lane in range(group.lanes):
                    _replay(group, lane, data)
                    out["batch_runs"] += 1
                    if once is not None:
                        with group.gate.shared():
                            context.warm(lane, once, aliases)
                        out["context_runs"] = out.get("context_runs", 0) + 1
        except ProcessorError as err:
            log.warning("warmup at batch size %d failed (larger sizes not warmed): %s", size, err.message)
            out["batch_sizes_skipped"] = f"batch size {size}: {err.message}"
            break
        out["batch_sizes"].append(size)
    return out
