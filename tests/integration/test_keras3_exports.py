"""Keras 3 SavedModels as users write them (issue 29): a DCN of Hashing + Embedding + Dense.

``model.export()`` serves on both backends, equal to Keras's own answer; ``tf.saved_model.save``
of the same model (whose signature reads variables nothing restores) is refused on both with a
ConfigError naming the fix, never an internal error. ``Hashing`` of int64 id columns ([N, k])
serves on both too (issue 48 item 5).
"""

import json

import numpy as np
import pytest

from processor import abi, codec
from processor.errors import ConfigError
from sp_checks import assert_outputs_close


@pytest.fixture(autouse=True)
def fresh_onnx_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SP_ONNX_CACHE_DIR", str(tmp_path / "onnx-cache"))


@pytest.fixture(scope="module")
def keras_export(tmp_path_factory):
    from models.zoo_more import build_keras3_hashing_dcn

    return build_keras3_hashing_dcn(tmp_path_factory.mktemp("keras3_export"), "export")


def _config(base, backend):
    return {"savedmodel_dir": str(base), "backend": backend, "session_num": 2, "use_per_session_threads": True}


@pytest.mark.parametrize("backend", ["tensorflow", "onnxruntime"])
def test_keras3_export_of_a_hashing_dcn_serves_equal_to_keras(keras_export, make_processor, backend):
    from models.zoo_more import HASHING_DCN_FEEDS

    base, want = keras_export
    p = make_processor(_config(base, backend))
    status, body = p.process(codec.encode_request(HASHING_DCN_FEEDS))
    assert status == 200, body
    # Keras ran eagerly in this process; ONNX Runtime with its own kernels
    assert_outputs_close(codec.decode_response(body), want, backend, atol=1e-5 if backend == "onnxruntime" else 1e-6)
    if backend == "onnxruntime":
        model = p.model_info()["session_group"]["model"]
        assert model["check"]["status"] == "passed", model["check"]
        # the unrestored twin handles are no parameter of the model
        assert not any(name.endswith("/embeddings") for name in model["variables_not_updatable"])


@pytest.mark.parametrize("backend", ["tensorflow", "onnxruntime"])
def test_keras3_export_hashing_int64_id_columns_serves_equal_to_keras(tmp_path, make_processor, backend):
    """Issue 48 item 5: ``Hashing`` of int64 ids shaped [N, k] (an id history, an ``Input(shape=(1,))``)
    converts for ONNX Runtime and buckets every id as TensorFlow does, whatever its length or sign."""
    from models.zoo_more import INT_HASHING_FEEDS, build_keras3_int_hashing

    base, want = build_keras3_int_hashing(tmp_path / "int_hashing")
    p = make_processor(_config(base, backend))
    status, body = p.process(codec.encode_request(INT_HASHING_FEEDS))
    assert status == 200, body
    # output_1, the buckets themselves, compares exactly
    assert_outputs_close(codec.decode_response(body), want, backend, atol=1e-5 if backend == "onnxruntime" else 1e-6)
    if backend == "onnxruntime":
        model = p.model_info()["session_group"]["model"]
        assert model["check"]["status"] == "passed", model["check"]


@pytest.mark.parametrize("backend", ["tensorflow", "onnxruntime"])
def test_keras3_tf_saved_model_save_is_refused_naming_the_fix(tmp_path, backend):
    from models.zoo_more import build_keras3_hashing_dcn

    base, _ = build_keras3_hashing_dcn(tmp_path / "saved", "tf_saved_model")
    with pytest.raises(ConfigError) as err:
        abi.initialize("", json.dumps(_config(base, backend)))
    message = str(err.value)
    assert message.startswith("savedmodel_dir: ") and "model.export()" in message
    assert "does not restore" in message and "item_emb/embeddings" in message
