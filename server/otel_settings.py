"""TracingSettings: the deployment's ``tracing`` key, OpenTelemetry traces exported over OTLP.

::

    "tracing": {"otlp_endpoint": "http://collector:4317", "protocol": "grpc",
                "sample_rate": 0.01, "service_name": "serving-processor",
                "headers": {"x-tenant": "recsys"}}

The key's presence turns tracing on (it is off by default); ``"tracing": {}`` takes every
setting from OpenTelemetry's standard environment variables, which also fill in whatever the key
leaves out (``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``, ``_PROTOCOL``, ``_HEADERS``, ``_TIMEOUT``,
``OTEL_TRACES_SAMPLER`` / ``_ARG``, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_BSP_*``; ``OTEL_SDK_DISABLED=true`` turns tracing off). They are read when the server
starts (:func:`server.otel.resolve`), never at import. Validation only here: this module is
transport-neutral and imports no OpenTelemetry package.

(The deployment's ``tracing`` is unrelated to a model_config's ``timeline_*`` keys, the DeepRec
StepStats timelines of :mod:`processor.tracing`; both may be on at once.)

Immutable, safe to share between threads.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# OTLP header names are HTTP header names (gRPC metadata keys): lower case, no spaces
_HEADER_NAME = r"^[a-z0-9][a-z0-9_.\-]{0,127}$"


class TracingSettings(BaseModel):
    """See the module doc. ``None``: the environment's setting, else OpenTelemetry's default
    (``sample_rate``'s default is ours: 0.01, parent-based; the SDK's would trace everything)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    # the collector: http(s)://host:port (gRPC), or the base URL or the full /v1/traces URL of
    # an OTLP/HTTP receiver (a URL without a path gets /v1/traces)
    otlp_endpoint: str | None = Field(None, pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$", max_length=2048)
    protocol: Literal["grpc", "http/protobuf"] | None = None
    # the share of requests without a caller's trace that start one; a caller's sampled trace
    # is always continued, an unsampled one never (parent-based)
    sample_rate: float | None = Field(None, ge=0, le=1)
    service_name: str | None = Field(None, min_length=1, max_length=256)
    # sent with every export (API keys, tenants); masked in logs. OTEL_EXPORTER_OTLP_HEADERS
    # keeps secrets out of the file
    headers: dict[str, str] | None = None
    # spans waiting for export; a span that finds it full is dropped (counted in /metrics)
    max_queue_size: int | None = Field(None, ge=1, le=1_000_000)
    max_export_batch_size: int | None = Field(None, ge=1, le=1_000_000)
    # how long one export may take before it is given up (its spans counted as failed)
    export_timeout_seconds: float | None = Field(None, gt=0, le=300)

    @model_validator(mode="after")
    def _check(self) -> TracingSettings:
        for name in self.headers or {}:
            if not re.match(_HEADER_NAME, name):
                raise ValueError(f"headers: {name[:80]!r} is not a lower-case header name")
        if (self.max_queue_size is not None and self.max_export_batch_size is not None
                and self.max_export_batch_size > self.max_queue_size):
            raise ValueError("max_export_batch_size: larger than max_queue_size")
        return self

    def redacted(self) -> dict:
        """For logs: the header values masked."""
        out = self.model_dump(mode="json")
        if out.get("headers"):
            out["headers"] = {name: "***" for name in out["headers"]}
        return out
