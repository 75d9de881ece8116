"""``ModelContext.truncate_after``: the embedded log's one exception to append-only."""

from __future__ import annotations

import asyncio

import pytest

from ctxcore.engine import ContextEngine
from ctxcore.errors import TruncateRefused
from ctxcore.messages import UserMessage, replace_content


def test_uncovered_tail_is_removed_from_log_and_view_and_ids_are_not_reused() -> None:
    ctx = ContextEngine().create_context("c")
    ids = ctx.add_messages([UserMessage(content=t) for t in ("a", "b", "c")])
    assert ctx.truncate_after(ids[0]) == ids[1:]
    assert [m.text for m in ctx.get_raw_messages()] == ["a"] == [m.text for m in ctx.get_messages()]
    assert ctx.raw_message(ids[1]) is None
    assert ctx.add_messages([UserMessage(content="d")]) == ["000000000004"]
    # A snapshot keeps the counter: a restored context does not reuse 2 or 3 either
    ctx.truncate_after(ids[0])
    restored = ContextEngine().create_context("c")
    restored.load_state(ctx.save_state())
    assert restored.add_messages([UserMessage(content="e")]) == ["000000000005"]
    with pytest.raises(TruncateRefused) as info:
        restored.truncate_after(ids[0], expected_last_id=ids[0])
    assert info.value.reason == "moved" and info.value.last_id == "000000000005"
    assert asyncio.run(ContextEngine().create_async_context("x").truncate_after(ids[0])) == []


def test_a_rewritten_message_is_covered_and_nothing_is_removed() -> None:
    ctx = ContextEngine().create_context("c")
    ids = ctx.add_messages([UserMessage(content=t) for t in ("a", "b", "c")])
    view = ctx.get_messages()
    ctx.set_messages([*view[:2], replace_content(view[2], "[summary of c]")])
    with pytest.raises(TruncateRefused) as info:
        ctx.truncate_after(ids[1])
    assert info.value.reason == "covered"
    assert len(ctx.get_raw_messages()) == 3
    # Cutting lower still takes the rewritten message with it: refused too
    with pytest.raises(TruncateRefused):
        ctx.truncate_after(ids[0])
