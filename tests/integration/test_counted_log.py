"""The CountedLog contract (stored counts, newest-first tails) against every backend."""

from __future__ import annotations

import pytest

from ctxcore.messages import AnyMessage, AssistantMessage, UserMessage
from ctxcore.state import ConversationKey, MessageLog
from ctxcore.state.base import format_log_id
from ctxcore.state.tail import TAIL_PAGE, AppendCounts, CountedLog
from tests.conftest import Backend

ENC = "o200k_base"


@pytest.fixture
def log(backend: Backend) -> CountedLog:
    found = backend.log.counted()
    if found is None:
        pytest.skip(f"{backend.kind} has no stored counts")
    return found


@pytest.fixture
def plain(backend: Backend) -> MessageLog:
    """The log itself (``log`` is its ``counted()``)."""
    return backend.log


def batch(n: int, start: int = 0) -> list[AnyMessage]:
    return [
        UserMessage(content=f"u{i}") if i % 2 == 0 else AssistantMessage(content=f"a{i}")
        for i in range(start, start + n)
    ]


def append(log: CountedLog, key: ConversationKey, messages: list[AnyMessage], count: int = 10) -> list[str]:
    flags = [isinstance(m, UserMessage) for m in messages]
    return log.append_counted(key, messages, AppendCounts(ENC, [count] * len(messages), flags))


def test_a_tail_that_fits_is_read_whole_with_its_counts(log: CountedLog, conv_key: ConversationKey) -> None:
    ids = append(log, conv_key, batch(300))
    read = log.read_tail(conv_key, ids[9], budget_tokens=10_000, encoding=ENC)
    assert [m.context_message_id for m in read.messages] == ids[10:]
    assert read.counts == [10] * 290 and read.omitted is None and read.anchors == []


def test_a_long_tail_is_read_newest_first_until_the_budget_is_filled(
    log: CountedLog, conv_key: ConversationKey
) -> None:
    ids = append(log, conv_key, batch(1000))
    read = log.read_tail(conv_key, ids[99], budget_tokens=2000, encoding=ENC)
    # 2,000 tokens are 200 entries: two pages of 128, never past the cursor
    got = [m.context_message_id for m in read.messages]
    assert got == ids[-2 * TAIL_PAGE :]
    assert read.omitted == (ids[100], ids[-2 * TAIL_PAGE - 1])
    # The running totals give the left-out part's tokens without reading it
    assert read.omitted_tokens == 10 * (1000 - 100 - 2 * TAIL_PAGE)
    # Real user messages left out that can be anchors: the first after the cursor, the latest
    assert [m.context_message_id for m in read.anchors] == [ids[100], ids[-2 * TAIL_PAGE - 2]]


def test_entries_logged_before_counts_make_the_tail_read_whole(
    log: CountedLog, plain: MessageLog, conv_key: ConversationKey
) -> None:
    uncounted = plain.append(conv_key, batch(50))
    ids = append(log, conv_key, batch(500, 50))
    read = log.read_tail(conv_key, None, budget_tokens=100, encoding=ENC)
    assert [m.context_message_id for m in read.messages] == [*uncounted, *ids]
    assert read.counts == [None] * 50 + [10] * 500 and read.omitted is None
    # After the cursor passes them, the counted run alone is paged again
    read = log.read_tail(conv_key, uncounted[-1], budget_tokens=100, encoding=ENC)
    assert len(read.messages) == TAIL_PAGE and read.omitted == (ids[0], ids[-TAIL_PAGE - 1])


def test_a_plain_append_ends_the_run(log: CountedLog, plain: MessageLog, conv_key: ConversationKey) -> None:
    append(log, conv_key, batch(300))
    plain.append(conv_key, batch(1, 300))
    read = log.read_tail(conv_key, None, budget_tokens=100, encoding=ENC)
    assert len(read.messages) == 301 and read.counts[-1] is None and read.omitted is None


def test_other_encodings_are_stored_on_first_use(log: CountedLog, conv_key: ConversationKey) -> None:
    ids = append(log, conv_key, batch(5))
    read = log.read_tail(conv_key, None, budget_tokens=10_000, encoding="cl100k_base")
    assert read.counts == [None] * 5
    log.store_counts(conv_key, "cl100k_base", {i: 7 for i in ids})
    read = log.read_tail(conv_key, None, budget_tokens=10_000, encoding="cl100k_base")
    assert read.counts == [7] * 5
    assert log.read_tail(conv_key, None, budget_tokens=10_000, encoding=ENC).counts == [10] * 5


def test_truncation_keeps_the_running_total(
    log: CountedLog, plain: MessageLog, conv_key: ConversationKey
) -> None:
    ids = append(log, conv_key, batch(400))
    plain.truncate_after(conv_key, ids[299])
    more = append(log, conv_key, batch(300, 400), count=20)
    read = log.read_tail(conv_key, ids[9], budget_tokens=20 * TAIL_PAGE, encoding=ENC)
    assert [m.context_message_id for m in read.messages] == more[-TAIL_PAGE:]
    assert read.omitted == (ids[10], more[-TAIL_PAGE - 1])
    assert read.omitted_tokens == 10 * 290 + 20 * (300 - TAIL_PAGE)
    # The removed real user messages are no anchors
    assert all(m.context_message_id in (*ids[:300], *more) for m in read.anchors)
    assert format_log_id(401) == more[0]


def test_the_overview_gives_the_stored_total_without_reading_entries(
    log: CountedLog, plain: MessageLog, conv_key: ConversationKey
) -> None:
    assert plain.overview(conv_key).tokens == 0  # nothing logged yet
    ids = append(log, conv_key, batch(300))
    seen = plain.overview(conv_key)
    assert seen.tokens == 3000 and seen.encoding == ENC
    plain.truncate_after(conv_key, ids[99], expected_last_id=ids[-1])
    assert plain.overview(conv_key).tokens == 1000  # the run's total follows a truncation
    plain.append(conv_key, batch(1, start=7))  # a plain append: this entry has no stored count
    assert plain.overview(conv_key).tokens is None
    plain.delete(conv_key)
    assert plain.overview(conv_key).tokens == 0
