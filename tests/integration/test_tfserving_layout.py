"""TF Serving's model layout as ``savedmodel_dir``: ``<base>/<version>/saved_model.pb``.

Real toy SavedModels (y = a*x + b) with different variable values in ``<base>/1``, ``<base>/2`` ...:
the newest complete version serves, a new directory is picked up by the watcher, a half-written
one is ignored, a broken one keeps the previous serving, pins and restore_model_version name a
number, and TF Serving's model status reports it.
"""

import os
import shutil

import numpy as np
import pytest

from processor import codec
from sp_checks import wait_for
from processor.errors import ConfigError, NotFound
from processor.store.checkpoint_layout import latest_version, version_dirs
from processor.store.model_store import ModelStore
from models.toy_versions import copy_version, export_versions

POLL = 0.2
X1 = {"x": np.array([[1.0]], np.float32)}


@pytest.fixture(scope="module")
def versions(tmp_path_factory):
    """Pristine version directories to copy from: 1 -> y = x + 1, 2 -> y = 2x + 1, 3 -> y = 3x + 1."""
    src = tmp_path_factory.mktemp("tfs") / "src"
    return export_versions(src, (1, 2, 3))


def config(base, **overrides):
    cfg = {"savedmodel_dir": str(base), "signature_name": "serving_default",
           "file_system_poll_wait_seconds": POLL, "init_timeout_minutes": 0}
    cfg.update(overrides)
    return cfg


def predict(processor):
    status, body = processor.process(codec.encode_request(X1))
    assert status == 200, body
    return codec.decode_response(body)["y"].tolist()


def label(processor):
    return processor.model_info()["version"]["label"]


# --- layout alone ---------------------------------------------------------------------------


def test_layout_lists_complete_versions_only(versions, tmp_path):
    base = tmp_path / "m"
    copy_version(versions, base, 1)
    copy_version(versions, base, 2)
    (base / "3").mkdir()  # being written: no saved_model.pb yet
    half = base / "4"
    half.mkdir()
    shutil.copy(versions / "1" / "saved_model.pb", half)  # pb but no variables index yet
    (base / "tmp").mkdir()  # not a number
    store = ModelStore()
    assert sorted(version_dirs(store, str(base))) == [1, 2]
    v = latest_version(store, str(base), None)
    assert (v.full_step, v.delta_step, v.label, v.is_version_dir) == (2, -1, "2", True)
    assert v.savedmodel_dir == str(base / "2") and v.full_prefix == ""
    assert latest_version(store, str(base), None, pin_step=1).savedmodel_dir == str(base / "1")
    with pytest.raises(NotFound, match=r"versions: \[1, 2\]"):
        latest_version(store, str(base), None, pin_step=4)
    with pytest.raises(ConfigError, match="checkpoint_dir"):
        latest_version(store, str(base), str(tmp_path / "ck"))
    # a version directory itself is a plain SavedModel, as before
    plain = latest_version(store, str(base / "1"), None)
    assert (plain.full_step, plain.savedmodel_dir, plain.is_version_dir) == (-1, str(base / "1"), False)


# --- serving --------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["tensorflow", "onnxruntime"])
def test_newest_serves_and_a_new_version_is_picked_up(backend, versions, tmp_path, make_processor):
    base = tmp_path / "m"
    copy_version(versions, base, 1)
    copy_version(versions, base, 2)
    p = make_processor(config(base, backend=backend))
    assert label(p) == "2" and predict(p) == [[3.0]]
    info = p.model_info()
    assert info["session_group"]["engine"] == backend
    assert info["version"]["savedmodel_dir"] == str(base / "2")
    assert info["version"]["why"] == "newest version directory"
    assert info["watcher"] is not None

    # a directory being written is ignored; once complete it serves
    (base / "3").mkdir()
    shutil.copy(versions / "3" / "saved_model.pb", base / "3")
    polls = p.model_info()["watcher"]["polls"]
    # Not a sleep: the watcher has looked at the incomplete directory (a whole poll round since).
    assert wait_for(timeout=30, predicate=lambda: p.model_info()["watcher"]["polls"] >= polls + 2)
    assert label(p) == "2" and predict(p) == [[3.0]]
    shutil.copytree(versions / "3" / "variables", base / "3" / "variables")
    assert wait_for(timeout=30, predicate=lambda: label(p) == "3"), p.model_info()
    assert predict(p) == [[4.0]]
    assert p.model_info()["history"] == ["2", "3"]

    # rollback serves 2 again and pins it
    p.manager.rollback()
    assert label(p) == "2" and predict(p) == [[3.0]]
    assert p.model_info()["version"]["mode"] == "pinned"
    p.manager.unpin()
    assert label(p) == "3"


def test_a_broken_newest_version_keeps_the_previous_serving(versions, tmp_path, make_processor):
    base = tmp_path / "m"
    copy_version(versions, base, 1)
    p = make_processor(config(base))
    assert predict(p) == [[2.0]]
    broken = base / ".tmp-2"
    shutil.copytree(versions / "2", broken)
    (broken / "saved_model.pb").write_bytes(b"not a SavedModel")
    os.rename(broken, base / "2")
    assert wait_for(timeout=30, predicate=lambda: p.model_info()["failed_versions"]), p.model_info()
    info = p.model_info()
    assert info["version"]["label"] == "1" and info["state"] == "ready"
    assert info["failed_versions"][0]["version"] == "2"
    assert "SavedModel" in info["last_error"] or "version 2" in info["last_error"], info["last_error"]
    assert predict(p) == [[2.0]]
    # a fixed (newer) version is tried at once
    copy_version(versions, base, 3)
    assert wait_for(timeout=30, predicate=lambda: label(p) == "3"), p.model_info()
    assert predict(p) == [[4.0]]


def test_pin_and_restore_model_version_name_a_number(versions, tmp_path, make_processor):
    base = tmp_path / "m"
    for n in (1, 2, 3):
        copy_version(versions, base, n)
    p = make_processor(config(base, restore_model_version=2))
    assert label(p) == "2" and predict(p) == [[3.0]]
    assert p.model_info()["version"]["mode"] == "pinned"
    p.manager.pin(1)
    assert label(p) == "1" and predict(p) == [[2.0]]
    with pytest.raises(NotFound, match=r"versions: \[1, 2, 3\]"):
        p.manager.pin(7)
    assert label(p) == "1"
    p.manager.unpin()
    assert label(p) == "3" and predict(p) == [[4.0]]


def test_tfserving_model_status_reports_the_version_number(versions, tmp_path, make_processor):
    from server.tfserving.status import model_status

    base = tmp_path / "m"
    copy_version(versions, base, 1, as_number=17)
    p = make_processor(config(base))
    status = model_status(p.model, None)
    assert [(s.version, s.state) for s in status] == [(17, "AVAILABLE")]
    assert model_status(p.model, 17)[0].version == 17
    with pytest.raises(NotFound):
        model_status(p.model, 1)
    copy_version(versions, base, 2, as_number=42)
    assert wait_for(timeout=30, predicate=lambda: model_status(p.model, None)[0].version == 42)
    assert predict(p) == [[3.0]]
    # the C ABI's get_serving_model_info names the served version directory
    from processor.proto import predict_pb2

    status, body = p.serving_model_info()
    assert status == 200 and predict_pb2.ServingModelInfo.FromString(body).model_path == str(base / "42")


def test_checkpoint_dir_with_a_base_dir_is_refused(versions, tmp_path, make_processor):
    base = tmp_path / "m"
    copy_version(versions, base, 1)
    with pytest.raises(ConfigError, match="TF Serving"):
        make_processor(config(base, checkpoint_dir=str(tmp_path / "ck")))


def test_base_dir_in_an_object_store(versions, make_processor):
    """The same layout on S3 (a moto server): listing, fetching, and a new version uploaded."""
    moto_server = pytest.importorskip("moto.server")
    s3fs = pytest.importorskip("s3fs")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        fs = s3fs.S3FileSystem(key="id", secret="secret", client_kwargs={"endpoint_url": endpoint})
        fs.mkdir("models")

        def upload(number):
            for root, _, files in os.walk(versions / str(number)):
                for name in sorted(files, key=lambda f: f == "saved_model.pb"):  # the pb last
                    path = os.path.join(root, name)
                    fs.put_file(path, f"models/toy/{number}/{os.path.relpath(path, versions / str(number))}")

        upload(1)
        p = make_processor(config("s3://models/toy", model_store_type="s3", oss_endpoint=endpoint,
                                  oss_access_id="id", oss_access_key="secret"))
        assert label(p) == "1" and predict(p) == [[2.0]]
        assert p.model_info()["version"]["savedmodel_dir"] == "s3://models/toy/1"
        upload(2)
        assert wait_for(timeout=30, predicate=lambda: label(p) == "2"), p.model_info()
        assert predict(p) == [[3.0]]
    finally:
        server.stop()


def test_rest_model_status_through_the_server(versions, tmp_path):
    """End to end: the server's TF Serving REST API reports and serves the version number."""
    import json
    import urllib.request

    from tools.server_process import ServerProcess

    base = tmp_path / "m"
    copy_version(versions, base, 1, as_number=5)
    deployment = {"models": [{"name": "toy", "model_config": config(base)}], "access_log": False}
    proc = ServerProcess(deployment, tmp_path / "server").start(timeout=180)
    try:
        def get(path, doc=None):
            data = None if doc is None else json.dumps(doc).encode()
            with urllib.request.urlopen(urllib.request.Request(proc.http + path, data=data), timeout=30) as resp:
                return json.loads(resp.read())

        def served_version():
            return get("/v1/models/toy")["model_version_status"][0]["version"]

        assert served_version() == "5"
        assert get("/v1/models/toy/versions/5")["model_version_status"][0]["state"] == "AVAILABLE"
        copy_version(versions, base, 3, as_number=9)
        assert wait_for(timeout=30, predicate=lambda: served_version() == "9"), proc.log()
        assert get("/v1/models/toy/versions/9:predict", {"instances": [[1.0]]})["predictions"] == [[4.0]]
    finally:
        assert proc.stop(timeout=30) == 0, proc.log()
