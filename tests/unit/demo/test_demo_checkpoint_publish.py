"""Checkpoints become visible only when complete."""

from __future__ import annotations

from pathlib import Path

import pytest

from demo.checkpoint_publish import publish_checkpoint
from demo.layout import list_checkpoint_steps


def _fake_writer(prefix: str) -> None:
    Path(prefix + ".data-00000-of-00001").write_bytes(b"data")
    Path(prefix + ".index").write_bytes(b"index")


def test_publishes_and_keeps_the_state_file_on_the_highest_step(tmp_path):
    assert publish_checkpoint(tmp_path, 20, _fake_writer) == tmp_path.resolve() / "model.ckpt-20"
    publish_checkpoint(tmp_path, 10, _fake_writer)

    assert list_checkpoint_steps(tmp_path) == [10, 20]
    assert (tmp_path / "checkpoint").read_text() == (
        'model_checkpoint_path: "model.ckpt-20"\n'
        'all_model_checkpoint_paths: "model.ckpt-10"\n'
        'all_model_checkpoint_paths: "model.ckpt-20"\n'
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint",
        "model.ckpt-10.data-00000-of-00001",
        "model.ckpt-10.index",
        "model.ckpt-20.data-00000-of-00001",
        "model.ckpt-20.index",
    ]


def test_failed_write_publishes_nothing(tmp_path):
    def failing_writer(prefix: str) -> None:
        Path(prefix + ".data-00000-of-00001").write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        publish_checkpoint(tmp_path, 5, failing_writer)
    def data_only_writer(prefix: str) -> None:
        Path(prefix + ".data-00000-of-00001").write_bytes(b"data")

    with pytest.raises(RuntimeError, match="no complete checkpoint"):
        publish_checkpoint(tmp_path, 5, data_only_writer)
    assert list(tmp_path.iterdir()) == []


def test_refuses_to_replace_a_published_step(tmp_path):
    publish_checkpoint(tmp_path, 1, _fake_writer)
    with pytest.raises(FileExistsError):
        publish_checkpoint(tmp_path, 1, _fake_writer)
