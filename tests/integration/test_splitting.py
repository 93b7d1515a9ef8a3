"""Large requests split across lanes on the demo CTR model (string inputs included), both
backends: split answers equal unsplit ones at odd sizes and chunk boundaries, through the C ABI's
serialized path (the native decode's length check sends them to the split run), numpy arrays
(the TF Serving / KServe edges' form) and with batching on; model info counts them. Deltas
published while split requests run never mix versions; the row limit through the C ABI."""

from __future__ import annotations

import json
import threading

import pytest

import sp_checks
from conftest import model_config
from processor import codec
from processor.request import PredictCall
from sp_checks import assert_outputs_close

SIZES = (1, 7, 8, 13, 14, 15, 50)


@pytest.fixture(scope="module", params=["tensorflow", "onnxruntime"])
def processors(request, ctr_model_small):
    from processor.processor import Processor

    def make(name: str, **keys):
        return Processor.create(name, json.dumps(model_config(ctr_model_small, session_num=2,
                                                              backend=request.param, **keys)))

    made = [make("split", max_execution_batch_size=7), make("whole", max_execution_batch_size=None),
            make("batched", max_execution_batch_size=7,
                 batching={"max_batch_size": 8, "batch_timeout_micros": 1000})]
    yield made
    for p in made:
        p.close()


def test_serialized_split_equals_unsplit(processors):
    from demo.synthetic_data import synthetic_batch

    split, whole, batched = processors
    before = split.model_info()["session_group"]["splitting"]
    for n in SIZES:
        request = codec.encode_request(synthetic_batch(n, n))
        want = codec.decode_response(whole.process(request)[1])
        for p in (split, batched):
            status, body = p.process(request)
            assert status == 200, body
            assert_outputs_close(codec.decode_response(body), want, f"{p.name} batch {n}")
    after = split.model_info()["session_group"]["splitting"]
    assert after["max_execution_batch_size"] == 7
    assert after["split_requests"] - before["split_requests"] == sum(n > 7 for n in SIZES)
    assert after["chunks_run"] - before["chunks_run"] == sum(-(-n // 7) for n in SIZES if n > 7)
    assert whole.model_info()["session_group"]["splitting"] is None


def test_arrays_split_equal_unsplit(processors):
    from demo.synthetic_data import synthetic_batch

    split, whole, _ = processors
    for n in (22, 49):
        feeds = synthetic_batch(n, 100 + n)
        got = split.dataplane.predict(PredictCall(split.name, feeds)).outputs
        want = whole.dataplane.predict(PredictCall(whole.name, feeds)).outputs
        assert_outputs_close(got, want, f"arrays batch {n}")


def test_row_limit_through_the_c_abi_is_a_400_naming_it(ctr_model_small, make_processor):
    from demo.synthetic_data import synthetic_batch

    p = make_processor(model_config(ctr_model_small, max_request_rows=10))
    status, body = p.process(codec.encode_request(synthetic_batch(11, 1)))
    assert status == 400 and b"max_request_rows (10)" in body, body
    status, body = p.process(codec.encode_request(synthetic_batch(10, 1)))
    assert status == 200, body


@pytest.mark.parametrize("backend", ["tensorflow", "onnxruntime"])
def test_deltas_during_split_requests_never_mix_versions(tmp_path, make_processor, backend):
    """Clients send split requests (40 rows in chunks of 7 on 2 lanes) while the trainer
    publishes deltas: every response equals one published version's predictions, and more than
    one version answered."""
    from demo.ctr_model import build_ctr_model
    from demo.streaming_trainer import StreamingTrainer
    from demo.synthetic_data import synthetic_batch

    ctr = build_ctr_model(tmp_path / "model", preset="small", versions=1)
    trainer = StreamingTrainer(ctr.out_dir)
    try:
        feeds = synthetic_batch(40, 5)
        p = make_processor(model_config(ctr, session_num=2, backend=backend, max_execution_batch_size=7,
                                        file_system_poll_wait_seconds=0.1))
        request = codec.encode_request(feeds)
        references = [trainer.predict(feeds)["logits"]]
        stop = threading.Event()
        failures, responses = [], []

        def client() -> None:
            while not stop.is_set():
                status, body = p.process(request)
                if status != 200:
                    failures.append(body)
                else:
                    responses.append(codec.decode_response(body)["logits"])

        clients = [threading.Thread(target=client) for _ in range(2)]
        for c in clients:
            c.start()
        try:
            for _ in range(4):
                answered = len(responses)
                assert sp_checks.wait_for(lambda: len(responses) > answered + 2, 30), "no request answered"
                trainer.train(3)
                trainer.save_delta()
                references.append(trainer.predict(feeds)["logits"])
                step = trainer.step
                assert sp_checks.wait_for(lambda: p.model_info()["version"]["label"].endswith(f"+{step}"), 30)
            answered = len(responses)
            assert sp_checks.wait_for(lambda: len(responses) > answered + 2, 30)
        finally:
            stop.set()
            for c in clients:
                c.join()
    finally:
        trainer.close()
    assert failures == []
    answered_by = sp_checks.versions_answered(responses, references, atol=1e-5)
    assert len(answered_by) >= 2, answered_by
    assert p.model_info()["session_group"]["splitting"]["split_requests"] >= len(responses)
