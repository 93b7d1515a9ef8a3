"""The deployment's ``tracing`` key and what the server resolves from it and the standard OTEL_*
environment variables (issue 46); the edge's sampling decision on W3C ``traceparent`` values."""

from __future__ import annotations

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the server extra installs the OpenTelemetry SDK")

from server.settings import DeploymentConfig  # noqa: E402
from processor.errors import ConfigError  # noqa: E402
from server.otel_settings import TracingSettings  # noqa: E402
from server.otel import DEFAULT_SAMPLE_RATE, Resolved, Tracing, resolve  # noqa: E402

MODEL = {"name": "m", "model_config": {"savedmodel_dir": "/tmp/none"}}
SAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
UNSAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"


def deployment(tracing) -> DeploymentConfig:
    return DeploymentConfig.from_dict({"models": [MODEL], "tracing": tracing})


def test_tracing_is_off_by_default_and_the_key_turns_it_on():
    assert DeploymentConfig.from_dict({"models": [MODEL]}).tracing is None
    assert resolve(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}) is None  # env alone: off
    got = resolve(deployment({}).tracing, {})
    assert (got.protocol, got.endpoint, got.parent_based, got.rate, got.service_name) == (
        "grpc", None, True, DEFAULT_SAMPLE_RATE, "serving-processor")


@pytest.mark.parametrize("tracing, message", [
    ({"sample_rate": 1.5}, "tracing.sample_rate"),
    ({"sample_rate": "0.1"}, "tracing.sample_rate"),
    ({"protocol": "http/json"}, "tracing.protocol"),
    ({"otlp_endpoint": "collector:4317"}, "tracing.otlp_endpoint"),
    ({"headers": {"X Key": "v"}}, "not a lower-case header name"),
    ({"max_queue_size": 10, "max_export_batch_size": 20}, "max_export_batch_size"),
    ({"sampler": "always_on"}, "tracing.sampler"),
])
def test_bad_settings_name_their_key(tracing, message):
    with pytest.raises(ConfigError, match=message):
        deployment(tracing)


def test_header_values_are_masked_in_logs():
    dep = deployment({"otlp_endpoint": "https://c:4317", "headers": {"x-api-key": "secret"}})
    assert dep.redacted()["tracing"]["headers"] == {"x-api-key": "***"}
    assert dep.tracing.headers == {"x-api-key": "secret"}


def test_the_deployment_wins_over_the_environment():
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_SERVICE_NAME": "env-name",
           "OTEL_TRACES_SAMPLER": "always_on"}
    got = resolve(TracingSettings(protocol="grpc", service_name="mine", sample_rate=0.25,
                                  otlp_endpoint="http://c:4317"), env)
    assert (got.protocol, got.service_name, got.parent_based, got.rate, got.endpoint) == (
        "grpc", "mine", True, 0.25, "http://c:4317")


def test_the_environment_fills_in():
    got = resolve(TracingSettings(), {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
                                      "OTEL_SERVICE_NAME": "recs", "OTEL_TRACES_SAMPLER": "traceidratio",
                                      "OTEL_TRACES_SAMPLER_ARG": "0.5"})
    assert (got.protocol, got.service_name, got.parent_based, got.rate) == ("http/protobuf", "recs", False, 0.5)
    assert resolve(TracingSettings(), {"OTEL_TRACES_SAMPLER": "parentbased_always_off"}).rate == 0.0
    assert resolve(TracingSettings(), {"OTEL_SDK_DISABLED": "true"}) is None


@pytest.mark.parametrize("env, message", [
    ({"OTEL_TRACES_SAMPLER": "jaeger_remote"}, "OTEL_TRACES_SAMPLER"),
    ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, "OTEL_TRACES_SAMPLER_ARG"),
    ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "x"}, "OTEL_TRACES_SAMPLER_ARG"),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
])
def test_bad_environment_values_name_the_variable(env, message):
    with pytest.raises(ConfigError, match=message):
        resolve(TracingSettings(), env)


def test_an_http_base_url_gets_the_traces_path():
    assert resolve(TracingSettings(protocol="http/protobuf", otlp_endpoint="http://c:4318"), {}).endpoint == \
        "http://c:4318/v1/traces"
    assert resolve(TracingSettings(protocol="http/protobuf", otlp_endpoint="http://c:4318/custom"), {}).endpoint == \
        "http://c:4318/custom"
    assert resolve(TracingSettings(protocol="grpc", otlp_endpoint="http://c:4317"), {}).endpoint == "http://c:4317"


class _NoExport:
    def export(self, batch):
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.SUCCESS

    def shutdown(self, *args, **kwargs):
        return None

    def force_flush(self, timeout_millis=0):
        return True


def tracing(rate: float, parent_based: bool = True) -> Tracing:
    return Tracing(Resolved("grpc", None, None, None, parent_based, rate, "test"), exporter=_NoExport())


def test_the_edge_decides_by_the_callers_flag_and_the_rate():
    headers = [(b"host", b"x"), (b"content-length", b"12")]
    never, always = tracing(0.0), tracing(1.0)
    try:
        assert never.http_edge(headers) is None  # a root at rate 0
        assert never.http_edge(headers + [(b"traceparent", SAMPLED.encode())]) is not None  # a sampled caller
        assert always.http_edge(headers + [(b"traceparent", UNSAMPLED.encode())]) is None  # an unsampled one
        edge = always.http_edge(headers)
        assert edge is not None and edge.context is None and edge.request_bytes == 12 and edge.name == "POST"
        assert never.grpc_edge((("traceparent", SAMPLED),), 5, "/pkg.Svc/M").name == "pkg.Svc/M"
        # a malformed traceparent is ignored: the request is a root, decided by the rate
        assert never.http_edge(headers + [(b"traceparent", b"00-zz-01")]) is None
        assert always.http_edge(headers + [(b"traceparent", b"00-zz-01")]).context is None
    finally:
        never.close()
        always.close()


def test_a_ratio_sampler_decides_on_the_callers_trace_id():
    half = tracing(0.5, parent_based=False)
    try:
        low = "00-00000000000000000000000000000001-b7ad6b7169203331-00"   # low 64 bits tiny: in
        high = "00-0000000000000000ffffffffffffffff-b7ad6b7169203331-01"  # low 64 bits top: out
        assert half.grpc_edge((("traceparent", low),), 1, "/p.S/M") is not None
        assert half.grpc_edge((("traceparent", high),), 1, "/p.S/M") is None
    finally:
        half.close()
