"""Checks shared by several test modules (importable as ``sp_checks``, like ``conftest``)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

# Floats one model computes in two processes, or under two thread settings, need not be equal:
# TensorFlow and ONNX Runtime split a reduction by their pools' thread counts and pick kernels
# by the CPU, so a float32 dot product of n terms may round differently, within about
# n * 2**-24 of the sum of |terms|. For the models served here (layers of at most a few hundred
# terms, outputs of order 1) 1e-5 relative plus 1e-6 absolute holds that with room to spare
# while a wrong row, version or parameter (differences of 1e-3 and more) still fails.
FLOAT_RTOL, FLOAT_ATOL = 1e-5, 1e-6


# a model_config the deployment's validation accepts; nothing reads it (config tests only)
TOY_MODEL = {"savedmodel_dir": "/models/toy/savedmodel"}


def toy_deployment(**top):
    """A ``DeploymentConfig`` of one model, "toy", and the top-level keys ``top``."""
    from server.settings import DeploymentConfig

    return DeploymentConfig.from_dict({"models": [{"name": "toy", "model_config": dict(TOY_MODEL)}], **top})


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` seconds passed; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def assert_outputs_close(got: Mapping[str, object], want: Mapping[str, np.ndarray], how: str = "",
                         atol: float = FLOAT_ATOL) -> None:
    """``got`` holds the outputs ``want`` holds, computed elsewhere (another process, another
    thread setting, another engine): the same names and shapes; floats within
    FLOAT_RTOL and ``atol`` (wider for another engine's kernels); integers, booleans and
    strings equal. For the same computation run
    twice (a codec round trip, one session asked again) compare exactly instead."""
    assert set(got) == set(want), (how, sorted(got), sorted(want))
    for key, expected in want.items():
        actual = np.asarray(got[key], dtype=expected.dtype)
        assert actual.shape == expected.shape, (how, key, actual.shape, expected.shape)
        if expected.dtype.kind in "fc":
            np.testing.assert_allclose(actual, expected, rtol=FLOAT_RTOL, atol=atol, err_msg=f"{how} {key}")
        else:
            np.testing.assert_array_equal(actual, expected, err_msg=f"{how} {key}")


def concurrent_mismatches(process: Callable[[bytes], tuple[int, bytes]], requests: Sequence[bytes],
                          threads: int = 8, calls: int = 500) -> list[str]:
    """Call ``process`` ``calls`` times from each of ``threads`` threads, cycling through
    ``requests``; return one line per thread whose answer was not 200 with the bytes a
    single-threaded call gave first (empty: every call matched)."""
    expected = [process(r)[1] for r in requests]
    errors: list[str] = []

    def worker(i: int) -> None:
        for n in range(calls):
            k = (i + n) % len(requests)
            status, body = process(requests[k])
            if status != 200 or body != expected[k]:
                errors.append(f"thread {i} call {n}: status {status}")
                return

    run_threads(worker, threads)
    return errors


def run_threads(worker: Callable[[int], None], threads: int) -> None:
    """``worker(k)`` for k in range(threads), each on its own thread; returns when all end."""
    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


def versions_answered(responses: Sequence[np.ndarray], references: Sequence[np.ndarray],
                      atol: float = FLOAT_ATOL) -> set[int]:
    """The indices of the published versions (``references``, one array per version) that
    answered ``responses``; fails on a response equal to none of them (it mixed versions)."""
    answered = set()
    for r in responses:
        match = [i for i, ref in enumerate(references) if np.allclose(r, ref, rtol=FLOAT_RTOL, atol=atol)]
        assert match, "a response equals no published version: it mixed versions"
        answered.add(match[0])
    return answered


@contextlib.contextmanager
def grpc_servers(kind: str):
    """Within the block, every server started serves gRPC with the ``kind`` server
    (``grpc_server: "python"`` or ``"native"``, issue 50): a ``ServerProcess`` (whose log must
    then say so) and an in-process ``ServingApp``. For a module of server tests run again against
    it (a module-scoped autouse fixture, set up before the module's ``server`` fixture)."""
    import pytest

    from server.app import ServingApp
    from tools.server_process import ServerProcess

    patch = pytest.MonkeyPatch()
    start, init = ServerProcess.start, ServingApp.__init__

    def start_with(self, *args, **kwargs):
        self.deployment = {**self.deployment, "grpc_server": kind}
        started = start(self, *args, **kwargs)
        assert_grpc_served_by(self, kind)
        return started

    def init_with(self, deployment, *args, **kwargs):
        init(self, deployment.model_copy(update={"grpc_server": kind}), *args, **kwargs)
    patch.setattr(ServerProcess, "start", start_with)
    patch.setattr(ServingApp, "__init__", init_with)
    try:
        yield
    finally:
        patch.undo()


def python_grpc_rerun(module: dict | None = None, only: Sequence[str] = ()):
    """For a module that runs another module's server tests again against the Python gRPC server
    (``python_grpc_server = sp_checks.python_grpc_rerun()`` at its top level): the autouse
    fixture that makes its servers serve gRPC with it (:func:`grpc_servers`). ``module`` (the
    rerunning module's ``globals()``) and ``only``: run only these of its tests (those that call
    gRPC, leaving out those that speak only HTTP); a name that is not one of them fails at
    collection (a stale list)."""
    import pytest

    if only:
        missing = [name for name in only if name not in module]
        assert not missing, f"python_grpc_rerun: no such tests {missing}"
        for name in [n for n in module if n.startswith("test_") and n not in only]:
            del module[name]

    @pytest.fixture(scope="module", autouse=True)
    def python_grpc_server():
        with grpc_servers("python"):
            yield

    return python_grpc_server


def set_model_spec(spec, name: str, **keys) -> None:
    """Fill a TF Serving ``ModelSpec``: ``name``, and ``keys``: ``version`` (the Int64Value's
    value) or another of its fields (``version_label``, ``signature_name``)."""
    spec.name = name
    for key, value in keys.items():
        if key == "version":
            spec.version.value = value
        else:
            setattr(spec, key, value)


def assert_grpc_served_by(server, kind: str) -> None:
    """The server's log says the ``kind`` ("python" or "native") gRPC server served its gRPC port."""
    line = '"native gRPC server (gRPC ' if kind == "native" else '"Python gRPC server (grpcio '
    assert line in server.log(), server.log()[-2000:]
