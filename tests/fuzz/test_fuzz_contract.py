"""Fuzzing the append, window and proxy routes with hostile bodies: deep nesting, lone
surrogates, NaN, unknown keys (inside messages and at the top level), huge, truncated and
non-UTF-8 bodies, and invalid conversation ids.

Properties (about 60 examples each; ``CTXCORE_LONG=1``: 1,000), over the real app on a real
Redis, the proxy against the local OpenAI-compatible test server:
- no response is a 500 (or any 5xx): client input is answered with a JSON error;
- every message an append or the proxy accepted reads back from ``GET .../messages`` as it
  was sent and appears in a window.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ctxcore.config import Settings, hash_token
from ctxcore.messages import from_openai
from ctxcore.testing import OpenAIServer
from tests.chaos.helpers import LONG
from workers.http import create_app
from workers.keyspace import delete_prefixed_keys
from workers.proxy.match import PROXY_HASH_KEY
from workers.runtime import Runtime
from workers.service import InlineQueue

pytestmark = [
    pytest.mark.fuzz,
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.timeout(900 if LONG else 300),
]

FUZZ = settings(
    max_examples=1_000 if LONG else 60,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
    suppress_health_check=list(HealthCheck),
)
TOKEN = "fuzz-contract-token"
AUTH = {"Authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
MODEL = "fuzz-model"
MAX_BODY = 64 * 1024
BIG_BUDGET = 10_000_000

# --- hostile values -----------------------------------------------------------------------

_SURROGATES = st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"])
_text = st.one_of(
    st.text(max_size=20),
    st.builds(lambda a, s, b: a + s + b, st.text(max_size=8), _SURROGATES, st.text(max_size=8)),
)
_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True), _text
)
_json = st.recursive(
    _scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_text, inner, max_size=3)),
    max_leaves=8,
)


@st.composite
def _deep(draw: st.DrawFn) -> Any:
    """A value 1-600 levels deep (past the contract's 32 and past the stores' ~200)."""
    value: Any = draw(_scalar)
    for level in range(draw(st.integers(1, 600))):
        value = [value] if level % 2 else {"k": value}
    return value


_value = st.one_of(_json, _deep())
_ROLES = st.sampled_from(["user", "assistant", "tool", "user", "assistant", "system", "developer", "bogus"])
_CALL_IDS = st.sampled_from(["c1", "c2", "c3"])


@st.composite
def hostile_message(draw: st.DrawFn) -> dict[str, Any]:
    role = draw(_ROLES)
    message: dict[str, Any] = {"role": role}
    message["content"] = draw(
        st.one_of(
            _text,
            st.none(),
            st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _text}), max_size=2),
            _value,
        )
    )
    if draw(st.booleans()):
        message["metadata"] = draw(st.one_of(st.dictionaries(_text, _value, max_size=2), _value))
    if draw(st.booleans()):  # unknown keys, as OpenAI SDK messages carry them
        name = draw(st.sampled_from(["refusal", "annotations", "audio", "x-custom"]))
        message[name] = draw(_value)
    if role == "assistant" and draw(st.booleans()):
        message["tool_calls"] = [
            {"id": draw(_CALL_IDS), "type": "function", "function": {"name": draw(_text), "arguments": "{}"}}
            for _ in range(draw(st.integers(1, 2)))
        ]
    if role == "tool":
        message["tool_call_id"] = draw(st.one_of(_CALL_IDS, _text))
    return message


def _good(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


@st.composite
def hostile_batch(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Mostly valid conversations with hostile messages mixed in."""
    batch: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.integers(0, 2)) == 0:
            batch.append(_good(draw(st.text(min_size=1, max_size=20))))
        else:
            batch.append(draw(hostile_message()))
    return batch


def encode(body: Any) -> bytes:
    """JSON as a client may send it: lone surrogates escaped, NaN written bare."""
    return json.dumps(body).encode()


@st.composite
def mangled(draw: st.DrawFn, body: bytes) -> bytes:
    """``body`` as sent, or truncated, or with a stray non-UTF-8 byte, or huge."""
    how = draw(st.sampled_from(["as is", "as is", "as is", "truncated", "bad byte", "huge"]))
    if how == "truncated" and len(body) > 1:
        return body[: draw(st.integers(1, len(body) - 1))]
    if how == "bad byte":
        at = draw(st.integers(0, len(body)))
        return body[:at] + b"\xff" + body[at:]
    if how == "huge":
        return body[:-1] + b',"pad":"' + b"x" * (MAX_BODY + 1) + b'"}'
    return body


# --- the app ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def upstream() -> Iterator[OpenAIServer]:
    with OpenAIServer() as server:
        yield server


@pytest.fixture(scope="module")
def client(redis_url: str, upstream: OpenAIServer) -> Iterator[TestClient]:
    prefix = f"fuzzc{uuid.uuid4().hex[:6]}"
    settings_ = Settings.load(
        {
            "redis": {"url": redis_url, "key_prefix": prefix},
            "http": {
                "tokens": {hash_token(TOKEN): "acme"},
                "requests_per_second": 100_000,
                "burst": 100_000,
                "max_body_bytes": MAX_BODY,
            },
            "proxy": {"upstream_base_url": upstream.base_url, "context_window_tokens": {MODEL: 1_000_000}},
        }
    )
    runtime = Runtime(settings_)
    with TestClient(create_app(runtime, InlineQueue()), raise_server_exceptions=False) as test_client:
        yield test_client
    delete_prefixed_keys(runtime.redis, prefix)
    runtime.redis.close()


def _no_server_error(response: Any, what: str) -> None:
    assert response.status_code < 500, (what, response.status_code, response.text[:300])
    assert response.headers.get("content-type", "").startswith("application/json"), (
        what,
        response.text[:200],
    )


def _same(sent: list[dict[str, Any]], stored: list[dict[str, Any]]) -> None:
    """The stored messages are the sent ones (compared as parsed messages, without log ids
    and what the proxy adds: its derived message ids and content hashes)."""
    clean = [{k: v for k, v in m.items() if k not in ("context_message_id", "message_id")} for m in stored]
    for m in clean:
        metadata = {k: v for k, v in m.get("metadata", {}).items() if k != PROXY_HASH_KEY}
        m.pop("metadata", None)
        if metadata:
            m["metadata"] = metadata

    def dumped(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # A null (or empty) content or unknown key is served as an absent one (OpenAI's form).
        out = []
        for m in from_openai(messages):
            data = {**m.model_dump(), "content": m.content or ""}
            extra = {k: v for k, v in data["metadata"].pop("extra", {}).items() if v not in (None, [])}
            if extra:
                data["metadata"]["extra"] = extra
            out.append(data)
        return out

    assert dumped(clean) == dumped(sent)


def _readable_and_windowed(client: TestClient, conv: str, expected: list[dict[str, Any]]) -> None:
    page = client.get(f"/v1/conversations/{conv}/messages", params={"limit": 1000}, headers=AUTH)
    assert page.status_code == 200, page.text[:300]
    stored = page.json()["messages"]
    _same(expected, stored[: len(expected)])
    window = client.post(f"/v1/conversations/{conv}/window", json={"budget_tokens": BIG_BUDGET}, headers=AUTH)
    assert window.status_code == 200, window.text[:300]
    served = {m.get("context_message_id") for m in window.json()["messages"]}
    assert {m["context_message_id"] for m in stored} <= served


@FUZZ
@given(batch=hostile_batch(), top_key=st.booleans(), data=st.data())
def test_append_never_5xx_and_what_is_accepted_reads_back(
    client: TestClient, batch: list[dict[str, Any]], top_key: bool, data: st.DataObject
) -> None:
    conv = f"f-{uuid.uuid4().hex[:10]}"
    body: dict[str, Any] = {"messages": batch}
    if top_key:
        body["stream"] = True
    raw = data.draw(mangled(encode(body)))
    r = client.post(f"/v1/conversations/{conv}/messages", content=raw, headers=AUTH)
    _no_server_error(r, "append")
    if r.status_code in (200, 201):
        assert not top_key  # an unknown top-level key is a 422 naming it
        _readable_and_windowed(client, conv, batch)
    elif top_key and r.status_code == 422 and raw == encode(body):
        assert any(e["loc"] == ["body", "stream"] for e in r.json()["detail"] if isinstance(e, dict))
    window_body = {"system_messages": [data.draw(hostile_message())], "tools": [data.draw(_value)]}
    w = client.post(f"/v1/conversations/{conv}/window", content=encode(window_body), headers=AUTH)
    _no_server_error(w, "window")


@FUZZ
@given(batch=hostile_batch(), conv=st.one_of(st.just(None), _text), data=st.data())
def test_proxy_never_5xx_and_what_is_accepted_reads_back(
    client: TestClient,
    upstream: OpenAIServer,
    batch: list[dict[str, Any]],
    conv: str | None,
    data: st.DataObject,
) -> None:
    conversation = conv if conv is not None else f"p-{uuid.uuid4().hex[:10]}"
    body: dict[str, Any] = {"model": MODEL, "messages": batch}
    if data.draw(st.booleans()):
        body["tools"] = [data.draw(_value)]
    raw = data.draw(mangled(encode(body)))
    headers = {**AUTH, "X-Ctxcore-Conversation": conversation.encode("utf-8", "surrogatepass")}
    r = client.post("/v1/chat/completions", content=raw, headers=headers)  # type: ignore[arg-type]
    _no_server_error(r, "proxy")
    if r.status_code >= 400:
        assert set(r.json()["error"]) >= {"message", "type", "code"}
        return
    logged = [m for m in batch if m.get("role") not in ("system", "developer")]
    _readable_and_windowed(client, conversation, logged)


def test_a_lone_surrogate_escape_is_answered_by_the_contract_not_as_bad_utf8(client: TestClient) -> None:
    # The append's streaming message count (workers.admission) cannot decode it; the route's
    # parsing and the message contract must still answer, naming their rule.
    raw = b'{"messages": [{"role": "user", "content": "x", "metadata": {"k": "\\ud800"}}]}'
    r = client.post(f"/v1/conversations/s-{uuid.uuid4().hex[:8]}/messages", content=raw, headers=AUTH)
    assert r.status_code == 422, r.text
    assert "UTF-8" not in r.text and "surrogate" in r.text.lower(), r.text
    with_key = raw[:-1] + b', "stream": true}'
    r = client.post(f"/v1/conversations/s-{uuid.uuid4().hex[:8]}/messages", content=with_key, headers=AUTH)
    assert r.status_code == 422 and any(e["loc"] == ["body", "stream"] for e in r.json()["detail"]), r.text
