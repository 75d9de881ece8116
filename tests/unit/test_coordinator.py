"""The Coordinator: incremental cursor, CAS saves, failures that keep state, conflicts."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from ctxcore.coordinator import Coordinator, TriggerInput
from ctxcore.errors import CursorNotFoundError, ModelError
from ctxcore.messages import AnyMessage, AssistantMessage, UserMessage
from ctxcore.pipeline import Stage
from ctxcore.state import CompressionState, ConversationKey, MemoryMessageLog, MemoryStateStore, SummaryBlock
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.tokens import TiktokenCounter
from tests.datasets import conversations
from tests.pipeline_helpers import check_coverage

KEY = ConversationKey("acme", "conv-1")
COUNTER = TiktokenCounter()


class RecordingSummarizer:
    """Records what it was given; summarises to one short message."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[list[str], list[str]]] = []
        self.fail = fail

    def __call__(
        self, previous_blocks: Sequence[SummaryBlock], pending_steps: Sequence[AnyMessage], target_tokens: int
    ) -> list[AnyMessage] | None:
        self.calls.append(
            ([b.block_id for b in previous_blocks], [m.context_message_id or "" for m in pending_steps])
        )
        if self.fail:
            return []
        return [UserMessage(content=f"summary of {len(pending_steps)} messages")]


def chat(n: int, start: int = 0) -> list[AnyMessage]:
    """n messages of plain dialogue: a real user message then a reply, repeated."""
    out: list[AnyMessage] = []
    for i in range(start, start + n, 2):
        out.append(UserMessage(content=f"question {i} " + "words " * 30))
        out.append(AssistantMessage(content=f"answer {i} " + "more words " * 30))
    return out


def make(
    summarizer: RecordingSummarizer, trigger: bool = True
) -> tuple[Coordinator, MemoryStateStore, MemoryMessageLog]:
    store, log = MemoryStateStore(), MemoryMessageLog()
    coord = Coordinator(
        store,
        log,
        COUNTER,
        model_for=lambda key: ExtractiveModel(COUNTER),
        summarizer=summarizer,
        trigger=lambda inp: trigger,
        keep_recent_messages=0,
    )
    return coord, store, log


def test_cursor_advances_over_three_rounds_with_only_the_new_range() -> None:
    summarizer = RecordingSummarizer()
    coord, store, log = make(summarizer)
    cursor = ""
    for round_no in range(3):
        ids = log.append(KEY, chat(100, start=round_no * 100))
        before_calls = len(summarizer.calls)
        result = coord.compress(KEY)
        assert result.outcome == "compressed", result.detail
        assert result.state.version == round_no + 1
        # The intent anchor (last user message) splits the pending range; the one-message run
        # after it is too small to summarise and stays raw, so the cursor stops before it.
        assert result.state.covered_until == ids[-3]
        calls = summarizer.calls[before_calls:]
        assert calls
        for previous, pending in calls:
            # Earlier blocks come as context; pending holds only messages after the old cursor.
            assert len(previous) == round_no
            assert pending and min(pending) > cursor and max(pending) <= ids[-1]
        cursor = result.state.covered_until
    state = store.load(KEY)
    assert state is not None and len(state.blocks) == 3
    check_coverage(coord.view(KEY), [m.context_message_id or "" for m in log.read_after(KEY, None)])


def test_missing_cursor_raises() -> None:
    coord, store, log = make(RecordingSummarizer())
    log.append(KEY, chat(4))
    assert store.save(KEY, CompressionState(covered_until="999999999999"), expected_version=0)
    with pytest.raises(CursorNotFoundError, match="not in the log"):
        coord.compress(KEY)


def test_summarizer_failure_keeps_state() -> None:
    coord, store, log = make(RecordingSummarizer(fail=True))
    log.append(KEY, chat(40))
    result = coord.compress(KEY)
    assert result.outcome == "failed" and result.error_kind == "summarizer_empty"
    assert store.load(KEY) is None


def test_trigger_false_and_nothing_pending_never_call_the_summarizer() -> None:
    summarizer = RecordingSummarizer()
    coord, _, log = make(summarizer, trigger=False)
    assert coord.compress(KEY).outcome == "skipped"  # nothing pending
    log.append(KEY, chat(40))
    assert coord.compress(KEY).outcome == "skipped"  # trigger false
    assert summarizer.calls == []


def test_trigger_sees_pending_facts() -> None:
    seen: list[TriggerInput] = []
    store, log = MemoryStateStore(), MemoryMessageLog()
    coord = Coordinator(
        store,
        log,
        COUNTER,
        model_for=lambda k: ExtractiveModel(COUNTER),
        summarizer=RecordingSummarizer(),
        trigger=lambda i: seen.append(i) or False,
        keep_recent_messages=0,
    )
    log.append(KEY, chat(10))
    coord.compress(KEY)
    assert seen and len(seen[0].pending_messages) == 10 and seen[0].pending_turn_count == 5
    assert seen[0].estimated_pending_tokens > 0 and seen[0].state.version == 0


def test_conflict_when_another_writer_saved_first() -> None:
    coord, store, log = make(RecordingSummarizer())
    log.append(KEY, chat(40))
    stage = Stage(
        kind="l0_to_l1",
        based_on_version=0,
        target_tokens=100,
        first_id="000000000001",
        last_id="000000000040",
    )
    assert store.save(KEY, CompressionState(), expected_version=0)  # someone else
    result = coord.run_stage(KEY, stage)
    assert result.outcome == "conflict" and result.state.version == 1


def test_run_stage_pipeline_on_swe_run_saves_with_cas() -> None:
    conv = next(conversations("minisweagent.jsonl"))
    store, log = MemoryStateStore(), MemoryMessageLog()
    from ctxcore.messages import from_openai

    log.append(KEY, [m for m in from_openai(conv["messages"]) if m.role != "system"])
    coord = Coordinator(store, log, COUNTER, model_for=lambda k: ExtractiveModel(COUNTER))
    store.set_budget(KEY, 12_000)
    stage = coord.plan(KEY)
    assert stage is not None and stage.kind == "l0_to_l1"
    result = coord.run_stage(KEY, stage)
    assert result.outcome == "compressed" and result.state.version == 1
    assert all(b.level == 1 and b.first_id <= b.last_id for b in result.state.blocks)
    # A redelivered copy of the same stage is stale now: it must not write twice.
    again = coord.run_stage(KEY, stage)
    assert again.outcome == "conflict" and store.load(KEY).version == 1  # type: ignore[union-attr]
    check_coverage(coord.view(KEY), [m.context_message_id or "" for m in log.read_after(KEY, None)])


def test_model_failure_in_stage_keeps_state() -> None:
    from tests.pipeline_helpers import FailingModel

    conv = next(conversations("minisweagent.jsonl"))
    from ctxcore.messages import from_openai

    store, log = MemoryStateStore(), MemoryMessageLog()
    log.append(KEY, [m for m in from_openai(conv["messages"]) if m.role != "system"])
    coord = Coordinator(store, log, COUNTER, model_for=lambda k: FailingModel("rate_limit"))
    store.set_budget(KEY, 12_000)
    stage = coord.plan(KEY)
    assert stage is not None
    result = coord.run_stage(KEY, stage)
    assert result.outcome == "failed" and result.error_kind == "rate_limit"
    assert store.load(KEY) is None
    # As the README says: with every model stage exhausted and no summary yet, there is no
    # block for the hard truncate, so nothing is planned and the state stays at version 0.
    from ctxcore.pipeline.models import STAGE_ORDER

    model_stages = [k for k in STAGE_ORDER if k != "hard_truncate"]
    assert coord.plan(KEY, exhausted=model_stages) is None
    assert coord.view(KEY).version == 0


class _SlowDownModel:
    """A client of another kind than the summariser's own: it raises a plain ModelError."""

    name = "slow-down"

    def complete(self, messages: Sequence[AnyMessage], *, max_tokens: int, contract: object = None) -> object:
        raise ModelError("rate_limit", "slow down", retry_after=2.5)


def test_a_failed_stage_reports_the_servers_retry_after() -> None:
    from ctxcore.messages import from_openai
    from tests.pipeline_helpers import FailingModel

    conv = next(conversations("minisweagent.jsonl"))
    for model, retry_after in ((_SlowDownModel(), 2.5), (FailingModel("rate_limit"), None)):
        store, log = MemoryStateStore(), MemoryMessageLog()
        log.append(KEY, [m for m in from_openai(conv["messages"]) if m.role != "system"])
        coord = Coordinator(store, log, COUNTER, model_for=lambda k, m=model: m)  # type: ignore[misc]
        store.set_budget(KEY, 12_000)
        stage = coord.plan(KEY)
        assert stage is not None
        result = coord.run_stage(KEY, stage)
        assert result.outcome == "failed" and result.error_kind == "rate_limit"
        assert result.retry_after == retry_after


class _BuggyModel:
    """A model client with a bug (not a classified model error)."""

    name = "buggy"

    def complete(self, messages: Sequence[AnyMessage], *, max_tokens: int, contract: object = None) -> object:
        raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")


def test_an_unclassified_exception_propagates_and_keeps_state() -> None:
    from ctxcore.messages import from_openai

    conv = next(conversations("minisweagent.jsonl"))
    store, log = MemoryStateStore(), MemoryMessageLog()
    log.append(KEY, [m for m in from_openai(conv["messages"]) if m.role != "system"])
    coord = Coordinator(store, log, COUNTER, model_for=lambda k: _BuggyModel())  # type: ignore[arg-type,return-value]
    store.set_budget(KEY, 12_000)
    stage = coord.plan(KEY)
    assert stage is not None
    # Only ModelError is a "failed" outcome: a bug must surface, never degrade into truncation.
    with pytest.raises(TypeError, match="unsupported operand"):
        coord.run_stage(KEY, stage)
    assert store.load(KEY) is None

    def buggy_summarizer(*_: object) -> list[AnyMessage]:
        raise KeyError("summary")

    coord = Coordinator(
        store,
        log,
        COUNTER,
        model_for=lambda k: ExtractiveModel(COUNTER),
        summarizer=buggy_summarizer,
        trigger=lambda i: True,
    )
    with pytest.raises(KeyError):
        coord.compress(KEY)
    assert store.load(KEY) is None
