"""The per-lane device map of lane_graphs and the virtual CPU devices in the session config (no
engine; the graph copies themselves: tests/integration/engine/test_lane_graphs.py)."""

from processor.engine import device_plan as gpu
from processor.engine.tensorflow import lane_graphs


def test_lane_map_one_copy_per_distinct_device():
    multi = lane_graphs.lane_map(gpu.assign_devices((0, 1), 2, True, visible_gpus=2))
    assert [(c.device, c.lanes) for c in multi.copies] == [
        ("/device:GPU:0", (0,)), ("/device:GPU:1", (1,)), ("/device:GPU:2", (2,)), ("/device:GPU:3", (3,))]
    shared_stream = lane_graphs.lane_map(gpu.assign_devices((0, 1), 3, False, visible_gpus=2))
    assert [(c.device, c.lanes) for c in shared_stream.copies] == [
        ("/device:GPU:0", (0, 1, 2)), ("/device:GPU:1", (3, 4, 5))]
    assert shared_stream.copy_of_lane == (0, 0, 0, 1, 1, 1) and shared_stream.replicated
    one = lane_graphs.lane_map(gpu.cpu_plan(3))
    assert not one.replicated and one.copy_of_lane == (0, 0, 0)
    virtual = lane_graphs.lane_map(gpu.virtual_cpu_plan(3))
    assert [c.device for c in virtual.copies] == [f"/device:CPU:{k}" for k in range(3)]


def test_virtual_cpu_devices_in_the_session_config():
    import tensorflow as tf

    proto = tf.compat.v1.ConfigProto()
    gpu.configure_tf_cpus(proto, gpu.virtual_cpu_plan(3))
    assert proto.device_count["CPU"] == 3
    plain = tf.compat.v1.ConfigProto()
    gpu.configure_tf_cpus(plain, gpu.cpu_plan(3))
    gpu.configure_tf_cpus(plain, gpu.assign_devices((0,), 2, True, visible_gpus=1))
    assert "CPU" not in plain.device_count
