"""The fast path's caches: decoded log entries, tool-definition counts, offload handles."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import pytest

from ctxcore.messages import AnyMessage, UserMessage
from ctxcore.state.base import encode_log_message, format_log_id
from ctxcore.state.decoded import DecodedEntries, decoded_rows
from ctxcore.state.undecodable import UNDECODABLE_KEY, is_undecodable
from ctxcore.tokens import TiktokenCounter, _tools_text


def row(seq: int, text: str) -> tuple[int, bytes]:
    return seq, encode_log_message(UserMessage(content=text)).encode()


class Counting:
    """``decode_log_messages`` that records how many rows it was asked to decode."""

    def __init__(self) -> None:
        self.rows = 0

    def __call__(self, rows: Sequence[tuple[int, bytes]]) -> list[AnyMessage]:
        self.rows += len(rows)
        return decoded_rows(rows)


def test_a_second_read_reuses_what_the_first_decoded() -> None:
    cache, decode = DecodedEntries(), Counting()
    rows = [row(i, f"m{i}") for i in range(5)]
    first = cache.decode(rows, decode)
    second = cache.decode([*rows[1:], row(5, "m5")], decode)
    assert decode.rows == 6  # only the new entry decoded the second time
    assert second[:4] == first[1:] and all(a is b for a, b in zip(second[:4], first[1:], strict=True))
    assert [m.context_message_id for m in second] == [f"{i:012d}" for i in range(1, 6)]
    assert (cache.hits, cache.misses) == (4, 6)


def test_a_reused_log_id_with_other_bytes_is_decoded_again() -> None:
    # After truncate_after (or a conversation deleted and re-created) an id can come back
    # holding another message: the bytes are part of the key.
    cache = DecodedEntries()
    (old,) = cache.decode([row(1, "before")], decoded_rows)
    (new,) = cache.decode([row(1, "after")], decoded_rows)
    assert (old.text, new.text) == ("before", "after")


def test_the_cache_is_bounded_by_entries_and_by_bytes() -> None:
    by_count = DecodedEntries(max_entries=3)
    by_count.decode([row(i, "x") for i in range(10)], decoded_rows)
    assert len(by_count) == 3
    big = row(1, "y" * 5000)
    by_bytes = DecodedEntries(max_bytes=6000)
    by_bytes.decode([big, row(2, "z" * 5000)], decoded_rows)
    assert len(by_bytes) == 1  # the older entry went to make room
    with pytest.raises(ValueError, match="at least one"):
        DecodedEntries(max_entries=0)


def test_a_malformed_entry_is_read_as_its_placeholder() -> None:
    cache = DecodedEntries()
    good, bad = cache.decode([row(1, "ok"), (2, b"garbage")], decoded_rows)
    assert good.text == "ok" and not is_undecodable(good)
    assert is_undecodable(bad) and bad.context_message_id == format_log_id(2)
    assert "not a stored message" in bad.metadata[UNDECODABLE_KEY]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web",
            "parameters": {"type": "object", "properties": {"q": {"type": "string", "default": 1}}},
        },
    }
]


def expected(tools: list[dict[str, object]], counter: TiktokenCounter) -> int:
    return 3 + sum(counter.count_text(t) for t in _tools_text(tools))


def test_tool_counts_follow_every_change_of_the_definitions() -> None:
    counter = TiktokenCounter()
    assert counter.count_tools(TOOLS) == expected(TOOLS, counter)
    assert counter.count_tools(copy.deepcopy(TOOLS)) == expected(TOOLS, counter)  # equal copy: cached
    changed = copy.deepcopy(TOOLS)
    changed[0]["function"]["description"] = "Search the web for pages about a topic"  # type: ignore[index]
    assert counter.count_tools(changed) == expected(changed, counter) > expected(TOOLS, counter)
    # Equal in Python but rendered differently in JSON (1 == 1.0 == True): never confused.
    for value in (1.25, True, 1.0):
        variant = copy.deepcopy(TOOLS)
        variant[0]["function"]["parameters"]["properties"]["q"]["default"] = value  # type: ignore[index]
        assert counter.count_tools(variant) == expected(variant, counter)


def test_tools_marshal_cannot_write_are_still_counted_exactly() -> None:
    class Odd:
        def __str__(self) -> str:
            return "odd"

    tools = [{"type": "function", "function": {"name": "f", "x": Odd()}}]
    counter = TiktokenCounter()
    assert counter.count_tools(tools) == expected(tools, counter)
