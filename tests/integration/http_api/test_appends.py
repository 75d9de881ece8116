"""The HTTP API's appends against a real Redis: preconditions, concurrency, interrupted calls,
idempotence and the message contract's errors."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ctxcore.messages import from_openai
from ctxcore.state import CompressionState, ConversationKey, SummaryBlock
from ctxcore.window import check_window
from tests.integration.http_api.helpers import AUTH_A, AUTH_B, CONV, Api, assistant, user

pytestmark = pytest.mark.redis


# --- appends -----------------------------------------------------------------------------


def test_if_match_mismatch_is_409(api: Api) -> None:
    first = api.append("c1", [user("one")]).json()
    stale = api.append("c1", [assistant("two")], headers={**AUTH_A, "If-Match": '"000000000009"'})
    assert stale.status_code == 409
    assert stale.json()["error"] == "conflict"
    assert stale.json()["last_id"] == first["last_id"]
    assert api.runtime.log.last_id(ConversationKey("tenant-a", "c1")) == first["last_id"]

    ok = api.append("c1", [assistant("two")], headers={**AUTH_A, "If-Match": f'"{first["last_id"]}"'})
    assert ok.status_code == 201 and ok.json()["last_id"] == "000000000002"
    bare = api.append("c1", [user("three")], headers={**AUTH_A, "If-Match": "000000000002"})
    assert bare.status_code == 201
    star = api.append("c1", [assistant("four")], headers={**AUTH_A, "If-Match": "*"})
    assert star.status_code == 201
    # If-Match on a conversation that does not exist cannot hold.
    assert api.append("new", [user("x")], headers={**AUTH_A, "If-Match": "000000000001"}).status_code == 409
    assert api.append("new", [user("x")], headers={**AUTH_A, "If-Match": "*"}).status_code == 409


def test_16_concurrent_appends_with_one_if_match_one_wins(api: Api) -> None:
    first = api.append("c1", [user("task")]).json()["last_id"]
    clients = [TestClient(api.client.app) for _ in range(16)]
    barrier = threading.Barrier(len(clients))
    responses: dict[int, Any] = {}

    def post(index: int) -> None:
        barrier.wait()
        responses[index] = clients[index].post(
            f"{CONV}/c1/messages",
            json={"messages": [assistant(f"writer {index}", message_id=f"w{index}")]},
            headers={**AUTH_A, "If-Match": f'"{first}"'},
        )

    pool = [threading.Thread(target=post, args=(i,)) for i in range(len(clients))]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    codes = sorted(r.status_code for r in responses.values())
    assert codes == [201] + [409] * 15
    winner = next(i for i, r in responses.items() if r.status_code == 201)
    for r in responses.values():
        if r.status_code == 409:
            assert r.json()["error"] == "conflict" and r.json()["last_id"] == "000000000002"
            assert r.headers["ETag"] == '"000000000002"'
    # The winner's retry after a lost response: 200, the same ids, nothing written twice
    retry = clients[winner].post(
        f"{CONV}/c1/messages",
        json={"messages": [assistant(f"writer {winner}", message_id=f"w{winner}")]},
        headers={**AUTH_A, "If-Match": f'"{first}"'},
    )
    assert retry.status_code == 200 and retry.json() == responses[winner].json()
    assert retry.headers["ETag"] == '"000000000002"'
    assert len(api.runtime.log.read_after(ConversationKey("tenant-a", "c1"), None)) == 2
    for client in clients:
        client.close()


def test_interrupted_call_is_accepted_and_closed_but_a_late_result_is_422(api: Api) -> None:
    call = {"id": "cancel-1", "type": "function", "function": {"name": "run", "arguments": "{}"}}
    shape = [user("run it"), assistant("", tool_calls=[call]), user("never mind"), assistant("ok")]
    assert api.append("c1", shape).status_code == 201
    window = api.client.post(f"{CONV}/c1/window", json={"budget_tokens": 2000}, headers=AUTH_A).json()
    roles = [m["role"] for m in window["messages"]]
    assert roles == ["user", "assistant", "tool", "user", "assistant"]
    closed = window["messages"][2]
    assert closed["tool_call_id"] == "cancel-1" and closed["content"] == "[Tool execution interrupted]"
    assert check_window(from_openai(window["messages"])) == []
    # The log keeps the raw shape; a late result for the interrupted call is rejected
    assert len(api.runtime.log.read_after(ConversationKey("tenant-a", "c1"), None)) == 4
    late = api.append("c1", [{"role": "tool", "tool_call_id": "cancel-1", "content": "done"}])
    assert late.status_code == 422 and late.json()["field"] == "orphan_tool_result"
    # A call followed by another assistant message (no user in between) stays a 422
    other = api.append("c2", [user("go"), assistant("", tool_calls=[call]), assistant("moving on")])
    assert other.status_code == 422 and other.json()["field"] == "missing_tool_result"
    # An interrupted call followed by a user message is accepted in a later batch too
    assert api.append("c3", [user("go"), assistant("", tool_calls=[call])]).status_code == 201
    assert api.append("c3", [user("stop")]).status_code == 201


def test_unservable_state_is_409_invalid_window(api: Api) -> None:
    api.append("c1", [user("task"), assistant("a"), user("intent"), assistant("b")])
    key = ConversationKey("tenant-a", "c1")
    # A state written by a buggy summariser: its block carries an orphan tool result
    bad = CompressionState(
        blocks=[
            SummaryBlock(
                block_id="b1",
                first_id="000000000002",
                last_id="000000000002",
                messages=from_openai([{"role": "tool", "tool_call_id": "other", "content": "x"}]),
            )
        ],
        covered_until="000000000002",
        pinned=["000000000001"],
    )
    assert api.runtime.state_store.save(key, bad, expected_version=0)
    r = api.client.post(f"{CONV}/c1/window", json={"budget_tokens": 2000}, headers=AUTH_A)
    assert r.status_code == 409
    body = r.json()
    assert body["error"] == "invalid_window" and body["state_version"] == 1
    assert body["violations"][0]["rule"] == "orphan_tool_result" and "roll" in body["detail"]


def test_idempotent_append_by_message_id(api: Api) -> None:
    batch = [user("question", message_id="m-1"), assistant("answer", message_id="m-2")]
    first = api.append("c1", batch)
    assert first.status_code == 201
    again = api.append("c1", batch)
    assert again.status_code == 200  # a replay: nothing new was appended
    assert again.json() == first.json()
    mixed = api.append("c1", [batch[1], user("follow-up", message_id="m-3")])
    assert mixed.status_code == 201
    assert mixed.json()["ids"] == [first.json()["ids"][1], "000000000003"]
    assert len(api.runtime.log.read_after(ConversationKey("tenant-a", "c1"), None)) == 3


def test_invalid_messages_are_422_naming_the_index(api: Api) -> None:
    bad_role = api.append("c1", [user("fine"), {"role": "wizard", "content": "x"}])
    assert bad_role.status_code == 422
    body = bad_role.json()
    assert body["error"] == "invalid_message"
    assert (body["index"], body["field"], body["location"]) == (1, "role", "messages")

    not_object = api.append("c1", [user("fine"), assistant("ok"), "just a string"])
    assert not_object.status_code == 422 and not_object.json()["index"] == 2

    system = api.append("c1", [{"role": "system", "content": "be nice"}])
    assert system.status_code == 422
    assert (system.json()["index"], system.json()["field"]) == (0, "role")

    orphan = api.append("c1", [user("go"), {"role": "tool", "tool_call_id": "nope", "content": "r"}])
    assert orphan.status_code == 422 and orphan.json()["error"] == "invalid_message"

    # Nothing of a rejected batch was written: the conversation does not exist.
    assert api.client.get(f"{CONV}/c1/state", headers=AUTH_A).status_code == 404

    malformed = api.client.post(f"{CONV}/c1/messages", json={"msgs": []}, headers=AUTH_A)
    assert malformed.status_code == 422 and malformed.json()["error"] == "invalid_request"
    not_json = api.client.post(
        f"{CONV}/c1/messages", content=b"{not json", headers={**AUTH_A, "Content-Type": "application/json"}
    )
    assert not_json.status_code == 422


def test_window_422s_budget_exceeded_and_bad_system_messages(api: Api) -> None:
    api.append("c1", [user("a task that has to fit " * 20), assistant("ok")])
    window = f"{CONV}/c1/window"
    exceeded = api.client.post(
        window,
        json={"budget_tokens": 50, "system_messages": [{"role": "system", "content": "rules " * 30}]},
        headers=AUTH_A,
    )
    assert exceeded.status_code == 422
    body = exceeded.json()
    assert body["error"] == "budget_exceeded" and body["budget"] == 50
    assert body["system_tokens"] > 0 and body["anchor_tokens"] > 0 and body["tools_tokens"] == 0

    not_system = api.client.post(
        window, json={"budget_tokens": 1000, "system_messages": [user("hi")]}, headers=AUTH_A
    )
    assert not_system.status_code == 422
    assert not_system.json()["location"] == "system_messages" and not_system.json()["index"] == 0
    for budget in (0, -5, "lots"):
        assert api.client.post(window, json={"budget_tokens": budget}, headers=AUTH_A).status_code == 422
    bad_model = api.client.post(window, json={"budget_tokens": 1000, "model": "x" * 500}, headers=AUTH_A)
    assert bad_model.status_code == 422


def test_conversation_limit_per_tenant(make_api: Callable[..., Api]) -> None:
    api = make_api(tenants={"tenant-a": {"max_conversations": 2}})
    assert api.append("c1", [user("1")]).status_code == 201
    assert api.append("c2", [user("2")]).status_code == 201
    third = api.append("c3", [user("3")])
    assert third.status_code == 403 and third.json()["error"] == "conversation_limit"
    assert api.append("c1", [assistant("still fine")]).status_code == 201  # existing conversation
    assert api.append("c3", [user("3")], headers=AUTH_B).status_code == 201  # other tenant
    assert api.client.delete(f"{CONV}/c2", headers=AUTH_A).status_code == 204
    assert api.append("c3", [user("3")]).status_code == 201
