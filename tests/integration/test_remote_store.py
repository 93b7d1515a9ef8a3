"""A model served from an S3-compatible object store (a moto server on 127.0.0.1)."""

import os

import numpy as np
import pytest

from conftest import model_config
from processor import codec
from processor.proto import predict_pb2
from sp_checks import wait_for

moto_server = pytest.importorskip("moto.server")
s3fs = pytest.importorskip("s3fs")


@pytest.fixture
def s3_endpoint():
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def upload(fs, local_dir, remote_dir):
    for root, _, files in os.walk(local_dir):
        for name in files:
            path = os.path.join(root, name)
            fs.put_file(path, f"{remote_dir}/{os.path.relpath(path, local_dir)}")


@pytest.mark.parametrize("scheme", ["s3", "oss"])
def test_serves_and_hot_updates_from_the_object_store(toy_model, tmp_path, s3_endpoint, scheme, make_processor):
    from demo.toy_model import write_toy_checkpoint

    fs = s3fs.S3FileSystem(key="id", secret="secret", client_kwargs={"endpoint_url": s3_endpoint})
    bucket = f"models-{scheme}"
    fs.mkdir(bucket)
    upload(fs, toy_model.out_dir, f"{bucket}/toy")
    config = model_config(toy_model, model_store_type=scheme, savedmodel_dir=f"{scheme}://{bucket}/toy/savedmodel",
                          checkpoint_dir=f"{scheme}://{bucket}/toy/checkpoints", oss_endpoint=s3_endpoint,
                          oss_access_id="id", oss_access_key="secret", file_system_poll_wait_seconds=0.3)
    p = make_processor(config)
    x = codec.encode_request({"x": np.array([[1.0]], np.float32)})
    assert codec.decode_response(p.process(x)[1])["y"].tolist() == [[2.5]]
    info = predict_pb2.ServingModelInfo.FromString(p.serving_model_info()[1])
    assert info.model_path == f"{scheme}://{bucket}/toy/checkpoints/run_1/model.ckpt-1"
    assert "secret" not in info.model_path and "secret" not in str(p.model_info())

    # A newer full checkpoint uploaded to the store is picked up.
    local_run = tmp_path / "run"
    local_run.mkdir()
    write_toy_checkpoint(local_run, 7, a=1.0, b=1.0)
    upload(fs, local_run, f"{bucket}/toy/checkpoints/run_1")
    assert wait_for(lambda: p.model_info()["version"]["full_step"] == 7, timeout=30), p.model_info()["version"]
    assert codec.decode_response(p.process(x)[1])["y"].tolist() == [[2.0]]
