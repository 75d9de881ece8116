"""Message model: OpenAI round trips on real data and every validation path."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from ctxcore import InvalidMessageError, from_openai, to_openai
from ctxcore.messages import (
    AssistantMessage,
    ToolMessage,
    UserMessage,
    message_text,
    messages_from_json,
    messages_to_json,
    replace_content,
)
from tests.datasets import conversations


def nest(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Flat tool calls -> nested; drop keys whose value is None or [] (empty strings stay)."""
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if v is not None and v != []}
        if "tool_calls" in m:
            m["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out


def test_round_trip_every_test_conversation() -> None:
    count = 0
    for conv in conversations():
        parsed = from_openai(conv["messages"])
        assert to_openai(parsed, include_extra=True) == nest(conv["messages"]), conv["id"]
        count += 1
    assert count == 6 + 20 + 11 + 4  # bundled runs, tau-bench and SWE slices, dated chats


def test_to_openai_emits_only_openai_keys_by_default() -> None:
    raw = [{"role": "user", "content": "hi", "msg_id": "D1:1", "message_id": "m1", "metadata": {"k": 1}}]
    parsed = from_openai(raw)
    assert to_openai(parsed) == [{"role": "user", "content": "hi"}]
    assert parsed[0].metadata == {"k": 1, "extra": {"msg_id": "D1:1"}}
    assert parsed[0].message_id == "m1"
    assert to_openai(parsed, include_extra=True) == raw


def test_nested_and_flat_tool_calls_are_equivalent() -> None:
    flat = from_openai(
        [{"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "name": "f", "arguments": "{}"}]}]
    )
    nested = from_openai(
        [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            }
        ]
    )
    assert flat == nested
    assert "content" not in to_openai(flat)[0]


def test_empty_string_content_stays_empty_string() -> None:
    out = to_openai(from_openai([{"role": "assistant", "content": ""}]))
    assert out == [{"role": "assistant", "content": ""}]


def test_content_parts_kept_exactly() -> None:
    parts = [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ]
    parsed = from_openai([{"role": "user", "content": parts}])
    assert to_openai(parsed)[0]["content"] == parts
    assert message_text(parsed[0]) == "look\n[image:data-url-omitted]"


def test_metadata_flags_and_json_round_trip() -> None:
    msgs = from_openai(
        [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "a", "name": "run", "arguments": "{}"}],
            },
            {"role": "tool", "tool_call_id": "a", "content": "boom", "metadata": {"is_error": True}},
        ]
    )
    assert isinstance(msgs[2], ToolMessage) and msgs[2].metadata["is_error"] is True
    assert messages_from_json(messages_to_json(msgs)) == msgs


def test_messages_are_immutable_and_replace_content_copies() -> None:
    msg = UserMessage(content="a")
    with pytest.raises(ValidationError):
        msg.content = "b"  # type: ignore[misc]
    changed = replace_content(msg, "b", note=1)
    assert msg.content == "a" and changed.content == "b" and changed.metadata == {"note": 1}


def test_data_url_sanitised_in_text() -> None:
    msg = UserMessage(content="see data:image/png;base64,iVBORw0KGgo= here")
    assert message_text(msg) == "see [image:data-url-omitted] here"


@pytest.mark.parametrize(
    ("raw", "index", "field"),
    [
        ("not a list", -1, "messages"),
        ({"role": "user"}, -1, "messages"),
        ([42], 0, "message"),
        ([{"role": "robot", "content": "x"}], 0, "role"),
        ([{"content": "x"}], 0, "role"),
        ([{"role": "user", "content": "ok"}, {"role": "tool", "content": "x"}], 1, "tool_call_id"),
        ([{"role": "tool", "content": "x", "tool_call_id": ""}], 0, "tool_call_id"),
        ([{"role": "user", "content": "x", "tool_call_id": "a"}], 0, "tool_call_id"),
        ([{"role": "user", "content": 5}], 0, "content"),
        ([{"role": "user", "content": [1]}], 0, "content[0]"),
        ([{"role": "user", "content": "x", "name": 3}], 0, "name"),
        ([{"role": "user", "content": "x", "metadata": []}], 0, "metadata"),
        ([{"role": "user", "content": "x", "message_id": 7}], 0, "message_id"),
        (
            [{"role": "user", "content": "x", "tool_calls": [{"id": "a", "name": "f", "arguments": "{}"}]}],
            0,
            "tool_calls",
        ),
        ([{"role": "assistant", "tool_calls": "nope"}], 0, "tool_calls"),
        ([{"role": "assistant", "tool_calls": [3]}], 0, "tool_calls[0]"),
        ([{"role": "assistant", "tool_calls": [{"name": "f", "arguments": "{}"}]}], 0, "tool_calls[0].id"),
        ([{"role": "assistant", "tool_calls": [{"id": "a", "arguments": "{}"}]}], 0, "tool_calls[0].name"),
        (
            [{"role": "assistant", "tool_calls": [{"id": "a", "name": "f", "arguments": {"x": 1}}]}],
            0,
            "tool_calls[0].arguments",
        ),
        ([{"role": "assistant", "tool_calls": [{"id": "a", "function": "f"}]}], 0, "tool_calls[0].function"),
        (
            [{"role": "assistant", "tool_calls": [{"id": "a", "name": "f", "type": 1}]}],
            0,
            "tool_calls[0].type",
        ),
        (
            [{"role": "assistant", "tool_calls": [{"id": "a", "name": "f"}, {"id": "a", "name": "g"}]}],
            0,
            "tool_calls[1].id",
        ),
    ],
)
def test_invalid_input_names_index_and_field(raw: Any, index: int, field: str) -> None:
    with pytest.raises(InvalidMessageError) as info:
        from_openai(raw)
    assert info.value.index == index
    assert info.value.field == field
    assert field in str(info.value)


def test_assistant_fields() -> None:
    (msg,) = from_openai([{"role": "assistant", "content": "x", "tool_calls": [{"id": "a", "name": "f"}]}])
    assert isinstance(msg, AssistantMessage)
    assert msg.tool_calls[0].arguments == "{}"
