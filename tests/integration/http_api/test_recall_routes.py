"""``POST /v1/conversations/{id}/recall`` against a real Redis: archives written by the
Coordinator's save, searched over HTTP, scoped to the tenant."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from ctxcore.markers import COMPRESSION_RECALL_PREFIX
from ctxcore.messages import to_openai
from ctxcore.processors.recall_tool import RECALL_TOOL_NAME
from ctxcore.state import ConversationKey
from tests.datasets import swe_runs
from tests.integration.http_api.helpers import AUTH_A, AUTH_B, CONV, Api
from tests.pipeline_helpers import logged
from workers.runtime import build_service

pytestmark = pytest.mark.redis


def compacted(api: Api, conversation: str = "run") -> dict[str, Any]:
    """Append a real run and compact it through the runtime's Coordinator (as the workers do)."""
    record = next(swe_runs())
    _, rest = logged(record["messages"])
    messages = to_openai([m.model_copy(update={"context_message_id": None}) for m in rest])
    assert (
        api.client.post(
            f"{CONV}/{conversation}/messages", json={"messages": messages}, headers=AUTH_A
        ).status_code
        == 201
    )
    window = api.client.post(f"{CONV}/{conversation}/window", json={"budget_tokens": 8000}, headers=AUTH_A)
    assert window.status_code == 200
    key = ConversationKey("tenant-a", conversation)
    coord = api.runtime.coordinator
    for _ in range(16):
        stage = coord.plan(key)
        if stage is None:
            break
        coord.run_stage(key, stage)
    return record


def test_recall_over_http_finds_folded_commands_and_the_window_offers_the_tool(
    make_api: Callable[..., Api],
) -> None:
    api = make_api(recall={"enabled": True, "chunk_size_tokens": 800, "chunk_overlap_tokens": 80})
    record = compacted(api)
    window = api.client.post(f"{CONV}/run/window", json={"budget_tokens": 8000}, headers=AUTH_A).json()
    texts = "\n".join(str(m.get("content", "")) for m in window["messages"])
    assert COMPRESSION_RECALL_PREFIX in texts
    call = next(m for m in record["messages"] if m.get("tool_calls"))
    command = json.loads(call["tool_calls"][0]["arguments"])["command"]
    found = api.client.post(f"{CONV}/run/recall", json={"query": command, "max_tokens": 3000}, headers=AUTH_A)
    assert found.status_code == 200, found.text
    body = found.json()
    assert 1 <= len(body["hits"]) <= 2 and body["archived_chunks"] > 0
    assert all(h["range"].startswith(h["first_id"]) and h["score"] > 0 for h in body["hits"])
    assert sum(h["tokens"] for h in body["hits"]) <= 3000
    # The window's tools carry the recall tool, counted in the budget.
    key = ConversationKey("tenant-a", "run")
    result = build_service(api.runtime, api.queue).get_window(key, 8000)
    assert RECALL_TOOL_NAME in [t["function"]["name"] for t in result.tools]
    # Bad input: empty query, max_tokens 0, a million, a huge query, FTS5 syntax.
    assert api.client.post(f"{CONV}/run/recall", json={"query": ""}, headers=AUTH_A).status_code == 422
    assert (
        api.client.post(
            f"{CONV}/run/recall", json={"query": "x", "max_tokens": 0}, headers=AUTH_A
        ).status_code
        == 422
    )
    many = api.client.post(f"{CONV}/run/recall", json={"query": command, "max_tokens": 10**6}, headers=AUTH_A)
    assert len(many.json()["hits"]) <= 2
    huge = api.client.post(f"{CONV}/run/recall", json={"query": "git diff " * 60_000}, headers=AUTH_A)
    assert huge.status_code == 200 and huge.json()["query_truncated"] is True
    odd = api.client.post(f"{CONV}/run/recall", json={"query": '"NEAR(* OR'}, headers=AUTH_A)
    assert odd.status_code == 200
    miss = api.client.post(f"{CONV}/run/recall", json={"query": "zzqx"}, headers=AUTH_A).json()
    assert miss["hits"] == [] and "broader" in miss["note"]
    # Another tenant's conversation is a 404, like an unknown one.
    assert api.client.post(f"{CONV}/run/recall", json={"query": command}, headers=AUTH_B).status_code == 404
    assert api.client.post(f"{CONV}/nope/recall", json={"query": command}, headers=AUTH_A).status_code == 404
    # Deleting the conversation deletes its archive.
    assert api.client.delete(f"{CONV}/run", headers=AUTH_A).status_code in (200, 204)
    assert api.runtime.state_store.load_archive(key) is None


def test_recall_disabled_is_a_409_naming_the_setting(make_api: Callable[..., Api]) -> None:
    api = make_api()
    assert (
        api.client.post(
            f"{CONV}/c/messages", json={"messages": [{"role": "user", "content": "hi"}]}, headers=AUTH_A
        ).status_code
        == 201
    )
    answer = api.client.post(f"{CONV}/c/recall", json={"query": "hi"}, headers=AUTH_A)
    assert answer.status_code == 409
    assert answer.json()["error"] == "recall_disabled" and answer.json()["setting"] == "recall.enabled"
    result = build_service(api.runtime, api.queue).get_window(ConversationKey("tenant-a", "c"), 4000)
    assert RECALL_TOOL_NAME not in [t["function"]["name"] for t in result.tools]
