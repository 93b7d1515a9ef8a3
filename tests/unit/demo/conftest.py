"""Fixtures for the demo-model tests: one small CTR build per session, and a plain-TF loader."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import tensorflow as tf

from demo.ctr_model import build_ctr_model
from demo.layout import ModelPaths


class LoadedModel:
    """A SavedModel loaded with plain TF1 APIs into its own graph and session."""

    def __init__(self, savedmodel_dir: Path) -> None:
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
            variables = tf.compat.v1.global_variables()
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


@pytest.fixture(scope="session")
def small_ctr(tmp_path_factory: pytest.TempPathFactory) -> ModelPaths:
    """The small CTR preset, two versions, built once for the whole session. Do not modify."""
    return build_ctr_model(tmp_path_factory.mktemp("ctr") / "model", preset="small", versions=2, seed=0)
