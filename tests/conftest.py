"""Shared fixtures: real models built once per test session into a temporary directory."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

# TensorFlow's C++ logging drowns test output; errors still show.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _native_grpc_first() -> None:
    """Load the native gRPC server (where it is built) before any test loads TensorFlow, as
    ``python -m server`` does: its gRPC library binds its OpenSSL calls when it is loaded
    (server/grpc/native_server.py native_module), and the in-process servers of the tests serve
    TLS with it."""
    from processor.errors import ConfigError
    from server.grpc.native_server import native_module

    try:
        native_module()
    except ConfigError:  # not built: the Python gRPC server serves
        pass


_native_grpc_first()


@pytest.fixture(autouse=True, scope="session")
def onnx_cache(tmp_path_factory):
    """One ONNX conversion cache for the test session, never the user's ~/.cache."""
    mp = pytest.MonkeyPatch()
    mp.setenv("SP_ONNX_CACHE_DIR", str(tmp_path_factory.mktemp("onnx_cache")))
    yield
    mp.undo()


def _tensorflow() -> None:
    """Skip, saying why, where TensorFlow is not installed: a GPU host's environment may hold only
    ONNX Runtime (scripts/gpu_check.sh); CI installs it, so nothing is skipped there."""
    pytest.importorskip("tensorflow", reason="TensorFlow builds this model and is not installed")


@pytest.fixture(scope="session")
def toy_model(tmp_path_factory):
    """DeepRec's toy y = 0.5*x + 2, TF1-exported, with one full checkpoint."""
    _tensorflow()
    from demo.toy_model import build_toy_model

    return build_toy_model(tmp_path_factory.mktemp("toy") / "model")


@pytest.fixture(scope="session")
def toy_model_tf2(tmp_path_factory):
    """The toy exported with tf.saved_model.save (TF2 object-based checkpoint keys)."""
    _tensorflow()
    from demo.toy_model import build_toy_model

    return build_toy_model(tmp_path_factory.mktemp("toy2") / "model", tf2=True)


@pytest.fixture(scope="session")
def ctr_model_small(tmp_path_factory):
    """The demo CTR model (small preset: same structure, small tables), two full versions."""
    _tensorflow()
    from demo.ctr_model import build_ctr_model

    return build_ctr_model(tmp_path_factory.mktemp("ctr") / "model", preset="small", versions=2)


@pytest.fixture
def redis():
    """A redis-server of the test's own on a free loopback port, stopped after it."""
    from tools.local_redis import LocalRedis

    server = LocalRedis()
    yield server
    server.close()


def model_config(paths, **overrides) -> dict:
    """A DeepRec-style model_config for a demo.layout.ModelPaths (see demo.paths.model_config)."""
    from demo.paths import model_config as base_config

    return base_config(paths, **overrides)


@pytest.fixture
def make_processor():
    """Factory: a Processor from a config dict; closed at the end of the test."""
    from processor.processor import Processor

    made = []

    def make(config: dict, name: str = ""):
        processor = Processor.create(name, json.dumps(config))
        made.append(processor)
        return processor

    yield make
    for processor in made:
        processor.close()


def plain_tf_predict(savedmodel_dir, checkpoint_prefix, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The reference: plain TensorFlow on the SavedModel graph with a checkpoint restored."""
    model = LoadedModel(savedmodel_dir)
    try:
        if checkpoint_prefix is not None:
            model.restore(checkpoint_prefix)
        return model.run(feeds)
    finally:
        model.close()


class LoadedModel:
    """A SavedModel loaded with plain TF1 APIs into its own graph and session."""

    def __init__(self, savedmodel_dir: Path) -> None:
        # imported here: a GPU host (scripts/gpu_check.sh) runs the tests without TensorFlow
        import tensorflow as tf

        self.graph = tf.Graph()
        self.session = tf.compat.v1.Session(graph=self.graph)
        self.meta_graph = tf.compat.v1.saved_model.loader.load(
            self.session, [tf.saved_model.SERVING], str(savedmodel_dir)
        )
        self.signature = self.meta_graph.signature_def["serving_default"]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run every signature output for ``feeds`` keyed by input alias."""
        fetches = {alias: info.name for alias, info in self.signature.outputs.items()}
        feed_dict = {self.signature.inputs[alias].name: value for alias, value in feeds.items()}
        return self.session.run(fetches, feed_dict)

    def restore(self, prefix: Path) -> None:
        """Load a checkpoint through the MetaGraphDef's saver_def, as a server would."""
        saver_def = self.meta_graph.saver_def
        self.session.run(saver_def.restore_op_name, {saver_def.filename_tensor_name: str(prefix)})

    def variable_values(self) -> dict[str, np.ndarray]:
        """Current value of every global variable, by variable name."""
        with self.graph.as_default():
            variables = self.graph.get_collection("variables")
        values = self.session.run(variables)
        return {v.op.name: value for v, value in zip(variables, values, strict=True)}

    def close(self) -> None:
        self.session.close()


@pytest.fixture
def load_model() -> Iterator[Callable[[Path], LoadedModel]]:
    """Factory loading a SavedModel; every model it loaded is closed at teardown."""
    loaded: list[LoadedModel] = []

    def load(savedmodel_dir: Path) -> LoadedModel:
        model = LoadedModel(savedmodel_dir)
        loaded.append(model)
        return model

    yield load
    for model in loaded:
        model.close()




@pytest.fixture
def shm_worker(tmp_path, monkeypatch) -> Iterator[Path]:
    """This process as a worker of server id 424242 (processor.shared_segments) with its
    segments in ``tmp_path / "shm"``, which it yields; not a worker again afterwards."""
    from processor import shared_segments

    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(shared_segments, "_active", None)
    shared_segments.enable("424242", shm)
    yield shm
    monkeypatch.setattr(shared_segments, "_active", None)
