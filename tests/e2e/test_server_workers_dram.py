"""workers: 2 with the CTR model's tables in the DRAM store (ev_storage_type 1) and the DRAM+SSD
store (ev_storage_type 12), a real ``python -m server``: both workers answer as one process does;
each store's version lives in one shared-memory segment for both workers (and the SSD files are
written once) while serving, and nothing is left after the stop."""

from __future__ import annotations

import urllib.request

import numpy as np
import pytest

from conftest import model_config
from processor import codec, shared_segments
from sp_checks import assert_outputs_close
from unit.features.helpers import served

SHM = shared_segments.default_directory()
MODELS = {"ctr_dram": {"ev_storage_type": 1}, "ctr_ssd": {"ev_storage_type": 12}}


def predict(server, model: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    request = urllib.request.Request(server.http + f"/api/predict/{model}", data=codec.encode_request(feeds))
    with urllib.request.urlopen(request, timeout=30) as resp:  # a new connection each call
        return codec.decode_response(resp.read())


def table_segments(pid: int) -> list[str]:
    return sorted(p.name for p in SHM.glob(f"{shared_segments.PREFIX}{pid}-*-tables-*") if not p.name.endswith(".build"))


def store_info(server, model: str) -> dict:
    return server.get_json(f"/api/models/{model}")["session_group"]["embedding"]["store"]


@pytest.mark.timeout(120)
def test_two_workers_serve_the_tables_from_one_segment(ctr_model_small, tmp_path, make_processor):
    from demo.synthetic_data import synthetic_batch
    from tools.server_process import ServerProcess

    feeds = synthetic_batch(32, 5)
    configs = {name: model_config(ctr_model_small, ev_storage_path=str(tmp_path / "ssd"), **keys)
               for name, keys in MODELS.items()}
    want = served(make_processor(configs["ctr_dram"]), feeds)  # one process, in this one
    deployment = {"models": [{"name": n, "model_config": c} for n, c in configs.items()], "workers": 2,
                  "access_log": False, "drain_timeout_seconds": 10}
    with ServerProcess(deployment, tmp_path / "server") as server:
        pid = server.proc.pid
        segments = table_segments(pid)
        assert len(segments) == 2 and {s.split("-tables-")[0].split("-", 3)[-1] for s in segments} == \
            {"dram", "dram_ssd"}, segments
        for model in MODELS:
            seen: dict[bool, dict] = {}
            for _ in range(200):  # model info from both workers: one created the segment, one mapped it
                info = store_info(server, model)["shared_memory"]
                seen[info["created_here"]] = info
                if len(seen) == 2:
                    break
            assert set(seen) == {True, False} and seen[True]["path"] == seen[False]["path"], seen
            assert seen[True]["path"].rsplit("/", 1)[-1] in segments
            for _ in range(12):  # fresh connections: both workers answer, as one process does
                assert_outputs_close(predict(server, model, feeds), want)
        ssd = seen[True]["files"]  # ctr_ssd's rows files: one directory for both workers
        assert len(list((tmp_path / "ssd" / "ctr_ssd").iterdir())) == 1
        code = server.stop()
    assert code == 0, server.log()[-3000:]
    assert table_segments(pid) == []
    assert not (tmp_path / "ssd" / "ctr_ssd").exists() or not any((tmp_path / "ssd" / "ctr_ssd").iterdir()), ssd


@pytest.mark.timeout(120)
@pytest.mark.parametrize("store", ["dram", "dram_ssd"])
def test_a_new_full_version_and_the_close_release_the_segments(ctr_model_small, tmp_path, monkeypatch,
                                                                make_processor, store):
    """In one process made a worker (as the supervisor's workers are): a new full version maps a
    new segment and the old version's goes once it is unloaded; closing the model removes the last."""
    from unit.features.helpers import copy_model, label, publish_full, read_all, wait_for

    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(shared_segments, "_active", None)
    shared_segments.enable("626262", shm)
    model = copy_model(ctr_model_small, tmp_path / "m")
    keys = MODELS["ctr_dram" if store == "dram" else "ctr_ssd"]
    p = make_processor(model_config(model, ev_storage_path=str(tmp_path / "ssd"), file_system_poll_wait_seconds=0.2,
                                    **keys))

    def segments() -> list[str]:
        return sorted(f.name for f in shm.glob(f"*-{store}-tables-*") if not f.name.endswith(".build"))

    first = segments()
    assert len(first) == 1
    step = model.steps[-1] + 10
    publish_full(model.run_dir, step, read_all(model.latest_checkpoint_prefix))
    assert wait_for(lambda: label(p) == str(step))
    assert wait_for(lambda: len(segments()) == 1 and segments() != first), segments()
    p.close()
    assert segments() == [] and not list((tmp_path / "ssd").rglob("*.rows"))
    monkeypatch.setattr(shared_segments, "_active", None)
