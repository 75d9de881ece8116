"""The window's ``format`` and ``tools``, and the raw log's routes (``GET``/``DELETE .../messages``)."""

from __future__ import annotations

from ctxcore.messages import UserMessage
from ctxcore.state import CompressionState, ConversationKey, SummaryBlock
from tests.integration.http_api.helpers import AUTH_A, AUTH_B, CONV, Api, assistant, user

TOOLS = [
    {"type": "function", "function": {"name": "bash", "description": "run", "parameters": {"type": "object"}}}
]


def test_window_format_and_tools(api: Api) -> None:
    api.append("c1", [user("hello", message_id="u1", metadata={"k": 1}), assistant("hi")])
    body = {"budget_tokens": 2000, "tools": TOOLS, "system_messages": [{"role": "system", "content": "s"}]}
    full = api.client.post(f"{CONV}/c1/window", json=body, headers=AUTH_A).json()
    assert full["messages"][1]["context_message_id"] == "000000000001"
    assert full["messages"][1]["message_id"] == "u1" and full["messages"][1]["metadata"] == {"k": 1}
    # The tools the budget counted come back with the window
    assert full["tools"] == TOOLS and full["stats"]["tool_tokens"] > 0
    plain = api.client.post(f"{CONV}/c1/window?format=openai", json=body, headers=AUTH_A).json()
    assert plain["messages"] == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"},
    ]
    assert plain["tools"] == TOOLS
    bad = api.client.post(f"{CONV}/c1/window?format=anthropic", json=body, headers=AUTH_A)
    assert bad.status_code == 422 and bad.json()["error"] == "invalid_request"


def test_read_the_raw_log_in_pages(api: Api) -> None:
    api.append("c1", [user(f"m{i}") if i % 2 == 0 else assistant(f"m{i}") for i in range(5)])
    first = api.client.get(f"{CONV}/c1/messages?limit=3", headers=AUTH_A).json()
    assert [m["content"] for m in first["messages"]] == ["m0", "m1", "m2"] and first["next"] == "000000000003"
    rest = api.client.get(f"{CONV}/c1/messages?after={first['next']}&limit=3", headers=AUTH_A).json()
    assert [m["context_message_id"] for m in rest["messages"]] == ["000000000004", "000000000005"]
    assert rest["next"] is None
    assert api.client.get(f"{CONV}/c1/messages", headers=AUTH_B).status_code == 404
    assert api.client.get(f"{CONV}/c1/messages?after=3", headers=AUTH_A).status_code == 422


def test_truncate_after_removes_the_uncovered_tail_only(api: Api) -> None:
    api.append("c1", [user("task", message_id="t"), assistant("a"), user("more"), assistant("b")])
    # If-Match that is not the end: nothing removed
    moved = api.client.delete(
        f"{CONV}/c1/messages?after=000000000003", headers={**AUTH_A, "If-Match": '"000000000003"'}
    )
    assert moved.status_code == 409 and moved.json()["reason"] == "moved"
    assert moved.json()["last_id"] == "000000000004"
    r = api.client.delete(
        f"{CONV}/c1/messages?after=000000000003", headers={**AUTH_A, "If-Match": '"000000000004"'}
    )
    assert r.status_code == 200 and r.json() == {"removed": ["000000000004"], "last_id": "000000000003"}
    # The next append gets a new id; the log ends where the truncation left it
    assert api.append("c1", [assistant("b2")]).json()["ids"] == ["000000000005"]
    # A compaction covering message 2 makes everything above 1 untouchable
    key = ConversationKey("tenant-a", "c1")
    block = SummaryBlock(
        block_id="B1",
        messages=[UserMessage(content="[summary] a")],
        first_id="000000000002",
        last_id="000000000002",
        level=1,
        tokens_before=10,
        tokens_after=5,
        model="m",
    )
    state = CompressionState(blocks=[block], covered_until="000000000002", pinned=["000000000001"])
    assert api.runtime.state_store.save(key, state, 0)
    covered = api.client.delete(f"{CONV}/c1/messages?after=000000000001", headers=AUTH_A)
    assert covered.status_code == 409 and covered.json()["error"] == "truncate_refused"
    assert covered.json()["reason"] == "covered"
    assert len(api.runtime.log.read_after(key, None)) == 4
    # Above the cursor is fine
    assert api.client.delete(f"{CONV}/c1/messages?after=000000000003", headers=AUTH_A).json()["removed"] == [
        "000000000005"
    ]
    assert api.client.delete(f"{CONV}/c1/messages?after=x", headers=AUTH_A).status_code == 422
    assert api.client.delete(f"{CONV}/nope/messages?after=000000000001", headers=AUTH_A).status_code == 404
