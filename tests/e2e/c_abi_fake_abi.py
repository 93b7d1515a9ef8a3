"""A stand-in for ``processor.abi`` used by the C ABI tests and the overhead benchmark.

The test build of the library, ``cpp_processor/build/testing/libserving_processor_testing.so``, imports
it instead of ``processor.abi`` (put this directory on ``PYTHONPATH``); the production library
always imports ``processor.abi``. It needs no model: ``process`` echoes the request (or returns
a fixed response of a chosen size), so what is measured or tested is the library itself.
``initialize`` takes a JSON config with optional keys:

* ``"fail"``: a message; initialize raises a ProcessorError-like error (status 400) with it.
* ``"crash"``: initialize raises a plain RuntimeError with this text.
* ``"misbehave"``: ``"raise"`` (process and batch_process raise), ``"badtype"`` (process returns
  a list, batch_process a list of the wrong length), ``"badpayload"`` (payload is an int),
  ``"badstatus"`` (status is a str), ``"status413"`` / ``"status299"`` (statuses processor.h
  does not define), ``"raise504"`` / ``"raise404"`` (process raises a ProcessorError-like
  error whose STATUS_TABLE row says 504 / 404).
* ``"response_size"``: process returns this many bytes instead of echoing.
* ``"model_path"``: what get_serving_model_info reports; ``"@thread_states"`` reports the
  number of Python thread states of the interpreter instead (to check that the library deletes
  the state it made for a host thread when that thread exits).
"""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

ABI_VERSION = 1


class FakeError(Exception):
    """Duck-types processor.errors.ProcessorError: a str ``message`` and ``edge.c_abi``, the
    status of its STATUS_TABLE row."""

    def __init__(self, message: str, c_abi: int) -> None:
        super().__init__(message)
        self.edge = SimpleNamespace(c_abi=c_abi)
        self.message = message


class Handle:
    def __init__(self, entry: str, cfg: dict) -> None:
        self.entry = entry
        self.cfg = cfg
        self.misbehave = cfg.get("misbehave")
        size = cfg.get("response_size")
        self.fixed = None if size is None else bytes(i % 251 for i in range(int(size)))
        self.model_path = cfg.get("model_path", "/fake/model.ckpt-1")
        self.finalized = 0
        self.lock = threading.Lock()


def initialize(model_entry: str, model_config: str) -> Handle:
    cfg = json.loads(model_config)  # a JSONDecodeError is a plain exception: C maps it to 500
    if "fail" in cfg:
        raise FakeError(str(cfg["fail"]), 400)
    if "crash" in cfg:
        raise RuntimeError(str(cfg["crash"]))
    return Handle(model_entry, cfg)


def _one(handle: Handle, data: bytes) -> tuple[int, bytes]:
    if handle.finalized:
        return 503, b"model finalized"
    if len(data) == 0:
        return 200, json.dumps({"signature_name": "serving_default", "fake": True}).encode()
    if data[:1] == b"\xff":
        return 400, "cannot parse request: garbage \u00e9".encode()
    if handle.fixed is not None:
        return 200, handle.fixed
    return 200, bytes(data)  # a view of the host's buffer: copied, never kept


def process(handle: Handle, data: bytes):
    m = handle.misbehave
    if m == "raise":
        raise ValueError("boom")
    if m == "badtype":
        return [200, bytes(data)]
    if m == "badpayload":
        return 200, 12345
    if m == "badstatus":
        return "200", bytes(data)
    if m == "status413":
        return 413, b"request too large"
    if m == "status299":
        return 299, "odd"
    if m == "raise504":
        raise FakeError("deadline passed", 504)
    if m == "raise404":
        raise FakeError("no such signature", 404)
    return _one(handle, data)


def batch_process(handle: Handle, requests: list[bytes]):
    if handle.misbehave == "raise":
        raise ValueError("boom")
    if handle.misbehave == "badtype":
        return [(200, b"x")]  # wrong length
    return [_one(handle, r) for r in requests]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _thread_states() -> int:
    import ctypes

    api = ctypes.pythonapi
    api.PyInterpreterState_Get.restype = ctypes.c_void_p
    api.PyInterpreterState_ThreadHead.restype = ctypes.c_void_p
    api.PyInterpreterState_ThreadHead.argtypes = [ctypes.c_void_p]
    api.PyThreadState_Next.restype = ctypes.c_void_p
    api.PyThreadState_Next.argtypes = [ctypes.c_void_p]
    n, ts = 0, api.PyInterpreterState_ThreadHead(api.PyInterpreterState_Get())
    while ts:
        n += 1
        ts = api.PyThreadState_Next(ts)
    return n


def get_serving_model_info(handle: Handle) -> tuple[int, bytes]:
    path = handle.model_path
    if path == "@thread_states":
        path = str(_thread_states())
    path = path.encode()
    return 200, b"\x0a" + _varint(len(path)) + path  # ServingModelInfo{model_path = 1}


def finalize(handle: Handle) -> None:
    with handle.lock:
        handle.finalized += 1
