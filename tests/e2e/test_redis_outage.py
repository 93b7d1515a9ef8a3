"""Redis killed under traffic and restarted empty: clean 503s meanwhile, then the processor refills
Redis from the checkpoint and serves correct predictions again, without a restart."""

import threading
import time

import numpy as np
import pytest

from conftest import model_config, plain_tf_predict
from sp_checks import FLOAT_ATOL, FLOAT_RTOL
from processor import codec
from tools.local_redis import LocalRedis, redis_server_binary

pytestmark = pytest.mark.skipif(redis_server_binary() is None,
                                reason="redis-server is not installed (scripts/setup.sh installs it)")


def test_outage_gives_503_then_recovers_without_restart(ctr_model_small, make_processor):
    from demo.synthetic_data import synthetic_batch

    redis = LocalRedis()
    try:
        p = make_processor(model_config(ctr_model_small, feature_store_type="redis", redis_url=redis.url))
        feeds = synthetic_batch(16, 51)
        request = codec.encode_request(feeds)
        want = plain_tf_predict(ctr_model_small.savedmodel_dir, ctr_model_small.latest_checkpoint_prefix, feeds)
        results: list[tuple[int, bytes]] = []
        stop = threading.Event()

        def traffic():
            deadline = time.monotonic() + 60  # bounded, whatever happens
            while not stop.is_set() and time.monotonic() < deadline:
                results.append(p.process(request))
                time.sleep(0.005)

        sender = threading.Thread(target=traffic)
        sender.start()
        time.sleep(0.5)
        redis.stop()  # killed mid-traffic
        time.sleep(1.5)
        during = len(results)
        redis.start()  # back on the same port, empty
        recovered = False
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if results and results[-1][0] == 200 and len(results) > during:
                recovered = True
                break
            time.sleep(0.05)
        time.sleep(0.3)
        stop.set()
        sender.join()
        assert recovered, results[-1][1][:300]
        statuses = [s for s, _ in results]
        assert set(statuses) == {200, 503}, set(statuses)
        failures = [b for s, b in results if s == 503]
        assert failures and all(b"feature store" in b for b in failures)
        # Fast: once a request found Redis down, the others fail at once on the store's state
        # (no network, so no request waits out a timeout); only the request(s) that found an
        # outage went to the network.
        info = p.model_info()["feature_store"]
        fast = [b for b in failures if b"requests fail until it is back" in b]
        assert len(failures) - len(fast) <= info["outages"], failures[:3]
        assert info["failed_fast"] >= len(fast) > 0
        # After the outage every answer is right again (Redis was refilled from the checkpoint).
        last = codec.decode_response(results[-1][1])
        np.testing.assert_allclose(last["logits"], want["logits"], rtol=FLOAT_RTOL, atol=FLOAT_ATOL)
        assert info["state"] == "up" and info["refills"] == 1 and info["outages"] >= 1
        assert p.model_info()["state"] == "ready"
    finally:
        redis.close()
