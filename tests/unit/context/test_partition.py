"""The context part of a graph (processor/context/partition.py with the ONNX rules of rules.py):
what depends on the context alone through row-wise ops, where it stops, and why."""

from __future__ import annotations

import numpy as np

from processor.context.partition import Node, find_partition
from processor.context.rules import ONNX_WEIGHT_SOURCES, onnx_rowwise, onnx_volatile, onnx_work


class Facts:
    def __init__(self, shapes, values=None):
        self.shapes, self.values, self.opset = shapes, values or {}, 17

    def shape(self, t):
        return self.shapes.get(t)

    def value(self, t):
        return self.values.get(t)


def partition(nodes, shapes, values=None, outputs=("y",), context=("u",), inputs=("u", "i")):
    weights = {t for t in shapes if t.startswith("W") or t.startswith("c_")}
    return find_partition(nodes, list(inputs), list(context), weights, list(outputs), Facts(shapes, values),
                          onnx_rowwise, onnx_work, ONNX_WEIGHT_SOURCES, onnx_volatile)


B = None  # the batch dimension: unknown statically
SHAPES = {"u": (B, 4), "i": (B, 3), "Wu": (4, 8), "Wi": (3, 8), "Wh": (16, 1), "ue": (B, 8), "ur": (B, 8),
          "ie": (B, 8), "h": (B, 16), "y": (B, 1)}


def two_tower(user_tail=()):
    return [Node("mu", "MatMul", ("u", "Wu"), ("ue",)), Node("ru", "Relu", ("ue",), ("ur",)), *user_tail,
            Node("mi", "MatMul", ("i", "Wi"), ("ie",)),
            Node("cat", "Concat", (user_tail[-1].outputs[0] if user_tail else "ur", "ie"), ("h",), {"axis": 1}),
            Node("head", "MatMul", ("h", "Wh"), ("y",))]


def test_the_user_side_is_the_context_part():
    p = partition(two_tower(), SHAPES)
    assert p.boundary == ("ur",)
    assert set(p.context_nodes) == {"mu", "ru"} and set(p.main_nodes) == {"mi", "cat", "head"}
    assert p.direct_inputs == () and p.context_outputs == ()
    assert p.context_node_count == 2 and p.model_node_count == 5
    # per row: 2*4*8 (user matmul) + 8 (relu) of 2*4*8 + 8 + 2*3*8 + 16 + 2*16*1
    assert abs(p.work_share - 72 / (72 + 48 + 16 + 32)) < 1e-9
    assert p.stops == ({"node": "cat", "op": "Concat", "why": "reads per-candidate tensors"},)


def test_a_reduction_over_the_rows_ends_the_part():
    tail = (Node("mean", "ReduceMean", ("ur",), ("um",), {"axes": [0], "keepdims": 1}),)
    p = partition(two_tower(tail), {**SHAPES, "um": (1, 8)})
    assert p.boundary == ("ur",)  # the batch mean mixes rows: it runs on the repeated boundary
    assert "mean" in p.main_nodes and p.stops[0]["why"] == "not known to be row-wise here"


def test_row_wise_reductions_reshapes_and_lookups_stay_in_the_part():
    nodes = [Node("g", "Gather", ("W_emb", "u"), ("e",), {"axis": 0}),  # [B, 4, 8]
             Node("m", "ReduceMean", ("e",), ("em",), {"axes": [1], "keepdims": 0}),  # [B, 8]
             Node("r", "Reshape", ("e", "c_shape"), ("ef",)),  # [B, 32]
             Node("cat", "Concat", ("em", "ef"), ("uv",), {"axis": -1}),
             Node("mi", "MatMul", ("i", "Wi"), ("ie",)),
             Node("c2", "Concat", ("uv", "ie"), ("y",), {"axis": 1})]
    shapes = {"u": (B, 4), "i": (B, 3), "W_emb": (100, 8), "e": (B, 4, 8), "em": (B, 8), "ef": (B, 32),
              "uv": (B, 40), "Wi": (3, 8), "ie": (B, 8), "y": (B, 48), "c_shape": (2,)}
    p = partition(nodes, shapes, {"c_shape": np.array([-1, 32])})
    assert p.boundary == ("uv",) and set(p.context_nodes) == {"g", "m", "r", "cat"}
    # a reshape across the rows (all of them into one) is not row-wise
    p = partition(nodes, shapes, {"c_shape": np.array([1, -1])})
    assert set(p.boundary) == {"em", "e"} and "r" in p.main_nodes


def test_context_inputs_read_by_the_rest_and_context_outputs():
    nodes = [Node("mu", "MatMul", ("u", "Wu"), ("ue",)), Node("ru", "Relu", ("ue",), ("user_vec",)),
             Node("shape", "Shape", ("u",), ("s",)),  # the shape of the context: not row-wise
             Node("mi", "MatMul", ("i", "Wi"), ("ie",)), Node("add", "Add", ("ie", "user_vec"), ("y",))]
    p = partition(nodes, {**SHAPES, "user_vec": (B, 8), "s": (2,), "y": (B, 8)},
                  outputs=("y", "user_vec", "s"))
    assert p.boundary == ("user_vec",) and p.context_outputs == ("user_vec",)
    assert p.direct_inputs == ("u",)  # Shape reads the (repeated) context input itself


def test_weights_broadcast_against_rows_only_without_a_batch_dimension():
    nodes = [Node("add", "Add", ("u", "W_bias"), ("ub",)), Node("mi", "MatMul", ("i", "Wi"), ("ie",)),
             Node("cat", "Concat", ("ub", "ie"), ("y",), {"axis": 1})]
    shapes = {**SHAPES, "ub": (B, 4), "y": (B, 12)}
    assert partition(nodes, {**shapes, "W_bias": (4,)}).boundary == ("ub",)
    assert partition(nodes, {**shapes, "W_bias": (1, 4)}).boundary == ("ub",)
    # a weight with rows of its own would pair row k with weight row k: not row-wise
    assert isinstance(partition(nodes, {**shapes, "W_bias": (5, 4)}), str)


def test_nothing_row_wise_on_the_context_alone():
    nodes = [Node("cat", "Concat", ("u", "i"), ("h",), {"axis": 1}), Node("head", "MatMul", ("h", "Wh"), ("y",))]
    assert partition(nodes, {**SHAPES, "h": (B, 7), "Wh": (7, 1)}) == (
        "no part of the model depends on the context inputs alone through row-wise ops")


def test_volatile_and_controlled_nodes_never_join_the_part():
    nodes = [Node("mu", "MatMul", ("u", "Wu"), ("ue",), controlled=True), Node("mi", "MatMul", ("i", "Wi"), ("ie",)),
             Node("cat", "Concat", ("ue", "ie"), ("y",), {"axis": 1})]
    assert isinstance(partition(nodes, {**SHAPES, "y": (B, 16)}), str)
    nodes = [Node("rnd", "RandomUniformLike", ("u",), ("r",)), Node("mi", "MatMul", ("i", "Wi"), ("ie",)),
             Node("add", "Add", ("r", "u"), ("y",))]
    assert isinstance(partition(nodes, {**SHAPES, "r": (B, 4), "y": (B, 4)}), str)
