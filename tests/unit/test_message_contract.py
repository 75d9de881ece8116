"""The message contract (ctxcore/contract.py): the same messages are refused by
``ModelContext.add_messages`` and ``ContextService.append`` on every backend, before
anything is stored; what is accepted reads back unchanged and appears in a window."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxcore.config import Settings
from ctxcore.contract import MAX_NESTING_DEPTH, check_message, json_problem
from ctxcore.engine import ContextEngine
from ctxcore.errors import InvalidMessageError
from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage, from_openai
from ctxcore.state import ConversationKey, MemoryMessageLog, MemoryStateStore, MessageLog
from ctxcore.state.sql.log import SqlMessageLog
from ctxcore.state.sql.state import SqlStateStore
from workers.service import ContextService, InlineQueue

KEY = ConversationKey("acme", "c")


def nested(depth: int) -> Any:
    """A value ``depth`` levels of objects and arrays deep."""
    value: Any = "leaf"
    for level in range(depth):
        value = {"k": value} if level % 2 else [value]
    return value


def bad_messages() -> dict[str, tuple[AnyMessage, str]]:
    """Messages the contract refuses, by case, with the field it names."""
    return {
        "deep metadata": (UserMessage(content="x", metadata={"a": nested(MAX_NESTING_DEPTH)}), "metadata.a"),
        "deep content part": (
            UserMessage(content=[{"type": "text", "text": "x", "deep": nested(MAX_NESTING_DEPTH)}]),
            "content[0].deep",
        ),
        "surrogate content": (UserMessage(content="bad \ud800 text"), "content"),
        "surrogate in a part": (UserMessage(content=[{"type": "text", "text": "\udfff"}]), "content[0].text"),
        "surrogate tool name": (
            AssistantMessage(content="", tool_calls=[ToolCall(id="c1", name="f\ud801")]),
            "tool_calls[0].name",
        ),
        "surrogate metadata key": (UserMessage(content="x", metadata={"k\ud800": 1}), "metadata"),
        "surrogate name": (UserMessage(content="x", name="\ud800"), "name"),
        "nan": (UserMessage(content="x", metadata={"score": float("nan")}), "metadata.score"),
        "tuple": (UserMessage(content="x", metadata={"pair": (1, 2)}), "metadata.pair"),
        "object": (UserMessage(content="x", metadata={"when": object()}), "metadata.when"),
        "int key": (UserMessage(content="x", metadata={"m": {1: "a"}}), "metadata.m"),
    }


@pytest.mark.parametrize("case", sorted(bad_messages()))
def test_check_message_names_the_field_and_the_rule(case: str) -> None:
    message, field = bad_messages()[case]
    with pytest.raises(InvalidMessageError) as info:
        check_message(3, message)
    assert info.value.index == 3 and info.value.field.startswith(field)
    assert info.value.detail


def test_depth_limit_is_exact_and_iterative() -> None:
    assert json_problem(nested(MAX_NESTING_DEPTH)) is None
    assert json_problem(nested(MAX_NESTING_DEPTH + 1)) is not None
    # Far beyond Python's recursion limit: refused, not a RecursionError.
    problem = json_problem(nested(100_000))
    assert problem is not None and "deeper than 32" in problem[1]
    check_message(0, UserMessage(content="x", metadata={"a": nested(MAX_NESTING_DEPTH - 1)}))


def test_unknown_keys_are_kept_in_metadata_and_depth_checked() -> None:
    (kept,) = from_openai([{"role": "assistant", "content": "a", "refusal": None, "annotations": [{"t": 1}]}])
    assert kept.metadata["extra"] == {"refusal": None, "annotations": [{"t": 1}]}
    check_message(0, kept)
    (deep,) = from_openai([{"role": "user", "content": "a", "audio": nested(40)}])
    with pytest.raises(InvalidMessageError) as info:
        check_message(0, deep)
    assert info.value.field.startswith("metadata.extra.audio")


@pytest.fixture(params=["memory", "sqlite"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ContextService]:
    log: MessageLog
    if request.param == "memory":
        log, state = MemoryMessageLog(), MemoryStateStore()
        yield ContextService(Settings(), state, log, None, InlineQueue())
        return
    state_sql = SqlStateStore(f"sqlite:///{tmp_path / 'ctx.db'}")
    state_sql.setup()
    log = SqlMessageLog(engine=state_sql.engine, table_prefix=state_sql.table_prefix)
    yield ContextService(Settings(), state_sql, log, None, InlineQueue())
    state_sql.close()


@pytest.mark.parametrize("case", sorted(bad_messages()))
def test_every_entry_point_refuses_the_same_messages_and_stores_nothing(
    case: str, service: ContextService
) -> None:
    message, field = bad_messages()[case]
    first = UserMessage(content="hello")
    with pytest.raises(InvalidMessageError) as info:
        service.append(KEY, [first, message])
    assert info.value.index == 1 and info.value.field.startswith(field)
    assert service.log.last_id(KEY) is None
    ctx = ContextEngine().create_context("c")
    with pytest.raises(InvalidMessageError) as info:
        ctx.add_messages([first, message])
    assert info.value.index == 1 and info.value.field.startswith(field)
    assert ctx.get_raw_messages() == []
    # Both stay usable.
    service.append(KEY, [first])
    ctx.add_messages([first])
    assert [m.text for m in service.get_window(KEY, 5000).messages] == ["hello"]
    assert [m.text for m in ctx.get_context_window().context_messages] == ["hello"]


def test_accepted_edge_messages_read_back_and_appear_in_windows(service: ContextService) -> None:
    messages: list[AnyMessage] = [
        UserMessage(content="emoji 😀 and 'quotes' \u2028", metadata={"a": nested(MAX_NESTING_DEPTH - 1)}),
        AssistantMessage(content=None, tool_calls=[ToolCall(id="c1", name="t\u00e9l\u00e9")]),
        ToolMessage(tool_call_id="c1", content=[{"type": "text", "text": "ok", "x": [1.5, None, True]}]),
    ]
    ids = service.append(KEY, messages)
    back = service.log.read_after(KEY, None, 10)
    assert [m.model_copy(update={"context_message_id": None}) for m in back] == messages
    window = service.get_window(KEY, 5000)
    assert [m.context_message_id for m in window.messages] == ids


def U(text: str) -> UserMessage:
    return UserMessage(content=text)


def A(*ids: str, content: str = "") -> AssistantMessage:
    return AssistantMessage(content=content, tool_calls=[ToolCall(id=i, name="f") for i in ids])


def T(call_id: str) -> ToolMessage:
    return ToolMessage(tool_call_id=call_id, content="r")


ORPHANS: dict[str, Callable[[], tuple[list[AnyMessage], list[AnyMessage]]]] = {
    # The reference accepts each of these at add; its windows then fail.
    "result with no call at all": lambda: ([U("q")], [T("nope")]),
    "result after a plain reply": lambda: ([U("q"), A(content="done")], [T("c1")]),
    "result for another step's call": lambda: ([U("q"), A("c1"), T("c1"), U("next"), A("c2")], [T("c1")]),
    "second result for one call": lambda: ([U("q"), A("c1"), T("c1")], [T("c1")]),
}


@pytest.mark.parametrize("case", sorted(ORPHANS))
def test_orphan_results_are_rejected_at_add_and_the_context_stays_usable(case: str) -> None:
    before, orphan = ORPHANS[case]()
    ctx = ContextEngine().create_context("c")
    ctx.add_messages(before)
    with pytest.raises(InvalidMessageError) as info:
        ctx.add_messages(orphan)
    assert info.value.field in ("orphan_tool_result", "duplicate_tool_result")
    assert "does not answer" in info.value.detail or "second result" in info.value.detail
    assert len(ctx.get_raw_messages()) == len(before)
    ctx.get_context_window()  # never InvalidWindowError
    ctx.add_messages([U("still usable")])
    assert ctx.get_context_window().context_messages[-1].text == "still usable"
