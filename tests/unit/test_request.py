"""processor.request: the request path's constructors equal the ordinary ones."""

from __future__ import annotations

from processor.request import PredictCall, PredictResult, wire_call, wire_result
from processor.signature import Signature


def test_wire_call_is_the_no_options_call():
    data = memoryview(b"\x0a\x01x")
    call = wire_call("m", data)
    assert type(call) is PredictCall
    assert call == PredictCall("m", data)  # every default, in step with the fields' own
    assert call.model == "m" and call.inputs is data and call.check_shapes is True


def test_wire_result_is_the_ordinary_result():
    signature = Signature("serving_default", {}, {})
    result = wire_result(b"out", "v", signature)
    assert type(result) is PredictResult
    assert result == PredictResult(b"out", "v", signature)
    assert result.introspection is False
