"""Which ops are row-wise: their result's row i computed from row i of their context inputs
alone, with the rows on the first axis of every context tensor (see :mod:`.partition`).

One rule per op type, for ONNX (:func:`onnx_rowwise`) and TensorFlow (:func:`tf_rowwise`) op
names; an op without a rule is not row-wise. A rule is called only for a node whose inputs are
context tensors or weights, at least one a context tensor. Where a rule needs a rank, an axis or
a constant (a reshape's target shape, a reduction's axes) and the graph does not say it
statically, the op is not row-wise. Also the estimated work per row of each node, for the
context part's share in model info (:func:`onnx_work`, :func:`tf_work`): a matrix product
counts 2·K·M per row, anything else the elements it writes per row. Pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .partition import Facts, Node

IsContext = Callable[[str], bool]

# --- shared helpers ---------------------------------------------------------------------------


def _rank(facts: Facts, tensor: str) -> int | None:
    shape = facts.shape(tensor)
    return None if shape is None else len(shape)


def _axes(values, rank: int | None) -> list[int] | None:
    """Axes normalised against ``rank`` (None where a negative axis meets an unknown rank)."""
    out = []
    for a in values:
        a = int(a)
        if a < 0:
            if rank is None:
                return None
            a += rank
        out.append(a)
    return out


def _keeps_rows(axes: list[int] | None) -> bool:
    return axes is not None and 0 not in axes


def _ints(facts: Facts, tensor: str) -> list[int] | None:
    value = facts.value(tensor) if tensor else None
    return None if value is None else [int(v) for v in np.asarray(value).ravel()]


def _broadcasts_by_row(node: Node, facts: Facts, is_context: IsContext, inputs=None) -> bool:
    """An element-wise op with numpy broadcasting: row-wise when every context operand has the
    output's rank (its rows stay on the first axis) and every weight broadcasts without a
    batch dimension (a lower rank, or a first dimension of 1)."""
    out = _rank(facts, node.outputs[0])
    if out is None or out == 0:
        return False
    for t in (inputs if inputs is not None else node.inputs):
        if not t:
            continue
        shape = facts.shape(t)
        if is_context(t):
            if shape is None or len(shape) != out:
                return False
        elif shape is None or (len(shape) == out and shape[0] != 1) or len(shape) > out:
            return False
    return True


def _reshape_keeps_rows(facts: Facts, data: str, target: list[int] | None, zero_copies: bool) -> bool:
    """A reshape of ``data`` to ``target`` keeps each row whole in its own row: the target keeps
    the first dimension (ONNX's 0) or infers it (-1) from static other dimensions whose product
    is that of the input's non-batch dimensions."""
    if not target:
        return False
    if target[0] == 0 and zero_copies:
        return True
    if target[0] != -1:
        return False
    shape = facts.shape(data)
    if shape is None or any(d is None for d in shape[1:]):
        return False
    rest = []
    for i, d in enumerate(target[1:], start=1):
        if d == 0 and zero_copies:
            if i >= len(shape):
                return False
            d = shape[i]
        if d is None or d <= 0:
            return False
        rest.append(d)
    return math.prod(rest) == math.prod(shape[1:])


def _row_elements(facts: Facts, tensor: str) -> float:
    shape = facts.shape(tensor)
    if not shape:
        return 1.0
    return float(math.prod(d if d else 1 for d in shape[1:]))


def _matmul_work(facts: Facts, a: str, b: str, transpose_b: bool) -> float:
    wb = facts.shape(b)
    sa = facts.shape(a)
    if not wb or len(wb) != 2 or None in wb:
        return _row_elements(facts, a)
    k, m = (wb[1], wb[0]) if transpose_b else (wb[0], wb[1])
    middle = math.prod(d if d else 1 for d in sa[1:-1]) if sa else 1
    return 2.0 * k * m * middle


# --- ONNX -------------------------------------------------------------------------------------

_ONNX_UNARY = frozenset({
    "Relu", "Sigmoid", "Tanh", "Neg", "Exp", "Log", "Sqrt", "Abs", "Reciprocal", "Cast", "Identity",
    "Softplus", "Softsign", "Elu", "Selu", "LeakyRelu", "Erf", "Floor", "Ceil", "Round", "Not", "IsNaN",
    "IsInf", "HardSigmoid", "HardSwish", "Gelu", "Sin", "Cos", "Sign", "Mish", "ThresholdedRelu",
    "Celu", "Clip", "CastLike",
})
_ONNX_BROADCAST = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mean", "Sum", "Equal", "Less", "Greater",
    "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Where", "Mod", "BitShift", "PRelu",
})
_ONNX_REDUCE = frozenset({
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSumExp", "ReduceSumSquare", "ReduceLogSum",
})
_ONNX_PER_SAMPLE = frozenset({"Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
                              "InstanceNormalization"})
ONNX_WEIGHT_SOURCES = frozenset({"Constant"})
_ONNX_VOLATILE = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                            "Multinomial", "Bernoulli", "Dropout"})


def onnx_volatile(op: str) -> bool:
    return op in _ONNX_VOLATILE


def onnx_rowwise(node: Node, facts: Facts, is_context: IsContext) -> bool:
    """Whether an ONNX node is row-wise (see the module doc)."""
    op, ins, attrs = node.op, node.inputs, node.attrs
    first = ins[0] if ins else ""
    if op in _ONNX_UNARY:
        return bool(first) and is_context(first) and all(not is_context(t) for t in ins[1:] if t)
    if op in _ONNX_BROADCAST:
        return _broadcasts_by_row(node, facts, is_context)
    if op in _ONNX_PER_SAMPLE:
        return is_context(first) and all(not is_context(t) for t in ins[1:] if t)
    if op == "MatMul":
        ra, rb = _rank(facts, ins[0]), _rank(facts, ins[1])
        return is_context(ins[0]) and not is_context(ins[1]) and ra is not None and ra >= 2 and rb == 2
    if op == "Gemm":
        c = ins[2] if len(ins) > 2 else ""
        cshape = facts.shape(c) if c else ()
        return (is_context(ins[0]) and not is_context(ins[1]) and not attrs.get("transA", 0)
                and (not c or (cshape is not None and (len(cshape) < 2 or cshape[0] == 1))))
    if op == "Gather":
        data, idx = ins[0], ins[1]
        rank = _rank(facts, data)
        axes = _axes([attrs.get("axis", 0)], rank)
        if axes is None:
            return False
        if not is_context(data) and is_context(idx):
            return axes[0] == 0 and (_rank(facts, idx) or 0) >= 1
        return is_context(data) and not is_context(idx) and axes[0] != 0
    if op == "Concat":
        rank = _rank(facts, node.outputs[0])
        return (all(is_context(t) and _rank(facts, t) == rank for t in ins if t)
                and _keeps_rows(_axes([attrs.get("axis", 0)], rank)))
    if op == "Reshape":
        return (is_context(ins[0]) and not is_context(ins[1])
                and _reshape_keeps_rows(facts, ins[0], _ints(facts, ins[1]), not attrs.get("allowzero", 0)))
    if op == "Flatten":
        return _keeps_rows(_axes([attrs.get("axis", 1)], _rank(facts, first)))
    if op in ("Unsqueeze", "Squeeze"):
        axes = attrs.get("axes")
        if axes is None and len(ins) > 1:
            axes = _ints(facts, ins[1])
        if axes is None:
            return False  # Squeeze of every size-1 axis: at batch 1 that drops the rows' axis
        rank = _rank(facts, node.outputs[0] if op == "Unsqueeze" else first)
        return is_context(first) and _keeps_rows(_axes(axes, rank))
    if op == "Transpose":
        perm = attrs.get("perm")
        return perm is not None and len(perm) > 0 and int(perm[0]) == 0
    if op in ("Softmax", "LogSoftmax", "Hardmax", "LayerNormalization", "ArgMax", "ArgMin", "Split", "CumSum"):
        default = {"Softmax": -1, "LogSoftmax": -1, "Hardmax": -1, "LayerNormalization": -1,
                   "ArgMax": 0, "ArgMin": 0, "Split": 0}.get(op)
        if op == "CumSum":
            axis = _ints(facts, ins[1])
            axis = axis[0] if axis else None
        else:
            axis = attrs.get("axis", default)
            if op in ("Softmax", "LogSoftmax", "Hardmax") and "axis" not in attrs and getattr(facts, "opset", 13) < 13:
                axis = 1  # before opset 13 the default axis was 1 (coerced to 2-D from it)
        if axis is None or not is_context(first) or any(is_context(t) for t in ins[1:] if t):
            return False
        return _keeps_rows(_axes([axis], _rank(facts, first)))
    if op == "BatchNormalization":
        return len(node.outputs) == 1 and is_context(first) and all(not is_context(t) for t in ins[1:])
    if op in _ONNX_REDUCE:
        axes = attrs.get("axes")
        if axes is None and len(ins) > 1 and ins[1]:
            axes = _ints(facts, ins[1])
        if axes is None:
            return bool(attrs.get("noop_with_empty_axes", 0)) and len(ins) < 2
        return _keeps_rows(_axes(axes, _rank(facts, first)))
    if op == "Slice":
        if len(ins) < 4 or not ins[3]:
            return False  # default axes start at 0: the rows would be sliced
        return is_context(first) and _keeps_rows(_axes(_ints(facts, ins[3]) or [0], _rank(facts, first)))
    return False


def onnx_work(node: Node, facts: Facts) -> float:
    if node.op == "MatMul" and len(node.inputs) == 2:
        return _matmul_work(facts, node.inputs[0], node.inputs[1], False)
    if node.op == "Gemm":
        return _matmul_work(facts, node.inputs[0], node.inputs[1], bool(node.attrs.get("transB", 0)))
    return _row_elements(facts, node.outputs[0]) if node.outputs else 0.0


# --- TensorFlow -------------------------------------------------------------------------------

_TF_UNARY = frozenset({
    "Relu", "Relu6", "Elu", "Selu", "Sigmoid", "Tanh", "Neg", "Exp", "Log", "Log1p", "Sqrt", "Rsqrt",
    "Abs", "Square", "Softplus", "Softsign", "Erf", "Floor", "Ceil", "Round", "Rint", "Sign",
    "Reciprocal", "Inv", "Cast", "Identity", "StopGradient", "LogicalNot", "IsNan", "IsInf", "IsFinite",
    "LeakyRelu", "Sin", "Cos", "Snapshot", "PreventGradient", "CheckNumerics", "StringToHashBucketFast",
    "StringToHashBucketStrong", "StringToHashBucket", "Gelu", "ClipByValue", "Softmax", "LogSoftmax",
})
_TF_BROADCAST = frozenset({
    "Add", "AddV2", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "FloorDiv", "FloorMod", "Mod",
    "TruncateDiv", "TruncateMod", "Maximum", "Minimum", "Pow", "SquaredDifference", "Equal", "NotEqual",
    "Less", "LessEqual", "Greater", "GreaterEqual", "LogicalAnd", "LogicalOr", "SelectV2", "AddN",
})
_TF_REDUCE = frozenset({"Mean", "Sum", "Max", "Min", "Prod", "All", "Any", "EuclideanNorm"})
TF_WEIGHT_SOURCES = frozenset({"Const", "VarHandleOp", "VariableV2", "Variable", "HashTableV2", "HashTable",
                               "MutableHashTableV2", "MutableHashTableOfTensorsV2", "MutableDenseHashTableV2"})


def tf_volatile(op: str) -> bool:
    return (op.startswith(("Random", "StatelessRandom", "Stateless", "TruncatedNormal", "Multinomial"))
            or op in ("ParameterizedTruncatedNormal",))


def tf_rowwise(node: Node, facts: Facts, is_context: IsContext) -> bool:
    """Whether a TensorFlow op is row-wise (see the module doc)."""
    op, ins, attrs = node.op, node.inputs, node.attrs
    first = ins[0] if ins else ""
    if op in _TF_UNARY:
        if op in ("Softmax", "LogSoftmax") and (_rank(facts, first) or 0) < 2:
            return False
        return bool(first) and is_context(first) and all(not is_context(t) for t in ins[1:])
    if op in _TF_BROADCAST:
        return _broadcasts_by_row(node, facts, is_context)
    if op == "BiasAdd":
        return is_context(first) and not is_context(ins[1]) and (_rank(facts, first) or 0) >= 2
    if op == "MatMul":
        return (is_context(first) and not is_context(ins[1]) and not attrs.get("transpose_a", False)
                and _rank(facts, first) == 2)
    if op in ("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"):
        ra = _rank(facts, first)
        return (is_context(first) and not is_context(ins[1]) and not attrs.get("adj_x", False)
                and ra is not None and ra >= 2 and _rank(facts, ins[1]) == 2)
    if op in ("GatherV2", "Gather", "ResourceGather"):
        params, idx = ins[0], ins[1]
        if attrs.get("batch_dims", 0):
            return False
        axis = _ints(facts, ins[2]) if op == "GatherV2" else [0]
        if not axis:
            return False
        if not is_context(params) and is_context(idx):
            return axis[0] == 0 and (_rank(facts, idx) or 0) >= 1
        return (op == "GatherV2" and is_context(params) and not is_context(idx)
                and _keeps_rows(_axes(axis, _rank(facts, params))))
    if op in ("ConcatV2", "Concat"):
        values, axis_t = (ins[:-1], ins[-1]) if op == "ConcatV2" else (ins[1:], ins[0])
        rank = _rank(facts, node.outputs[0])
        axis = _ints(facts, axis_t)
        return (not is_context(axis_t) and axis is not None and rank is not None
                and all(is_context(t) and _rank(facts, t) == rank for t in values)
                and _keeps_rows(_axes(axis, rank)))
    if op == "Reshape":
        return (is_context(first) and not is_context(ins[1])
                and _reshape_keeps_rows(facts, first, _ints(facts, ins[1]), False))
    if op == "ExpandDims":
        return is_context(first) and _keeps_rows(_axes(_ints(facts, ins[1]) or [0], _rank(facts, node.outputs[0])))
    if op == "Squeeze":
        dims = attrs.get("squeeze_dims") or []
        return bool(dims) and is_context(first) and _keeps_rows(_axes(dims, _rank(facts, first)))
    if op in _TF_REDUCE or op in ("ArgMax", "ArgMin"):
        axes = _ints(facts, ins[1])
        return (is_context(first) and not is_context(ins[1]) and axes is not None and len(axes) > 0
                and _keeps_rows(_axes(axes, _rank(facts, first))))
    if op in ("Transpose",):
        perm = _ints(facts, ins[1])
        return is_context(first) and bool(perm) and perm[0] == 0
    if op in ("LookupTableFindV2", "LookupTableFind"):
        return not is_context(first) and is_context(ins[1]) and not is_context(ins[2])
    return False


def tf_work(node: Node, facts: Facts) -> float:
    if node.op == "MatMul":
        return _matmul_work(facts, node.inputs[0], node.inputs[1], bool(node.attrs.get("transpose_b", False)))
    if node.op in ("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"):
        return _matmul_work(facts, node.inputs[0], node.inputs[1], bool(node.attrs.get("adj_y", False)))
    if node.op in ("Identity", "ReadVariableOp", "Const", "NoOp"):
        return 0.0
    return _row_elements(facts, node.outputs[0]) if node.outputs else 0.0
