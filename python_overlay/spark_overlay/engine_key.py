"""Guard every route of vLLM's API with its key, not only ``/v1``.

vLLM's own ``--api-key`` (``VLLM_API_KEY``) guards the ``/v1`` routes only:
``/metrics``, ``/tokenize``, ``/detokenize``, ``/version`` and the rest answer
anyone who can reach the port. spark-kit starts vLLM behind its gateway on a
loopback port, which every local user can reach; with this middleware
(``vllm serve --middleware spark_overlay.engine_key.KeyOnEveryRoute``) a
request without ``Authorization: Bearer $VLLM_API_KEY`` gets 401 on every
route but ``/health`` (the node's liveness probe; it says nothing else).
Without ``VLLM_API_KEY`` (a deployment without API keys, whose gateway then
listens on loopback only and is itself open) it passes everything through.
"""

from __future__ import annotations

import hmac
import json
import os

OPEN_PATHS = frozenset({"/health"})
BODY = json.dumps(
    {
        "error": {
            "message": "Unauthorized: this is the engine behind spark-kit's gateway: "
            "send requests to the gateway (engine.host:engine.port)",
            "type": "invalid_request_error",
            "code": "invalid_api_key",
        }
    }
).encode()


def _bearer(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else None
    return None


class KeyOnEveryRoute:
    """Pure ASGI middleware: 401 without the key on every HTTP route but ``/health``."""

    def __init__(self, app) -> None:
        self.app = app
        key = os.environ.get("VLLM_API_KEY", "")
        self.key = key.encode() if key else None

    async def __call__(self, scope, receive, send) -> None:
        if self.key is None or scope["type"] not in ("http", "websocket") or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        token = _bearer(scope.get("headers") or [])
        if token is not None and hmac.compare_digest(token, self.key):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": BODY})
