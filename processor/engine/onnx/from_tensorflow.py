"""Convert a TensorFlow SavedModel to ONNX with tf2onnx.

The SavedModel is loaded in a TF1 Session and the served full checkpoint (or the SavedModel's
own variables) is restored: that session gives the signature, the variables' values and the
reference outputs. The graph that is converted depends on how the model was saved:

* TF2 (``tf.saved_model.save``, an object graph): tf2onnx's TF2 path, as
  ``python -m tf2onnx.convert --saved-model`` does it: the model is loaded as objects, the
  checkpoint restored into them, the signature's concrete function frozen (resource variables,
  ``tf.nn.embedding_lookup``) and captured lookup tables (``tf.lookup.StaticHashTable``) handed
  to tf2onnx as initialized tables. Initializers are mapped back to variables by value (an
  initializer equal to exactly one variable, and no other initializer alike);
* TF1 (``SavedModelBuilder``): the session graph is frozen; initializers are traced to the
  variables by name.

Either way the ONNX graph is checked against TensorFlow
(:mod:`processor.engine.onnx.check`) before anything is written. What cannot convert (ops tf2onnx
cannot map, strings ONNX Runtime cannot process) is refused with a ConfigError naming the reason
and ``backend: tensorflow``. Rewrites applied to converted graphs:

* ``Log1p`` -> ``Log(x + 1)`` (tf2onnx has no handler);
* integer ``FloorMod`` -> ONNX ``Mod(fmod=0)`` (tf2onnx's handler truncates, which is wrong for
  negative ids: a negative row index then wraps to another row);
* ``StringToHashBucketFast`` on string inputs -> ``Mod`` on uint64 fingerprints
  (:mod:`processor.engine.onnx.hash_rewrite`); ``as_string`` of integers + hash bucket -> the
  fingerprint of the decimal text computed in the graph (same module).

Parameters that are unchanged copies of TF variables are recorded as such, so delta updates can
reach them. Functions only; thread-safe.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ...config import shorten
from ...errors import ConfigError, Internal, NotFound, ProcessorError
from ...store.model_version import ModelVersion
from ..tensorflow.signature import SERVE_TAGS, signature_from_def
from ..tensorflow.variables import check_outputs_restored, restored_variables
from .check import check_against_tensorflow
from .hash_rewrite import CONTRIB_DOMAIN, rewrite_string_hashing
from .signature import signature_to_manifest
from .weights import externalize_parameters

OPSET = 17


def _load_tf(savedmodel_dir: str, version: ModelVersion, signature_name: str):
    import tensorflow as tf
    from tensorflow.python.saved_model import loader_impl

    try:
        loader = loader_impl.SavedModelLoader(savedmodel_dir)
        meta_graph = loader.get_meta_graph_def_from_tags(SERVE_TAGS)
    except (OSError, RuntimeError, ValueError) as exc:
        raise Internal(f"cannot read SavedModel in {savedmodel_dir!r}: {exc}") from exc
    sig_def = meta_graph.signature_def.get(signature_name)
    if sig_def is None:
        available = sorted(k for k in meta_graph.signature_def if not k.startswith("__"))
        raise NotFound(f"signature_name {shorten(signature_name)} not in the SavedModel; "
                       f"available: {shorten(available, 400)}")
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
            restored = restored_variables(graph, session)
            signature = signature_from_def(signature_name, sig_def)
            check_outputs_restored(graph, restored, [s.name for s in signature.outputs.values()], savedmodel_dir)
    except Exception as exc:
        session.close()
        if isinstance(exc, ProcessorError):
            raise
        raise Internal(f"loading {version.full_prefix or savedmodel_dir!r} for conversion failed: "
                       f"{type(exc).__name__}: {exc}") from exc
    # tf.saved_model.save writes an object graph: such models convert through tf2onnx's TF2 path
    tf2 = len(meta_graph.object_graph_def.nodes) > 0
    return graph, session, signature, tf2, restored


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


def _convert_tf2(savedmodel_dir: str, prefix: str | None, signature_name: str, signature):
    """tf2onnx's TF2 path: the SavedModel loaded as objects, ``prefix`` restored, the signature's
    concrete function frozen (resource variables, captured lookup tables) and converted.

    Graph inputs and outputs are renamed to the TF1 signature's tensor names, so the manifest,
    the check and the backend see one naming whichever path converted the model.
    """
    import onnx
    import tensorflow as tf
    from tf2onnx import convert, optimizer, tf_loader

    imported = tf.saved_model.load(savedmodel_dir, tags=list(SERVE_TAGS))
    if prefix:
        tf.train.Checkpoint(imported).read(prefix).expect_partial()
    func = imported.signatures[signature_name]
    captured = {id(t) for t in func.graph.function_captures.by_val_internal.values()}
    inputs = [t.name for t in func.inputs if t.dtype != tf.resource and id(t) not in captured]
    specs = {k: v for k, v in func.structured_input_signature[1].items() if isinstance(v, tf.TensorSpec)}
    by_spec_name = {f"{v.name}:0": k for k, v in specs.items() if v.name}
    if len(by_spec_name) == len(specs) and set(by_spec_name) == set(inputs):
        input_aliases = [by_spec_name[name] for name in inputs]  # placeholders are named after the specs
    else:
        input_aliases = sorted(specs)  # the flattening order of the signature's keyword arguments
    outputs = [t.name for t in func.outputs if t.dtype != tf.resource]
    output_aliases = sorted(func.structured_outputs)
    if len(inputs) != len(input_aliases) or len(outputs) != len(output_aliases):
        raise ConfigError("backend: cannot match the concrete function's inputs and outputs to the "
                          "signature; serve this model with `backend: tensorflow`")
    rename = {name: signature.inputs[a].name for name, a in zip(inputs, input_aliases)}
    rename.update({name: signature.outputs[a].name for name, a in zip(outputs, output_aliases)})
    optimizers = {k: v for k, v in optimizer._get_optimizers().items() if k != "merge_duplication"}
    with tf.device("/cpu:0"):
        frozen, tables = tf_loader.from_trackable(imported, func, inputs, outputs, False)
    with tf.device("/cpu:0"), tf.Graph().as_default():
        model, _ = convert._convert_common(
            frozen, name="model", continue_on_error=True, opset=OPSET,
            custom_op_handlers=_tf2onnx_handlers(), extra_opset=[onnx.helper.make_opsetid(CONTRIB_DOMAIN, 1)],
            input_names=inputs, output_names=outputs, optimizers=optimizers, initialized_tables=tables)
    _rename_tensors(model, rename)
    return model, frozen


def _rename_tensors(model, rename: dict[str, str]) -> None:
    graph = model.graph
    taken = ({o for n in graph.node for o in n.output} | {t.name for t in graph.initializer}
             | {v.name for v in graph.input}) - set(rename)
    clash = sorted(set(rename.values()) & taken)
    if clash:
        raise Internal(f"renaming converted tensors to the signature's names clashes with {clash}")
    for node in graph.node:
        node.input[:] = [rename.get(n, n) for n in node.input]
        node.output[:] = [rename.get(n, n) for n in node.output]
    for value in (*graph.input, *graph.output, *graph.value_info):
        value.name = rename.get(value.name, value.name)


def _variable_values(graph, session, variable_names: set[str]) -> dict[str, np.ndarray]:
    """Values of the TF1-loaded graph's variables (the served checkpoint restored)."""
    import tensorflow as tf

    with graph.as_default():
        reads = {}
        for name in sorted(variable_names):
            op = graph.get_operation_by_name(name)
            if op.type == "VarHandleOp":
                reads[name] = tf.raw_ops.ReadVariableOp(resource=op.outputs[0], dtype=op.get_attr("dtype"))
            else:
                reads[name] = op.outputs[0]
    return session.run(reads) if reads else {}


def _model_constants(graph_def, sizes: set[int]):
    """Constants of the SavedModel's graph and functions whose element count is in ``sizes``."""
    import tensorflow as tf

    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    for node in nodes:
        if node.op != "Const":
            continue
        proto = node.attr["value"].tensor
        count = int(np.prod([d.size for d in proto.tensor_shape.dim])) if proto.tensor_shape.dim else 1
        if count in sizes:
            try:
                yield tf.make_ndarray(proto)
            except Exception:  # strings and other values no variable holds
                continue


def _map_by_value(model, values: dict[str, np.ndarray], graph_def) -> tuple[dict[str, str], dict[str, list[int]]]:
    """Initializers holding exactly one variable's value.

    A value held by two variables, by two initializers or by a constant of the model itself
    is ambiguous: those variables are left out (reported as not updatable).
    """
    from onnx import numpy_helper

    def key(array):
        array = np.ascontiguousarray(array)
        return array.dtype.str, array.size, array.tobytes()

    by_value: dict[tuple, list[str]] = {}
    for var, value in values.items():
        value = np.ascontiguousarray(value)
        if value.dtype.kind not in "fiub":
            continue
        by_value.setdefault(key(value), []).append(var)
    inits: dict[tuple, list[str]] = {}
    for tensor in model.graph.initializer:
        if tensor.data_type in (0, 8):  # undefined, string
            continue
        inits.setdefault(key(np.ascontiguousarray(numpy_helper.to_array(tensor))), []).append(tensor.name)
    constants = {key(c) for c in _model_constants(graph_def, {k[1] for k in by_value})}
    mapped, shapes = {}, {}
    for k, variables in by_value.items():
        names = inits.get(k, [])
        if len(variables) == 1 and len(names) == 1 and k not in constants:
            mapped[names[0]] = variables[0]
            shapes[names[0]] = list(np.shape(values[variables[0]]))
    return mapped, shapes


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


def _onnx_op_names() -> set[str]:
    import onnx

    return {schema.name for schema in onnx.defs.get_all_schemas_with_history() if schema.domain == ""}


def _map_frozen(model, frozen, variable_names: set[str]) -> tuple[dict[str, str], dict[str, list[int]]]:
    """Initializers that are unchanged copies of a TF1-frozen variable (traced by name)."""
    import tensorflow as tf
    from onnx import numpy_helper

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
    return mapped, variable_shapes


def convert_savedmodel(savedmodel_dir: str, version: ModelVersion, signature_name: str,
                         work: Path) -> dict[str, Any]:
    import onnx
    import tensorflow as tf
    import tf2onnx

    graph, session, signature, tf2, variable_names = _load_tf(savedmodel_dir, version, signature_name)
    try:
        graph_def = graph.as_graph_def()
        outputs = [s.name for s in signature.outputs.values()]
        tf2_error = None
        if tf2:
            try:
                model, frozen = _convert_tf2(savedmodel_dir, version.full_prefix, signature_name, signature)
            except ProcessorError:
                raise
            except Exception as exc:  # the TF1 freeze may still convert it
                tf2_error, tf2 = exc, False
        if not tf2:
            try:
                frozen = tf.compat.v1.graph_util.convert_variables_to_constants(
                    session, graph_def, sorted({n.split(":")[0] for n in outputs}))
                model = _tf2onnx_convert(frozen, [s.name for s in signature.inputs.values()], outputs)
            except ProcessorError:
                raise
            except Exception as exc:
                first = tf2_error or exc
                raise ConfigError(f"backend: tf2onnx cannot convert {savedmodel_dir!r} "
                                  f"({type(first).__name__}: {shorten(str(first), 300)}); "
                                  f"serve this model with `backend: tensorflow`") from None
        unsupported = sorted({n.op_type for n in model.graph.node
                              if n.domain not in ("", "ai.onnx", "ai.onnx.ml", CONTRIB_DOMAIN)
                              or (n.domain == CONTRIB_DOMAIN and n.op_type != "StringToHashBucketFast")})
        tf_ops = sorted({n.op_type for n in model.graph.node if n.domain in ("", "ai.onnx")
                         and n.op_type not in _onnx_op_names()})
        if unsupported or tf_ops:
            raise ConfigError(f"backend: the converted graph needs ops ONNX Runtime lacks: "
                              f"{unsupported + tf_ops} (TensorFlow ops tf2onnx cannot map); "
                              f"serve this model with `backend: tensorflow`")
        hashed = rewrite_string_hashing(model)
        aliases = {s.name: a for a, s in signature.inputs.items()}
        hashed_aliases = [aliases[name] for name in hashed]
        if tf2:
            mapped, variable_shapes = _map_by_value(model, _variable_values(graph, session, variable_names), graph_def)
        else:
            mapped, variable_shapes = _map_frozen(model, frozen, variable_names)
        check = check_against_tensorflow(model, session, signature, hashed_aliases)
    finally:
        session.close()
    parameters = externalize_parameters(model, work, mapped)
    for init_name, shape in variable_shapes.items():
        parameters[init_name]["variable_shape"] = shape
    onnx.save(model, str(work / "model.onnx"))
    unmapped = sorted(variable_names - set(mapped.values()))
    return {
        "source": {"kind": "savedmodel", "savedmodel_dir": savedmodel_dir, "checkpoint": version.full_prefix,
                   "tf2onnx": tf2onnx.__version__, "opset": OPSET,
                   "path": "tf2 (saved objects, concrete function)" if tf2 else "tf1 (frozen session graph)"},
        "signature": signature_to_manifest(signature),
        "parameters": parameters,
        "hashed_inputs": hashed_aliases,
        "variables_not_updatable": unmapped,
        "check": check,
    }
