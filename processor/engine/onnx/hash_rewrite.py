"""Rewrite string hashing in a converted graph so ONNX Runtime can run it.

tf2onnx turns ``tf.strings.to_hash_bucket_fast`` into ``StringToHashBucketFast`` of the
onnxruntime-extensions domain, which computes another hash than TensorFlow. String inputs that
only reach hashing through shape ops (Split, Squeeze, Reshape, Gather, ...) become ``uint64``
inputs carrying TensorFlow's 64-bit string fingerprint, computed by the backend
(:mod:`processor.engine.string_hash`); the hash op becomes ``Mod(fingerprint, num_buckets)``.
``tf.strings.as_string`` of an integer tensor (tf2onnx: a ``Cast`` to string, the same decimal
text) followed by the hash is computed in the graph: :func:`integer_fingerprint` is farmhash's
``Fingerprint64`` of the decimal text (lengths 1 to 20) in standard ONNX ops on uint64, so Keras
``Hashing`` of int64 ids runs in ONNX Runtime with TensorFlow's buckets.
String inputs that feed lookup tables (``ai.onnx.ml`` ``LabelEncoder``, what tf2onnx makes of
``tf.lookup.StaticHashTable``) stay strings. Any other use of a string tensor fails the conversion.

Functions only; thread-safe.
"""

from __future__ import annotations

import numpy as np

from ...errors import ConfigError

CONTRIB_DOMAIN = "ai.onnx.contrib"
# ONNX ops that move or reshape values without looking at them: a string tensor may pass
# through them on its way to hashing (they work the same on uint64 fingerprints).
_SHAPE_OPS = frozenset({"Identity", "Split", "Squeeze", "Unsqueeze", "Reshape", "Gather", "Concat",
                        "Slice", "Transpose", "Flatten", "Expand", "Tile", "GatherElements"})
# ai.onnx.ml ops ONNX Runtime runs on strings: tf2onnx maps string-keyed lookup tables to them.
_STRING_LOOKUP_OPS = frozenset({"LabelEncoder", "CategoryMapper"})
_INTEGER_TYPES = frozenset({6, 7, 2, 3, 4, 5, 12})  # int32, int64, uint8, int8, uint16, int16, uint32


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
    retyped: set[str] = set()
    hash_nodes = []
    for value in string_inputs:
        # follow the input through shape ops: it may end in hashes (then it becomes a uint64
        # fingerprint input) or in string lookups ONNX Runtime runs itself (it stays a string)
        frontier, reached, own_hashes, lookups = [value.name], {value.name}, [], []
        while frontier:
            tensor = frontier.pop()
            for node in consumers.get(tensor, []):
                if node.op_type == "StringToHashBucketFast" and node.domain == CONTRIB_DOMAIN:
                    if node not in own_hashes:
                        own_hashes.append(node)
                elif node.domain == "ai.onnx.ml" and node.op_type in _STRING_LOOKUP_OPS:
                    lookups.append(node)
                elif node.domain in ("", "ai.onnx") and node.op_type in _SHAPE_OPS and node.input[0] == tensor:
                    for out in node.output:
                        if out not in reached:
                            reached.add(out)
                            frontier.append(out)
                else:
                    raise ConfigError(
                        f"backend: string tensor {tensor!r} reaches {node.op_type!r}, which ONNX Runtime "
                        f"cannot run on strings; only tf.strings.to_hash_bucket_fast and lookup tables "
                        f"on string inputs are supported; serve this model with `backend: tensorflow`")
        if own_hashes and lookups:
            raise ConfigError(f"backend: string input {value.name!r} feeds both hashing and a lookup table; "
                              f"serve this model with `backend: tensorflow`")
        if own_hashes:
            retyped |= reached
            hash_nodes.extend(n for n in own_hashes if n not in hash_nodes)
    left = [n for n in graph.node if n.op_type == "StringToHashBucketFast" and n.domain == CONTRIB_DOMAIN
            and n not in hash_nodes]
    for node in left:
        _hash_integer_strings(model, node, initializers)
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



def _hash_integer_strings(model, node, initializers) -> None:
    """``to_hash_bucket_fast(as_string(ids))`` of integer ``ids`` computed in the graph.

    tf2onnx makes ``tf.strings.as_string`` of an integer a ``Cast`` to string (the same decimal
    text); the hash of that text is computed by standard ONNX ops (:func:`integer_fingerprint`).
    Any other string computed in the graph raises ConfigError.
    """
    from onnx import TensorProto, helper, numpy_helper, shape_inference

    graph = model.graph
    producer = next((n for n in graph.node if node.input[0] in n.output), None)
    source_type = None
    if producer is not None and producer.op_type == "Cast" and producer.domain in ("", "ai.onnx") and \
            next((a.i for a in producer.attribute if a.name == "to"), None) == TensorProto.STRING:
        typed = {v.name: v.type.tensor_type.elem_type for v in (*graph.input, *graph.value_info)}
        source_type = typed.get(producer.input[0])
        if source_type is None:
            inferred = shape_inference.infer_shapes(model).graph
            typed = {v.name: v.type.tensor_type.elem_type for v in (*inferred.input, *inferred.value_info)}
            source_type = typed.get(producer.input[0])
    if source_type not in _INTEGER_TYPES:
        made_by = producer.op_type if producer is not None else "an input"
        raise ConfigError(
            f"backend: tf.strings.to_hash_bucket_fast of a string computed in the graph (made by "
            f"{[made_by]}) cannot run in ONNX Runtime: only string inputs and tf.strings.as_string of "
            f"integers are hashed; serve this model with `backend: tensorflow`")
    buckets = initializers.get(node.input[1])
    if buckets is None:
        raise ConfigError(f"backend: {node.name!r}: num_buckets is not a constant")
    builder = _Builder(f"{node.name}__fp")
    ids = producer.input[0]
    if source_type != TensorProto.INT64:
        ids = builder.op("Cast", ids, to=TensorProto.INT64)
    fingerprint = integer_fingerprint(builder, ids)
    count = builder.const(numpy_helper.to_array(buckets).astype(np.uint64))
    bucket = builder.op("Mod", fingerprint, count, fmod=0)
    builder.nodes.append(helper.make_node("Cast", [bucket], list(node.output), name=f"{node.name}__cast",
                                          to=TensorProto.INT64))
    position = list(graph.node).index(node)
    graph.node.remove(node)
    for offset, new in enumerate(builder.nodes):
        graph.node.insert(position + offset, new)
    graph.initializer.extend(builder.initializers)
    if not any(producer.output[0] in n.input for n in graph.node) and producer.output[0] not in \
            {o.name for o in graph.output}:
        graph.node.remove(producer)


class _Builder:
    """ONNX nodes computing on uint64 vectors (wrapping arithmetic, as farmhash's C++)."""

    def __init__(self, prefix: str) -> None:
        self.prefix, self.nodes, self.initializers, self.count = prefix, [], [], 0

    def _name(self) -> str:
        self.count += 1
        return f"{self.prefix}__{self.count}"

    def const(self, value, dtype=np.uint64) -> str:
        from onnx import numpy_helper

        name = self._name()
        self.initializers.append(numpy_helper.from_array(np.array(value, dtype), name))
        return name

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        from onnx import helper

        out = self._name()
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def add(self, *xs: str) -> str:
        out = xs[0]
        for x in xs[1:]:
            out = self.op("Add", out, x)
        return out

    def where(self, condition: str, x: str, y: str) -> str:  # ORT has no uint64 Where
        from onnx import TensorProto

        pick = self.op("Cast", condition, to=TensorProto.UINT64)
        return self.add(y, self.mul(self.op("Sub", x, y), pick))

    def mul(self, a: str, b: str) -> str:
        return self.op("Mul", a, b)

    def shr(self, x: str, k: int) -> str:
        return self.op("BitShift", x, self.const(k), direction="RIGHT")

    def shl(self, x: str, k: int) -> str:
        return self.op("BitShift", x, self.const(k), direction="LEFT")

    def rot(self, x: str, k: int) -> str:  # the two parts have no bit in common: + is |
        return self.add(self.shr(x, k), self.shl(x, 64 - k))

    def _columns_sum(self, x: str, width: int) -> str:
        """Sum of the ``width`` columns of a uint64 [N, width] tensor, in uint64."""
        total = None
        for j in range(width):
            column = self.op("Gather", x, self.const(j, np.int64), axis=1)
            total = column if total is None else self.add(total, column)
        return total

    def xor(self, a: str, b: str) -> str:
        from onnx import TensorProto

        shifts = self.const(np.arange(64, dtype=np.uint64))
        two = self.const(2)
        bits = [self.op("Mod", self.op("BitShift", self.op("Unsqueeze", v, self.const([-1], np.int64)), shifts,
                                       direction="RIGHT"), two, fmod=0) for v in (a, b)]
        differ = self.op("Mod", self.add(*bits), two, fmod=0)  # [N, 64], bit j of a ^ b
        # ORT sums int64 through doubles (exact below 2**53): sum 16-bit groups, then join them
        groups = self.op("Reshape", differ, self.const([0, 4, 16], np.int64))
        weighted = self.op("BitShift", groups, self.const(np.arange(16, dtype=np.uint64)), direction="LEFT")
        sums = self.op("ReduceSum", self.op("Cast", weighted, to=TensorProto.INT64), self.const([-1], np.int64),
                       keepdims=0)
        placed = self.op("BitShift", self.op("Cast", sums, to=TensorProto.UINT64),
                         self.const(np.arange(4, dtype=np.uint64) * 16), direction="LEFT")
        return self._columns_sum(placed, 4)

    def shift_mix(self, v: str) -> str:
        return self.xor(v, self.shr(v, 47))

    def len16(self, u: str, v: str, mul: str) -> str:
        a = self.mul(self.xor(u, v), mul)
        a = self.shift_mix(a)
        b = self.mul(self.xor(v, a), mul)
        return self.mul(self.shift_mix(b), mul)


_K0, _K1, _K2 = 0xC3A5C85C97CB3127, 0xB492B66FBE98F273, 0x9AE16A3B2F90404F
_DIGITS = 20  # an int64 in decimal: at most 19 digits and a sign


def integer_fingerprint(b: _Builder, ids: str) -> str:
    """uint64 ``Fingerprint64`` of the decimal string of every element of int64 ``ids``.

    That is ``tf.strings.to_hash_bucket_fast(tf.strings.as_string(ids), n)`` before the ``mod n``
    (farmhash ``na::Hash64`` for lengths 1 to 20, each branch computed and the right one picked).
    ``ids`` may have any shape (Keras ``Input(shape=(1,))`` or id sequences give [N, k]); the
    result has the same shape.
    """
    # the hash lays each id's digits along a new last axis and works on [N, 20] tensors: it runs
    # on the ids flattened to one vector, and its answer takes their shape back
    flat = b.op("Reshape", ids, b.const([-1], np.int64))
    return b.op("Reshape", _vector_fingerprint(b, flat), b.op("Shape", ids))


def _vector_fingerprint(b: _Builder, ids: str) -> str:
    """:func:`integer_fingerprint` of an int64 vector ``ids`` [N]."""
    from onnx import TensorProto

    i64 = lambda v: b.const(v, np.int64)  # noqa: E731
    zero = i64(0)
    negative = b.op("Less", ids, zero)
    unsigned = b.op("Cast", ids, to=TensorProto.UINT64)
    magnitude = b.where(negative, b.op("Sub", b.const(0), unsigned), unsigned)
    column = b.op("Unsqueeze", magnitude, i64([1]))
    powers = b.const([10 ** k for k in range(_DIGITS)])
    digits = b.op("Mod", b.op("Div", column, powers), b.const(10), fmod=0)  # [N, 20], least significant first
    at_least = b.op("Cast", b.op("Not", b.op("Less", column, powers)), to=TensorProto.INT64)
    count = b.op("Max", b.op("ReduceSum", at_least, i64([1]), keepdims=0), i64(1))
    sign = b.op("Cast", negative, to=TensorProto.INT64)
    length = b.add(count, sign)  # [N] int64
    positions = i64(np.arange(_DIGITS))
    last = b.op("Sub", length, i64(1))
    index = b.op("Clip", b.op("Sub", b.op("Unsqueeze", last, i64([1])), positions), i64(0), i64(_DIGITS - 1))
    chars = b.add(b.op("GatherElements", digits, index, axis=1), b.const(48))
    minus = b.op("And", b.op("Unsqueeze", negative, i64([1])), b.op("Equal", positions, zero))
    text = b.where(minus, b.const(45), chars)  # [N, 20] uint64 bytes

    def fetch(offset: str, width: int) -> str:
        idx = b.op("Clip", b.op("Add", b.op("Unsqueeze", offset, i64([1])), i64(np.arange(width))),
                   i64(0), i64(_DIGITS - 1))
        shifted = b.op("BitShift", b.op("GatherElements", text, idx, axis=1),
                       b.const(np.arange(width, dtype=np.uint64) * 8), direction="LEFT")
        return b._columns_sum(shifted, width)

    def fetch_at(k: int, width: int, from_end: bool = False) -> str:
        return fetch(b.op("Sub", length, i64(k)) if from_end else b.op("Add", b.op("Mul", length, zero), i64(k)), width)

    ulen = b.op("Cast", length, to=TensorProto.UINT64)
    k0, k1, k2 = b.const(_K0), b.const(_K1), b.const(_K2)
    mul = b.add(k2, b.mul(ulen, b.const(2)))
    # length 1..3
    y = b.add(fetch_at(0, 1), b.shl(fetch(b.op("Div", length, i64(2)), 1), 8))
    z = b.add(ulen, b.shl(fetch_at(1, 1, from_end=True), 2))
    h3 = b.mul(b.shift_mix(b.xor(b.mul(y, k2), b.mul(z, k0))), k2)
    # length 4..7
    h7 = b.len16(b.add(ulen, b.shl(fetch_at(0, 4), 3)), fetch_at(4, 4, from_end=True), mul)
    # length 8..16
    a = b.add(fetch_at(0, 8), k2)
    bb = fetch_at(8, 8, from_end=True)
    c = b.add(b.mul(b.rot(bb, 37), mul), a)
    d = b.mul(b.add(b.rot(a, 25), bb), mul)
    h16 = b.len16(c, d, mul)
    # length 17..32
    a = b.mul(fetch_at(0, 8), k1)
    bb = fetch_at(8, 8)
    c = b.mul(fetch_at(8, 8, from_end=True), mul)
    d = b.mul(fetch_at(16, 8, from_end=True), k2)
    h32 = b.len16(b.add(b.rot(b.add(a, bb), 43), b.rot(c, 30), d), b.add(a, b.rot(b.add(bb, k2), 18), c), mul)
    out = h32
    for limit, h in ((16, h16), (7, h7), (3, h3)):
        out = b.where(b.op("Less", length, i64(limit + 1)), h, out)
    return out
