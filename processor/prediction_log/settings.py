"""LoggingConfig: the ``logging_config`` key of a model_config (prediction logging).

```json
"logging_config": {"sampling_rate": 0.01, "path": "/var/log/sp/demo", "format": "prediction_log",
                   "max_file_bytes": 67108864, "max_file_age_seconds": 300, "queue_size": 1024}
```

Absent (the default): nothing is logged. ``path`` is a local directory (absolute) or an fsspec
URL (``s3://``, ``oss://``, ``gs://``, ``memory://``...); with a URL, files are written to
``staging_dir`` and each closed file is uploaded there (through the model store's file system
when the scheme is ``model_store_type``'s, so its credentials apply) and then removed locally.
Types are strict (``"0.5"`` or ``true`` is not a number); a wrong key or value is a ConfigError
naming ``logging_config.<key>``. Immutable.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

_PREFIX = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class LoggingConfig(BaseModel):
    """One model's prediction-logging settings. See the module doc."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    # Share of predict calls logged, each drawn at random (TF Serving's sampling_config).
    sampling_rate: float = Field(ge=0, le=1)
    # Where closed files go: an absolute local directory or an fsspec URL.
    path: str = Field(min_length=1)
    # "prediction_log": TFRecord files of tensorflow.serving.PredictionLog (*.tfrecord);
    # "jsonl": one JSON object per line (*.jsonl).
    format: Literal["prediction_log", "jsonl"] = "prediction_log"
    # A file is closed (and renamed into place, uploaded) at this size or age, whichever first.
    max_file_bytes: int = Field(64 << 20, ge=4096, le=1 << 40)
    max_file_age_seconds: float = Field(300, gt=0, le=7 * 86400)
    # Records waiting for the writer thread; when full, a sampled record is dropped and counted.
    queue_size: int = Field(1024, ge=1, le=1 << 20)
    # File names start with this (default: the model's name).
    filename_prefix: str | None = None
    # Local directory for files on their way to a URL ``path`` (default: a per-process temp dir).
    staging_dir: str | None = None

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not (value.startswith("/") or "://" in value):
            raise ValueError("must be an absolute directory or a URL (s3://bucket/dir, file:///dir)")
        return value

    @field_validator("staging_dir")
    @classmethod
    def _staging_dir(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError("must be an absolute directory")
        return value

    @field_validator("filename_prefix")
    @classmethod
    def _filename_prefix(cls, value: str | None) -> str | None:
        if value is not None and not _PREFIX.match(value):
            raise ValueError("must be 1-64 characters of letters, digits, '.', '_' or '-'")
        return value

    @property
    def remote(self) -> bool:
        """Closed files are uploaded to a URL (not a local or ``file://`` directory)."""
        return "://" in self.path and not self.path.startswith("file://")

    @property
    def extension(self) -> str:
        return ".tfrecord" if self.format == "prediction_log" else ".jsonl"
