"""TF Serving's text-format files, read with protobuf's own text format.

:func:`parse` reads any of them into its message and reports a malformed file in TF Serving's
words: ``Error parsing text-format <full message name>: <line>:<column> : <what>; Invalid
protobuf file: '<path>'`` (protobuf's parser message, then TF Serving's ``ParseProtoTextFile``
status), as a :class:`~processor.errors.ConfigError`.

The ``ModelServerConfig`` comes from the tensorflow-serving-api package
(:mod:`server.tfserving.model_config`). That package ships none of the protos of three other flag
files, so their messages are declared here through the protobuf runtime (no protoc, no
TensorFlow), with TF Serving's full names and field numbers, in a private descriptor pool:

* ``tensorflow.serving.BatchingParameters`` (``--batching_parameters_file``;
  ``servables/tensorflow/session_bundle_config.proto``): its wrapper fields are
  ``google.protobuf.Int64Value`` / ``StringValue`` / ``BoolValue``, so a file reads
  ``max_batch_size { value: 128 }`` as TF Serving's does;
* ``tensorflow.serving.MonitoringConfig`` with ``PrometheusConfig`` (``--monitoring_config_file``;
  ``config/monitoring_config.proto``);
* ``tensorflow.serving.SSLConfig`` (``--ssl_config_file``; ``config/ssl_config.proto``).

:func:`flag_message` returns a new message of one of them by its short name. Nothing is built
at import; the pool is built on first use (a lock) and read-only after.
"""

from __future__ import annotations

import threading
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format, wrappers_pb2

from processor.echo import cut
from processor.errors import ConfigError

_F = descriptor_pb2.FieldDescriptorProto
_PACKAGE = "tensorflow.serving"
_WRAPPERS = {"int64": ".google.protobuf.Int64Value", "string": ".google.protobuf.StringValue",
             "bool": ".google.protobuf.BoolValue"}
_SCALARS = {"int64": _F.TYPE_INT64, "string": _F.TYPE_STRING, "bool": _F.TYPE_BOOL}

# message -> (field, number, type): a scalar type, "repeated <type>", "wrapped <type>" (a
# google.protobuf wrapper message) or "message <name>" (one of these)
_MESSAGES: dict[str, tuple[tuple[str, int, str], ...]] = {
    "BatchingParameters": (
        ("max_batch_size", 1, "wrapped int64"), ("batch_timeout_micros", 2, "wrapped int64"),
        ("max_enqueued_batches", 3, "wrapped int64"), ("num_batch_threads", 4, "wrapped int64"),
        ("thread_pool_name", 5, "wrapped string"), ("allowed_batch_sizes", 6, "repeated int64"),
        ("pad_variable_length_inputs", 7, "bool"), ("enable_large_batch_splitting", 8, "wrapped bool"),
        ("max_execution_batch_size", 9, "wrapped int64")),
    "PrometheusConfig": (("enable", 1, "bool"), ("path", 2, "string")),
    "MonitoringConfig": (("prometheus_config", 1, "message PrometheusConfig"),),
    "SSLConfig": (("server_key", 1, "string"), ("server_cert", 2, "string"), ("custom_ca", 3, "string"),
                  ("client_verify", 4, "bool")),
}

_lock = threading.Lock()
_classes: dict[str, Any] = {}


def parse(message: Any, data: str | bytes, source: str) -> Any:
    """Read the text-format ``data`` into ``message`` (a new message) and return it;
    ConfigError in TF Serving's words (see the module doc). ``source``: the file's path."""
    name = message.DESCRIPTOR.full_name
    try:
        text_format.Parse(data.decode("utf-8") if isinstance(data, bytes) else data, message)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"Error parsing text-format {name}: not UTF-8 (byte {exc.start}); "
                          f"Invalid protobuf file: '{source}'") from None
    except text_format.ParseError as exc:
        raise ConfigError(f"Error parsing text-format {name}: {cut(str(exc), 300)}; "
                          f"Invalid protobuf file: '{source}'") from None
    return message


def read_file(message: Any, path: str, what: str) -> Any:
    """:func:`parse` of the file at ``path``; ``what``: how messages name the file (its flag)."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path!r}: {exc.strerror}") from None
    return parse(message, data, path)


def flag_message(name: str) -> Any:
    """A new ``tensorflow.serving.<name>`` message (``BatchingParameters``, ``MonitoringConfig``,
    ``SSLConfig``)."""
    if not _classes:
        with _lock:
            if not _classes:
                _classes.update(_build())
    return _classes[name]()


def _build() -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    file = descriptor_pb2.FileDescriptorProto(name="sp/tfs_flag_files.proto", package=_PACKAGE, syntax="proto3",
                                              dependency=[wrappers_pb2.DESCRIPTOR.name])
    for message, fields in _MESSAGES.items():
        file.message_type.add(name=message).field.extend(_field(*f) for f in fields)
    pool.Add(file)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
            for name in _MESSAGES}


def _field(name: str, number: int, kind: str) -> Any:
    form, _, of = kind.rpartition(" ")
    field = _F(name=name, number=number, label=_F.LABEL_REPEATED if form == "repeated" else _F.LABEL_OPTIONAL)
    if form == "wrapped":
        field.type, field.type_name = _F.TYPE_MESSAGE, _WRAPPERS[of]
    elif form == "message":
        field.type, field.type_name = _F.TYPE_MESSAGE, f".{_PACKAGE}.{of}"
    else:
        field.type = _SCALARS[of]
    return field
