"""Per-session device assignment for gpu_ids_list / session_num / use_multi_stream (no GPU needed),
and GPU discovery on this machine (with a GPU, or without one)."""

import pytest

from processor.config import ModelConfig
from processor.engine import device_plan as gpu
from processor.errors import ConfigError


def test_no_gpu_config_is_cpu_lanes():
    plan = gpu.assign_devices((), 3, False, visible_gpus=0)
    assert not plan.on_gpu and len(plan.lanes) == 3 and plan.sessions == 3
    assert {d.tf_device for d in plan.lanes} == {"/device:CPU:0"}


def test_multi_stream_gives_every_lane_its_own_stream_and_session():
    plan = gpu.assign_devices((1, 3), 2, True, visible_gpus=4)
    assert [(d.lane, d.gpu, d.stream, d.tf_device, d.session) for d in plan.lanes] == [
        (0, 1, 0, "/device:GPU:0", 0),
        (1, 1, 1, "/device:GPU:1", 1),
        (2, 3, 0, "/device:GPU:2", 2),
        (3, 3, 1, "/device:GPU:3", 3),
    ]
    assert plan.sessions == 4


def test_without_multi_stream_the_lanes_of_a_gpu_share_its_stream():
    plan = gpu.assign_devices((0, 1), 3, False, visible_gpus=2)
    assert [(d.gpu, d.stream, d.tf_device, d.session) for d in plan.lanes] == (
        [(0, 0, "/device:GPU:0", 0)] * 3 + [(1, 0, "/device:GPU:1", 1)] * 3)
    assert plan.sessions == 2


def test_multi_stream_without_ids_uses_every_visible_gpu():
    plan = gpu.assign_devices((), 2, True, visible_gpus=2)
    assert plan.gpu_ids == (0, 1) and len(plan.lanes) == 4


def test_id_beyond_visible_count_fails_with_the_valid_range():
    with pytest.raises(ConfigError) as err:
        gpu.assign_devices((0, 2), 1, False, visible_gpus=2)
    assert "gpu_ids_list" in err.value.message and "[2]" in err.value.message
    assert "0..1" in err.value.message


def test_no_visible_gpu_fails_fast_or_falls_back():
    with pytest.raises(ConfigError) as err:
        gpu.assign_devices((0,), 2, True, visible_gpus=0, why_none="tensorflow-cpu")
    assert "no GPU is visible" in err.value.message and "tensorflow-cpu" in err.value.message
    plan = gpu.assign_devices((0, 1), 2, True, visible_gpus=0, fallback_to_cpu=True)
    assert not plan.on_gpu and len(plan.lanes) == 4 and "gpu_fallback_to_cpu" in plan.note


def test_tf_config_proto_for_virtual_devices():
    import tensorflow as tf

    proto = tf.compat.v1.ConfigProto()
    gpu.configure_tf_gpus(proto, gpu.assign_devices((1, 0), 4, True, visible_gpus=2), session_num=4)
    assert proto.gpu_options.visible_device_list == "1,0"
    assert proto.gpu_options.experimental.num_virtual_devices_per_gpu == 4
    shared = tf.compat.v1.ConfigProto()
    gpu.configure_tf_gpus(shared, gpu.assign_devices((0,), 4, False, visible_gpus=1), session_num=4)
    assert shared.gpu_options.experimental.num_virtual_devices_per_gpu == 0
    cpu = tf.compat.v1.ConfigProto()
    gpu.configure_tf_gpus(cpu, gpu.cpu_plan(2), session_num=2)
    assert cpu.gpu_options.visible_device_list == ""


def test_ort_providers_put_each_session_on_its_gpu():
    plan = gpu.assign_devices((2,), 2, True, visible_gpus=3)
    name, options = gpu.ort_providers(plan.lanes[1])[0]
    assert name == "CUDAExecutionProvider" and options["device_id"] == "2"
    assert gpu.ort_providers(gpu.cpu_plan(1).lanes[0]) == ["CPUExecutionProvider"]


# --- discovery on this machine: one of the two tests below runs, the other says why it skips ----

def _tf_gpus() -> int:
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU"))


def test_this_machine_reports_why_it_has_no_gpu():
    import tensorflow as tf

    if _tf_gpus():
        pytest.skip("TensorFlow sees a GPU here: test_gpu_host_discovers_and_serves_on_its_gpus runs instead")
    count, why = gpu.tf_visible_gpus()
    assert count == 0
    if tf.test.is_built_with_cuda():
        assert why == "TensorFlow finds no CUDA device"
    else:
        assert "built without CUDA (tensorflow-cpu)" in why
    with pytest.raises(ConfigError, match="no GPU is visible"):
        gpu.plan_for(ModelConfig.from_dict({"savedmodel_dir": "/x", "gpu_ids_list": "0"}), "tensorflow")


def test_gpu_host_discovers_and_serves_on_its_gpus():
    """On a GPU host: TensorFlow's GPUs are found (the driver agrees), a config asking for them
    gets a GPU plan, one beyond them is refused, and the plan's session config runs on GPU 0."""
    import numpy as np
    import tensorflow as tf

    visible = _tf_gpus()
    if not visible:
        pytest.skip("no GPU visible to TensorFlow on this machine (tensorflow-cpu or no CUDA device)")
    count, why = gpu.tf_visible_gpus()
    assert (count, why) == (visible, "")
    assert count <= gpu.cuda_device_count()  # what the CUDA driver reports
    plan = gpu.plan_for(ModelConfig.from_dict({"savedmodel_dir": "/x", "use_multi_stream": True,
                                               "session_num": 2}), "tensorflow")
    assert plan.on_gpu and plan.gpu_ids == tuple(range(count)) and len(plan.lanes) == 2 * count
    with pytest.raises(ConfigError, match=rf"valid ids: 0\.\.{count - 1}"):
        gpu.plan_for(ModelConfig.from_dict({"savedmodel_dir": "/x", "gpu_ids_list": str(count)}), "tensorflow")
    shared = gpu.plan_for(ModelConfig.from_dict({"savedmodel_dir": "/x", "gpu_ids_list": "0",
                                                 "session_num": 2}), "tensorflow")
    assert [d.tf_device for d in shared.lanes] == ["/device:GPU:0"] * 2
    config = tf.compat.v1.ConfigProto(allow_soft_placement=False)
    gpu.configure_tf_gpus(config, shared, session_num=2)
    graph = tf.Graph()
    with graph.as_default(), tf.device(shared.lanes[0].tf_device):
        product = tf.linalg.matmul(tf.constant([[1.0, 2.0]]), tf.constant([[3.0], [4.0]]))
    with tf.compat.v1.Session(graph=graph, config=config) as session:
        assert any(d.device_type == "GPU" for d in session.list_devices())
        np.testing.assert_array_equal(session.run(product), [[11.0]])  # no soft placement: ran on GPU 0


def test_onnxruntime_gpu_discovery_agrees_with_the_driver():
    import onnxruntime as ort

    count, why = gpu.ort_visible_gpus()
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        assert count == 0 and "no CUDA execution provider" in why
        return
    driver = gpu.cuda_device_count()
    assert count == driver
    assert why == ("" if driver else "the CUDA driver reports no device")
