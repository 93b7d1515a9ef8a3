"""The plaintext health port (``health_port``): only the probes and the Prometheus metrics.

When the main ports speak TLS (and may require client certificates), the kubelet's probes and a
Prometheus without a client certificate can use this port instead. Every other path answers
404, so nothing that predicts, reads model details or administers is reachable here.
"""

from __future__ import annotations

import json
from typing import Any

PATHS = frozenset({"/healthz", "/readyz", "/v2/health/live", "/v2/health/ready",
                   "/metrics", "/monitoring/prometheus/metrics"})


def probes_only(app: Any) -> Any:
    """The ASGI ``app`` restricted to :data:`PATHS`."""

    async def asgi(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in PATHS:
            body = json.dumps({"error": f"the health port serves only {', '.join(sorted(PATHS))}"}).encode()
            await send({"type": "http.response.start", "status": 404,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await app(scope, receive, send)

    return asgi
