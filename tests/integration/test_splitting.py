"""Large requests split across lanes on the demo CTR model (string inputs included), both
backends: split answers equal unsplit ones at odd sizes and chunk boundaries, through the C ABI's
serialized path (the native decode's length check sends them to the split run), numpy arrays
(the TF Serving / KServe edges' form) and with batching on; model info counts them."""

from __future__ import annotations

import json

import pytest

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
