"""The CTR presets' sizes and build_ctr_model's argument checks (no model is built)."""

from __future__ import annotations

import pytest

from demo.ctr_model import build_ctr_model
from demo.ctr_spec import PRESETS


def test_presets_have_the_promised_sizes():
    full, small = PRESETS["full"], PRESETS["small"]
    assert [t.feature for t in full.tables] == [f"C{i}" for i in range(1, 27)]
    assert min(t.rows for t in full.tables) == 1_000 and max(t.rows for t in full.tables) == 1_000_000
    assert {t.dim for t in full.tables} == {16, 32, 64}
    assert sum(t.rows * t.dim for t in full.tables) * 4 <= 200e6
    assert max(t.rows for t in small.tables) <= 5_000
    assert [t.dim for t in small.tables] == [t.dim for t in full.tables]


def test_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="preset"):
        build_ctr_model(tmp_path, preset="huge")
    with pytest.raises(ValueError, match="versions"):
        build_ctr_model(tmp_path, preset="small", versions=0)
    assert list(tmp_path.iterdir()) == []
