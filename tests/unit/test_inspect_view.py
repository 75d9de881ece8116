"""``ctxcore inspect``'s overview (``workers.inspect_view``): one screen for 10 blocks and a
full journal, status and reason first, any status the API adds shown as it is."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ctxcore.messages import UserMessage
from ctxcore.state import CompressionState, ConversationKey, SummaryBlock
from ctxcore.state.journal import JOURNAL_LIMIT, JournalEntry
from ctxcore.status import CompactionDetail, Hold, LastError
from workers.inspect_view import InspectView, render_overview

AT = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
KEY = ConversationKey("acme", "support-chat-42")


def _state(blocks: int) -> CompressionState:
    return CompressionState(
        version=7,
        covered_until=f"{blocks * 20:012d}",
        pinned=["000000000001"],
        blocks=[
            SummaryBlock(
                block_id=f"b{i}",
                messages=[UserMessage(content=f"summary {i}")],
                first_id=f"{i * 20 + 1:012d}",
                last_id=f"{i * 20 + 20:012d}",
                level=1 + i % 2,
                tokens_before=4200 + i,
                tokens_after=380,
                model="gpt-4o-mini-2024-07-18-long-name",
                created_at=AT + timedelta(minutes=i),
            )
            for i in range(blocks)
        ],
    )


def _journal(n: int) -> list[JournalEntry]:
    outcomes = ["compressed", "skipped", "conflict", "failed", "rejected", "paused"]
    return [
        JournalEntry(
            stage="l0_to_l1",
            outcome=outcomes[i % len(outcomes)],
            at=AT + timedelta(seconds=n - i),
            tokens_before=9800,
            tokens_after=5200,
            model_calls=1,
            input_tokens=9000,
            output_tokens=400,
            duration_ms=120.5,
            error_kind="rate_limit" if outcomes[i % len(outcomes)] == "failed" else None,
            version=n - i if i % len(outcomes) == 0 else None,
            detail="nothing to summarise " * 10 if i % len(outcomes) == 1 else "",
        )
        for i in range(n)
    ]


def _view(status: str = "paused", blocks: int = 10, journal: int = JOURNAL_LIMIT) -> InspectView:
    hold = Hold("no_progress", AT, "the last job saved nothing while the view stayed over its target " * 3)
    error = LastError("internal", "TypeError: boom " + "x" * 500, "l1_to_l2", AT)
    return InspectView(
        key=KEY,
        status=status,
        detail=CompactionDetail(error, AT - timedelta(hours=1), hold),
        state=_state(blocks),
        kept_versions=list(range(7, 0, -1)),
        journal=_journal(journal),
        last_log_id="000000000240",
        budget=16000,
    )


def test_ten_blocks_and_a_full_journal_fit_one_screen() -> None:
    lines = render_overview(_view())
    assert len(lines) <= 40, "\n".join(lines)
    assert all(len(line) <= 100 for line in lines), max(lines, key=len)
    assert lines[0] == "acme/support-chat-42  compaction: paused (no_progress)"
    assert lines[1].startswith("  why: the last job saved nothing")
    text = "\n".join(lines)
    assert "state version 7 (kept 1..7)" in text and "budget 16,000" in text
    assert "blocks (10):" in text and "000000000181..000000000200" in text and "4,209->380" in text
    assert "journal (newest 8 of 200):" in text and "rate_limit" in text
    assert "last error (2026-12-02 10:00:00, l1_to_l2): internal: TypeError: boom" in text


def test_many_blocks_show_the_newest_and_say_how_many_are_left_out() -> None:
    lines = render_overview(_view(blocks=40))
    assert len(lines) <= 42
    assert any("29 older blocks" in line for line in lines)
    assert any("000000000781..000000000800" in line for line in lines)


def test_a_status_the_api_adds_is_shown_as_it_is_and_an_empty_conversation_reads_plainly() -> None:
    view = _view(status="throttled")
    assert render_overview(view)[0].startswith("acme/support-chat-42  compaction: throttled")
    empty = InspectView(KEY, "idle", CompactionDetail(), None, [], [], None, None)
    text = "\n".join(render_overview(empty))
    assert "compaction: idle" in text and "no compaction state saved yet" in text
    assert "journal: no stage has run yet" in text and "last error" not in text
