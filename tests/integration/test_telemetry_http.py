"""The HTTP API's spans on a live app: an append, a window, and the proxy's window and
upstream call (the test server as the upstream), each with its tenant and conversation."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ctxcore.testing import OpenAIServer
from tests.live_server import TOKEN, LiveApi, serve_api
from workers.telemetry.otel import tracer_with

pytestmark = pytest.mark.redis
MODEL = "agent-model"


@pytest.fixture()
def traced(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[LiveApi, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    tracer = tracer_with(SimpleSpanProcessor(exporter))
    monkeypatch.setattr("workers.runtime.build_tracer", lambda _settings: tracer)
    with OpenAIServer() as upstream:
        api = serve_api(
            redis_url,
            worker=False,
            proxy={"upstream_base_url": upstream.base_url, "context_window_tokens": {MODEL: 6000}},
        )
        try:
            yield api, exporter
        finally:
            api.close()


def test_append_window_and_proxy_spans(traced: tuple[LiveApi, InMemorySpanExporter]) -> None:
    live, exporter = traced
    conv = f"tel-{uuid.uuid4().hex[:8]}"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=live.url, headers=auth, timeout=30) as client:
        turns = [{"role": "user", "content": "list the files"}, {"role": "assistant", "content": "a.py b.py"}]
        assert client.post(f"/v1/conversations/{conv}/messages", json={"messages": turns}).status_code == 201
        assert (
            client.post(f"/v1/conversations/{conv}/window", json={"budget_tokens": 4000}).status_code == 200
        )
    sdk = openai.OpenAI(
        base_url=f"{live.url}/v1",
        api_key=TOKEN,
        default_headers={"X-Ctxcore-Conversation": conv},
        max_retries=0,
    )
    sdk.chat.completions.create(model=MODEL, messages=[*turns, {"role": "user", "content": "and now?"}])

    spans = {
        (s.name, (s.attributes or {}).get("ctxcore.window.source")): s for s in exporter.get_finished_spans()
    }
    append = spans[("ctxcore.append", None)]
    window = spans[("ctxcore.window", "api")]
    proxied = spans[("ctxcore.window", "proxy")]
    upstream = spans[("ctxcore.proxy.upstream", None)]
    for span in (append, window, proxied, upstream):
        attrs = span.attributes or {}
        assert attrs["ctxcore.tenant.id"] == "acme" and attrs["gen_ai.conversation.id"] == conv
    assert (append.attributes or {})["ctxcore.append.ids"] == 2
    attrs = window.attributes or {}
    assert attrs["ctxcore.window.budget_tokens"] == 4000 and attrs["ctxcore.window.fallback_applied"] is False
    assert 0 < int(str(attrs["ctxcore.window.tokens_served"])) < 4000
    assert attrs["ctxcore.compaction.status"] == "idle"
    up = upstream.attributes or {}
    assert up["http.response.status_code"] == 200 and up["gen_ai.request.model"] == MODEL
    assert "authorization" not in str(up).lower()
