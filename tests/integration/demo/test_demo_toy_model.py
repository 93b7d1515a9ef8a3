"""The toy model y = a*x + b, TF1 and TF2 flavours, loaded with plain TF."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from demo.layout import read_model_card, read_model_paths
from demo.toy_model import build_toy_model, write_toy_checkpoint



def y_at_one(model) -> float:
    """The model's output for x = 1.0, checking the output shape on the way."""
    y = model.run({"x": np.array([[1.0]], dtype=np.float32)})["y"]
    assert y.shape == (1, 1) and y.dtype == np.float32
    return y.item()


@pytest.mark.parametrize("tf2", [False, True], ids=["tf1", "tf2"])
def test_serves_savedmodel_values_then_newest_checkpoint(tmp_path, load_model, tf2):
    paths = build_toy_model(tmp_path / "toy", tf2=tf2)
    assert paths.steps == [1]

    model = load_model(paths.savedmodel_dir)
    assert y_at_one(model) == pytest.approx(2.5)
    model.restore(paths.latest_checkpoint_prefix)
    assert y_at_one(model) == pytest.approx(2.5)

    write_toy_checkpoint(paths.run_dir, 2, a=1.5, b=-1.0, tf2=tf2)
    newest = read_model_paths(paths.out_dir)
    assert newest.steps == [1, 2]
    assert tf.train.latest_checkpoint(str(paths.run_dir)) == str(newest.latest_checkpoint_prefix)

    model.restore(newest.latest_checkpoint_prefix)
    y = model.run({"x": np.array([[1.0], [2.0]], dtype=np.float32)})["y"]
    np.testing.assert_allclose(y, [[0.5], [2.0]])
    model.restore(newest.checkpoint_prefixes[0])
    assert y_at_one(model) == pytest.approx(2.5)


@pytest.mark.parametrize("tf2", [False, True], ids=["tf1", "tf2"])
def test_signature_and_saver_def(tmp_path, load_model, tf2):
    paths = build_toy_model(tmp_path / "toy", tf2=tf2)
    model = load_model(paths.savedmodel_dir)

    signature = model.signature
    assert signature.method_name == "tensorflow/serving/predict"
    assert set(signature.inputs) == {"x"} and set(signature.outputs) == {"y"}
    for info in (signature.inputs["x"], signature.outputs["y"]):
        assert info.dtype == tf.float32.as_datatype_enum
        assert [d.size for d in info.tensor_shape.dim] == [-1, 1]
    if not tf2:
        assert (signature.inputs["x"].name, signature.outputs["y"].name) == ("x:0", "y:0")
    assert model.meta_graph.saver_def.restore_op_name
    assert model.meta_graph.saver_def.filename_tensor_name

    card = read_model_card(paths.out_dir)
    assert card["format"] == ("tf2" if tf2 else "tf1")
    assert card["inputs"]["x"]["name"] == signature.inputs["x"].name
    assert card["steps"] == [1]


def test_checkpoint_keys_match_each_flavour(tmp_path):
    tf1 = build_toy_model(tmp_path / "tf1")
    tf2 = build_toy_model(tmp_path / "tf2", tf2=True)

    assert {name for name, _ in tf.train.list_variables(str(tf1.latest_checkpoint_prefix))} == {"a", "b", "c"}
    tf2_keys = {name for name, _ in tf.train.list_variables(str(tf2.latest_checkpoint_prefix))}
    assert {f"{name}/.ATTRIBUTES/VARIABLE_VALUE" for name in "abc"} <= tf2_keys
    reader = tf.train.load_checkpoint(str(tf1.latest_checkpoint_prefix))
    assert (reader.get_tensor("a"), reader.get_tensor("b"), reader.get_tensor("c")) == (0.5, 2.0, 3.0)


def test_refuses_to_overwrite(tmp_path):
    paths = build_toy_model(tmp_path / "toy")
    with pytest.raises(FileExistsError):
        build_toy_model(tmp_path / "toy")
    with pytest.raises(FileExistsError):
        write_toy_checkpoint(paths.run_dir, 1, a=9.0, b=9.0)
    reader = tf.train.load_checkpoint(str(paths.latest_checkpoint_prefix))
    assert reader.get_tensor("a") == 0.5
