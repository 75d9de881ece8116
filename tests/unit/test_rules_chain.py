"""apply_rules and the default chain: determinism and recoverability (the property test is in
``test_rules_chain_properties.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from ctxcore.engine import ContextEngine
from ctxcore.errors import ConfigError, StoreUnavailable
from ctxcore.messages import (
    AnyMessage,
    AssistantMessage,
    SystemMessage,
    ToolMessage,
    UserMessage,
    from_openai,
    messages_to_json,
)
from ctxcore.processors import apply_rules, apply_rules_result, build_rule_chain, default_rule_chain
from ctxcore.processors.offload import OFFLOAD_MARKER_RE
from ctxcore.state.keys import ConversationKey
from ctxcore.state.memory import MemoryOffloadStore
from ctxcore.tokens import EstimateCounter, TiktokenCounter
from tests.datasets import conversations
from tests.unit.rules_chain_checks import assert_sound, with_ids

settings.register_profile(
    "ctxcore-rules", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
RULES_PROFILE = settings.get_profile("ctxcore-rules")
KEY = ConversationKey("t", "c")


class CountingStore(MemoryOffloadStore):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.batches = 0

    def put_if_absent(self, key: ConversationKey, handle: str, messages: Sequence[AnyMessage]) -> bool:
        written = super().put_if_absent(key, handle, messages)
        self.writes += written
        return written

    def put_many_if_absent(
        self, key: ConversationKey, items: Sequence[tuple[str, Sequence[AnyMessage]]]
    ) -> list[bool]:
        self.batches += 1
        written = super().put_many_if_absent(key, items)
        self.writes += sum(written)
        return written


class OneAtATime:
    """A store whose batch is one put at a time, whose puts fail while ``failing`` is set."""

    def __init__(self) -> None:
        self.inner = MemoryOffloadStore()
        self.failing = False

    def put_if_absent(self, key: ConversationKey, handle: str, messages: Sequence[AnyMessage]) -> bool:
        if self.failing:
            raise StoreUnavailable("offload store down (test)")
        return self.inner.put_if_absent(key, handle, messages)

    def put_many_if_absent(
        self, key: ConversationKey, items: Sequence[tuple[str, Sequence[AnyMessage]]]
    ) -> list[bool]:
        return [self.put_if_absent(key, handle, messages) for handle, messages in items]

    def files(self) -> None:
        return None

    def get(self, key: ConversationKey, handle: str) -> list[AnyMessage] | None:
        return self.inner.get(key, handle)

    def delete(self, key: ConversationKey) -> None:
        self.inner.delete(key)


class FailingBatch(CountingStore):
    """Batches of more than one fail (a script too large, say); single puts work."""

    def put_many_if_absent(
        self, key: ConversationKey, items: Sequence[tuple[str, Sequence[AnyMessage]]]
    ) -> list[bool]:
        if len(items) > 1:
            raise StoreUnavailable("batch refused (test)")
        # put_if_absent counts the write: skip the batch counter.
        return MemoryOffloadStore.put_many_if_absent(self, key, items)


def swe_run() -> list[AnyMessage]:
    record = next(conversations("minisweagent.jsonl"))
    return with_ids([m for m in from_openai(record["messages"]) if not isinstance(m, SystemMessage)])


def test_default_chain_order_and_scaling() -> None:
    chain = default_rule_chain()
    assert [name for name, _ in chain] == [
        "ToolResultCap",
        "ToolResultCap",
        "CompactCompletedToolTurns",
        "WindowLimit",
        "ToolResultBudgetProcessor",
        "MicroCompactProcessor",
        "ToolResultCap",
    ]
    assert [c.get("scope") for _, c in chain[:2]] == ["newest_step", "older_steps"]
    assert "scope" not in chain[-1][1]
    big, small = dict(default_rule_chain(200_000)), dict(default_rule_chain(16_000))
    assert big["ToolResultCap"]["max_result_ratio"] == 0.25
    assert dict(default_rule_chain(16_000, max_result_ratio=0.5))["ToolResultCap"]["max_result_ratio"] == 0.5
    assert small["ToolResultBudgetProcessor"]["large_message_threshold"] == 800
    assert big["ToolResultBudgetProcessor"]["large_message_threshold"] == 10_000
    for name in (
        "CompactCompletedToolTurns",
        "WindowLimit",
        "ToolResultBudgetProcessor",
        "MicroCompactProcessor",
        "ToolResultCap",
    ):
        assert small[name]["act_only_over_budget"] is True


def test_apply_rules_runs_rule_processors_only() -> None:
    with pytest.raises(ConfigError, match="cannot find processor type"):
        apply_rules([], [("Summariser", {})], EstimateCounter(), None, KEY)


def test_nothing_to_do_returns_the_input_unchanged() -> None:
    messages = with_ids([UserMessage(content="hi"), AssistantMessage(content="hello")])
    result = apply_rules_result(messages, default_rule_chain(), EstimateCounter(), MemoryOffloadStore(), KEY)
    assert result.messages == messages and not result.changed and not result.offloaded


def test_same_input_twice_gives_the_same_window_and_writes_once() -> None:
    messages = swe_run()
    store = CountingStore()
    chain = build_rule_chain(default_rule_chain(16_000))
    counter = TiktokenCounter()
    room = 16_000 - counter.count_messages(messages[:1])
    first = apply_rules_result(
        messages, chain, counter, store, KEY, budget_tokens=16_000, tail_budget_tokens=room
    )
    writes = store.writes
    second = apply_rules_result(
        messages, chain, counter, store, KEY, budget_tokens=16_000, tail_budget_tokens=room
    )
    assert first.changed and writes > 0
    assert messages_to_json(first.messages) == messages_to_json(second.messages)
    assert first.offloaded == second.offloaded and first.removed_ranges == second.removed_ranges
    assert store.writes == writes
    assert_sound(messages, first.messages, store, KEY)


def _default_chain_on(messages: list[AnyMessage], store: Any) -> Any:
    counter = TiktokenCounter()
    room = 16_000 - counter.count_messages(messages[:1])
    return apply_rules_result(
        messages,
        default_rule_chain(16_000),
        counter,
        store,
        KEY,
        budget_tokens=16_000,
        tail_budget_tokens=room,
    )


def test_a_chain_writes_its_offloads_in_one_batch_as_one_at_a_time_would() -> None:
    messages = swe_run()
    store, single = CountingStore(), OneAtATime()
    batched, plain = _default_chain_on(messages, store), _default_chain_on(messages, single)
    assert len(batched.offloaded) > 1 and store.batches == 1 and store.writes == len(batched.offloaded)
    assert messages_to_json(batched.messages) == messages_to_json(plain.messages)
    assert batched.offloaded == plain.offloaded and batched.removed_ranges == plain.removed_ranges
    for handle in batched.offloaded:
        assert store.get(KEY, handle) == single.get(KEY, handle) is not None
    assert_sound(messages, batched.messages, store, KEY)


def test_a_failed_batch_falls_back_to_one_put_each() -> None:
    messages = swe_run()
    store = FailingBatch()
    result = _default_chain_on(messages, store)
    assert messages_to_json(result.messages) == messages_to_json(
        _default_chain_on(messages, CountingStore()).messages
    )
    assert store.writes == len(result.offloaded) > 1
    assert_sound(messages, result.messages, store, KEY)


def test_a_store_that_fails_keeps_every_message_it_could_not_offload() -> None:
    messages = swe_run()
    store = OneAtATime()
    store.failing = True
    result = _default_chain_on(messages, store)
    assert not result.offloaded
    assert "[[OFFLOAD:" not in "".join(str(m.content) for m in result.messages)


def test_embedded_contexts_with_the_same_input_serve_the_same_window_and_write_once() -> None:
    store = CountingStore()
    record = next(conversations("minisweagent.jsonl"))
    messages = from_openai(record["messages"])
    windows = []
    writes = []
    for _ in range(2):
        engine = ContextEngine(
            {"context_window_tokens": 16_000, "strict_processors": True}, offload_store=store
        )
        ctx = engine.create_context("swe", "s", processors=default_rule_chain(16_000))
        for start in range(1, len(messages), 9):
            ctx.add_messages(messages[start : start + 9])
        windows.append(messages_to_json(ctx.get_context_window(system_messages=messages[:1]).get_messages()))
        writes.append(store.writes)
    assert windows[0] == windows[1]
    assert writes[0] > 0 and writes[1] == writes[0]


def test_originals_come_from_the_log_not_from_a_processed_input() -> None:
    messages = swe_run()
    processed = [
        m.model_copy(update={"content": "already shortened " * 200}) if isinstance(m, ToolMessage) else m
        for m in messages
    ]
    store = MemoryOffloadStore()
    originals = {m.context_message_id: m for m in messages}
    out = apply_rules(
        processed,
        default_rule_chain(16_000),
        TiktokenCounter(),
        store,
        KEY,
        budget_tokens=16_000,
        originals=originals,
    )
    assert_sound(messages, out, store, KEY)


def test_removed_ranges_and_handles_cover_everything_left_out() -> None:
    messages = swe_run()
    store = MemoryOffloadStore()
    result = apply_rules_result(
        messages, default_rule_chain(16_000), TiktokenCounter(), store, KEY, budget_tokens=16_000
    )
    shown = {m.context_message_id: m for m in result.messages}
    for message in messages:
        log_id = str(message.context_message_id)
        served = shown.get(log_id)
        if served is not None and (
            served.content == message.content or OFFLOAD_MARKER_RE.search(str(served.content))
        ):
            continue
        assert any(r.first <= log_id <= r.last for r in result.removed_ranges), log_id
