"""ctypes binding of libserving_processor.so for the C ABI tests and benchmark.

Used in-process (the library then joins the caller's interpreter) and as a script run in a
subprocess, where it drives scenarios against the stand-in Python module c_abi_fake_abi (LIB is
then the test build, ``cpp_processor/build/testing/libserving_processor_testing.so``) or under
LeakSanitizer::

    python tests/e2e/c_abi_ctypes.py LIB SCENARIO [CONFIG_FILE [REQUEST_FILE]]

Scenarios print one ``RESULT {json}`` line; see :func:`main`.
"""

from __future__ import annotations

import ctypes
import json
import sys
import threading
from collections.abc import Sequence

_c_int_p = ctypes.POINTER(ctypes.c_int)
_c_void_pp = ctypes.POINTER(ctypes.c_void_p)

UNSET = object()


class NativeProcessor:
    """The C functions with Python arguments. ``None`` passes a NULL pointer."""

    def __init__(self, lib_path: str) -> None:
        lib = ctypes.CDLL(str(lib_path))  # CDLL releases the GIL around each call
        lib.initialize.restype = ctypes.c_void_p
        lib.initialize.argtypes = [ctypes.c_char_p, ctypes.c_char_p, _c_int_p]
        lib.process.restype = ctypes.c_int
        lib.process.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, _c_void_pp, _c_int_p]
        lib.batch_process.restype = ctypes.c_int
        lib.batch_process.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p),
                                      _c_int_p, _c_void_pp, _c_int_p, _c_int_p]
        lib.get_serving_model_info.restype = ctypes.c_int
        lib.get_serving_model_info.argtypes = [ctypes.c_void_p, _c_void_pp, _c_int_p]
        lib.finalize.restype = None
        lib.finalize.argtypes = [ctypes.c_void_p]
        lib.processor_free.restype = None
        lib.processor_free.argtypes = [ctypes.c_void_p]
        lib.processor_abi_version.restype = ctypes.c_int
        lib.processor_abi_version.argtypes = []
        lib.processor_last_error.restype = ctypes.c_char_p
        lib.processor_last_error.argtypes = []
        self.lib = lib

    def abi_version(self) -> int:
        return self.lib.processor_abi_version()

    def last_error(self) -> str:
        return self.lib.processor_last_error().decode("utf-8", "replace")

    def initialize(self, config: bytes | str | None, entry: bytes | str | None = b"",
                   with_state: bool = True) -> tuple[int | None, int]:
        """Returns (handle or None, state)."""
        state = ctypes.c_int(12345)
        enc = lambda v: v.encode() if isinstance(v, str) else v  # noqa: E731
        handle = self.lib.initialize(enc(entry), enc(config), ctypes.byref(state) if with_state else None)
        return handle, state.value

    def _take(self, out: ctypes.c_void_p, size: int) -> bytes | None:
        if not out.value:
            return None
        data = ctypes.string_at(out.value, size)
        self.lib.processor_free(out)
        return data

    def process(self, handle, data: bytes | None, size: int | None = None, *,
                null_output: bool = False, null_size: bool = False) -> tuple[int, bytes | None]:
        """Returns (status, output bytes or None when the library wrote no buffer)."""
        out, n = ctypes.c_void_p(), ctypes.c_int(-1)
        if size is None:
            size = len(data) if data is not None else 0
        status = self.lib.process(handle, data, size,
                                  None if null_output else ctypes.byref(out),
                                  None if null_size else ctypes.byref(n))
        return status, self._take(out, n.value)

    def batch_process(self, handle, requests: Sequence[bytes | None],
                      sizes: Sequence[int] | None = None) -> tuple[int, list[tuple[int, bytes | None]]]:
        """Returns (call status, [(status_i, output_i)])."""
        count = len(requests)
        if sizes is None:
            sizes = [len(r) if r is not None else 0 for r in requests]
        ins = (ctypes.c_char_p * max(count, 1))(*requests)
        ins_size = (ctypes.c_int * max(count, 1))(*sizes)
        outs = (ctypes.c_void_p * max(count, 1))()
        outs_size = (ctypes.c_int * max(count, 1))()
        status = (ctypes.c_int * max(count, 1))()
        rc = self.lib.batch_process(handle, count, ins, ins_size, outs, outs_size, status)
        results = []
        for i in range(count):
            data = ctypes.string_at(outs[i], outs_size[i]) if outs[i] else None
            self.lib.processor_free(outs[i])
            results.append((status[i], data))
        return rc, results

    def get_serving_model_info(self, handle) -> tuple[int, bytes | None]:
        out, n = ctypes.c_void_p(), ctypes.c_int(-1)
        status = self.lib.get_serving_model_info(handle, ctypes.byref(out), ctypes.byref(n))
        return status, self._take(out, n.value)

    def finalize(self, handle) -> None:
        self.lib.finalize(handle)


def decode_model_path(info: bytes) -> str:
    """ServingModelInfo{model_path = 1}, without needing the generated module."""
    from processor.proto import predict_pb2

    return predict_pb2.ServingModelInfo.FromString(info).model_path


def argument_errors(native: NativeProcessor, handle, good_request: bytes) -> dict[str, object]:
    """Every malformed call, each followed by a good one; returns what each gave."""
    bogus = ctypes.create_string_buffer(64)  # a non-NULL pointer that is no handle
    cases = {
        "null_handle": lambda: native.process(None, good_request),
        "bogus_handle": lambda: native.process(ctypes.addressof(bogus), good_request),
        "negative_size": lambda: native.process(handle, good_request, -5),
        "null_data": lambda: native.process(handle, None, 10),
        "null_output": lambda: native.process(handle, good_request, null_output=True),
        "null_output_size": lambda: native.process(handle, good_request, null_size=True),
        "garbage": lambda: native.process(handle, b"\xff\xfe garbage \x00\x01 bytes"),
        "empty": lambda: native.process(handle, b""),
        "null_empty": lambda: native.process(handle, None, 0),
        "info_null_handle": lambda: native.get_serving_model_info(None),
    }
    results: dict[str, object] = {}
    for name, call in cases.items():
        status, out = call()
        after_status, _ = native.process(handle, good_request)
        results[name] = {"status": status, "message": None if out is None else out.decode("utf-8", "replace"),
                         "next_call": after_status}
    return results


def main(argv: list[str]) -> int:
    """Scenarios for subprocess runs (the library joins this script's interpreter).

    * ``fake_misbehave CONFIG``: initialize with the fake module's config, run process,
      batch_process and get_serving_model_info, report statuses and messages.
    * ``fake_init CONFIG``: initialize only; report handle, state and last error.
    * ``errors CONFIG REQUEST N``: N rounds of every argument error, then batch_process with bad
      and good entries, then finalize and use-after-finalize (for the leak check).
    """
    lib, scenario = argv[1], argv[2]
    native = NativeProcessor(lib)
    config = open(argv[3], "rb").read() if len(argv) > 3 else b"{}"
    result: dict[str, object] = {"abi_version": native.abi_version()}
    handle, state = native.initialize(config)
    result.update(initialized=handle is not None, state=state, last_error=native.last_error())
    if scenario == "fake_init" or handle is None:
        pass
    elif scenario == "fake_misbehave":
        st, out = native.process(handle, b"request")
        result["process"] = [st, out.decode("utf-8", "replace") if out is not None else None]
        rc, items = native.batch_process(handle, [b"a", b"b"])
        result["batch"] = [rc, [[s, o.decode("utf-8", "replace") if o is not None else None] for s, o in items]]
        st, out = native.get_serving_model_info(handle)
        result["info"] = [st, len(out or b"")]
        native.finalize(handle)
        native.finalize(handle)
        result["after_finalize"] = native.process(handle, b"x")[0]
    elif scenario == "errors":
        request = open(argv[4], "rb").read()
        rounds = int(argv[5]) if len(argv) > 5 else 1
        for _ in range(rounds):
            errs = argument_errors(native, handle, request)
            rc, items = native.batch_process(handle, [request, None, b"\xffjunk", request, b""],
                                             [len(request), 7, 5, -1, 0])
            bogus = ctypes.create_string_buffer(8)
            native.batch_process(ctypes.addressof(bogus), [request])
            native.get_serving_model_info(handle)
        result["errors"] = errs
        result["batch"] = [rc, [s for s, _ in items]]

        def worker() -> None:
            for _ in range(rounds):
                native.process(handle, request)

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        native.finalize(handle)
        result["after_finalize"] = native.process(handle, request)[0]
        native.finalize(handle)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
