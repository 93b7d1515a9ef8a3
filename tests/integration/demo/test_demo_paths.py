"""Building on demand, the model_config dicts and the command line."""

from __future__ import annotations

import json

from demo.__main__ import main
from demo.layout import read_model_card
from demo.paths import (
    DEFAULT_DEMO_DIR,
    REPO_ROOT,
    demo_model_config,
    ensure_demo_model,
    ensure_toy_model,
    toy_model_config,
)
from demo.toy_model import write_toy_checkpoint

EXPECTED_SETTINGS = {
    "signature_name": "serving_default",
    "feature_store_type": "memory",
    "serialize_protocol": "protobuf",
    "model_store_type": "local",
    "session_num": 2,
    "select_session_policy": "MOD",
    "inter_op_parallelism_threads": 1,
    "intra_op_parallelism_threads": 2,
}


def test_default_dir_is_under_the_gitignored_artifacts():
    assert DEFAULT_DEMO_DIR == REPO_ROOT / "artifacts" / "demo"
    assert (REPO_ROOT / "pyproject.toml").is_file()


def test_ensure_toy_model_builds_once_per_flavour(tmp_path):
    out = tmp_path / "toy"
    first = ensure_toy_model(out)
    write_toy_checkpoint(first.run_dir, 2, a=1.0, b=1.0)
    again = ensure_toy_model(out)
    assert again.steps == [1, 2]  # reused, kept the added version

    tf2 = ensure_toy_model(out, tf2=True)
    assert tf2.steps == [1] and read_model_card(out)["format"] == "tf2"
    write_toy_checkpoint(tf2.run_dir, 2, a=1.0, b=1.0, tf2=True)
    assert ensure_toy_model(out, tf2=True).steps == [1, 2]  # reused
    forced = ensure_toy_model(out, tf2=True, force=True)
    assert forced == tf2 and forced.steps == [1]  # rebuilt: the added version is gone


def test_ensure_demo_model_reuses_a_matching_build(ctr_model_small):
    pb = ctr_model_small.savedmodel_dir / "saved_model.pb"
    before = pb.stat().st_mtime_ns
    assert ensure_demo_model(ctr_model_small.out_dir, preset="small") == ctr_model_small
    assert pb.stat().st_mtime_ns == before


def test_model_configs(ctr_model_small, tmp_path):
    config = demo_model_config(ctr_model_small)
    assert config == {
        "savedmodel_dir": str(ctr_model_small.savedmodel_dir),
        "checkpoint_dir": str(ctr_model_small.checkpoint_dir),
        **EXPECTED_SETTINGS,
    }
    toy = ensure_toy_model(tmp_path / "toy")
    assert toy_model_config(toy) == {
        "savedmodel_dir": str(tmp_path / "toy" / "savedmodel"),
        "checkpoint_dir": str(tmp_path / "toy" / "checkpoints"),
        **EXPECTED_SETTINGS,
    }


def test_cli(ctr_model_small, tmp_path, capsys):
    assert main(["toy", "--out", str(tmp_path / "toy"), "--tf2"]) == 0
    toy = json.loads(capsys.readouterr().out)
    assert toy["steps"] == [1]
    assert toy["model_config"]["savedmodel_dir"] == str(tmp_path / "toy" / "savedmodel")
    assert read_model_card(tmp_path / "toy")["format"] == "tf2"

    assert main(["build", "--out", str(ctr_model_small.out_dir), "--preset", "small"]) == 0
    built = json.loads(capsys.readouterr().out)
    assert built["latest_checkpoint_prefix"] == str(ctr_model_small.latest_checkpoint_prefix)
    assert built["model_config"] == demo_model_config(ctr_model_small)
