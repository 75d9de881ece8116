"""Parity with the reference, decided item by item (README: compatibility section)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ctxcore.engine import ContextEngine
from ctxcore.markers import MEMORY_BLOCK_CURRENT, RECOVERED_CONTEXT, SYSTEM_REMINDER
from ctxcore.messages import (
    AnyMessage,
    AssistantMessage,
    ToolCall,
    ToolMessage,
    UsageMetadata,
    UserMessage,
    message_text,
)
from ctxcore.processors.events import CompressionStateEvent
from ctxcore.processors.usage_trigger import trigger_tokens
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.tokens import TiktokenCounter, image_part_tokens, image_tokens_for_size

COUNTER = TiktokenCounter()


# --- CurrentRoundCompressor folds internal user messages after the intent anchor --------


def test_current_round_folds_internal_user_messages_with_no_assistant_after_them() -> None:
    engine = ContextEngine({"strict_processors": True, "context_window_tokens": 4000})
    ctx = engine.create_context(
        "c", processors=[("CurrentRoundCompressor", {"model_client": ExtractiveModel(COUNTER)})]
    )
    older = f"{MEMORY_BLOCK_CURRENT}\n<summary>\n" + "We inspected app.py and ran the tests. " * 60
    recovered = f"{RECOVERED_CONTEXT}\nRecently read file: /repo/src/app.py\n" + "def f(): pass\n" * 120
    reminder = f"{SYSTEM_REMINDER} keep the tests green " * 20
    ctx.add_messages(
        [
            UserMessage(content="set up the project"),
            AssistantMessage(content="done"),
            UserMessage(content="fix the failing test"),
            UserMessage(content=older),
            UserMessage(content=recovered),
            UserMessage(content=reminder),
        ]
    )
    assert ctx.compress_context() == "compressed"
    view = ctx.get_messages()
    texts = [message_text(m) for m in view]
    assert texts[:3] == ["set up the project", "done", "fix the failing test"]
    # One new memory block right after the intent anchor, standing for all three
    assert len(view) == 4 and texts[3].startswith(MEMORY_BLOCK_CURRENT)
    assert older not in texts and recovered not in texts and reminder not in texts
    assert len(ctx.get_raw_messages()) == 6  # the log keeps them


def test_current_round_default_span_takes_tool_results_and_the_trailing_reminder() -> None:
    # Spec 8.1 #8: prefix = [user], compress = the rest incl. tool results and the reminder
    from ctxcore.processors.current_round import CurrentRoundCompressor

    ctx = ContextEngine().create_context("c")
    messages: list[AnyMessage] = [
        UserMessage(content="fix it"),
        AssistantMessage(content="", tool_calls=[ToolCall(id="c1", name="read")]),
        ToolMessage(content="file", tool_call_id="c1"),
        UserMessage(content=f"{SYSTEM_REMINDER} tests must pass"),
    ]
    span = CurrentRoundCompressor().span(ctx, messages)
    assert (span.prefix, span.target, span.tail) == (messages[:1], messages[1:], [])
    # An unfinished call after the reminder stays in the tail
    open_call = AssistantMessage(content="", tool_calls=[ToolCall(id="c2", name="run")])
    span = CurrentRoundCompressor().span(ctx, [*messages, open_call])
    assert span.target == messages[1:] and span.tail == [open_call]


def test_overflow_recovery_finds_the_internal_messages() -> None:
    engine = ContextEngine({"context_window_tokens": 4000})
    ctx = engine.create_context(
        "c", processors=[("CurrentRoundCompressor", {"model_client": ExtractiveModel(COUNTER)})]
    )
    ctx.add_messages(
        [
            UserMessage(content="fix the failing test"),
            UserMessage(content=f"{RECOVERED_CONTEXT}\n" + "line of a file\n" * 400),
        ]
    )
    overflow = RuntimeError("This model's maximum context length is 4000 tokens")
    assert ctx.recover_from_model_exception(overflow) is True


# --- images priced from a stamped size ------------------------------------------------------


def test_image_with_stamped_size_is_priced_from_it() -> None:
    remote = {"url": "https://example.com/cat.png"}
    assert image_part_tokens({"type": "image_url", "image_url": remote}) == 1445
    for part in (
        {"type": "image_url", "image_url": remote, "width": 100, "height": 100},
        {"type": "image_url", "image_url": {**remote, "width": 100, "height": 100}},
        {"type": "image_url", "image_url": remote, "dimensions": "100x100"},
        {"type": "image_url", "image_url": {**remote, "dimensions": "100X100"}},
    ):
        assert image_part_tokens(part) == 255, part
    big = {"type": "image_url", "image_url": remote, "width": 2048, "height": 1024}
    assert image_part_tokens(big) == image_tokens_for_size(2048, 1024) == 1568
    # Low detail stays flat; nonsense sizes fall back to the unknown price
    assert (
        image_part_tokens({"type": "image_url", "image_url": {**remote, "detail": "low"}, "width": 999}) == 85
    )
    for bad in ({"width": 0, "height": 100}, {"width": "x", "height": 1}, {"dimensions": "100"}):
        assert image_part_tokens({"type": "image_url", "image_url": remote, **bad}) == 1445, bad


# --- compression-state events: model, times, statistic --------------------------------------


def test_state_events_carry_model_times_and_statistic() -> None:
    engine = ContextEngine({"strict_processors": True})
    events: list[CompressionStateEvent] = []
    engine.subscribe(events.append)
    ctx = engine.create_context(
        "c",
        processors=[
            (
                "RoundLevelCompressor",
                {
                    "trigger_total_tokens": 800,
                    "target_total_tokens": 800,
                    "model_client": ExtractiveModel(COUNTER, name="local-summariser"),
                },
            )
        ],
    )
    for i in range(12):
        ctx.add_messages(
            [UserMessage(content=f"question {i} " + "words " * 40), AssistantMessage(content="ok " * 30)]
        )
    ctx.get_context_window()
    completed = [e for e in events if e.status == "completed"]
    assert completed, [e.status for e in events]
    event = completed[-1]
    assert event.model == "local-summariser"
    assert event.before is not None and event.after is not None and event.statistic is not None
    before = datetime.fromisoformat(event.before.time)
    after = datetime.fromisoformat(event.after.time)
    assert before <= after and before.tzinfo is not None
    assert len(event.before.time.split("T")[1].split("+")[0].split(".")[1]) == 3  # milliseconds
    assert event.statistic.total_tokens == event.after.tokens
    assert event.statistic.total_messages == event.after.messages
    started = next(e for e in events if e.status == "started" and e.operation_id == event.operation_id)
    assert started.statistic is not None and started.statistic.total_tokens == started.before.tokens  # type: ignore[union-attr]
    assert event.to_dict()["statistic"]["total_tokens"] == event.after.tokens
    # A rule processor reports no model
    plain = ContextEngine().create_context("d", processors=[("MicroCompactProcessor", None)])
    seen: list[CompressionStateEvent] = []
    plain.subscribe(seen.append)
    plain.add_messages([UserMessage(content="q")])
    plain.compress_context()
    assert all(e.model == "" for e in seen)


# --- usage-aware trigger ------------------------------------------------------------------


def replied(total_tokens: int) -> list[AnyMessage]:
    return [
        UserMessage(content="task"),
        AssistantMessage(
            content="",
            tool_calls=[ToolCall(id="c1", name="read")],
            usage_metadata=UsageMetadata(
                input_tokens=total_tokens - 10, output_tokens=10, total_tokens=total_tokens
            ),
        ),
        ToolMessage(content="x" * 400, tool_call_id="c1"),
    ]


def test_trigger_tokens_use_the_newest_usage_plus_later_text_and_no_tools_twice() -> None:
    ctx = ContextEngine().create_context("c")
    ctx.add_messages(replied(5000))
    messages = ctx.get_messages()
    tools: list[dict[str, Any]] = [{"type": "function", "function": {"name": "read", "parameters": {}}}]
    exact = COUNTER.count_messages(messages) + COUNTER.count_tools(tools)
    assert trigger_tokens(messages, tools, COUNTER, usage_aware=False) == exact
    assert trigger_tokens(messages, tools, COUNTER, usage_aware=True) == 5000 + 400 // 4
    # No valid usage (absent or 0): exact
    bare = [
        m.model_copy(update={"usage_metadata": None}) if isinstance(m, AssistantMessage) else m
        for m in messages
    ]
    assert trigger_tokens(bare, tools, COUNTER, usage_aware=True) == exact
    zero = replied(0)
    assert trigger_tokens(zero, [], COUNTER, usage_aware=True) == COUNTER.count_messages(zero)


def round_level(usage_aware: bool) -> Any:
    config = {
        "trigger_total_tokens": 3000,
        "target_total_tokens": 3000,
        "model_client": ExtractiveModel(COUNTER),
        "usage_aware_trigger": usage_aware,
    }
    ctx = ContextEngine().create_context(f"c{usage_aware}", processors=[("RoundLevelCompressor", config)])
    ctx.add_messages(replied(5000))
    return ctx


def test_usage_aware_trigger_is_off_by_default_and_stale_after_a_rewrite() -> None:
    from ctxcore.window import ContextWindow

    exact_ctx, aware_ctx = round_level(False), round_level(True)
    exact_proc, aware_proc = exact_ctx.processors[0][1], aware_ctx.processors[0][1]
    window = ContextWindow(context_messages=exact_ctx.get_messages())
    assert exact_proc.trigger_get_context_window(exact_ctx, window) is False  # ~150 exact tokens
    assert (
        aware_proc.trigger_get_context_window(
            aware_ctx, ContextWindow(context_messages=aware_ctx.get_messages())
        )
        is True
    )
    # Budgets stay exact: the compressor finds the view within target and changes nothing
    assert aware_ctx.get_context_window().context_messages == aware_ctx.get_messages()
    # After a rewrite of the view the reported usage describes an old request: ignored
    aware_ctx.set_messages(aware_ctx.get_messages())
    again = ContextWindow(context_messages=aware_ctx.get_messages())
    assert aware_proc.trigger_get_context_window(aware_ctx, again) is False
    # A reply logged after the rewrite is fresh again
    aware_ctx.add_messages(
        [AssistantMessage(content="done", usage_metadata=UsageMetadata(total_tokens=4000))]
    )
    fresh = ContextWindow(context_messages=aware_ctx.get_messages())
    assert aware_proc.trigger_get_context_window(aware_ctx, fresh) is True
