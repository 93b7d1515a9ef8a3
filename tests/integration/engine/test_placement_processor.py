"""The device placement report of a real CTR processor on a machine without a GPU."""

from conftest import model_config


def test_placement_in_model_info_without_a_gpu(ctr_model_small, make_processor):
    p = make_processor(model_config(ctr_model_small, enable_device_placement_optimization=True))
    report = p.model_info()["session_group"]["device_placement"]
    assert report["enabled"] and report["applied"] is False and "no GPU" in report["note"]
    assert len(report["embedding_tables"]) == 26 and report["cpu_op_count"] > 26
