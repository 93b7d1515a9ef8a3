"""Every signature of a SavedModel served through the DataPlane (in process, real engines): any
signature by name on the one version and session, the config's ``signature_name`` the default,
TF Serving's shape rule (``check_shapes=False``) beside our own wire format's strict one, our
wire format naming another signature, and ONNX Runtime serving its one converted signature and
refusing another with TF Serving's words.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import model_config
from processor import codec
from processor.errors import InvalidArgument, SignatureNotFound
from processor.request import PredictCall

X = {"x": np.array([[2.0], [4.0]], np.float32)}


def serialized(*values: float) -> np.ndarray:
    import tensorflow as tf

    out = []
    for v in values:
        ex = tf.train.Example()
        ex.features.feature["x"].float_list.value.append(v)
        out.append(ex.SerializeToString())
    return np.array(out, dtype=object)


@pytest.fixture(scope="module")
def half_plus_two(tmp_path_factory):
    from models.half_plus_two import export_tf1

    return export_tf1(tmp_path_factory.mktemp("hp2") / "model").parent


def test_every_signature_by_name_on_one_version(make_processor, half_plus_two):
    processor = make_processor({"savedmodel_dir": str(half_plus_two), "signature_name": "regress_x_to_y2"})
    dp = processor.dataplane
    default = dp.predict(PredictCall(processor.name, {"inputs": serialized(2.0, 4.0)}))
    assert default.signature.name == "regress_x_to_y2"
    np.testing.assert_allclose(default.outputs["outputs"], [[4.0], [5.0]])  # 0.5x + 3
    for name, key, want in (("regress_x_to_y", "outputs", [[3.0], [4.0]]),
                            ("classify_x_to_y", "scores", [[3.0], [4.0]])):
        result = dp.predict(PredictCall(processor.name, {"inputs": serialized(2.0, 4.0)}, signature_name=name))
        assert result.signature.name == name and result.version is default.version
        np.testing.assert_allclose(result.outputs[key], want)
    predicted = dp.predict(PredictCall(processor.name, X, signature_name="serving_default"))
    np.testing.assert_allclose(predicted.outputs["y"], [[3.0], [4.0]])
    served = dp.served(processor.name)
    assert sorted(served.signatures) == ["classify_x_to_y", "regress_x2_to_y3", "regress_x_to_y",
                                         "regress_x_to_y2", "serving_default"]
    assert processor.model_info()["session_group"]["signatures"] == sorted(served.signatures)

    with pytest.raises(SignatureNotFound, match='Serving signature key "nope" not found.'):
        dp.predict(PredictCall(processor.name, X, signature_name="nope"))
    # our wire format naming another signature: that signature's inputs, checked strictly
    wire = codec.encode_request(X)
    answer = dp.predict(PredictCall(processor.name, wire, signature_name="serving_default"))
    np.testing.assert_allclose(codec.decode_response(answer.outputs)["y"], [[3.0], [4.0]])


def test_another_signature_of_a_batching_model(make_processor, half_plus_two):
    """Arrays and our wire format naming another signature go through the reference batcher."""
    from concurrent.futures import ThreadPoolExecutor

    processor = make_processor({"savedmodel_dir": str(half_plus_two), "signature_name": "regress_x_to_y",
                                "batching": {"max_batch_size": 8, "batch_timeout_micros": 1000}})
    dp = processor.dataplane

    def regress(i: int):
        return dp.predict(PredictCall(processor.name, {"inputs": serialized(float(i))},
                                      signature_name="regress_x_to_y2")).outputs["outputs"]

    def wire(i: int):
        data = codec.encode_request({"x": np.array([[float(i)]], np.float32)})
        return codec.decode_response(dp.predict(PredictCall(processor.name, data,
                                                            signature_name="serving_default")).outputs)["y"]

    with ThreadPoolExecutor(4) as pool:
        for i, got in enumerate(pool.map(regress, range(16))):
            np.testing.assert_allclose(got, [[0.5 * i + 3.0]])
        for i, got in enumerate(pool.map(wire, range(16))):
            np.testing.assert_allclose(got, [[0.5 * i + 2.0]])


def test_shapes_left_to_the_graph_only_where_asked(make_processor, half_plus_two):
    processor = make_processor({"savedmodel_dir": str(half_plus_two)})
    flat = {"x": np.array([2.0, 3.0, 4.0], np.float32)}  # rank 1 against [-1, 1]
    result = processor.dataplane.predict(PredictCall(processor.name, flat, check_shapes=False))
    np.testing.assert_allclose(result.outputs["y"], [3.0, 3.5, 4.0])
    with pytest.raises(InvalidArgument, match="expects rank 2"):
        processor.dataplane.predict(PredictCall(processor.name, flat))
    with pytest.raises(InvalidArgument, match="the model rejected the input"):  # the graph's own refusal
        processor.dataplane.predict(PredictCall(processor.name, {"inputs": serialized(1.0)[None]},
                                                signature_name="regress_x_to_y", check_shapes=False))
    with pytest.raises(InvalidArgument, match="dtype"):  # dtypes are still checked
        processor.dataplane.predict(PredictCall(processor.name, {"x": np.array([1], np.int64)}, check_shapes=False))


def test_onnx_runtime_serves_its_one_signature(make_processor, toy_model):
    pytest.importorskip("onnxruntime")
    processor = make_processor(model_config(toy_model, backend="onnxruntime"))
    dp = processor.dataplane
    assert list(dp.served(processor.name).signatures) == ["serving_default"]
    result = dp.predict(PredictCall(processor.name, X, signature_name="serving_default"))
    assert result.outputs["y"].shape == (2, 1)
    with pytest.raises(SignatureNotFound) as caught:
        dp.predict(PredictCall(processor.name, X, signature_name="regress"))
    assert str(caught.value) == ('Serving signature key "regress" not found. This model serves '
                                 "['serving_default']")
    assert json.loads(json.dumps(processor.model_info()["signature"]))  # model info still reads
