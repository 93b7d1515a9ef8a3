"""Prepare a model for ONNX Runtime: convert (or import) once, check, cache.

Two sources, one result. A TensorFlow SavedModel is loaded in a TF1 Session, the served full
checkpoint (or the SavedModel's own variables) is restored, the graph is frozen and converted
with tf2onnx; a ``.onnx`` file in ``savedmodel_dir`` is taken as it is. Either way the result is
a cache entry (a directory)::

    <cache>/<key>/model.onnx       the graph; parameters stored as external data in weights.bin
    <cache>/<key>/weights.bin      every parameter, 64-byte aligned
    <cache>/<key>/manifest.json    signature, parameters (offset, dtype, shape, TF variable), check

The key hashes the source (``saved_model.pb`` bytes, the checkpoint prefix and the size and
mtime of its files; or the ``.onnx`` file's bytes), the tf2onnx / onnx versions, the opset and
:data:`CONVERTER_REVISION`. Entries are written aside and renamed into place, so a reader never
sees half of one and two processes converting the same model both end with a valid entry.
The cache root is ``$SP_ONNX_CACHE_DIR``, default ``~/.cache/serving-processor/onnx``.

Converted graphs are checked against TensorFlow on synthetic inputs before they are cached;
a mismatch beyond ``|ort - tf| <= ATOL + RTOL * |tf|`` fails the load with a message naming the
output and the error. Rewrites applied to converted graphs (each needed by the demo model):

* ``Log1p`` -> ``Log(x + 1)`` (tf2onnx has no handler);
* integer ``FloorMod`` -> ONNX ``Mod(fmod=0)`` (tf2onnx's handler truncates, which is wrong for
  negative ids: a negative row index then wraps to another row);
* ``StringToHashBucketFast``: string inputs that only reach hashing through shape ops (Split,
  Squeeze, Reshape, Gather, ...) become ``uint64`` inputs carrying TensorFlow's 64-bit string
  fingerprint, computed by the backend (:mod:`processor.engine.string_hash`); the hash op becomes
  ``Mod(fingerprint, num_buckets)``. Any other use of a string tensor fails the conversion.

Thread-safe: functions only; the cache is safe for concurrent processes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, Internal, NotFound
from ..signature import Signature, TensorSpec
from ..store.checkpoint_layout import ModelVersion

OPSET = 17
CONVERTER_REVISION = 2
ATOL = 1e-5
RTOL = 1e-5
CHECK_BATCH = 8
ALIGN = 64
EXTERNAL_MIN_BYTES = 4096
CONTRIB_DOMAIN = "ai.onnx.contrib"
# ONNX ops that move or reshape values without looking at them: a string tensor may pass
# through them on its way to hashing (they work the same on uint64 fingerprints).
_SHAPE_OPS = frozenset({"Identity", "Split", "Squeeze", "Unsqueeze", "Reshape", "Gather", "Concat",
                        "Slice", "Transpose", "Flatten", "Expand", "Tile", "GatherElements"})

# ONNX TensorProto element type -> TF DataType number (the signature's dtype numbering).
_ONNX_TO_TF = {1: 1, 2: 4, 3: 6, 4: 17, 5: 5, 6: 3, 7: 9, 8: 7, 9: 10, 10: 19, 11: 2, 12: 22, 13: 23, 16: 14}


def cache_root() -> Path:
    return Path(os.environ.get("SP_ONNX_CACHE_DIR") or Path.home() / ".cache" / "serving-processor" / "onnx")


def find_onnx_file(savedmodel_dir: str) -> str | None:
    """The ``.onnx`` model in ``savedmodel_dir`` (``model.onnx`` preferred), or None."""
    directory = Path(savedmodel_dir)
    if not directory.is_dir():
        return None
    if (directory / "model.onnx").is_file():
        return str(directory / "model.onnx")
    found = sorted(p for p in directory.glob("*.onnx") if p.is_file())
    return str(found[0]) if found else None


@dataclass(frozen=True)
class PreparedModel:
    """A cache entry: where the graph is, the signature, and the parameter layout."""

    directory: Path
    manifest: dict[str, Any]
    cache_hit: bool

    @property
    def model_path(self) -> str:
        return str(self.directory / "model.onnx")

    @property
    def signature(self) -> Signature:
        return signature_from_manifest(self.manifest["signature"])

    @property
    def hashed_inputs(self) -> tuple[str, ...]:
        """Aliases of string inputs the backend must turn into uint64 fingerprints."""
        return tuple(self.manifest.get("hashed_inputs", ()))

    def load_parameters(self) -> dict[str, np.ndarray]:
        """Read every parameter into fresh numpy memory the caller owns (one copy per call)."""
        out: dict[str, np.ndarray] = {}
        with open(self.directory / "weights.bin", "rb", buffering=0) as f:
            for name, p in self.manifest["parameters"].items():
                array = np.empty(p["shape"], np.dtype(p["dtype"]))
                f.seek(p["offset"])
                view = memoryview(array).cast("B") if array.size else memoryview(b"")
                if array.size and f.readinto(view) != p["length"]:
                    raise Internal(f"ONNX cache entry {self.directory} is truncated at {name!r}")
                out[name] = array
        return out


def prepare(savedmodel_dir: str, version: ModelVersion, signature_name: str) -> PreparedModel:
    """Return the cache entry for ``version``, converting or importing it first if needed.

    Raises ProcessorError: NotFound (signature), ConfigError (a graph ONNX cannot run),
    Internal (unreadable model, conversion error, mismatch against TensorFlow).
    """
    onnx_file = find_onnx_file(savedmodel_dir)
    key = _cache_key(savedmodel_dir, version, signature_name, onnx_file)
    final = cache_root() / key
    manifest_path = final / "manifest.json"
    if manifest_path.is_file():
        return PreparedModel(final, json.loads(manifest_path.read_text()), cache_hit=True)
    cache_root().mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=cache_root()))
    try:
        if onnx_file:
            manifest = _import_onnx(onnx_file, work)
        else:
            manifest = _convert_savedmodel(savedmodel_dir, version, signature_name, work)
        manifest["key"] = key
        (work / "manifest.json").write_text(json.dumps(manifest, indent=1))
        try:
            os.rename(work, final)
        except OSError:  # another process finished the same entry first
            if not manifest_path.is_file():
                raise
            shutil.rmtree(work, ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return PreparedModel(final, json.loads(manifest_path.read_text()), cache_hit=False)


# --- cache key --------------------------------------------------------------------------------

def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _stat_list(prefix: str) -> list[tuple[str, int, int]]:
    directory, base = os.path.split(prefix)
    out = []
    for name in sorted(os.listdir(directory or ".")):
        if name.startswith(base + ".") or name == base:
            st = os.stat(os.path.join(directory, name))
            out.append((name, st.st_size, st.st_mtime_ns))
    return out


def _cache_key(savedmodel_dir: str, version: ModelVersion, signature_name: str, onnx_file: str | None) -> str:
    import onnx

    parts: dict[str, Any] = {"revision": CONVERTER_REVISION, "onnx": onnx.__version__, "opset": OPSET}
    if onnx_file:
        parts.update(kind="onnx", file=_file_digest(onnx_file))
    else:
        from importlib.metadata import version as installed_version  # importing tf2onnx imports TF

        pb = os.path.join(savedmodel_dir, "saved_model.pb")
        if not os.path.isfile(pb):
            raise Internal(f"savedmodel_dir {savedmodel_dir!r} holds neither saved_model.pb nor a .onnx model")
        prefix = version.full_prefix or os.path.join(savedmodel_dir, "variables", "variables")
        parts.update(kind="savedmodel", pb=_file_digest(pb), prefix=os.path.abspath(prefix),
                     files=_stat_list(prefix), signature=signature_name, tf2onnx=installed_version("tf2onnx"))
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


# --- signature <-> manifest -------------------------------------------------------------------

def signature_to_manifest(sig: Signature) -> dict[str, Any]:
    def specs(d: dict[str, TensorSpec]) -> dict[str, Any]:
        return {a: {"name": s.name, "dtype": s.dtype, "shape": None if s.shape is None else list(s.shape)}
                for a, s in d.items()}

    return {"name": sig.name, "method": sig.method, "inputs": specs(sig.inputs), "outputs": specs(sig.outputs)}


def signature_from_manifest(m: dict[str, Any]) -> Signature:
    def specs(d: dict[str, Any]) -> dict[str, TensorSpec]:
        return {a: TensorSpec(a, s["name"], s["dtype"], None if s["shape"] is None else tuple(s["shape"]))
                for a, s in d.items()}

    return Signature(m["name"], specs(m["inputs"]), specs(m["outputs"]), m["method"])


def _signature_of_onnx(model, name: str) -> Signature:
    def specs(values) -> dict[str, TensorSpec]:
        out = {}
        for v in values:
            t = v.type.tensor_type
            dtype = _ONNX_TO_TF.get(t.elem_type)
            if dtype is None:
                raise ConfigError(f"ONNX model: tensor {v.name!r} has element type {t.elem_type}, "
                                  f"which the wire format cannot carry")
            shape = None if not t.HasField("shape") else tuple(
                d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim)
            out[v.name] = TensorSpec(v.name, v.name, dtype, shape)
        return out

    initializers = {i.name for i in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in initializers]
    return Signature(name, specs(inputs), specs(model.graph.output))


# --- parameters to external data ----------------------------------------------------------------

def _externalize(model, work: Path, variables: dict[str, str]) -> dict[str, Any]:
    """Move the parameters into ``work/weights.bin``; return the parameter table.

    Parameters are the initializers holding a TF variable unchanged (``variables`` maps their
    names to the variable) and every numeric initializer of at least :data:`EXTERNAL_MIN_BYTES`.
    Small constants stay in the graph: ONNX shape inference must read them (axes, shapes).
    """
    from onnx import TensorProto, numpy_helper

    table: dict[str, Any] = {}
    offset = 0
    with open(work / "weights.bin", "wb") as f:
        for tensor in model.graph.initializer:
            if tensor.data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
                continue
            array = np.ascontiguousarray(numpy_helper.to_array(tensor))
            if tensor.name not in variables and array.nbytes < EXTERNAL_MIN_BYTES:
                continue
            offset = (offset + ALIGN - 1) // ALIGN * ALIGN
            f.seek(offset)
            data = array.tobytes()
            f.write(data)
            table[tensor.name] = {"offset": offset, "length": len(data), "dtype": array.dtype.str,
                                  "shape": list(array.shape), "variable": variables.get(tensor.name)}
            for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
                tensor.ClearField(field)
            del tensor.external_data[:]
            for key, value in (("location", "weights.bin"), ("offset", str(offset)), ("length", str(len(data)))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            tensor.data_location = TensorProto.EXTERNAL
            offset += len(data)
    return table


def _import_onnx(onnx_file: str, work: Path) -> dict[str, Any]:
    import onnx

    try:
        model = onnx.load(onnx_file)  # loads external data too
    except Exception as exc:
        raise Internal(f"cannot read ONNX model {onnx_file!r}: {type(exc).__name__}: {exc}") from None
    signature = _signature_of_onnx(model, "serving_default")
    # Initializers that are also graph inputs would be overridable by feeds; they are parameters here.
    parameters = _externalize(model, work, {})
    onnx.save(model, str(work / "model.onnx"))
    return {"source": {"kind": "onnx", "path": onnx_file}, "signature": signature_to_manifest(signature),
            "parameters": parameters, "hashed_inputs": [], "check": {"status": "not applicable (ONNX source)"}}


# --- TensorFlow -> ONNX ---------------------------------------------------------------------

def _load_tf(savedmodel_dir: str, version: ModelVersion, signature_name: str):
    import tensorflow as tf
    from tensorflow.python.saved_model import loader_impl

    from .tensorflow_backend import SERVE_TAGS, _signature_from_def

    try:
        loader = loader_impl.SavedModelLoader(savedmodel_dir)
        meta_graph = loader.get_meta_graph_def_from_tags(SERVE_TAGS)
    except (OSError, RuntimeError, ValueError) as exc:
        raise Internal(f"cannot read SavedModel in {savedmodel_dir!r}: {exc}") from None
    sig_def = meta_graph.signature_def.get(signature_name)
    if sig_def is None:
        available = sorted(k for k in meta_graph.signature_def if not k.startswith("__"))
        raise NotFound(f"signature_name {signature_name!r} not in the SavedModel; available: {available}")
    graph = tf.Graph()
    session = tf.compat.v1.Session(graph=graph, config=tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=1, inter_op_parallelism_threads=1))
    try:
        with graph.as_default():
            loader.load_graph(graph, SERVE_TAGS)
            saver_def = meta_graph.saver_def
            if not saver_def.restore_op_name:
                raise Internal("the SavedModel has no saver_def; cannot restore its parameters")
            prefix = version.full_prefix or os.path.join(savedmodel_dir, "variables", "variables")
            session.run(saver_def.restore_op_name, {saver_def.filename_tensor_name: prefix})
            loader.run_init_ops(session, SERVE_TAGS)
    except Exception as exc:
        session.close()
        if isinstance(exc, (Internal, NotFound)):
            raise
        raise Internal(f"loading {version.full_prefix or savedmodel_dir!r} for conversion failed: "
                       f"{type(exc).__name__}: {exc}") from None
    return graph, session, _signature_from_def(signature_name, sig_def)


def _tf2onnx_handlers() -> dict[str, Any]:
    import onnx
    from tf2onnx.onnx_opset.math import FloorMod

    def floor_mod(ctx, node, name, args):
        if ctx.get_dtype(node.input[0]) in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
            node.type = "Mod"
            node.set_attr("fmod", 0)
        else:
            FloorMod.version_7(ctx, node)

    def log1p(ctx, node, name, args):
        from tf2onnx import utils

        dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(node.input[0]))
        one = ctx.make_const(utils.make_name(f"{node.name}_one"), np.array(1, dtype))
        add = ctx.make_node("Add", [node.input[0], one.output[0]])
        ctx.replace_inputs(node, [add.output[0]])
        node.type = "Log"

    return {"FloorMod": (floor_mod, []), "Log1p": (log1p, [])}


def _tf2onnx_convert(frozen_graph_def, inputs: list[str], outputs: list[str]):
    """tf2onnx's ``from_graph_def`` without its duplicate-constant merging.

    Merging would make two parameters that happen to hold equal values (two biases trained
    alike) one initializer, and an update of either would then change both.
    """
    import onnx
    import tensorflow as tf
    from tf2onnx import convert, optimizer, tf_loader

    optimizers = {k: v for k, v in optimizer._get_optimizers().items() if k != "merge_duplication"}
    with tf.device("/cpu:0"), tf.Graph().as_default():
        optimized = tf_loader.tf_optimize(inputs, outputs, frozen_graph_def)
        model, _ = convert._convert_common(
            optimized, name="model", continue_on_error=True, opset=OPSET,
            custom_op_handlers=_tf2onnx_handlers(), extra_opset=[onnx.helper.make_opsetid(CONTRIB_DOMAIN, 1)],
            input_names=inputs, output_names=outputs, optimizers=optimizers)
    return model


def _variable_of(frozen_graph_def, variable_names: set[str]) -> dict[str, str]:
    """Map frozen-graph tensor names (``node:0``) to the variable they are an unchanged copy of."""
    nodes = {n.name: n for n in frozen_graph_def.node}
    out = {}
    for node in frozen_graph_def.node:
        current = node
        while current.op == "Identity" and current.input:
            current = nodes.get(current.input[0].split(":")[0].lstrip("^"), current)
            if current.op != "Identity":
                break
        if current.op == "Const" and current.name in variable_names:
            out[f"{node.name}:0"] = current.name
    return out


def _convert_savedmodel(savedmodel_dir: str, version: ModelVersion, signature_name: str,
                        work: Path) -> dict[str, Any]:
    import onnx
    import tensorflow as tf
    import tf2onnx
    from onnx import numpy_helper

    graph, session, signature = _load_tf(savedmodel_dir, version, signature_name)
    try:
        graph_def = graph.as_graph_def()
        variable_names = {n.name for n in graph_def.node if n.op in ("VarHandleOp", "VariableV2")}
        outputs = [s.name for s in signature.outputs.values()]
        try:
            frozen = tf.compat.v1.graph_util.convert_variables_to_constants(
                session, graph_def, sorted({n.split(":")[0] for n in outputs}))
            model = _tf2onnx_convert(frozen, [s.name for s in signature.inputs.values()], outputs)
        except Exception as exc:
            raise Internal(f"tf2onnx could not convert {savedmodel_dir!r}: {type(exc).__name__}: {exc}") from None
        unsupported = sorted({n.op_type for n in model.graph.node
                              if n.domain not in ("", "ai.onnx", CONTRIB_DOMAIN)
                              or (n.domain == CONTRIB_DOMAIN and n.op_type != "StringToHashBucketFast")})
        if unsupported:
            raise ConfigError(f"backend: the converted graph needs ops ONNX Runtime lacks: {unsupported}; "
                              f"serve this model with backend 'tensorflow'")
        hashed = rewrite_string_hashing(model)
        aliases = {s.name: a for a, s in signature.inputs.items()}
        hashed_aliases = [aliases[name] for name in hashed]
        frozen_values = {n.name: n for n in frozen.node if n.name in variable_names}
        mapped, variable_shapes = {}, {}
        for init_name, var in _variable_of(frozen, variable_names).items():
            init = next((t for t in model.graph.initializer if t.name == init_name), None)
            if init is None:
                continue
            value = tf.make_ndarray(frozen_values[var].attr["value"].tensor)
            array = numpy_helper.to_array(init)
            # tf2onnx may give a scalar variable shape [1]; same values, same size, is the same parameter
            if array.size == value.size and array.dtype == value.dtype and np.array_equal(array.reshape(value.shape), value):
                mapped[init_name] = var
                variable_shapes[init_name] = list(value.shape)
        check = check_against_tensorflow(model, session, signature, hashed_aliases)
    finally:
        session.close()
    parameters = _externalize(model, work, mapped)
    for init_name, shape in variable_shapes.items():
        parameters[init_name]["variable_shape"] = shape
    onnx.save(model, str(work / "model.onnx"))
    unmapped = sorted(variable_names - set(mapped.values()))
    return {
        "source": {"kind": "savedmodel", "savedmodel_dir": savedmodel_dir, "checkpoint": version.full_prefix,
                   "tf2onnx": tf2onnx.__version__, "opset": OPSET},
        "signature": signature_to_manifest(signature),
        "parameters": parameters,
        "hashed_inputs": hashed_aliases,
        "variables_not_updatable": unmapped,
        "check": check,
    }


# --- string hashing ---------------------------------------------------------------------------

def rewrite_string_hashing(model) -> list[str]:
    """Turn string inputs feeding ``StringToHashBucketFast`` into uint64 fingerprint inputs.

    Returns the names of the rewritten graph inputs. Raises ConfigError when a string tensor
    reaches any op other than shape ops and the hash.
    """
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    string_inputs = [v for v in graph.input
                     if v.type.tensor_type.elem_type == TensorProto.STRING and v.name not in initializers]
    frontier = [v.name for v in string_inputs]
    retyped: set[str] = set(frontier)
    hash_nodes = []
    while frontier:
        tensor = frontier.pop()
        for node in consumers.get(tensor, []):
            if node.op_type == "StringToHashBucketFast" and node.domain == CONTRIB_DOMAIN:
                if node not in hash_nodes:
                    hash_nodes.append(node)
            elif node.domain in ("", "ai.onnx") and node.op_type in _SHAPE_OPS and node.input[0] == tensor:
                for out in node.output:
                    if out not in retyped:
                        retyped.add(out)
                        frontier.append(out)
            else:
                raise ConfigError(
                    f"backend: string tensor {tensor!r} reaches {node.op_type!r}, which ONNX Runtime "
                    f"cannot run; only tf.strings.to_hash_bucket_fast on string inputs is supported; "
                    f"serve this model with backend 'tensorflow'")
    for value in graph.input:
        if value.name in retyped:
            value.type.tensor_type.elem_type = TensorProto.UINT64
    kept = [v for v in graph.value_info if v.name not in retyped]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    for node in hash_nodes:
        buckets = initializers.get(node.input[1])
        if buckets is None:
            raise ConfigError(f"backend: {node.name!r}: num_buckets is not a constant")
        count = numpy_helper.to_array(buckets).astype(np.uint64)
        const_name = f"{node.name}__num_buckets_u64"
        graph.initializer.append(numpy_helper.from_array(count, const_name))
        mod_out = f"{node.name}__mod"
        position = list(graph.node).index(node)
        new_nodes = [
            helper.make_node("Mod", [node.input[0], const_name], [mod_out], name=f"{node.name}__mod", fmod=0),
            helper.make_node("Cast", [mod_out], list(node.output), name=f"{node.name}__cast", to=TensorProto.INT64),
        ]
        graph.node.remove(node)
        for offset, new in enumerate(new_nodes):
            graph.node.insert(position + offset, new)
    used = {name for n in graph.node for name in n.input}
    unused = [t for t in graph.initializer if t.name not in used]
    for tensor in unused:
        graph.initializer.remove(tensor)
    if not any(n.domain == CONTRIB_DOMAIN for n in graph.node):
        kept_opsets = [o for o in model.opset_import if o.domain != CONTRIB_DOMAIN]
        del model.opset_import[:]
        model.opset_import.extend(kept_opsets)
    return [v.name for v in string_inputs if v.name in retyped]


# --- the check against TensorFlow ---------------------------------------------------------------

def synthetic_feeds(signature: Signature, batch: int, seed: int, small_ints: bool = False) -> dict[str, np.ndarray]:
    """Random inputs that fit ``signature`` (free dimensions = ``batch``)."""
    from ..dtypes import WIRE_TYPES

    rng = np.random.default_rng(seed)
    feeds = {}
    for alias, spec in signature.inputs.items():
        shape = (batch,) if spec.shape is None else tuple(batch if d < 0 else d for d in spec.shape)
        dtype = WIRE_TYPES[spec.dtype].numpy if spec.dtype in WIRE_TYPES else np.dtype(np.float32)
        if spec.dtype == 7:  # DT_STRING: hex tokens of many lengths, some past 64 bytes
            lengths = rng.integers(0, 90, size=shape)
            flat = [rng.bytes(int(n) // 2 + 1).hex()[: int(n)].encode() for n in lengths.reshape(-1)]
            feeds[alias] = np.array(flat, dtype=object).reshape(shape)
        elif dtype.kind == "f":
            feeds[alias] = (rng.standard_normal(shape) * 2).astype(dtype)
        elif dtype.kind in "iu":
            info = np.iinfo(dtype)
            lo, hi = (0, 2) if small_ints else (max(info.min, -(2 ** 62)), min(info.max, 2 ** 62))
            feeds[alias] = rng.integers(lo, hi, size=shape, dtype=dtype)
        elif dtype.kind == "b":
            feeds[alias] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            feeds[alias] = np.zeros(shape, dtype)
    return feeds


def ort_feeds(signature: Signature, feeds: dict[str, np.ndarray], hashed: tuple[str, ...] | list[str]) -> dict:
    """Feeds keyed by ONNX input name, with string inputs fingerprinted or made ``str``."""
    from .string_hash import fingerprint64

    out = {}
    for alias, value in feeds.items():
        spec = signature.inputs[alias]
        if alias in hashed:
            value = fingerprint64(value)
        elif spec.dtype == 7:
            value = np.array([v.decode("utf-8") if isinstance(v, bytes) else v for v in value.reshape(-1)],
                             dtype=object).reshape(value.shape)
        out[spec.name] = value
    return out


def check_against_tensorflow(model, session, signature: Signature, hashed: list[str]) -> dict[str, Any]:
    """Run TF and ORT on synthetic inputs; raise Internal if an output differs beyond tolerance."""
    import onnxruntime as ort

    from .onnxruntime_backend import global_pools_in_force

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    if global_pools_in_force():  # ORT then refuses sessions with their own pools
        options.use_per_session_threads = False
    try:
        ort_session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ConfigError(f"backend: the converted graph does not load in ONNX Runtime ({exc}); "
                          f"serve this model with backend 'tensorflow'") from None
    aliases = list(signature.outputs)
    report: dict[str, Any] = {"atol": ATOL, "rtol": RTOL, "batch": CHECK_BATCH, "max_abs_diff": {}}
    for small_ints in (False, True):  # ids used directly as rows need small values
        feeds = synthetic_feeds(signature, CHECK_BATCH, seed=7, small_ints=small_ints)
        try:
            want = session.run([signature.outputs[a].name for a in aliases],
                               {signature.inputs[a].name: v for a, v in feeds.items()})
            break
        except Exception:
            if small_ints:
                raise Internal("the TensorFlow model rejects synthetic inputs; cannot check the conversion") from None
    got = ort_session.run([signature.outputs[a].name for a in aliases], ort_feeds(signature, feeds, hashed))
    for alias, w, g in zip(aliases, want, got):
        w, g = np.asarray(w), np.asarray(g)
        if w.shape != g.shape:
            raise Internal(f"ONNX conversion does not match TensorFlow: output {alias!r} has shape "
                           f"{list(g.shape)}, TensorFlow's is {list(w.shape)}")
        if w.dtype.kind in "fc":
            diff = float(np.max(np.abs(g.astype(np.float64) - w))) if w.size else 0.0
            g64, w64 = g.astype(np.float64), w.astype(np.float64)
            ok = (np.abs(g64 - w64) <= ATOL + RTOL * np.abs(w64)) | (np.isnan(g64) & np.isnan(w64))
            bad = not bool(ok.all())
        else:
            diff = float(np.count_nonzero(g != w))
            bad = diff > 0
        report["max_abs_diff"][alias] = diff
        if bad:
            raise Internal(f"ONNX conversion does not match TensorFlow: output {alias!r} differs by up "
                           f"to {diff:.3g} on synthetic inputs (tolerance {ATOL} + {RTOL}*|tf|); "
                           f"serve this model with backend 'tensorflow'")
    report["status"] = "passed"
    return report
