"""Every processor over the test conversations (tau-bench and SWE runs, the dated chats).

Thresholds are small so each processor acts wherever it can; on every conversation the
served window must be protocol-valid, keep both anchors verbatim, leave the log as added,
and everything it changed must be recoverable: offloaded originals reload byte for byte,
anything else lies in a log-id range some event reported.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from ctxcore.engine import ContextEngine, ModelContext
from ctxcore.errors import BudgetExceeded
from ctxcore.messages import (
    AnyMessage,
    AssistantMessage,
    SystemMessage,
    ToolMessage,
    from_openai,
    messages_to_json,
)
from ctxcore.processors import CompressionStateEvent, IdRange, default_rule_chain
from ctxcore.processors.offload import OFFLOAD_MARKER_RE
from ctxcore.processors.rules import rounds, tool_calls_of_results, tool_name
from ctxcore.tokens import TiktokenCounter
from ctxcore.turns import anchors, is_real_user, turns
from ctxcore.window import ContextWindow, check_window
from tests.datasets import FILES, conversations

WINDOW_TOKENS = 2000  # MessageSummaryOffloader then acts on tool results above 200 tokens
COUNTER = TiktokenCounter()


def tokens(message: AnyMessage) -> int:
    return COUNTER.count_message(message)


def names(messages: list[AnyMessage]) -> list[str]:
    calls = tool_calls_of_results(messages)
    return [tool_name(m, calls.get(i)) for i, m in enumerate(messages) if isinstance(m, ToolMessage)]


def offloadable(messages: list[AnyMessage]) -> bool:
    pinned = set(anchors(messages).indices())
    return any(
        i not in pinned
        and isinstance(m.content, str)
        and len(m.content) > 200
        and (m.role != "user" or is_real_user(m))
        for i, m in enumerate(messages)
    )


def fits_anchors(messages: list[AnyMessage]) -> bool:
    """True when both anchors fit the window with room to spare (the reload tool, the system)."""
    return COUNTER.count_messages([messages[i] for i in anchors(messages).indices()]) < WINDOW_TOKENS - 400


def compactable_turn(messages: list[AnyMessage]) -> bool:
    older = turns(messages)[:-1]
    return any(
        t.complete
        and not t.failed
        and any(isinstance(m, AssistantMessage) and m.tool_calls for m in messages[t.start : t.end])
        for t in older
    )


Config = Callable[[list[AnyMessage]], dict[str, Any]]
# name -> (config for a conversation, "can act on this conversation")
SWEEP: dict[str, tuple[Config, Callable[[list[AnyMessage]], bool]]] = {
    "MessageOffloader": (
        lambda _: {
            "tokens_threshold": 1,
            "large_message_threshold": 200,
            "trim_size": 50,
            "keep_last_round": False,
            "offload_message_type": ["user", "assistant", "tool"],
        },
        offloadable,
    ),
    "MessageSummaryOffloader": (
        lambda _: {},
        lambda ms: any(isinstance(m, ToolMessage) and tokens(m) > WINDOW_TOKENS // 10 for m in ms),
    ),
    "ToolResultBudgetProcessor": (
        lambda _: {"tokens_threshold": 1, "large_message_threshold": 100, "trim_size": 50},
        lambda ms: any(isinstance(m, ToolMessage) and tokens(m) > 100 for m in ms),
    ),
    "ToolResultWindowProcessor": (
        lambda ms: {
            "tool_names": sorted(set(names(ms))),
            "keep_last_k": 1,
            "min_offload_chars": 300,
            "small_result_trim_size": 100,
        },
        lambda ms: len(names(ms)) >= 2,
    ),
    "MicroCompactProcessor": (
        lambda _: {"compactable_tool_names": ["*"], "keep_recent_per_tool": 1, "trigger_threshold": 1},
        lambda ms: any(n >= 3 for n in Counter(names(ms)).values()),
    ),
    "CompactCompletedToolTurns": (lambda _: {"keep_recent_turns": 1}, compactable_turn),
    "WindowLimit": (
        lambda _: {"max_attached_turns": 2},
        lambda ms: len(rounds(ms, ContextEngine().detector)) > 2,
    ),
}


def single(name: str) -> Callable[[list[AnyMessage]], list[tuple[str, Any]]]:
    make_config = SWEEP[name][0]
    return lambda messages: [(name, make_config(messages))]


# Each processor alone, and the default chain, where later processors meet earlier ones'
# placeholders (and must still offload the logged originals).
CHAINS: dict[
    str, tuple[Callable[[list[AnyMessage]], list[tuple[str, Any]]], Callable[[list[AnyMessage]], bool]]
] = {
    **{name: (single(name), can_act) for name, (_, can_act) in SWEEP.items()},
    "default chain": (
        lambda _: default_rule_chain(WINDOW_TOKENS),
        # The cap acts on any result over a quarter of the window; the rest only over budget
        # (where the anchors fit at all: below that, BudgetExceeded is the answer).
        lambda ms: (
            fits_anchors(ms)
            and (
                COUNTER.count_messages(ms) > WINDOW_TOKENS
                or any(isinstance(m, ToolMessage) and tokens(m) > WINDOW_TOKENS // 4 for m in ms)
            )
        ),
    ),
}


def run(
    name: str, record: dict[str, Any]
) -> tuple[ModelContext, list[AnyMessage], ContextWindow, list[CompressionStateEvent]]:
    messages = from_openai(record["messages"])
    system = [m for m in messages if isinstance(m, SystemMessage)]
    rest: list[AnyMessage] = [m for m in messages if not isinstance(m, SystemMessage)]
    engine = ContextEngine({"strict_processors": True, "context_window_tokens": WINDOW_TOKENS})
    ctx = engine.create_context(str(record["id"]).replace("/", "_")[:100], processors=CHAINS[name][0](rest))
    events: list[CompressionStateEvent] = []
    ctx.subscribe(events.append)
    chunk = 25 if len(rest) > 300 else 7  # odd chunks end on tool results and on calls alike
    for start in range(0, len(rest), chunk):
        ctx.add_messages(rest[start : start + chunk])
    window = ctx.get_context_window(system_messages=system)
    return ctx, rest, window, events


def covered(log_id: str, spans: list[IdRange]) -> bool:
    return any(span.first <= log_id <= span.last for span in spans)


def check(name: str, record: dict[str, Any]) -> bool:
    """Run one processor over one conversation, assert the guarantees; True if it acted."""
    where = f"{name} on {record['id']}"
    try:
        ctx, added, window, events = run(name, record)
    except BudgetExceeded as exc:
        # The default chain promises the budget: the anchors alone must really be too big.
        assert name == "default chain", where
        assert exc.system_tokens + exc.tools_tokens + exc.anchor_tokens > exc.budget, where
        return False
    raw = ctx.get_raw_messages()
    assert [m.model_copy(update={"context_message_id": None}) for m in raw] == added, where
    assert check_window(window.get_messages()) == [], where
    served = window.context_messages
    found = anchors(raw)
    for index in found.indices():
        assert raw[index] in served, f"{where}: anchor {index} not verbatim in the window"

    spans = [span for e in events if e.event for span in e.event.removed_ranges]
    # The served window names what its fallback left out, in a note of its own.
    spans += [
        IdRange(m.metadata["elided"]["first_id"], m.metadata["elided"]["last_id"])
        for m in served
        if "elided" in m.metadata
    ]
    served = [m for m in served if "elided" not in m.metadata]
    by_id = {m.context_message_id: m for m in raw}
    for message in [*ctx.get_messages(), *served]:
        original = by_id[message.context_message_id]
        handles = OFFLOAD_MARKER_RE.findall(str(message.content))
        for handle, _, _ in handles:
            assert messages_to_json(ctx.reload(handle)) == messages_to_json([original]), where
        if not handles and message.content != original.content:
            assert covered(str(message.context_message_id), spans), (
                f"{where}: {message.context_message_id} lost"
            )
    shown = {m.context_message_id for m in served}
    for message in raw:
        if message.context_message_id not in shown:
            assert covered(str(message.context_message_id), spans), (
                f"{where}: {message.context_message_id} lost"
            )
    assert not ctx.last_failures, where
    return ctx.get_messages() != raw or served != ctx.get_messages()


def sample(file: str) -> list[dict[str, Any]]:
    # Every other tau-bench run keeps the sweep fast; all SWE runs and chats.
    return list(conversations(file, every=2 if file.startswith("tau") else 1))


@pytest.mark.parametrize("file", FILES)
@pytest.mark.parametrize("name", list(CHAINS))
def test_processor_over_real_conversations(name: str, file: str) -> None:
    can_act = CHAINS[name][1]
    acted = expected = 0
    for record in sample(file):
        rest: list[AnyMessage] = [
            m for m in from_openai(record["messages"]) if not isinstance(m, SystemMessage)
        ]
        should = can_act(rest)
        did = check(name, record)
        expected += should
        acted += did
        if should:
            assert did, f"{name} did nothing on {record['id']} although it could"
    # A mini-swe-agent run is one turn (its format reminders are not the user's): the
    # turn-based processors have nothing older to act on there.
    turn_based = name in ("WindowLimit", "CompactCompletedToolTurns")
    if (file != "dialogue_qa.jsonl" or name in ("WindowLimit", "MessageOffloader", "default chain")) and not (
        turn_based and file == "minisweagent.jsonl"
    ):
        assert expected > 0, f"{name}: no conversation in {file} it could act on; thresholds too high"
