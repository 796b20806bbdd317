"""spark_overlay.engine_key: the engine's key guards every route but /health."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from spark_overlay.engine_key import KeyOnEveryRoute


def app() -> FastAPI:
    a = FastAPI()
    for path in ("/health", "/metrics", "/version", "/v1/models"):
        a.add_api_route(path, lambda: {"ok": True}, methods=["GET"])
    a.add_api_route("/tokenize", lambda: {"count": 1}, methods=["POST"])
    # As vLLM's --middleware does it: add_middleware(cls), no arguments.
    a.add_middleware(KeyOnEveryRoute)
    return a


def test_every_route_but_health_needs_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "sk-engine")
    c = TestClient(app())
    assert c.get("/health").status_code == 200
    for method, path in (("GET", "/metrics"), ("GET", "/version"), ("GET", "/v1/models"), ("POST", "/tokenize")):
        r = c.request(method, path)
        assert r.status_code == 401, path
        assert r.json()["error"]["code"] == "invalid_api_key"
        assert c.request(method, path, headers={"Authorization": "Bearer sk-other"}).status_code == 401, path
        assert c.request(method, path, headers={"Authorization": "Basic sk-engine"}).status_code == 401, path
        assert c.request(method, path, headers={"Authorization": "Bearer sk-engine"}).status_code == 200, path


def test_without_a_key_everything_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    c = TestClient(app())
    assert c.get("/metrics").status_code == 200
    assert c.post("/tokenize").status_code == 200
