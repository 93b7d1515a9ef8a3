"""TF Serving's ``tensorflow.serving.PredictionLog`` without TensorFlow: the record format.

Declares, through the protobuf runtime only (no protoc, no TensorFlow, no tensorflow-serving-api
at import), the subset of ``tensorflow_serving/apis/prediction_log.proto`` (and the messages it
uses: ``LogMetadata``, ``PredictLog``, ``PredictRequest`` / ``PredictResponse``, ``ModelSpec``,
``tensorflow.TensorProto``) that a predict log needs, with the same field numbers, so the
records parse with ``tensorflow_serving.apis.prediction_log_pb2`` and ``tf.make_ndarray``.
Enums are declared as ``int32`` (the same varint on the wire), ``google.protobuf.Int64Value`` as
a local message of the same shape.

What TF Serving's proto has no field for is kept in ``LogMetadata`` under field numbers of ours
(:data:`EXTRA_FIELDS`, far above TF Serving's): ``request_id``, ``timestamp_micros``,
``error_code`` and ``error_message`` (a failed call: its request, no response). TF Serving's
readers keep them as unknown fields; :data:`PredictionLog` of this module reads them.

The messages live in a private descriptor pool, so they never clash with TF Serving's own when
both are loaded in one process.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_PACKAGE = "sp_prediction_log"

# Ours, in LogMetadata: name -> field number
EXTRA_FIELDS = {"request_id": 1001, "timestamp_micros": 1002, "error_code": 1003, "error_message": 1004}


def _field(name: str, number: int, kind: int, repeated: bool = False, message: str = ""):
    f = _F(name=name, number=number, type=kind, label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
    if message:
        f.type_name = f".{_PACKAGE}.{message}"
    return f


def _message(file, name: str, *fields):
    msg = file.message_type.add(name=name)
    msg.field.extend(fields)
    return msg


def _map(msg, field: str, number: int, value: str) -> None:
    """A ``map<string, value>`` field of ``msg``: a nested entry message, as protoc writes it."""
    entry_name = "".join(p.capitalize() for p in field.split("_")) + "Entry"
    entry = msg.nested_type.add(name=entry_name)
    entry.field.extend([_field("key", 1, _F.TYPE_STRING), _field("value", 2, _F.TYPE_MESSAGE, message=value)])
    entry.options.map_entry = True
    msg.field.append(_field(field, number, _F.TYPE_MESSAGE, True, f"{msg.name}.{entry_name}"))


def _build_pool() -> descriptor_pool.DescriptorPool:
    file = descriptor_pb2.FileDescriptorProto(
        name="processor/prediction_log/prediction_log_subset.proto", package=_PACKAGE, syntax="proto3")
    _message(file, "Dim", _field("size", 1, _F.TYPE_INT64), _field("name", 2, _F.TYPE_STRING))
    _message(file, "TensorShapeProto", _field("dim", 2, _F.TYPE_MESSAGE, True, "Dim"),
             _field("unknown_rank", 3, _F.TYPE_BOOL))
    _message(file, "TensorProto", _field("dtype", 1, _F.TYPE_INT32),
             _field("tensor_shape", 2, _F.TYPE_MESSAGE, message="TensorShapeProto"),
             _field("tensor_content", 4, _F.TYPE_BYTES), _field("float_val", 5, _F.TYPE_FLOAT, True),
             _field("double_val", 6, _F.TYPE_DOUBLE, True), _field("int_val", 7, _F.TYPE_INT32, True),
             _field("string_val", 8, _F.TYPE_BYTES, True), _field("int64_val", 10, _F.TYPE_INT64, True),
             _field("bool_val", 11, _F.TYPE_BOOL, True))
    _message(file, "Int64Value", _field("value", 1, _F.TYPE_INT64))
    _message(file, "ModelSpec", _field("name", 1, _F.TYPE_STRING),
             _field("version", 2, _F.TYPE_MESSAGE, message="Int64Value"),
             _field("signature_name", 3, _F.TYPE_STRING), _field("version_label", 4, _F.TYPE_STRING))
    request = _message(file, "PredictRequest", _field("model_spec", 1, _F.TYPE_MESSAGE, message="ModelSpec"))
    _map(request, "inputs", 2, "TensorProto")
    request.field.append(_field("output_filter", 3, _F.TYPE_STRING, True))
    response = _message(file, "PredictResponse")
    _map(response, "outputs", 1, "TensorProto")
    response.field.append(_field("model_spec", 2, _F.TYPE_MESSAGE, message="ModelSpec"))
    _message(file, "SamplingConfig", _field("sampling_rate", 1, _F.TYPE_DOUBLE))
    _message(file, "LogMetadata", _field("model_spec", 1, _F.TYPE_MESSAGE, message="ModelSpec"),
             _field("sampling_config", 2, _F.TYPE_MESSAGE, message="SamplingConfig"),
             _field("timestamp_secs", 4, _F.TYPE_INT64),
             _field("request_id", EXTRA_FIELDS["request_id"], _F.TYPE_STRING),
             _field("timestamp_micros", EXTRA_FIELDS["timestamp_micros"], _F.TYPE_INT64),
             _field("error_code", EXTRA_FIELDS["error_code"], _F.TYPE_STRING),
             _field("error_message", EXTRA_FIELDS["error_message"], _F.TYPE_STRING))
    _message(file, "PredictLog", _field("request", 1, _F.TYPE_MESSAGE, message="PredictRequest"),
             _field("response", 2, _F.TYPE_MESSAGE, message="PredictResponse"))
    _message(file, "PredictionLog", _field("log_metadata", 1, _F.TYPE_MESSAGE, message="LogMetadata"),
             _field("predict_log", 6, _F.TYPE_MESSAGE, message="PredictLog"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return pool


_POOL = _build_pool()
PredictionLog = message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{_PACKAGE}.PredictionLog"))
