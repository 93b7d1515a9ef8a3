"""The small CTR preset: signature, outputs, versions restored through saver_def, file layout."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from demo.ctr_model import synthetic_batch
from demo.ctr_spec import get_preset
from demo.layout import read_model_card

EXPECTED_INPUTS = {
    "dense": ("dense:0", tf.float32, [-1, 13]),
    "sparse_ids": ("sparse_ids:0", tf.int64, [-1, 20]),
    "sparse_tokens": ("sparse_tokens:0", tf.string, [-1, 6]),
}
EXPECTED_OUTPUTS = {
    "probability": ("probability:0", tf.float32, [-1, 1]),
    "logits": ("logits:0", tf.float32, [-1, 1]),
}


def _describe(infos):
    return {
        alias: (info.name, tf.dtypes.as_dtype(info.dtype), [d.size for d in info.tensor_shape.dim])
        for alias, info in infos.items()
    }


def test_signature(ctr_model_small, load_model):
    model = load_model(ctr_model_small.savedmodel_dir)
    assert model.signature.method_name == "tensorflow/serving/predict"
    assert _describe(model.signature.inputs) == EXPECTED_INPUTS
    assert _describe(model.signature.outputs) == EXPECTED_OUTPUTS
    assert model.meta_graph.saver_def.restore_op_name


def test_outputs_are_probabilities_for_any_ids(ctr_model_small, load_model):
    model = load_model(ctr_model_small.savedmodel_dir)
    feeds = synthetic_batch(64, seed=7)
    extreme = np.iinfo(np.int64)
    feeds["sparse_ids"][:3] = [[extreme.min], [extreme.max], [-1]]
    feeds["sparse_tokens"][0] = [b"", b"\xff\x00", "\u00e9t\u00e9".encode(), b"x" * 300, b"0", b" "]

    out = model.run(feeds)

    probability, logits = out["probability"], out["logits"]
    assert probability.shape == logits.shape == (64, 1)
    assert probability.dtype == logits.dtype == np.float32
    assert np.all((probability > 0.0) & (probability < 1.0))
    np.testing.assert_allclose(probability, 1.0 / (1.0 + np.exp(-logits)), rtol=1e-5)
    np.testing.assert_array_equal(model.run(feeds)["probability"], probability)


def test_saver_def_restores_each_version(ctr_model_small, load_model):
    model = load_model(ctr_model_small.savedmodel_dir)
    exported = model.variable_values()
    feeds = synthetic_batch(32, seed=3)
    exported_prediction = model.run(feeds)["probability"]

    model.restore(ctr_model_small.checkpoint_prefixes[0])
    older = model.variable_values()
    assert older.keys() == exported.keys()
    assert any(not np.array_equal(older[name], exported[name]) for name in exported)
    assert not np.allclose(model.run(feeds)["probability"], exported_prediction)

    model.restore(ctr_model_small.latest_checkpoint_prefix)
    newest = model.variable_values()
    for name, value in exported.items():
        np.testing.assert_array_equal(newest[name], value, err_msg=name)
    np.testing.assert_array_equal(model.run(feeds)["probability"], exported_prediction)


def test_files_laid_out_as_designed(ctr_model_small):
    spec = get_preset("small")
    assert ctr_model_small.checkpoint_dir == ctr_model_small.out_dir / "checkpoints"
    assert ctr_model_small.run_dir == ctr_model_small.checkpoint_dir / "run_1"
    assert ctr_model_small.steps == [spec.steps_per_version, 2 * spec.steps_per_version]
    assert ctr_model_small.checkpoint_prefixes == [ctr_model_small.run_dir / f"model.ckpt-{s}" for s in ctr_model_small.steps]

    assert (ctr_model_small.savedmodel_dir / "saved_model.pb").is_file()
    assert (ctr_model_small.savedmodel_dir / "variables" / "variables.index").is_file()
    run_files = sorted(p.name for p in ctr_model_small.run_dir.iterdir())
    expected = ["checkpoint"]
    for step in ctr_model_small.steps:
        expected += [f"model.ckpt-{step}.data-00000-of-00001", f"model.ckpt-{step}.index"]
    assert run_files == sorted(expected)  # no temporary leftovers, no .meta files

    state = tf.train.get_checkpoint_state(str(ctr_model_small.run_dir))
    assert state.model_checkpoint_path == str(ctr_model_small.latest_checkpoint_prefix)
    assert list(state.all_model_checkpoint_paths) == [str(p) for p in ctr_model_small.checkpoint_prefixes]
    assert '"model.ckpt-' in (ctr_model_small.run_dir / "checkpoint").read_text()  # relative paths


def test_checkpoints_hold_only_model_variables(ctr_model_small):
    spec = get_preset("small")
    stored = dict(tf.train.list_variables(str(ctr_model_small.latest_checkpoint_prefix)))
    tables = {t.name: [t.rows, t.dim] for t in spec.tables}
    assert {name: stored[name] for name in tables} == tables
    dense = set(stored) - set(tables)
    assert dense == {
        "mlp/layer_1/kernel", "mlp/layer_1/bias", "mlp/layer_2/kernel", "mlp/layer_2/bias",
        "mlp/output/kernel", "mlp/output/bias", "wide/kernel", "wide/bias",
    }  # fmt: skip


def test_model_card(ctr_model_small):
    card = read_model_card(ctr_model_small.out_dir)
    spec = get_preset("small")
    assert card["preset"] == "small"
    assert card["steps"] == ctr_model_small.steps
    assert [(t["name"], t["rows"], t["dim"]) for t in card["tables"]] == [
        (t.name, t.rows, t.dim) for t in spec.tables
    ]
    assert {alias: v["name"] for alias, v in card["inputs"].items()} == {
        alias: name for alias, (name, _, _) in EXPECTED_INPUTS.items()
    }
    assert set(card["outputs"]) == set(EXPECTED_OUTPUTS)
    assert 0.5 < card["evaluation"]["auc"] <= card["evaluation"]["oracle_auc"]
    assert card["parameters"]["bytes"] == 4 * card["parameters"]["total"]
