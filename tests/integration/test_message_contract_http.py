"""The message contract over HTTP: the append, the window and the proxy refuse what breaks it
with a JSON error naming the field and the rule, store nothing, and the conversation stays
readable; invalid conversation ids are 422 (API) and 400 ``invalid_conversation`` (proxy)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ctxcore.config import Settings, hash_token
from workers.http import create_app
from workers.keyspace import delete_prefixed_keys
from workers.runtime import Runtime
from workers.service import InlineQueue

pytestmark = pytest.mark.redis

TOKEN = "contract-token"
AUTH = {"Authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
MODEL = "contract-model"


@pytest.fixture()
def client(redis_url: str) -> Iterator[TestClient]:
    settings = Settings.load(
        {
            "redis": {"url": redis_url, "key_prefix": f"contract{uuid.uuid4().hex[:8]}"},
            "http": {"tokens": {hash_token(TOKEN): "acme"}},
            # Never reached: every request here is refused before the upstream call.
            "proxy": {"upstream_base_url": "http://127.0.0.1:9/v1", "context_window_tokens": {MODEL: 8000}},
        }
    )
    runtime = Runtime(settings)
    with TestClient(create_app(runtime, InlineQueue()), raise_server_exceptions=False) as test_client:
        yield test_client
    delete_prefixed_keys(runtime.redis, settings.redis.key_prefix)
    runtime.redis.close()


def fill(template: str, *parts: str) -> str:
    """``template`` with each ``@`` replaced by the next part: JSON written by hand, as it
    is too deep for ``json.dumps`` or holds what ``json.dumps`` does not write."""
    pieces = template.split("@")
    return "".join(p + q for p, q in zip(pieces, [*parts, ""], strict=True))


def nested(depth: int, leaf: str = "1") -> str:
    return '{"k":' * depth + leaf + "}" * depth


def message_body(message: str) -> str:
    return fill('{"messages":[{"role":"user","content":"first"},@]}', message)


REFUSED_APPENDS = {
    # name: (the second message's JSON, the field the error names)
    "metadata 33 deep": (fill('{"role":"user","content":"x","metadata":@}', nested(33)), "metadata.k"),
    "metadata 250 deep": (fill('{"role":"user","content":"x","metadata":@}', nested(250)), "metadata.k"),
    "unknown key 200 deep": (
        fill('{"role":"user","content":"x","audio":@}', nested(200)),
        "metadata.extra.audio",
    ),
    "lone surrogate in content": ('{"role":"user","content":"a\\ud800b"}', "content"),
    "lone surrogate in a tool name": (
        '{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",'
        '"function":{"name":"\\udfff","arguments":"{}"}}]}',
        "tool_calls[0].name",
    ),
    "NaN in metadata": ('{"role":"user","content":"x","metadata":{"v":NaN}}', "metadata.v"),
    "orphan tool result": ('{"role":"tool","tool_call_id":"nope","content":"r"}', "orphan_tool_result"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_APPENDS))
def test_append_refuses_with_field_and_rule_and_stores_nothing(client: TestClient, case: str) -> None:
    message, field = REFUSED_APPENDS[case]
    conv = f"c-{uuid.uuid4().hex[:8]}"
    r = client.post(f"/v1/conversations/{conv}/messages", content=message_body(message), headers=AUTH)
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["error"] == "invalid_message" and body["index"] == 1
    assert body["field"].startswith(field) and body["detail"]
    assert client.get(f"/v1/conversations/{conv}/messages", headers=AUTH).status_code == 404
    # The conversation is created by a good append and serves windows.
    ok = client.post(
        f"/v1/conversations/{conv}/messages",
        content=message_body('{"role":"user","content":"y"}'),
        headers=AUTH,
    )
    assert ok.status_code == 201
    assert (
        client.post(
            f"/v1/conversations/{conv}/window", json={"budget_tokens": 2000}, headers=AUTH
        ).status_code
        == 200
    )


def test_unknown_keys_inside_a_message_are_kept_and_at_the_top_level_named(client: TestClient) -> None:
    conv = f"c-{uuid.uuid4().hex[:8]}"
    sdk_reply = {
        "role": "assistant",
        "content": "hi",
        "refusal": None,
        "annotations": [{"type": "url"}],
        "audio": {"id": "a1"},
    }
    r = client.post(
        f"/v1/conversations/{conv}/messages",
        json={"messages": [{"role": "user", "content": "q"}, sdk_reply]},
        headers=AUTH,
    )
    assert r.status_code == 201, r.text
    page = client.get(f"/v1/conversations/{conv}/messages", headers=AUTH).json()["messages"]
    # Stored in metadata["extra"], served back as the message's own keys (a null one is left out).
    assert page[1]["annotations"] == [{"type": "url"}] and page[1]["audio"] == {"id": "a1"}
    assert "refusal" not in page[1] and "extra" not in page[1].get("metadata", {})
    window = client.post(
        f"/v1/conversations/{conv}/window", json={"budget_tokens": 2000}, headers=AUTH
    ).json()
    assert [m["content"] for m in window["messages"]] == ["q", "hi"]
    top = client.post(
        f"/v1/conversations/{conv}/messages", json={"messages": [sdk_reply], "ttl": 5}, headers=AUTH
    )
    assert top.status_code == 422 and top.json()["detail"][0]["loc"] == ["body", "ttl"]


def test_window_refuses_bad_system_messages_and_tools(client: TestClient) -> None:
    conv = f"c-{uuid.uuid4().hex[:8]}"
    client.post(
        f"/v1/conversations/{conv}/messages",
        json={"messages": [{"role": "user", "content": "q"}]},
        headers=AUTH,
    )
    cases = {
        '{"system_messages":[{"role":"system","content":"\\ud800"}]}': ("system_messages", "content"),
        fill('{"tools":[@]}', nested(40)): ("tools", "tools[0].k"),
        '{"tools":[{"type":"function","function":{"name":"\\udc00"}}]}': ("tools", "tools[0].function.name"),
    }
    for body, (location, field) in cases.items():
        r = client.post(f"/v1/conversations/{conv}/window", content=body, headers=AUTH)
        assert r.status_code == 422, r.text
        assert r.json()["location"] == location and r.json()["field"].startswith(field)
    deep = client.post(
        f"/v1/conversations/{conv}/window", content=fill('{"tools":[@]}', nested(5000)), headers=AUTH
    )
    assert deep.status_code == 422 and deep.json()["detail"][0]["type"] == "json_too_deep"
    utf8 = client.post(f"/v1/conversations/{conv}/window", content=b'{"model":"\xff"}', headers=AUTH)
    assert utf8.status_code == 422 and utf8.json()["detail"][0]["type"] == "json_invalid_utf8"


def test_invalid_conversation_ids_name_the_rule_on_the_api_and_the_proxy(client: TestClient) -> None:
    for bad in ("a b", "été", "a:b", "x" * 300):
        r = client.get(f"/v1/conversations/{bad}/messages", headers=AUTH)
        assert r.status_code == 422 and r.json()["error"] == "invalid_conversation_id", bad
        assert "1-128 characters from letters, digits" in r.json()["detail"]
        p = client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "q"}]},
            headers={**AUTH, "X-Ctxcore-Conversation": bad.encode("utf-8")},  # type: ignore[dict-item]
        )
        assert p.status_code == 400, p.text
        error = p.json()["error"]
        assert error["code"] == "invalid_conversation" and "1-128 characters" in error["message"]


def proxy(client: TestClient, body: str | bytes) -> Any:
    headers = {**AUTH, "X-Ctxcore-Conversation": f"p-{uuid.uuid4().hex[:8]}"}
    return client.post("/v1/chat/completions", content=body, headers=headers)


def test_proxy_refuses_in_openai_shape(client: TestClient) -> None:
    user = '{"role":"user","content":"q"}'
    cases = {
        fill('{"model":"@","messages":[{"role":"user","content":"\\ud800"}]}', MODEL): "messages[0]",
        fill(
            '{"model":"@","messages":[{"role":"user","content":"q","audio":@}]}', MODEL, nested(40)
        ): "messages",
        fill('{"model":"@","messages":[@],"tools":[@]}', MODEL, user, nested(40)): "tools",
        fill('{"model":"@","messages":[@],"tools":[@]}', MODEL, user, nested(5000)): None,
        fill('{"model":"@","messages":[{"role":"system","content":"\\udc00"},@]}', MODEL, user): "messages",
        fill(
            '{"model":"@","messages":[@,{"role":"tool","tool_call_id":"x","content":"r"}]}', MODEL, user
        ): "messages[1]",
        fill('{"model":"@","messages":[@],"temperature":NaN}', MODEL, user): "temperature",
    }
    for body, param in cases.items():
        r = proxy(client, body)
        assert r.status_code == 400, (body[:80], r.status_code, r.text[:300])
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and error["message"]
        if param is not None:
            assert (error["param"] or "").startswith(param), (body[:80], error)


def test_proxy_413_is_openai_shaped_with_the_limit(client: TestClient) -> None:
    limit = Settings().http.max_body_bytes
    huge = b'{"model":"m","messages":[{"role":"user","content":"' + b"x" * limit + b'"}]}'
    r = proxy(client, huge)
    assert r.status_code == 413
    error = r.json()["error"]
    assert error["code"] == "body_too_large" and f"{limit} bytes" in error["message"]
    assert error["type"] == "invalid_request_error"
    api = client.post("/v1/conversations/c/messages", content=huge, headers=AUTH)
    assert api.status_code == 413 and api.json()["error"] == "body_too_large"
