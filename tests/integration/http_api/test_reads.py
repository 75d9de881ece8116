"""The HTTP API's reads against a real Redis: windows, state and history, offloads, deletes,
lists, usage, metrics and the OpenAPI document."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ctxcore.messages import SystemMessage, UserMessage, from_openai
from ctxcore.state import CompressionState, ConversationKey, SummaryBlock
from ctxcore.tokens import TiktokenCounter
from ctxcore.turns import anchors
from ctxcore.window import check_window
from tests.datasets import conversations
from tests.integration.http_api.helpers import AUTH_A, AUTH_B, CONV, Api, assistant, user

pytestmark = pytest.mark.redis


# --- reads, windows, deletes -------------------------------------------------------------


def test_window_on_a_tau_bench_conversation_fits_the_budget(api: Api) -> None:
    record = max(
        conversations("tau_bench.jsonl"), key=lambda c: len(c["messages"])
    )  # 48 messages, 6.4K tokens
    system = [m for m in record["messages"] if m["role"] == "system"]
    rest = [m for m in record["messages"] if m["role"] != "system"]
    appended = api.append("tau", rest)
    assert appended.status_code == 201, appended.text
    assert len(appended.json()["ids"]) == len(rest)

    budget = 4000
    r = api.client.post(
        f"{CONV}/tau/window", json={"budget_tokens": budget, "system_messages": system}, headers=AUTH_A
    )
    assert r.status_code == 200, r.text
    body = r.json()
    served = from_openai(body["messages"])
    assert isinstance(served[0], SystemMessage)
    assert check_window(served) == []
    counter = TiktokenCounter()
    assert counter.count_messages(served) <= budget
    assert body["stats"]["total_tokens"] <= budget
    assert len(body["stats"]) == 13
    assert body["compaction"] == "queued" and api.queue.requests == [ConversationKey("tenant-a", "tau")]
    # Both anchors are served verbatim, with their log ids.
    logged = api.runtime.log.read_after(ConversationKey("tenant-a", "tau"), None)
    served_ids = {m.context_message_id for m in served}
    for index in anchors(logged).indices():
        assert logged[index].context_message_id in served_ids
    # The conversation really is over the budget: the window had to shrink it (rules and,
    # with no worker compacting, maybe the fallback).
    assert counter.count_messages(from_openai(record["messages"])) > budget
    assert isinstance(body["fallback_applied"], bool)

    compact = api.client.post(f"{CONV}/tau/compact", headers=AUTH_A)
    assert compact.status_code == 202 and compact.json() == {"status": "queued"}


def _block(block_id: str, first: str, last: str, text: str) -> SummaryBlock:
    return SummaryBlock(
        block_id=block_id,
        messages=[UserMessage(content=text)],
        first_id=first,
        last_id=last,
        tokens_before=100,
        tokens_after=10,
        model="extractive",
    )


def test_state_with_provenance_and_history(api: Api) -> None:
    api.append("c1", [user("task"), assistant("step 1"), user("more"), assistant("step 2")])
    empty = api.client.get(f"{CONV}/c1/state", headers=AUTH_A)
    assert empty.status_code == 200
    assert empty.json() == {
        "version": 0,
        "covered_until": None,
        "pinned": [],
        "blocks": [],
        "budget": None,
        "compaction": "idle",
        "compaction_detail": {"last_error": None, "last_success_at": None, "reason": None, "hold": None},
    }

    key = ConversationKey("tenant-a", "c1")
    store = api.runtime.state_store
    v1 = CompressionState(blocks=[_block("B1", "000000000002", "000000000002", "summary one")])
    assert store.save(
        key, v1.model_copy(update={"covered_until": "000000000002", "pinned": ["000000000001"]}), 0
    )
    v2 = CompressionState(
        blocks=[_block("B2", "000000000002", "000000000004", "summary two")],
        covered_until="000000000004",
        pinned=["000000000001", "000000000003"],
    )
    assert store.save(key, v2, 1)
    api.client.post(f"{CONV}/c1/window", json={"budget_tokens": 5000}, headers=AUTH_A)

    current = api.client.get(f"{CONV}/c1/state", headers=AUTH_A).json()
    assert "history" not in current
    assert current["version"] == 2 and current["budget"] == 5000
    assert current["covered_until"] == "000000000004"
    assert current["pinned"] == ["000000000001", "000000000003"]
    (block,) = current["blocks"]
    assert {k: block[k] for k in ("block_id", "first_id", "last_id", "level", "text", "model")} == {
        "block_id": "B2",
        "first_id": "000000000002",
        "last_id": "000000000004",
        "level": 1,
        "text": "summary two",
        "model": "extractive",
    }
    assert block["tokens_before"] == 100 and block["tokens_after"] == 10 and block["created_at"]

    with_history = api.client.get(f"{CONV}/c1/state?history=1", headers=AUTH_A).json()
    assert [s["version"] for s in with_history["history"]] == [2, 1]
    assert with_history["history"][1]["blocks"][0]["block_id"] == "B1"


def test_offload_is_returned_in_openai_format_or_404(api: Api) -> None:
    api.append("c1", [user("task")])
    key = ConversationKey("tenant-a", "c1")
    handle = "0123456789abcdef"
    original = from_openai(
        [
            {
                "role": "assistant",
                "tool_calls": [{"id": "call-1", "function": {"name": "ls", "arguments": "{}"}}],
            }
        ]
    )
    api.runtime.offloads.put_if_absent(key, handle, original)
    r = api.client.get(f"{CONV}/c1/offloads/{handle}", headers=AUTH_A)
    assert r.status_code == 200
    assert r.json()["handle"] == handle
    assert r.json()["messages"][0]["tool_calls"][0]["function"]["name"] == "ls"
    for bad in ("0123456789abcdee", "0123456789ABCDEF", "NOT-HEX", "abc"):
        assert api.client.get(f"{CONV}/c1/offloads/{bad}", headers=AUTH_A).status_code == 404, bad


def test_delete_removes_everything_then_404(api: Api) -> None:
    api.append("doomed", [user("task"), assistant("done")])
    api.append("kept", [user("other task")])
    key = ConversationKey("tenant-a", "doomed")
    rt = api.runtime
    handle = "aaaaaaaabbbbbbbb"
    rt.offloads.put_if_absent(key, handle, [UserMessage(content="big")])
    assert rt.state_store.save(
        key, CompressionState(covered_until="000000000001", pinned=["000000000001"]), 0
    )
    assert rt.scheduler.request(key)
    assert rt.scheduler.status(key) == "queued"

    assert api.client.delete(f"{CONV}/doomed", headers=AUTH_A).status_code == 204
    assert rt.log.last_id(key) is None and rt.log.read_after(key, None) == []
    assert rt.state_store.load(key) is None and rt.state_store.history(key) == []
    assert rt.offloads.get(key, handle) is None
    assert rt.scheduler.status(key) == "idle" and rt.scheduler.depth() == 0

    for method, path in [
        ("GET", f"{CONV}/doomed/state"),
        ("POST", f"{CONV}/doomed/compact"),
        ("DELETE", f"{CONV}/doomed"),
        ("GET", f"{CONV}/doomed/offloads/{handle}"),
    ]:
        assert api.client.request(method, path, headers=AUTH_A).status_code == 404, (method, path)
    assert api.client.get(CONV, headers=AUTH_A).json()["conversations"] == ["kept"]
    # The id can be used again, from scratch.
    assert api.append("doomed", [user("again")]).json()["ids"] == ["000000000001"]


def test_delete_waits_for_a_running_stage_then_409(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    import workers.delete
    from workers.locks import conversation_lock

    api.append("busy", [user("task")])
    key = ConversationKey("tenant-a", "busy")
    monkeypatch.setattr(workers.delete, "DELETE_LOCK_WAIT_SECONDS", 0.2)
    with conversation_lock(api.runtime.redis, api.runtime.settings.redis.key_prefix, key, timeout=10):
        r = api.client.delete(f"{CONV}/busy", headers=AUTH_A)
    assert r.status_code == 409 and r.json()["error"] == "conversation_busy"
    assert r.headers["Retry-After"] == "1"
    assert api.runtime.log.last_id(key) == "000000000001"  # nothing was deleted
    assert api.client.delete(f"{CONV}/busy", headers=AUTH_A).status_code == 204


def test_list_is_paged(api: Api) -> None:
    names = [f"conv-{i}" for i in range(5)]
    for name in names:
        api.append(name, [user("hi")])
    seen: list[str] = []
    after: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2, **({"after": after} if after else {})}
        page = api.client.get(CONV, params=params, headers=AUTH_A).json()
        seen += page["conversations"]
        pages += 1
        after = page["next"]
        if after is None:
            break
    assert seen == names and pages == 3
    assert api.client.get(CONV, params={"limit": 1000}, headers=AUTH_A).json() == {
        "conversations": names,
        "next": None,
    }
    for params in ({"limit": 0}, {"limit": 1001}, {"after": ".bad"}):
        assert api.client.get(CONV, params=params, headers=AUTH_A).status_code == 422, params


def test_usage_is_per_tenant(api: Api) -> None:
    api.runtime.usage.add("tenant-a", 3, 1200, 300)
    usage = api.client.get("/v1/usage", headers=AUTH_A).json()
    assert usage == {
        "tenant": "tenant-a",
        "calls": 3,
        "input_tokens": 1200,
        "output_tokens": 300,
        "day": usage["day"],
        "summariser_tokens_today": 0,
        "summariser_tokens_per_day": None,
    }
    assert api.client.get("/v1/usage", headers=AUTH_B).json()["calls"] == 0


def _sample(text: str, series: str) -> float:
    """The value of one exposition line (0 when absent)."""
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name == series:
            return float(value)
    return 0.0


def test_metrics_and_healthz(api: Api) -> None:
    api.append("c1", [user("task"), assistant("answer")])
    before = api.client.get("/metrics").text
    assert (
        api.client.post(f"{CONV}/c1/window", json={"budget_tokens": 1000}, headers=AUTH_A).status_code == 200
    )
    assert (
        api.client.post(f"{CONV}/nope/window", json={"budget_tokens": 1000}, headers=AUTH_A).status_code
        == 404
    )
    r = api.client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    assert "version=0.0.4" in r.headers["content-type"]
    text = r.text
    assert "# TYPE ctxcore_fast_path_seconds histogram" in text
    assert "# TYPE ctxcore_window_request_seconds histogram" in text
    fast = 'ctxcore_fast_path_seconds_count{fallback="false",route="window"}'
    assert _sample(text, fast) == _sample(before, fast) + 1
    assert _sample(text, 'ctxcore_fast_path_seconds_bucket{fallback="false",le="+Inf",route="window"}') == 1
    assert _sample(text, 'ctxcore_window_request_seconds_count{status="200"}') == 1
    assert _sample(text, 'ctxcore_windows_total{status="200"}') == 1
    assert _sample(text, 'ctxcore_windows_total{status="404"}') == 1
    assert _sample(text, 'ctxcore_appends_total{status="201"}') == 1
    assert _sample(text, 'ctxcore_errors_total{status="404"}') == 1
    assert _sample(text, "ctxcore_queue_depth") == 0 and "ctxcore_queue_depth 0.0" in text
    # Stage series are served by the worker nodes, not here.
    assert "ctxcore_stage_seconds" not in text
    assert "tenant-a" not in text and "c1" not in text and "nope" not in text  # no unbounded labels
    assert api.client.get("/healthz").status_code == 200


def test_store_outage_is_503_with_retry_after(make_api: Callable[..., Api]) -> None:
    api = make_api(url="redis://127.0.0.1:1/0")
    for method, path, body in [
        ("POST", f"{CONV}/c1/messages", {"messages": [user("hi")]}),
        ("POST", f"{CONV}/c1/window", {"budget_tokens": 1000}),
        ("GET", CONV, None),
        ("GET", "/v1/usage", None),
        ("GET", "/metrics", None),
    ]:
        r = api.client.request(method, path, json=body, headers=AUTH_A)
        assert r.status_code == 503, (method, path, r.text)
        assert r.headers["Retry-After"] == "1"
        if path != "/metrics":
            assert "127.0.0.1:1" not in r.text  # no internals in the body
    health = api.client.get("/healthz")
    assert health.status_code == 503 and health.json() == {"status": "unavailable"}
    # Authentication needs no store: a bad token is still a 401.
    assert api.client.get(CONV, headers={"Authorization": "Bearer nope"}).status_code == 401


# --- OpenAPI -----------------------------------------------------------------------------


def test_openapi_document_is_valid_and_complete(api: Api) -> None:
    r = api.client.get("/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    try:
        from openapi_spec_validator import validate
    except ImportError:  # pragma: no cover - the dev extra installs it
        assert doc["openapi"].startswith("3.")
    else:
        validate(doc)

    paths = doc["paths"]
    expected = {
        ("post", "/v1/conversations/{conversation_id}/messages"): "AppendRequest",
        ("post", "/v1/conversations/{conversation_id}/window"): "WindowRequest",
        ("post", "/v1/conversations/{conversation_id}/compact"): None,
        ("get", "/v1/conversations/{conversation_id}/state"): None,
        ("get", "/v1/conversations/{conversation_id}/offloads/{handle}"): None,
        ("get", "/v1/conversations"): None,
        ("delete", "/v1/conversations/{conversation_id}"): None,
        ("get", "/v1/usage"): None,
        ("get", "/healthz"): None,
        ("get", "/metrics"): None,
    }
    for (method, path), request_model in expected.items():
        op = paths[path][method]
        if request_model:
            ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            assert ref.endswith(f"/{request_model}")
        success = next(code for code in op["responses"] if code.startswith("2"))
        if method != "delete":
            assert op["responses"][success].get("content"), (method, path)
        if path.startswith("/v1/"):
            assert op["security"] == [{"HTTPBearer": []}]
            assert "401" in op["responses"] and "429" in op["responses"]
    schemas = doc["components"]["schemas"]
    for name in ("AppendResponse", "WindowResponse", "StateResponse", "ConversationList", "ErrorBody"):
        assert name in schemas
    assert set(schemas["WindowStats"]["properties"]) >= {"total_tokens", "tool_tokens", "total_dialogues"}
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


def test_a_window_without_a_budget_uses_the_tenants_default(make_api: Callable[..., Api]) -> None:
    api = make_api(service={"default_budget": 5000}, tenants={"tenant-b": {"default_budget": 900}})
    for auth, conv in ((AUTH_A, "d1"), (AUTH_B, "d2")):
        api.client.post(
            f"{CONV}/{conv}/messages",
            json={
                "messages": [
                    user("fix the parser " * 100),
                    assistant("on it " * 300),
                    user("and the tests " * 100),
                    assistant("done " * 300),
                ]
            },
            headers=auth,
        )
    wide = api.client.post(f"{CONV}/d1/window", json={}, headers=AUTH_A)
    narrow = api.client.post(f"{CONV}/d2/window", json={}, headers=AUTH_B)
    assert wide.status_code == 200 and narrow.status_code == 200, (wide.text, narrow.text)
    assert wide.json()["stats"]["total_tokens"] <= 5000
    assert narrow.json()["stats"]["total_tokens"] <= 900
    # The default is the conversation's budget from then on, as an explicit one would be.
    assert api.runtime.state_store.get_budget(ConversationKey("tenant-a", "d1")) == 5000
    assert api.runtime.state_store.get_budget(ConversationKey("tenant-b", "d2")) == 900
