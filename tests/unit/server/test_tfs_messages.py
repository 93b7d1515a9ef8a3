"""``server/tfserving/messages.py``: TF Serving's messages from a private pool, without TensorFlow.

Checked against the real pb2 modules (this process may import TensorFlow): the same files
(byte-identical FileDescriptorProtos), the same full names, the same bytes for messages built
field by field both ways, each parsing the other's bytes; the enums' values; ``Any.Pack``'s
type URL. Building the pool imports no TensorFlow (a fresh interpreter); a missing package or a
file that is not protoc's is an ImportError; concurrent first calls build one pool.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from dataclasses import fields
from pathlib import Path

import pytest

from server.tfserving import messages as tfs_messages

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def real():
    """The real pb2 modules' classes, by the names of :class:`tfs_messages.Messages`."""
    pytest.importorskip("tensorflow_serving")
    from tensorflow.core.framework import tensor_shape_pb2
    from tensorflow.core.protobuf import error_codes_pb2, meta_graph_pb2
    from tensorflow_serving.apis import (classification_pb2, get_model_metadata_pb2, get_model_status_pb2,
                                         inference_pb2, model_management_pb2, predict_pb2, regression_pb2)
    from tensorflow_serving.config import model_server_config_pb2

    modules = (predict_pb2, classification_pb2, regression_pb2, inference_pb2, get_model_metadata_pb2,
               get_model_status_pb2, model_management_pb2, model_server_config_pb2, meta_graph_pb2,
               tensor_shape_pb2)
    out = {f.name: getattr(next(m for m in modules if hasattr(m, f.name)), f.name)
           for f in fields(tfs_messages.Messages) if f.name != "ErrorCode"}
    out["ErrorCode"] = error_codes_pb2.Code
    return out


def test_the_same_files_and_full_names_as_the_pb2_modules(real):
    ours = tfs_messages.messages()
    for name, cls in real.items():
        if name == "ErrorCode":
            assert dict(ours.ErrorCode.items()) == dict(cls.items())
            continue
        mine = getattr(ours, name)
        assert mine.DESCRIPTOR.full_name == cls.DESCRIPTOR.full_name
        assert mine.DESCRIPTOR.file.serialized_pb == cls.DESCRIPTOR.file.serialized_pb, name
        assert mine is not cls  # another pool: never the default pool's class


def _fill_predict(request) -> None:
    request.model_spec.name = "m"
    request.model_spec.version.value = 7
    request.model_spec.signature_name = "serving_default"
    for key, values in (("b", [1.5, 2.5]), ("a", [3.0])):
        tensor = request.inputs[key]
        tensor.dtype = 1  # DT_FLOAT
        tensor.tensor_shape.dim.add(size=len(values))
        tensor.float_val.extend(values)
    request.output_filter.append("y")


def _fill_classification(request) -> None:
    request.model_spec.name = "m"
    request.model_spec.version_label = "stable"
    listed = request.input.example_list_with_context
    listed.context.features.feature["user"].bytes_list.value.append(b"u1")
    for i in range(2):
        features = listed.examples.add().features.feature
        features["age"].int64_list.value.append(30 + i)
        features["score"].float_list.value.extend([0.5, 0.25 * i])


def _fill_status(response, state: int, not_found: int) -> None:
    item = response.model_version_status.add(version=3, state=state)
    item.status.error_code = not_found
    item.status.error_message = "gone"


def _fill_metadata(response, sig_map, signature_def, tensor_info, shape) -> None:
    sig = signature_def(method_name="tensorflow/serving/predict")
    sig.inputs["x"].CopyFrom(tensor_info(name="x:0", dtype=1, tensor_shape=shape(unknown_rank=True)))
    out_shape = shape()
    out_shape.dim.add(size=-1)
    sig.outputs["y"].CopyFrom(tensor_info(name="y:0", dtype=1, tensor_shape=out_shape))
    sig_map.signature_def["serving_default"].CopyFrom(sig)
    response.model_spec.name = "m"
    response.model_spec.version.value = 2
    response.metadata["signature_def"].Pack(sig_map)


def _same_bytes(mine, theirs) -> None:
    data = theirs.SerializeToString(deterministic=True)
    assert mine.SerializeToString(deterministic=True) == data
    assert type(mine).FromString(data) == mine
    assert type(theirs).FromString(mine.SerializeToString()) == theirs


def test_messages_serialize_byte_identically_to_the_pb2_ones(real):
    ours = tfs_messages.messages()
    mine, theirs = ours.PredictRequest(), real["PredictRequest"]()
    _fill_predict(mine)
    _fill_predict(theirs)
    _same_bytes(mine, theirs)
    mine, theirs = ours.ClassificationRequest(), real["ClassificationRequest"]()
    _fill_classification(mine)
    _fill_classification(theirs)
    _same_bytes(mine, theirs)
    mine, theirs = ours.GetModelStatusResponse(), real["GetModelStatusResponse"]()
    _fill_status(mine, ours.ModelVersionStatus.State.Value("AVAILABLE"), ours.ErrorCode.Value("NOT_FOUND"))
    _fill_status(theirs, real["ModelVersionStatus"].AVAILABLE, real["ErrorCode"].Value("NOT_FOUND"))
    _same_bytes(mine, theirs)
    mine, theirs = ours.GetModelMetadataResponse(), real["GetModelMetadataResponse"]()
    _fill_metadata(mine, ours.SignatureDefMap(), ours.SignatureDef, ours.TensorInfo, ours.TensorShapeProto)
    _fill_metadata(theirs, real["SignatureDefMap"](), real["SignatureDef"], real["TensorInfo"],
                   real["TensorShapeProto"])
    assert mine.metadata["signature_def"].type_url == "type.googleapis.com/tensorflow.serving.SignatureDefMap"
    _same_bytes(mine, theirs)
    unpacked = real["SignatureDefMap"]()
    assert real["GetModelMetadataResponse"].FromString(mine.SerializeToString()).metadata["signature_def"].Unpack(
        unpacked)
    assert unpacked.signature_def["serving_default"].outputs["y"].tensor_shape.dim[0].size == -1


def test_building_them_imports_no_tensorflow():
    code = ("import sys; from server.tfserving import messages as tfs_messages; m = tfs_messages.messages(); "
            "m.PredictRequest();"
            "loaded = sorted(n for n in sys.modules if n.split('.')[0] in ('tensorflow', 'tensorflow_serving'));"
            "print(loaded); sys.exit(1 if loaded else 0)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture
def unbuilt(monkeypatch):
    """:func:`tfs_messages.messages` as on its first call (the built pool restored after)."""
    monkeypatch.setattr(tfs_messages, "_built", None)


def test_a_missing_package_is_an_import_error_and_a_later_call_tries_again(unbuilt, monkeypatch):
    monkeypatch.setattr(tfs_messages, "_ROOTS", ("no_such_serving_package.apis.predict_pb2",))
    with pytest.raises(ModuleNotFoundError, match="no_such_serving_package"):
        tfs_messages.messages()
    monkeypatch.undo()
    monkeypatch.setattr(tfs_messages, "_built", None)
    assert tfs_messages.messages().PredictRequest.DESCRIPTOR.full_name == "tensorflow.serving.PredictRequest"


def test_the_grpc_api_is_disabled_with_a_warning_without_the_package(unbuilt, monkeypatch, caplog):
    from server.tfserving import grpc_service as tfs

    monkeypatch.setattr(tfs_messages, "_ROOTS", ("no_such_serving_package.apis.predict_pb2",))
    assert tfs.services(rt=None, admin=None) == []
    assert "TF Serving gRPC API disabled" in caplog.text


def test_a_file_that_is_not_protocs_is_an_import_error(tmp_path):
    path = tmp_path / "odd_pb2.py"
    path.write_text("DESCRIPTOR = build(b'\\n\\x03abc')\n")
    with pytest.raises(ImportError, match="AddSerializedFile"):
        tfs_messages._read(path)
    path.write_text("DESCRIPTOR = pool.AddSerializedFile(load('x'))\n")  # not a literal: never run
    with pytest.raises(ImportError, match="AddSerializedFile"):
        tfs_messages._read(path)


def test_concurrent_first_calls_build_one_pool(unbuilt):
    got: list = []
    threads = [threading.Thread(target=lambda: got.append(tfs_messages.messages())) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(got) == 4 and all(m is got[0] for m in got)
