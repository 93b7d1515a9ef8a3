"""Several versions at once (``model_version_policy``) with real TensorFlow models.

TF Serving's layout: toy versions (y = n*x + 1 for version n) under a base directory, served
side by side, each addressed by number; a new version replaces the oldest once it serves, and
the oldest is freed only after its in-flight requests end. DeepRec's layout: the newest two full
checkpoints of a run serve side by side; deltas reach the newest only, the older one serves the
step it was loaded at.
"""

import json

import numpy as np
import pytest

import sp_checks
from conftest import model_config
from processor import codec
from processor.errors import NotFound
from processor.request import PredictCall
from models.toy_versions import copy_version, export_versions

POLL = 0.2
X1 = {"x": np.array([[1.0]], np.float32)}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """Version directories 1, 2, 3 to copy from: version n answers n*x + 1."""
    src = tmp_path_factory.mktemp("versions") / "src"
    return export_versions(src, (1, 2, 3))


def toy_config(base, **overrides):
    cfg = {"savedmodel_dir": str(base), "signature_name": "serving_default",
           "file_system_poll_wait_seconds": POLL, "model_version_policy": {"latest": {"num_versions": 2}}}
    cfg.update(overrides)
    return cfg


def answer(processor, version=None, label=None):
    result = processor.dataplane.predict(PredictCall(processor.name, codec.encode_request(X1), version, label))
    return result.version.number, codec.decode_response(result.outputs)["y"].item()


def served_numbers(processor):
    return [v["version"] for v in processor.model_info()["versions"]]


def test_two_versions_serve_side_by_side_and_a_new_one_replaces_the_oldest(pristine, tmp_path, make_processor):
    base = tmp_path / "base"
    for n in (1, 2):
        copy_version(pristine, base, n)
    p = make_processor(toy_config(base), name="toy")
    assert served_numbers(p) == [1, 2]
    assert answer(p) == (2, 3.0)  # the default is the newest
    assert answer(p, version=1) == (1, 2.0) and answer(p, version=2) == (2, 3.0)
    with pytest.raises(NotFound, match=r"Specific\(toy, 7\).*serving versions \[1, 2\]"):
        answer(p, version=7)

    held = p.manager.acquire_handle(1)  # a request of version 1 in flight
    closed = []
    close = held.group.close
    held.group.close = lambda: (closed.append(True), close())
    copy_version(pristine, base, 3)
    assert sp_checks.wait_for(lambda: served_numbers(p) == [2, 3], timeout=30), p.model_info()["failed_versions"]
    assert answer(p) == (3, 4.0) and answer(p, version=2) == (2, 3.0)
    with pytest.raises(NotFound):
        answer(p, version=1)
    assert not closed, "version 1 was closed under its in-flight request"
    assert codec.decode_response(held.group.serve(codec.encode_request(X1)))["y"].item() == 2.0  # still version 1
    held.release()
    assert closed, "version 1 was not freed once its last request ended"


def test_all_and_specific_policies(pristine, tmp_path, make_processor):
    base = tmp_path / "base"
    for n in (1, 2, 3):
        copy_version(pristine, base, n)
    every = make_processor(toy_config(base, model_version_policy={"all": {}}), name="every")
    assert served_numbers(every) == [1, 2, 3]
    chosen = make_processor(toy_config(base, model_version_policy={"specific": {"versions": [1, 3]}}), name="chosen")
    assert served_numbers(chosen) == [1, 3]
    assert answer(chosen, version=1) == (1, 2.0) and answer(chosen) == (3, 4.0)


def test_a_pin_serves_one_version_and_unpin_restores_the_policy(pristine, tmp_path, make_processor):
    base = tmp_path / "base"
    for n in (1, 2):
        copy_version(pristine, base, n)
    p = make_processor(toy_config(base), name="toy")
    p.manager.pin(1)
    assert served_numbers(p) == [1] and answer(p) == (1, 2.0)
    p.manager.unpin()
    assert served_numbers(p) == [1, 2] and answer(p) == (2, 3.0)


@pytest.fixture
def ctr(tmp_path):
    from demo.ctr_model import build_ctr_model

    return build_ctr_model(tmp_path / "model", preset="small", versions=2)


def test_deeprec_fulls_serve_side_by_side_and_deltas_reach_the_newest_only(ctr, make_processor):
    from demo.streaming_trainer import StreamingTrainer
    from demo.synthetic_data import synthetic_batch

    feeds = synthetic_batch(8, 11)
    request = codec.encode_request(feeds)
    older, newest = ctr.steps[-2], ctr.steps[-1]
    p = make_processor(model_config(ctr, file_system_poll_wait_seconds=POLL,
                                    model_version_policy={"latest": {"num_versions": 2}}), name="ctr")
    assert served_numbers(p) == [older, newest]

    def logits(version):
        result = p.dataplane.predict(PredictCall("ctr", request, version))
        return result.version.label, codec.decode_response(result.outputs)["logits"]

    label_old, before_old = logits(older)
    assert label_old == str(older)
    trainer = StreamingTrainer(ctr.out_dir)
    try:
        trainer.train(5)
        trainer.save_delta()
        want = trainer.predict(feeds)["logits"]
    finally:
        trainer.close()
    assert sp_checks.wait_for(lambda: logits(newest)[0] == f"{newest}+{trainer.step}", timeout=30), \
        p.model_info()["failed_versions"]
    np.testing.assert_allclose(logits(newest)[1], want, rtol=1e-5, atol=1e-6)
    label_after, after_old = logits(older)
    assert label_after == str(older)  # the older full keeps the step it was loaded at
    np.testing.assert_array_equal(after_old, before_old)


def test_rollback_serves_the_previous_default_alone(pristine, tmp_path, make_processor):
    base = tmp_path / "base"
    for n in (1, 2):
        copy_version(pristine, base, n)
    p = make_processor(toy_config(base), name="toy")
    copy_version(pristine, base, 3)
    assert sp_checks.wait_for(lambda: served_numbers(p) == [2, 3], timeout=30), p.model_info()["failed_versions"]
    assert p.model_info()["history"] == ["2", "3"]  # version 1 never was the default
    p.manager.rollback()
    assert served_numbers(p) == [2] and answer(p) == (2, 3.0)


def test_a_95_5_split_of_100000_keyed_requests_and_one_arm_per_key(pristine, tmp_path):
    """100,000 requests with distinct routing keys through the DataPlane on real versions: the
    canary's share is 5 +- 0.5 points, and a key always meets the same arm."""
    from processor.config import ModelConfig
    from processor.dataplane import DataPlane
    from processor.routing import RoutingSettings
    from processor.served_model import ModelRegistry, ServedModel

    base = tmp_path / "base"
    for n in (1, 2):
        copy_version(pristine, base, n)
    routing = RoutingSettings(version_labels={"stable": 1, "canary": 2}, traffic={"stable": 95, "canary": 5})
    model = ServedModel.compose("toy", ModelConfig.from_dict(toy_config(base, file_system_poll_wait_seconds=0)),
                                routing=routing)
    model.start()
    try:
        plane = DataPlane(ModelRegistry([model]))
        request = codec.encode_request(X1)
        counts = {1: 0, 2: 0}
        for i in range(100_000):
            counts[plane.predict(PredictCall("toy", request, routing_key=f"user-{i}")).version.number] += 1
        assert abs(counts[2] / 100_000 - 0.05) <= 0.005, counts
        for i in range(0, 100_000, 9973):  # the same key, the same arm
            arms = {plane.predict(PredictCall("toy", request, routing_key=f"user-{i}")).version.number
                    for _ in range(5)}
            assert len(arms) == 1
    finally:
        model.close()


@pytest.mark.parametrize("form", ["jsonl", "prediction_log"])
def test_shadow_copies_run_on_the_shadow_version_and_are_logged_as_shadow(pristine, tmp_path, form):
    """100% shadow to the canary: every answer is the stable version's; each call's copy runs on
    the canary, off the response path, and its prediction-log record says shadow."""
    from processor.config import ModelConfig
    from processor.dataplane import DataPlane
    from processor.routing import RoutingSettings
    from processor.served_model import ModelRegistry, ServedModel

    base = tmp_path / "base"
    for n in (1, 2):
        copy_version(pristine, base, n)
    logs = tmp_path / "logs"
    routing = RoutingSettings(version_labels={"stable": 1, "canary": 2}, traffic={"stable": 100},
                              shadow={"label": "canary", "fraction": 1.0, "max_queued": 1000})
    config = toy_config(base, file_system_poll_wait_seconds=0,
                        logging_config={"sampling_rate": 1.0, "path": str(logs), "format": form})
    model = ServedModel.compose("toy", ModelConfig.from_dict(config), routing=routing)
    model.start()
    try:
        plane = DataPlane(ModelRegistry([model]))
        request = codec.encode_request(X1)
        for _ in range(20):
            result = plane.predict(PredictCall("toy", request))
            assert result.version.number == 1 and codec.decode_response(result.outputs)["y"].item() == 2.0
        assert plane.predict(PredictCall("toy", request, version=1)).version.number == 1  # named: no copy
        assert sp_checks.wait_for(lambda: model.shadow.stats()["ran"] == 20, timeout=30), model.shadow.stats()
        assert model.shadow.stats()["offered"] == 20
    finally:
        model.close()  # writes the queued records
    if form == "jsonl":
        data = b"".join(f.read_bytes() for f in sorted(logs.glob("*.jsonl")))
        records = [json.loads(line) for line in data.splitlines()]
        shadows = [r for r in records if r.get("shadow")]
        primaries = [r for r in records if not r.get("shadow")]
        assert {r["version"] for r in shadows} == {2} and {r["version"] for r in primaries} == {1}
        assert all(r["outputs"]["y"]["values"] == [[3.0]] for r in shadows)
    else:
        import tensorflow as tf
        from tensorflow_serving.apis import prediction_log_pb2  # the official messages read them

        files = sorted(str(p) for p in logs.glob("*.tfrecord"))
        entries = [prediction_log_pb2.PredictionLog.FromString(raw.numpy())
                   for raw in tf.data.TFRecordDataset(files)]
        shadows = [e for e in entries if e.log_metadata.model_spec.version_label == "shadow"]
        primaries = [e for e in entries if e.log_metadata.model_spec.version_label != "shadow"]
        assert {e.predict_log.response.model_spec.version.value for e in shadows} == {2}
        assert {e.log_metadata.model_spec.version.value for e in primaries} == {1}
    assert (len(shadows), len(primaries)) == (20, 21)
