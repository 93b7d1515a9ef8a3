"""Serving without the native extension is correct, logged once and visible in model info."""

from __future__ import annotations

import logging

import numpy as np

from processor import codec, native
from processor.signature import Signature, TensorSpec
from processor.wire_codec import WireCodec

SIG = Signature("s", {"x": TensorSpec("x", "x:0", 1, (-1, 2)), "s": TensorSpec("s", "s:0", 7, (-1,))},
                {"y": TensorSpec("y", "y:0", 1, None)})


def test_without_the_extension_the_reference_serves_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(native, "MODULE", None)
    monkeypatch.setattr(native, "_REASON", "processor._native is not built for this Python (test)")
    monkeypatch.setattr(native, "_warned", type(native._warned)())
    with caplog.at_level(logging.WARNING, logger="processor.native"):
        wire = WireCodec(SIG, {"s"})
        WireCodec(SIG)
    assert [r.getMessage() for r in caplog.records] == ["processor._native is not built for this Python (test)"]
    assert wire.describe() == {"native": False, "reason": "processor._native is not built for this Python (test)",
                               "fingerprinted_inputs": ["s"]}
    data = codec.encode_request({"x": np.ones((3, 2), np.float32), "s": np.array([b"a", b"b", b"c"], object)})
    feeds, keys, aliases = wire.decode(data)
    want = codec.decode_request(data, SIG)
    assert keys == aliases == ("y",) and feeds["s"].tolist() == want.feeds["s"].tolist()  # bytes: not hashed
    out = [np.arange(3, dtype=np.float32)]
    assert wire.encode(keys, out) == codec.encode_response({"y": out[0]})
