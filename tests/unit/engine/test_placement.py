"""Device placement plan for the demo CTR model: the embedding layer goes to the CPU."""

import pytest


@pytest.fixture(scope="module")
def demo_graph_def():
    import tensorflow as tf

    from demo.ctr_network import build_ctr_network
    from demo.ctr_spec import get_preset

    graph = tf.Graph()
    with graph.as_default():
        network = build_ctr_network(get_preset("small"))
    return graph.as_graph_def(), [t.name for t in network.outputs.values()]


def _ops(graph_def, op_type):
    return {n.name for n in graph_def.node if n.op == op_type}


def test_plan_puts_the_embedding_layer_on_the_cpu(demo_graph_def):
    from processor.engine.tensorflow.placement import plan_placement, serving_ancestors

    graph_def, outputs = demo_graph_def
    plan = plan_placement(graph_def, serving_ancestors(graph_def, outputs))
    assert sorted(plan.embedding_tables) == sorted(f"embeddings/C{i}" for i in range(1, 27))
    cpu = set(plan.cpu_ops)
    lookups = _ops(graph_def, "ResourceGather")
    assert len(lookups) == 26 and lookups <= cpu
    assert _ops(graph_def, "StringToHashBucketFast") <= cpu  # string hashing
    assert _ops(graph_def, "FloorMod") <= cpu  # id preprocessing
    assert _ops(graph_def, "Unpack") <= cpu
    assert {f"embeddings/C{i}" for i in range(1, 27)} <= cpu
    gpu = set(plan.gpu_ops)
    for op_type in ("MatMul", "Relu", "Sigmoid", "ConcatV2", "Log1p"):
        assert _ops(graph_def, op_type) and _ops(graph_def, op_type) <= gpu, op_type
    assert "mlp/layer_1/kernel" in gpu  # 2-D but not looked up: a dense parameter
    assert not cpu & gpu
    assert plan.reasons["embeddings/C21"] == "embedding table"
    assert _ops(graph_def, "Placeholder").isdisjoint(cpu | gpu)


def test_apply_plan_sets_devices(demo_graph_def):
    from processor.engine.tensorflow.placement import apply_plan, plan_placement

    graph_def, _ = demo_graph_def
    copy = type(graph_def)()
    copy.CopyFrom(graph_def)
    plan = plan_placement(copy)
    assert apply_plan(copy, plan, "/device:GPU:1") == len(plan.cpu_ops) + len(plan.gpu_ops)
    devices = {n.name: n.device for n in copy.node}
    assert all(devices[n] == "/device:CPU:0" for n in _ops(copy, "ResourceGather"))
    assert all(devices[n] == "/device:GPU:1" for n in _ops(copy, "MatMul"))
