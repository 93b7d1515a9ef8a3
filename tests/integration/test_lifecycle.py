"""Hot update from full and delta checkpoints, failures, rollback, pinning and warmup."""

import os
import threading
import time

import numpy as np
import pytest

import sp_checks
from conftest import model_config, plain_tf_predict
from processor import codec
from processor.errors import ConfigError, NotFound

POLL = 0.2


@pytest.fixture
def ctr(tmp_path):
    from demo.ctr_model import build_ctr_model

    return build_ctr_model(tmp_path / "model", preset="small", versions=2)


@pytest.fixture(params=["cumulative"])
def delta_mode(request):
    """The delta mode of the trainer and the processor (tests that run in both say so)."""
    return request.param


@pytest.fixture
def trainer(ctr, delta_mode):
    from demo.streaming_trainer import StreamingTrainer

    t = StreamingTrainer(ctr.out_dir, delta_mode=delta_mode)
    yield t
    t.close()


@pytest.fixture
def feeds():
    from demo.synthetic_data import synthetic_batch

    return synthetic_batch(8, 11)


def served(processor, feeds):
    status, body = processor.process(codec.encode_request(feeds))
    assert status == 200, body
    return codec.decode_response(body)


def wait_for(predicate, timeout=POLL + 2.0):
    """Updates must land within the poll interval (plus the load itself): that is the default."""
    return sp_checks.wait_for(predicate, timeout)


def label(processor):
    return processor.model_info()["version"]["label"]


def wait_for_polls(processor, rounds=2):
    """Wait until the watcher has started ``rounds`` more polls than it had now. A poll is counted
    as it starts, so with 2 the poll that started after this call has finished: whatever the
    store held at the call has been seen."""
    polls = lambda: processor.model_info()["watcher"]["polls"]  # noqa: E731
    start = polls()
    assert wait_for(lambda: polls() >= start + rounds, timeout=30), f"the watcher did not poll ({polls()})"


def test_delta_then_full_are_served_within_the_poll_interval(ctr, trainer, feeds, make_processor):
    p = make_processor(model_config(ctr, file_system_poll_wait_seconds=POLL, session_num=2))
    assert label(p) == str(ctr.steps[-1])
    for _ in range(3):
        trainer.train(5)
        trainer.save_delta()
        want = trainer.predict(feeds)["logits"]
        assert wait_for(lambda: label(p) == f"{ctr.steps[-1]}+{trainer.step}"), p.model_info()["failed_versions"]
        np.testing.assert_allclose(served(p, feeds)["logits"], want, rtol=1e-5, atol=1e-6)
    trainer.train(5)
    trainer.save_full()
    want = trainer.predict(feeds)["logits"]
    assert wait_for(lambda: label(p) == str(trainer.step))
    np.testing.assert_allclose(served(p, feeds)["logits"], want, rtol=1e-5, atol=1e-6)
    # the counters follow the swap that changes the label: wait for them too
    counts = lambda: (p.model_info()["updates"]["delta_updates"], p.model_info()["updates"]["full_loads"])  # noqa: E731
    assert wait_for(lambda: counts() == (3, 2)), counts()


def test_a_delta_present_at_start_is_applied(ctr, trainer, feeds, make_processor):
    trainer.train(5)
    trainer.save_delta()
    want = trainer.predict(feeds)["logits"]
    p = make_processor(model_config(ctr))
    assert label(p) == f"{ctr.steps[-1]}+{trainer.step}"
    np.testing.assert_allclose(served(p, feeds)["logits"], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("delta_mode", ["cumulative", "chain"], indirect=True)
def test_steady_load_during_updates_zero_failures_consistent_versions(ctr, trainer, feeds, make_processor,
                                                                       delta_mode):
    """4 client threads while deltas and fulls land. SP_SOAK_SECONDS=60 runs the issue's soak
    (a delta every 2 s, a full every 20 s); the default is a 4 s version of it.

    Asserted by count, not by time: every request succeeds with one version's outputs, requests
    are answered between every two updates, more than one version answered, and some requests
    were in flight while a version was swapped in (the update counters moved during them)."""
    soak = float(os.environ.get("SP_SOAK_SECONDS", "0"))
    duration, delta_every, full_every = (soak, 2.0, 20.0) if soak else (4.0, 0.5, 2.0)
    p = make_processor(model_config(ctr, file_system_poll_wait_seconds=POLL, session_num=4,
                                    use_per_session_threads=True, delta_mode=delta_mode))
    request = codec.encode_request(feeds)
    references = [trainer.predict(feeds)["logits"]]
    stop = threading.Event()
    failures, responses, across_swaps = [], [], []

    def swaps():
        return p.manager.stats["full_loads"] + p.manager.stats["delta_updates"]

    def client():
        while not stop.is_set():
            before = swaps()
            status, body = p.process(request)
            if status != 200:
                failures.append(body)
            else:
                responses.append(codec.decode_response(body)["logits"])
                if swaps() != before:
                    across_swaps.append(before)

    clients = [threading.Thread(target=client) for _ in range(4)]
    for c in clients:
        c.start()
    started = last_full = time.monotonic()
    while time.monotonic() - started < duration:
        answered = len(responses)
        time.sleep(delta_every)  # the pace of the trainer, not an assertion
        assert wait_for(lambda: len(responses) > answered, timeout=30), "no request answered between updates"
        trainer.train(3)
        if time.monotonic() - last_full >= full_every:
            trainer.save_full()
            last_full = time.monotonic()
        else:
            trainer.save_delta()
        references.append(trainer.predict(feeds)["logits"])
    # the last version lands (a full load under this load can take seconds on 2 cores)
    final = wait_for(lambda: label(p) == str(trainer.step) or label(p).endswith(f"+{trainer.step}"), timeout=30)
    stop.set()
    for c in clients:
        c.join()
    assert final, label(p)
    assert failures == []
    answered_by = sp_checks.versions_answered(responses, references)
    assert len(answered_by) >= 2, answered_by  # requests were answered before and after updates
    assert across_swaps, "no request was in flight while a version was swapped in"
    info = p.model_info()["updates"]
    print(f"\nsoak {duration:.0f}s: {len(responses)} responses ({len(across_swaps)} across a swap), 0 failures, "
          f"{info['delta_updates']} deltas, {info['full_loads']} full loads")


def _corrupt_truncate(prefix):
    data = next(p for p in os.listdir(os.path.dirname(prefix)) if p.startswith(os.path.basename(prefix) + ".data"))
    path = os.path.join(os.path.dirname(prefix), data)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 3)


def _corrupt_index(prefix):
    with open(prefix + ".index", "r+b") as f:
        f.seek(10)
        f.write(b"\xde\xad\xbe\xef" * 8)


@pytest.mark.parametrize("corrupt", [_corrupt_truncate, _corrupt_index])
@pytest.mark.parametrize("kind", ["delta", "full"])
def test_corrupt_checkpoint_keeps_the_old_version(ctr, trainer, feeds, make_processor, corrupt, kind):
    p = make_processor(model_config(ctr, file_system_poll_wait_seconds=POLL))
    before = served(p, feeds)["logits"]
    old_label = label(p)
    trainer.train(3)
    prefix = str(trainer.save_delta() if kind == "delta" else trainer.save_full())
    corrupt(prefix)
    assert wait_for(lambda: p.model_info()["failed_versions"])
    for _ in range(20):
        np.testing.assert_array_equal(served(p, feeds)["logits"], before)
    info = p.model_info()
    assert label(p) == old_label and info["state"] == "ready"
    assert info["last_error"] and info["updates"]["failed_updates"] >= 1


def test_half_written_checkpoint_is_not_picked_up(ctr, feeds, make_processor):
    p = make_processor(model_config(ctr, file_system_poll_wait_seconds=POLL))
    old_label = label(p)
    (ctr.run_dir / "model.ckpt-99999.index").write_bytes(b"partial")  # no data shard yet
    wait_for_polls(p)
    assert label(p) == old_label and p.model_info()["failed_versions"] == []


def test_mismatched_delta_is_rejected(ctr, trainer, feeds, make_processor):
    from demo.trainer.publish import publish_checkpoint
    from processor.checkpoint.tensor_file import write_tensors

    p = make_processor(model_config(ctr, file_system_poll_wait_seconds=POLL))
    before = served(p, feeds)["logits"]
    bad = {"embeddings/C1-keys": np.array([0, 1], np.int64),
           "embeddings/C1-values": np.ones((2, 3), np.float32)}  # wrong dim
    publish_checkpoint(ctr.run_dir / ".incremental_checkpoint", "incremental_model.ckpt",
                       ctr.steps[-1] + 1, lambda tmp: write_tensors(tmp, bad))
    assert wait_for(lambda: p.model_info()["failed_versions"])
    assert "shape" in p.model_info()["last_error"]
    np.testing.assert_array_equal(served(p, feeds)["logits"], before)


def test_rollback_and_pinning(ctr, trainer, feeds, make_processor):
    p = make_processor(model_config(ctr, file_system_poll_wait_seconds=POLL))
    first = served(p, feeds)["logits"]
    trainer.train(5)
    trainer.save_full()
    assert wait_for(lambda: label(p) == str(trainer.step))
    newest = served(p, feeds)["logits"]
    assert not np.allclose(first, newest)

    p.manager.rollback()
    np.testing.assert_allclose(served(p, feeds)["logits"], first, rtol=1e-6)
    wait_for_polls(p)  # pinned: the watcher does not move it forward
    assert label(p) == str(ctr.steps[-1])

    p.manager.pin(ctr.steps[0])
    want = plain_tf_predict(ctr.savedmodel_dir, ctr.checkpoint_prefixes[0], feeds)["logits"]
    np.testing.assert_allclose(served(p, feeds)["logits"], want, rtol=1e-5, atol=1e-6)
    with pytest.raises(NotFound):
        p.manager.pin(123456)

    p.manager.unpin()
    np.testing.assert_allclose(served(p, feeds)["logits"], newest, rtol=1e-6)


@pytest.mark.parametrize("delta_mode", ["cumulative", "chain"], indirect=True)
def test_every_step_serves_exactly_its_parameters(ctr, trainer, feeds, make_processor, delta_mode):
    """Fulls and deltas interleaved: pinning (at start or later) any full or delta step serves
    the parameters the trainer had at that step; a delta never lands on another full."""
    want = {ctr.steps[-1]: plain_tf_predict(ctr.savedmodel_dir, ctr.latest_checkpoint_prefix, feeds)["logits"]}
    for save in ("delta", "delta", "full", "delta", "full"):
        trainer.train(5)
        (trainer.save_delta if save == "delta" else trainer.save_full)()
        want[trainer.step] = trainer.predict(feeds)["logits"]
    steps = sorted(want)
    # a full with later deltas, then a delta step, pinned at start
    first = make_processor(model_config(ctr, delta_mode=delta_mode, restore_model_version=steps[0]))
    np.testing.assert_allclose(served(first, feeds)["logits"], want[steps[0]], rtol=1e-5, atol=1e-6)
    p = make_processor(model_config(ctr, delta_mode=delta_mode, restore_model_version=steps[2]))
    np.testing.assert_allclose(served(p, feeds)["logits"], want[steps[2]], rtol=1e-5, atol=1e-6)
    for step in steps:
        p.manager.pin(step)
        np.testing.assert_allclose(served(p, feeds)["logits"], want[step], rtol=1e-5, atol=1e-6,
                                   err_msg=f"step {step} ({label(p)})")
    version = p.model_info()["version"]
    assert (version["mode"], version["why"], version["full_step"]) == ("pinned", f"pin({steps[-1]})", steps[-1])
    p.manager.pin(steps[2])  # the second delta of the first full
    applied = steps[1:3] if delta_mode == "chain" else steps[2:3]
    assert p.model_info()["version"]["deltas_applied"] == applied
    with pytest.raises(NotFound, match=r"full steps: .*delta steps: "):
        p.manager.pin(steps[-1] + 1)
    p.manager.unpin()
    assert label(p) == str(steps[-1])
    assert p.model_info()["version"]["mode"] == "following"
    version = first.model_info()["version"]
    assert (version["mode"], version["why"], version["deltas_applied"]) == (
        "pinned", "config restore_model_version", [])


@pytest.mark.parametrize("delta_mode", ["chain"], indirect=True)
@pytest.mark.parametrize("broken", ["missing", "corrupt"])
def test_a_chain_with_a_broken_link_is_refused_whole(ctr, trainer, feeds, make_processor, delta_mode, broken):
    p = make_processor(model_config(ctr, delta_mode="chain", file_system_poll_wait_seconds=0))
    update = lambda: p.manager.reconcile(p.manager.discover())  # noqa: E731 - no watcher: no race
    trainer.train(5)
    trainer.save_delta()
    update()
    good, good_label = served(p, feeds)["logits"], label(p)
    assert good_label == f"{ctr.steps[-1]}+{trainer.step}"
    trainer.train(5)
    link = trainer.save_delta()
    if broken == "missing":  # never published whole: the chain skips it
        os.unlink(f"{link}.index")
    else:
        with open(f"{link}.data-00000-of-00001", "r+b") as f:
            f.write(b"\xff" * 64)
    trainer.train(5)
    trainer.save_delta()
    update()
    assert label(p) == good_label
    np.testing.assert_allclose(served(p, feeds)["logits"], good, rtol=1e-6)
    failed = p.model_info()["failed_versions"]
    assert [f["version"] for f in failed] == [f"{ctr.steps[-1]}+{trainer.step}"]
    assert "missing link" in failed[0]["error"] if broken == "missing" else "cannot read delta" in failed[0]["error"]


def test_rollback_after_a_delta_serves_the_previous_version_exactly(ctr, trainer, feeds, make_processor):
    p = make_processor(model_config(ctr, file_system_poll_wait_seconds=POLL))
    served_at = {}
    for _ in range(2):
        trainer.train(5)
        trainer.save_delta()
        served_at[trainer.step] = trainer.predict(feeds)["logits"]
        assert wait_for(lambda: label(p) == f"{ctr.steps[-1]}+{trainer.step}")
    previous = sorted(served_at)[0]
    assert p.manager.rollback().label == f"{ctr.steps[-1]}+{previous}"
    np.testing.assert_allclose(served(p, feeds)["logits"], served_at[previous], rtol=1e-5, atol=1e-6)
    version = p.model_info()["version"]
    assert (version["mode"], version["why"], version["deltas_applied"]) == ("pinned", "rollback", [previous])


def test_restore_model_version_pins_at_start(ctr, feeds, make_processor):
    p = make_processor(model_config(ctr, restore_model_version=ctr.steps[0]))
    want = plain_tf_predict(ctr.savedmodel_dir, ctr.checkpoint_prefixes[0], feeds)["logits"]
    np.testing.assert_allclose(served(p, feeds)["logits"], want, rtol=1e-5, atol=1e-6)


def test_warmup_sources(ctr, feeds, tmp_path, make_processor):
    p = make_processor(model_config(ctr, session_num=3))
    assert p.model_info()["warmup"]["source"] == "synthetic"
    assert p.model_info()["warmup"]["runs"] == 5 * 3

    warm = tmp_path / "warmup.bin"
    warm.write_bytes(codec.encode_request(feeds))
    p2 = make_processor(model_config(ctr, warmup_file_name=str(warm)))
    assert p2.model_info()["warmup"]["source"] == "warmup_file_name"

    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\xff\xff\xff")
    for path in (bad, tmp_path / "missing.bin"):
        with pytest.raises(ConfigError, match="warmup_file_name"):
            make_processor(model_config(ctr, warmup_file_name=str(path)))


def test_tf_serving_warmup_records(ctr, feeds, make_processor):
    pytest.importorskip("tensorflow_serving.apis.prediction_log_pb2")
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    request = predict_pb2.PredictRequest()
    for k, v in feeds.items():
        request.inputs[k].CopyFrom(tf.make_tensor_proto(v))
    log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
    extra = ctr.savedmodel_dir / "assets.extra"
    extra.mkdir(exist_ok=True)
    with tf.io.TFRecordWriter(str(extra / "tf_serving_warmup_requests")) as w:
        for _ in range(3):
            w.write(log.SerializeToString())
    p = make_processor(model_config(ctr, session_num=2))
    warmup = p.model_info()["warmup"]
    assert warmup == {"source": "assets.extra/tf_serving_warmup_requests", "runs": 5 * 2 * 3,
                      "batch_sizes": [1, 2, 4, 8], "batch_runs": 4 * 2 * 2, "seconds": warmup["seconds"]}
