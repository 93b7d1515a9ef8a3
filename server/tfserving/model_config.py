"""TF Serving's model config: a ``tensorflow.serving.ModelServerConfig``, as our JSON model entries.

Three ways in take it: ``tensorflow_model_server --model_config_file`` (:mod:`server.tfserving.cli`),
``python -m server --config`` naming a file that is not JSON (:func:`server.model_set.read_deployment`)
and gRPC ``ModelService/HandleReloadConfigRequest`` (:mod:`server.tfserving.grpc_service`). Each file read is
parsed again, so a polled file follows the server's live model set (:mod:`server.model_set`).

* :func:`read_model_entries`: a file read with protobuf's own text format
  (:mod:`server.tfserving.text_protos`) into the message of the tensorflow-serving-api protos
  (:mod:`server.tfserving.messages`: TensorFlow is not imported), as entries. A malformed file is a
  :class:`~processor.errors.ConfigError` in TF Serving's words: ``Error parsing text-format
  tensorflow.serving.ModelServerConfig: <line>:<column> : <what>`` and ``Invalid protobuf file:
  '<path>'``.
* :func:`model_entries`: each ``ModelConfig`` of its ``model_config_list`` as a deployment entry
  (``{"name", "model_config", "version_labels"}``):

  ==========================  ===================================================================
  ``name``                    the entry's ``name``
  ``base_path``               ``savedmodel_dir`` (a TF Serving base directory, versions in it);
                              ``s3://`` / ``oss://`` set ``model_store_type``; another scheme is
                              refused (the stores we read are local, S3 and OSS)
  ``model_platform``          ``tensorflow`` or empty; another is refused (ONNX models through a
                              JSON deployment)
  ``model_type``              (deprecated) ``TENSORFLOW`` or unset
  ``model_version_policy``    ``model_version_policy`` (latest / all / specific; unset: latest 1)
  ``version_labels``          the entry's ``version_labels``
  ``logging_config``          ``logging_config``: ``sampling_config.sampling_rate``, and
                              ``log_collector_config.filename_prefix`` split into the directory
                              (``path``: absolute, or a URL) and the files' ``filename_prefix``;
                              its ``type`` is the format: empty or ``prediction_log`` (TFRecord
                              PredictionLogs), ``jsonl``; per-task sampling, attributes and a
                              custom logging config have no equivalent and are refused
  ==========================  ===================================================================

  A ``custom_model_config`` is refused (TF Serving's own server refuses it too). Problems are a
  ConfigError naming the field (``config.model_config_list.config[1].model_platform: ...``).
* :func:`is_json`: whether a config file's bytes are JSON (our deployment) rather than the text
  format; :func:`new_config`: an empty message (a single model's config is built in one).

Pure functions; nothing is read at import.
"""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import Any

from processor.echo import shorten
from processor.errors import ConfigError

_STORE_SCHEMES = {"s3": "s3", "oss": "oss"}  # base_path URL scheme -> model_store_type
_LOG_FORMATS = {"": "prediction_log", "prediction_log": "prediction_log", "jsonl": "jsonl"}


def is_json(data: bytes) -> bool:
    """Whether a config file's bytes are JSON (an object or array first, a UTF-8 byte order
    mark allowed; an empty file too: JSON's "empty" says more) and not text format, which never
    starts with a bracket."""
    head = data.removeprefix(codecs.BOM_UTF8).lstrip()
    return head[:1] in (b"{", b"[", b"")


def new_config() -> Any:
    """An empty ``ModelServerConfig``."""
    return _message_class()()


def read_model_entries(path: str | Path, what: str = "--model_config_file") -> list[dict[str, Any]]:
    """The model entries of the text-format ``ModelServerConfig`` file at ``path``."""
    from .text_protos import read_file

    return model_entries(read_file(new_config(), str(path), what))


def model_entries(config: Any) -> list[dict[str, Any]]:
    """A ``ModelServerConfig``'s models as our JSON model entries (see the module doc)."""
    if config.WhichOneof("config") == "custom_model_config":
        raise ConfigError("ServerModelConfig type not supported by HandleReloadConfigRequest. "
                          "Only ModelConfigList is currently supported")
    return [_entry(f"config.model_config_list.config[{i}]", model)
            for i, model in enumerate(config.model_config_list.config)]


def _entry(where: str, model: Any) -> dict[str, Any]:
    if model.model_platform not in ("", "tensorflow"):
        raise ConfigError(f"{where}.model_platform: {shorten(model.model_platform, 80)} is not served; "
                          f"only \"tensorflow\" (SavedModels; ONNX models through a JSON deployment)")
    if model.model_type not in (0, 1):  # MODEL_TYPE_UNSPECIFIED, TENSORFLOW
        raise ConfigError(f"{where}.model_type: only TENSORFLOW models are served")
    config: dict[str, Any] = {"savedmodel_dir": model.base_path,
                              "model_version_policy": _version_policy(model.model_version_policy)}
    scheme = model.base_path.split("://", 1)[0] if "://" in model.base_path else ""
    if scheme:
        if scheme not in _STORE_SCHEMES:
            raise ConfigError(f"{where}.base_path: {shorten(scheme, 20)}:// is not a model store served here; "
                              f"a local directory, s3:// or oss://")
        config["model_store_type"] = _STORE_SCHEMES[scheme]
    if model.HasField("logging_config"):
        config["logging_config"] = _logging_config(f"{where}.logging_config", model.logging_config)
    return {"name": model.name, "model_config": config, "version_labels": dict(model.version_labels)}


def _version_policy(policy: Any) -> dict[str, Any]:
    """A ``ServableVersionPolicy`` in our JSON form (none set: latest 1, TF Serving's default)."""
    kind = policy.WhichOneof("policy_choice")
    if kind == "all":
        return {"all": {}}
    if kind == "specific":
        return {"specific": {"versions": list(policy.specific.versions)}}
    return {"latest": {"num_versions": (policy.latest.num_versions if kind == "latest" else 0) or 1}}


def _logging_config(where: str, logging: Any) -> dict[str, Any]:
    """A TF Serving ``LoggingConfig`` as our ``logging_config`` (see the module doc)."""
    sampling = logging.sampling_config
    for field, what in (("per_task_sampling_configs", "per-task sampling rates"),
                        ("attributes", "sampled request attributes")):
        if getattr(sampling, field):
            raise ConfigError(f"{where}.sampling_config.{field}: {what} have no equivalent here; "
                              f"one sampling_rate per model")
    if logging.HasField("custom_logging_config"):
        raise ConfigError(f"{where}.custom_logging_config: no custom logger here (prediction logs are "
                          f"TFRecord PredictionLogs or JSON lines)")
    collector = logging.log_collector_config
    if collector.type not in _LOG_FORMATS:
        raise ConfigError(f"{where}.log_collector_config.type: {shorten(collector.type, 40)} is not a log "
                          f"format here; empty or \"prediction_log\" (TFRecord PredictionLogs), \"jsonl\"")
    if not collector.filename_prefix:
        raise ConfigError(f"{where}.log_collector_config.filename_prefix: required: where the logs go "
                          f"(/var/log/sp/model, s3://bucket/logs/model)")
    path, _, prefix = collector.filename_prefix.rpartition("/")
    out: dict[str, Any] = {"sampling_rate": sampling.sampling_rate, "path": path or "/",
                           "format": _LOG_FORMATS[collector.type]}
    if prefix:
        out["filename_prefix"] = prefix
    return out


def _message_class() -> Any:
    """tensorflow-serving-api's ``ModelServerConfig`` (server/tfserving/messages.py); ConfigError
    saying what to install when it is not there."""
    from .messages import messages

    try:
        return messages().ModelServerConfig
    except ImportError as exc:
        raise ConfigError(f"a TF Serving model config file needs the tensorflow-serving-api package "
                          f"({exc}); install it as scripts/setup.sh does") from None
