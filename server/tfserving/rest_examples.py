"""TF Serving REST ``:classify`` / ``:regress`` bodies -> ``ClassificationRequest`` /
``RegressionRequest``, as TF Serving's ``FillClassifyRegressRequestFromJson`` reads them.

``{"signature_name": "...", "context": {feature: value}, "examples": [{feature: value}, ...]}``:
a value is a JSON number, string, boolean, ``{"b64": "..."}`` or a list of them; integers (and
booleans, 0/1) go to an ``int64_list``, other numbers to a ``float_list``, strings and ``b64``
to a ``bytes_list``; one feature's values must be of one kind. A ``context`` makes the input an
``ExampleListWithContext``. Errors are InvalidArgument with TF Serving's messages (values echoed
cut). Pure functions; thread-safe.
"""

from __future__ import annotations

import binascii
import base64
from typing import Any

from processor.echo import cut
from processor.errors import InvalidArgument

from .rest_json import parse_body

_INT64 = (-(1 << 63), (1 << 63) - 1)


def fill_request(body: bytes | bytearray, request, max_depth: int) -> None:
    """Fill ``request`` (a Classification- or RegressionRequest, its model_spec set) from ``body``."""
    doc = parse_body(body, max_depth)
    name = doc.get("signature_name", "")
    if not isinstance(name, str):
        raise InvalidArgument("'signature_name' key must be a string value.")
    request.model_spec.signature_name = name
    examples = doc.get("examples")
    if examples is None:
        raise InvalidArgument("When method is classify, key 'examples' is expected and was not found")
    if not isinstance(examples, list):
        raise InvalidArgument("Expecting 'examples' value to be an list/array")
    if not examples:
        raise InvalidArgument("'examples' value is an empty array")
    if "context" in doc:
        listed = request.input.example_list_with_context
        _fill_example(doc["context"], listed.context)
    else:
        listed = request.input.example_list
    for value in examples:
        _fill_example(value, listed.examples.add())


def _fill_example(value: Any, example) -> None:
    if not isinstance(value, dict):
        raise InvalidArgument(f"Example must be JSON object but got JSON {_json_type(value)}")
    features = example.features.feature
    for name, content in value.items():
        feature = features[name]
        for item in content if isinstance(content, list) else [content]:
            _add_value(item, name, feature)


def _add_value(value: Any, name: str, feature) -> None:
    if isinstance(value, bool) or (isinstance(value, int) and not isinstance(value, bool)):
        _kind(feature, "int64_list", name)
        number = int(value)
        if not _INT64[0] <= number <= _INT64[1]:
            raise InvalidArgument(f"Feature: {cut(name)} has uint64_t element. Only int64_t is supported.")
        feature.int64_list.value.append(number)
    elif isinstance(value, float):
        _kind(feature, "float_list", name)
        feature.float_list.value.append(value)
    elif isinstance(value, str):
        _kind(feature, "bytes_list", name)
        feature.bytes_list.value.append(value.encode("utf-8", "surrogatepass"))
    elif isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str):
        _kind(feature, "bytes_list", name)
        try:
            feature.bytes_list.value.append(base64.b64decode(value["b64"], validate=True))
        except (binascii.Error, ValueError):
            raise InvalidArgument("Unable to base64 decode") from None
    else:
        raise InvalidArgument(f"Feature: {cut(name)} has element with unexpected JSON type: {_json_type(value)}")


def _kind(feature, kind: str, name: str) -> None:
    """Refuse a value of another kind than the feature's earlier ones (TF Serving's wording)."""
    have = feature.WhichOneof("kind")
    if have is not None and have != kind:
        raise InvalidArgument(f"Unexpected element type in feature: {cut(name)} expecting type: "
                              f"{have.split('_')[0]}")


def _json_type(value: Any) -> str:
    if value is None:
        return "Null"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, dict):
        return "Object"
    if isinstance(value, list):
        return "Array"
    if isinstance(value, str):
        return "String"
    return "Number"
