"""Several versions with ``workers: 2``: labels and the traffic split changed through the admin
API reach every worker (the admin journal) within 1 s, and a worker started afterwards replays
them; a change naming a version that is not served is refused and changes nothing anywhere.

Real processes and loopback ports; the toy versions (version n answers y = n*x + 1) on ONNX
Runtime, as TF Serving's base directory.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from models.toy_versions import export_versions
from processor import codec
from sp_checks import wait_for

ADMIN_TOKEN = "versions-admin-token"


def answer(server, key: str | None = None) -> tuple[int, float]:
    """One call naming no version, on a fresh connection (the kernel spreads them over the
    workers): the version that answered (X-Model-Version) and y at x = 1."""
    headers = {"X-Routing-Key": key} if key else {}
    request = urllib.request.Request(server.http + "/api/predict/toy", headers=headers,
                                     data=codec.encode_request({"x": np.array([[1.0]], np.float32)}))
    with urllib.request.urlopen(request, timeout=30) as resp:
        y = float(codec.decode_response(resp.read())["y"].ravel()[0])
        return int(resp.headers["X-Model-Version"]), y


def every_call_meets(server, number: int, calls: int = 30) -> bool:
    return all(answer(server) == (number, number + 1.0) for _ in range(calls))


def routing(server, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(server.http + "/admin/models/toy/routing", method="PUT",
                                     data=json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}",
                                              "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.timeout(600)
def test_routing_changes_reach_every_worker_within_a_second(tmp_path):
    from tools.server_process import ServerProcess

    base = tmp_path / "toy"
    export_versions(base)
    config = {"savedmodel_dir": str(base), "signature_name": "serving_default", "backend": "onnxruntime",
              "file_system_poll_wait_seconds": 0, "model_version_policy": {"latest": {"num_versions": 2}}}
    dep = {"models": [{"name": "toy", "model_config": config, "version_labels": {"stable": 1, "canary": 2}}],
           "workers": 2, "admin_token": ADMIN_TOKEN, "access_log": False, "drain_timeout_seconds": 10}
    with ServerProcess(dep, tmp_path / "server") as server:
        assert every_call_meets(server, 2)  # the newest is the default

        status, body = routing(server, {"traffic": {"stable": 100, "canary": 0}})
        assert status == 200, body
        time.sleep(1.0)
        assert every_call_meets(server, 1), "the split did not reach every worker within 1 s"

        status, body = routing(server, {"version_labels": {"stable": 1, "canary": 7}})
        assert status == 400 and "version 7" in body["error"], body
        assert every_call_meets(server, 1)  # nothing changed

        status, body = routing(server, {"traffic": {"stable": 50, "canary": 50}})
        assert status == 200, body
        time.sleep(1.0)
        for key in ("user-1", "user-2", "user-3", "user-4"):  # one key, one arm, in every worker
            assert len({answer(server, key) for _ in range(12)}) == 1, key
        arms = {answer(server, f"user-{i}")[0] for i in range(40)}
        assert arms == {1, 2}, arms

        # a worker that starts now replays the journal: the split it serves is the others'
        status, body = routing(server, {"traffic": {"canary": 0, "stable": 100}})
        assert status == 200, body
        victim = server.ports["workers"][0]
        os.kill(victim, signal.SIGKILL)
        ports_file = tmp_path / "server" / "ports.json"
        assert wait_for(lambda: victim not in json.loads(ports_file.read_text())["workers"], 180)
        assert every_call_meets(server, 1, calls=40)
        assert server.stop() == 0
