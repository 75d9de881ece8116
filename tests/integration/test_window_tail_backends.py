"""Windows over stored counts on each backend: the same window as a whole-tail read when
the tail fits, anchors and the trigger's input kept when it is paged."""

from __future__ import annotations

import pytest

from ctxcore.config import Settings
from ctxcore.markers import ELIDED_STEPS
from ctxcore.messages import UserMessage
from ctxcore.state import ConversationKey
from ctxcore.state.tail import AppendCounts
from tests.conftest import Backend
from tests.unit.test_window_tail import SYSTEM, PlainLog, agent_run
from workers.service import ContextService, InlineQueue


def services(backend: Backend) -> tuple[ContextService, ContextService]:
    log = backend.log
    if log.counted() is None:
        pytest.skip(f"{backend.kind} has no stored counts")
    state = backend.state
    counted = ContextService(Settings(), state, log, None, InlineQueue())
    plain = ContextService(Settings(), state, PlainLog(log), None, InlineQueue())  # type: ignore[arg-type]
    return counted, plain


def test_windows_match_the_whole_tail_read(backend: Backend, conv_key: ConversationKey) -> None:
    counted, plain = services(backend)
    # Entries logged before counts were stored come first: such a tail is read whole
    for batch in agent_run(30)[:10]:
        plain.append(conv_key, batch)
    for batch in agent_run(30)[10:]:
        counted.append(conv_key, batch)
    for budget in (50_000, 1_500):
        a, b = counted.get_window(conv_key, budget, SYSTEM), plain.get_window(conv_key, budget, SYSTEM)
        assert a.messages == b.messages and a.raw_tokens == b.raw_tokens


def test_counts_of_an_earlier_run_are_not_taken_for_the_current_one(
    backend: Backend, conv_key: ConversationKey
) -> None:
    counted, plain = services(backend)
    batches = agent_run(6)
    # The first entries were counted under another encoding (another deployment's default)
    first = [m for batch in batches[:4] for m in batch]
    log = counted.log.counted()
    assert log is not None
    log.append_counted(
        conv_key, first, AppendCounts("o200k_base", [5_000] * len(first), [False] * len(first))
    )
    for batch in batches[4:]:
        counted.append(conv_key, batch)  # cl100k_base: a new run starts here
    expected = plain.get_window(conv_key, 20_000, SYSTEM)
    for _ in range(2):
        window = counted.get_window(conv_key, 20_000, SYSTEM)
        assert window.messages == expected.messages and window.stats == expected.stats
        assert window.raw_tokens == expected.raw_tokens < 5_000


def test_a_paged_tail_keeps_anchors_and_the_raw_total(backend: Backend, conv_key: ConversationKey) -> None:
    counted, plain = services(backend)
    for batch in agent_run(400, user_at=150):
        counted.append(conv_key, batch)
    a, b = counted.get_window(conv_key, 4_000, SYSTEM), plain.get_window(conv_key, 4_000, SYSTEM)
    texts = [str(m.content) for m in a.messages]
    assert a.stats.total_tokens <= 4_000 and any(t.startswith(ELIDED_STEPS) for t in texts)
    assert texts[1] == "Fix the failing build in repo x, please." and "now also check module 150" in texts
    assert a.raw_tokens == b.raw_tokens
    assert a.messages[-1] == b.messages[-1]
    # A later step is served at once: the newest page moved
    counted.append(conv_key, [UserMessage(content="and the docs")])
    assert counted.get_window(conv_key, 4_000, SYSTEM).messages[-1].content == "and the docs"


def test_a_client_switching_models_between_windows_gets_the_whole_tail_windows(
    backend: Backend, conv_key: ConversationKey
) -> None:
    counted, plain = services(backend)
    for batch in agent_run(30, user_at=10):
        counted.append(conv_key, batch)
    # cl100k_base is the run's encoding; o200k_base is counted on first use, then stored
    for model in ("gpt-4", "gpt-4o", "gpt-4", "gpt-4o", "gpt-4o"):
        counted.append(conv_key, [UserMessage(content=f"and now with {model}")])
        for budget in (50_000, 1_500):
            a = counted.get_window(conv_key, budget, SYSTEM, model=model)
            b = plain.get_window(conv_key, budget, SYSTEM, model=model)
            assert a.messages == b.messages and a.stats == b.stats and a.raw_tokens == b.raw_tokens
