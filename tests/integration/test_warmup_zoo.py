"""Warmup that cannot reject a good model (issue 14 items 1 and 3), on small model builders.

* an Estimator-style wide & deep model taking serialized tf.Examples serves with no warmup file
  (the synthetic request is a minimal valid tf.Example), its predictions equal TF's own;
* the same network with raw placeholders serves too;
* a model that rejects the synthetic input still serves, model info says warmup was skipped and why;
* warmup runs at several batch sizes (model info lists them); ``warmup_batch_sizes`` is strict.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import model_config, plain_tf_predict
from processor import codec
from processor.errors import ConfigError
from processor.manager.warmup import SIZE_ROUNDS, parse_op_examples, synthetic_request
from sp_checks import assert_outputs_close

ROWS = [
    {"age": [31.0], "hours": [1.5, 2.0], "item_id": [3, 17, 49], "city": [b"paris"]},
    {"age": [54.0], "item_id": [120], "city": [b"oslo", b"lima"]},  # no hours: the default
    {"age": [19.0], "hours": [0.0, 7.0]},  # no ids, no city: empty sparse rows
    {"age": [40.0], "hours": [3.0, 3.0], "item_id": [0], "city": [b""]},
    {"age": [22.5], "hours": [5.0, 1.0], "item_id": [7, 7], "city": [b"rome"]},
]


@pytest.fixture(scope="module")
def examples_model(tmp_path_factory):
    from models.wide_deep import build_wide_deep

    return build_wide_deep(tmp_path_factory.mktemp("wd_examples") / "model", examples=True)


@pytest.fixture(scope="module")
def raw_model(tmp_path_factory):
    from models.wide_deep import build_wide_deep

    return build_wide_deep(tmp_path_factory.mktemp("wd_raw") / "model", examples=False)


@pytest.fixture(scope="module")
def rejecting_model(tmp_path_factory):
    from models.rejecting import build_rejecting_model

    return build_rejecting_model(tmp_path_factory.mktemp("rejecting") / "model")


def predict(processor, feeds):
    status, body = processor.process(codec.encode_request(feeds))
    assert status == 200, body
    return codec.decode_response(body)


def test_tf_example_model_serves_without_warmup_file(examples_model, make_processor):
    from models.wide_deep import example_bytes

    p = make_processor(model_config(examples_model, backend="tensorflow", session_num=2))
    info = p.model_info()
    assert info["state"] == "ready"
    warmup = info["warmup"]
    assert warmup["source"] == "synthetic" and "skipped" not in warmup, warmup
    assert warmup["runs"] == 5 * 2
    assert warmup["batch_sizes"] == [1, 2, 4, 8]
    assert warmup["batch_runs"] == 4 * SIZE_ROUNDS * 2

    feeds = {"examples": example_bytes(ROWS)}
    got = predict(p, feeds)
    want = plain_tf_predict(examples_model.savedmodel_dir, examples_model.latest_checkpoint_prefix, feeds)
    assert set(got) == {"logits", "probabilities"}
    assert_outputs_close(got, want, "two lanes vs plain TensorFlow")  # other thread settings
    # the checkpoint's parameters serve, not the SavedModel's
    assert not np.array_equal(plain_tf_predict(examples_model.savedmodel_dir, None, feeds)["logits"], got["logits"])


def test_synthetic_tf_example_holds_every_parsed_key(examples_model):
    import tensorflow as tf
    from processor.dtypes import DT_STRING
    from processor.signature import Signature, TensorSpec

    spec = TensorSpec("examples", "input_example_tensor:0", DT_STRING, (-1,))
    signature = Signature("serving_default", {"examples": spec}, {})
    found = parse_op_examples(signature, str(examples_model.savedmodel_dir))
    example = tf.train.Example.FromString(found["examples"])
    feature = example.features.feature
    assert sorted(feature) == ["age", "city", "hours", "item_id"]
    assert list(feature["hours"].float_list.value) == [0.0, 0.0]  # a dense feature at its full shape
    # the synthetic request carries it whole (it ends in NUL bytes: the int64 id 0)
    assert found["examples"].endswith(b"\x00")
    request = codec.parse_request(synthetic_request(signature, str(examples_model.savedmodel_dir)))
    assert list(request.inputs["examples"].string_val) == [found["examples"]]


def test_raw_placeholder_model_serves(raw_model, make_processor):
    p = make_processor(model_config(raw_model, backend="tensorflow"))
    warmup = p.model_info()["warmup"]
    assert warmup["source"] == "synthetic" and "skipped" not in warmup
    assert warmup["batch_sizes"] == [1, 2, 4, 8]
    feeds = {"age": np.array([[31.0], [54.0], [19.0]], np.float32),
             "hours": np.array([[1.5, 2.0], [0.0, 0.0], [0.0, 7.0]], np.float32),
             "item_id": np.array([[3, 17, 49], [120, 0, 0], [5, 5, 5]], np.int64),
             "city": np.array([b"paris", b"oslo", b""], dtype=object)}
    got = predict(p, feeds)
    want = plain_tf_predict(raw_model.savedmodel_dir, raw_model.latest_checkpoint_prefix, feeds)
    assert_outputs_close({k: got[k] for k in ("logits", "probabilities")},
                         {k: want[k] for k in ("logits", "probabilities")}, "lanes vs plain TensorFlow")


def test_model_rejecting_synthetic_input_still_serves(rejecting_model, make_processor):
    p = make_processor(model_config(rejecting_model, backend="tensorflow"))
    info = p.model_info()
    assert info["state"] == "ready" and info["last_error"] is None
    warmup = info["warmup"]
    assert warmup["source"] == "synthetic"
    assert "rejected the synthetic warmup request" in warmup["skipped"]
    assert "x must be at least 100" in warmup["skipped"]
    assert warmup["batch_sizes"] == [] and warmup["runs"] == 0
    assert predict(p, {"x": np.array([[100.0], [250.0]], np.float32)})["y"].tolist() == [[200.0], [500.0]]
    status, body = p.process(codec.encode_request({"x": np.array([[1.0]], np.float32)}))
    assert status == 400 and b"x must be at least 100" in body


def test_a_rejected_warmup_file_still_rejects_the_version(rejecting_model, tmp_path, make_processor):
    warm = tmp_path / "warmup.bin"
    warm.write_bytes(codec.encode_request({"x": np.array([[1.0]], np.float32)}))
    with pytest.raises(Exception, match="x must be at least 100"):
        make_processor(model_config(rejecting_model, backend="tensorflow", warmup_file_name=str(warm)))


def test_configured_batch_sizes(raw_model, toy_model, tmp_path, make_processor):
    p = make_processor(model_config(raw_model, backend="tensorflow", warmup_batch_sizes=[1, 3, 16]))
    warmup = p.model_info()["warmup"]
    assert warmup["batch_sizes"] == [1, 3, 16] and warmup["batch_runs"] == 3 * SIZE_ROUNDS
    assert p.model_info()["config"]["warmup_batch_sizes"] == [1, 3, 16]

    # a warmup file: 1, powers of two and its largest batch
    warm = tmp_path / "warmup.bin"
    warm.write_bytes(codec.encode_request({"x": np.arange(6, dtype=np.float32).reshape(6, 1)}))
    p2 = make_processor(model_config(toy_model, warmup_file_name=str(warm)))
    assert p2.model_info()["warmup"]["batch_sizes"] == [1, 2, 4, 6]

    # batching: its allowed sizes (and 1)
    p3 = make_processor(model_config(toy_model, batching={"max_batch_size": 32, "allowed_batch_sizes": [8, 32]}))
    assert p3.model_info()["warmup"]["batch_sizes"] == [1, 8, 32]


@pytest.mark.parametrize("value", ["8", 8, [], [0], [4, 2], [2, 2], [True], [1.5], ["4"], [70000],
                                   list(range(1, 18)), {"a": 1}])
def test_warmup_batch_sizes_strict(toy_model, make_processor, value):
    with pytest.raises(ConfigError, match="^warmup_batch_sizes"):
        make_processor(model_config(toy_model, warmup_batch_sizes=value))


@pytest.mark.parametrize("op", ["ParseSingleExample", "ParseExample"])
def test_other_parse_ops_get_a_minimal_example(op, tmp_path):
    """tf.io.parse_single_example (a reshaped scalar input) and the v1 ParseExample op."""
    import tensorflow as tf
    from processor.dtypes import DT_STRING
    from processor.signature import Signature, TensorSpec

    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session() as sess:
        single = op == "ParseSingleExample"
        serialized = tf.compat.v1.placeholder(tf.string, [] if single else [None], name="ex")
        if single:
            dense = tf.io.parse_single_example(serialized, {"a": tf.io.FixedLenFeature([3], tf.float32),
                                                            "b": tf.io.VarLenFeature(tf.int64)})["a"]
        else:
            dense = tf.raw_ops.ParseExample(
                serialized=serialized, names=[], sparse_keys=[tf.constant("b")], dense_keys=[tf.constant("a")],
                dense_defaults=[tf.constant([], tf.float32)], sparse_types=[tf.int64], dense_shapes=[[3]])[3][0]
        builder = tf.compat.v1.saved_model.Builder(str(tmp_path / "sm"))
        builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={
            "serving_default": tf.compat.v1.saved_model.predict_signature_def({"ex": serialized}, {"a": dense})})
        builder.save()
    spec = TensorSpec("ex", "ex:0", DT_STRING, () if single else (-1,))
    found = parse_op_examples(Signature("serving_default", {"ex": spec}, {}), str(tmp_path / "sm"))
    feature = tf.train.Example.FromString(found["ex"]).features.feature
    assert list(feature["a"].float_list.value) == [0.0] * 3 and list(feature["b"].int64_list.value) == [0]
