"""A ``.onnx`` source imported in a child process (processor/engine/onnx/import_child.py).

The child's entry equals the in-process one (graph, weights, manifest); its errors come back as
the same class and message; a child that ends without a result fails the import with Internal;
a model served from a child's entry answers as one imported in-process.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from demo import dlrm_onnx
from processor.engine.onnx import import_child
from processor.engine.onnx.import_child import RESULT, import_model
from processor.errors import Internal
from processor.processor import Processor


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    return dlrm_onnx.build(tmp_path_factory.mktemp("dlrm") / "model.onnx", rows=500, dim=8, seed=3)


@pytest.fixture
def in_child(monkeypatch):
    """in_child(True): every import in a child; in_child(False): every one in-process."""
    return lambda child: monkeypatch.setattr(import_child, "CHILD_MIN_BYTES", 0 if child else 1 << 62)


def _import(path, work, in_child, child: bool) -> dict:
    in_child(child)
    work.mkdir()
    return import_model(str(path), work)


def test_the_child_writes_the_entry_the_process_writes(model_file, tmp_path, in_child):
    here = _import(model_file, tmp_path / "here", in_child, child=False)
    child = _import(model_file, tmp_path / "child", in_child, child=True)
    assert child == here
    assert (tmp_path / "child" / "weights.bin").read_bytes() == (tmp_path / "here" / "weights.bin").read_bytes()
    assert onnx.load(str(tmp_path / "child" / "model.onnx"), load_external_data=False) == \
        onnx.load(str(tmp_path / "here" / "model.onnx"), load_external_data=False)
    assert not (tmp_path / "child" / RESULT).exists()  # read and removed


def test_a_file_below_the_size_is_imported_in_process(model_file, tmp_path, monkeypatch, in_child):
    monkeypatch.setattr(import_child.sys, "executable", "/bin/false")  # a child would fail
    monkeypatch.setattr(import_child, "CHILD_MIN_BYTES", model_file.stat().st_size + 1)
    work = tmp_path / "w"
    work.mkdir()
    assert import_model(str(model_file), work)["source"]["path"] == str(model_file)
    monkeypatch.setattr(import_child, "CHILD_MIN_BYTES", model_file.stat().st_size)
    with pytest.raises(Internal, match="its process ended"):
        import_model(str(model_file), work)


def test_an_unreadable_model_fails_as_in_process(tmp_path, in_child):
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"\x0a\xff\xff\xff this is not a model")
    with pytest.raises(Internal) as here:
        _import(bad, tmp_path / "here", in_child, child=False)
    with pytest.raises(Internal) as child:
        _import(bad, tmp_path / "child", in_child, child=True)
    assert child.value.message == here.value.message
    assert "cannot read ONNX model" in child.value.message


def test_a_child_that_ends_without_a_result_fails_the_import(model_file, tmp_path, monkeypatch, in_child):
    monkeypatch.setattr(import_child.sys, "executable", "/bin/false")
    with pytest.raises(Internal) as err:
        _import(model_file, tmp_path / "w", in_child, child=True)
    assert "its process ended with exit status 1" in err.value.message and str(model_file) in err.value.message


def test_a_model_from_the_childs_entry_serves_as_one_imported_here(model_file, tmp_path, monkeypatch, in_child):
    from processor.codec import decode_response, encode_request

    request = encode_request(dlrm_onnx.inputs(4, seed=4))
    # per-session pools: ORT's global pools are process state every later session here would take
    config = json.dumps({"savedmodel_dir": str(model_file.parent), "backend": "onnxruntime", "session_num": 1,
                         "use_per_session_threads": True})
    answers = []
    for child in (False, True):
        monkeypatch.setenv("SP_ONNX_CACHE_DIR", str(tmp_path / f"cache-{child}"))
        in_child(child)
        processor = Processor.create("m", config)
        try:
            status, body = processor.process(request)
            assert status == 200, body
            answers.append(decode_response(body))
        finally:
            processor.close()
    assert answers[0].keys() == answers[1].keys()
    for name, value in answers[0].items():
        np.testing.assert_allclose(answers[1][name], value, rtol=1e-6, atol=1e-7)

