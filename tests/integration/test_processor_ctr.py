"""The demo CTR model through process(): equal to plain TensorFlow, stable under concurrency."""

import numpy as np
import pytest

from conftest import model_config, plain_tf_predict
from processor import codec
from sp_checks import assert_outputs_close, concurrent_mismatches


def test_predictions_equal_plain_tensorflow(ctr_model_small, make_processor):
    from demo.synthetic_data import synthetic_batch

    p = make_processor(model_config(ctr_model_small, session_num=2))
    for batch, seed in ((1, 3), (64, 4)):
        feeds = synthetic_batch(batch, seed)
        status, body = p.process(codec.encode_request(feeds))
        assert status == 200, body
        got = codec.decode_response(body)
        want = plain_tf_predict(ctr_model_small.savedmodel_dir,
                                ctr_model_small.latest_checkpoint_prefix, feeds)
        assert set(want) == {"probability", "logits"}
        assert_outputs_close(got, want, f"batch {batch}")  # two lanes vs plain TensorFlow's settings
        assert ((got["probability"] > 0) & (got["probability"] < 1)).all()


def test_earlier_version_differs_from_the_served_one(ctr_model_small, make_processor):
    from demo.synthetic_data import synthetic_batch

    feeds = synthetic_batch(16, 9)
    p = make_processor(model_config(ctr_model_small))
    got = codec.decode_response(p.process(codec.encode_request(feeds))[1])["logits"]
    earlier = plain_tf_predict(ctr_model_small.savedmodel_dir, ctr_model_small.checkpoint_prefixes[0], feeds)
    assert not np.allclose(got, earlier["logits"])


@pytest.mark.parametrize("policy", ["RR", "MOD"])
def test_8_threads_x_500_calls_equal_single_threaded(ctr_model_small, make_processor, policy):
    from demo.synthetic_data import synthetic_batch

    p = make_processor(model_config(ctr_model_small, session_num=4, use_per_session_threads=True,
                                    select_session_policy=policy))
    requests = [codec.encode_request(synthetic_batch(4, seed)) for seed in range(8)]
    errors = concurrent_mismatches(p.process, requests, threads=8, calls=500)
    assert errors == []
