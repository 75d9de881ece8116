"""Writing the stage journal (``ctxcore.state.journal``) from the workers and the API.

Entries are built here, where errors are classified: the message is redacted (API keys,
tokens, passwords: ``ctxcore.summarize.redact``) and bounded before it is stored. A journal
write that the store refuses is logged and does not fail the stage: the state it reports
on is already saved (or untouched), and the task's own outcome stays what it was.
"""

from __future__ import annotations

import logging
import time

from ctxcore.coordinator import CoordinatorResult
from ctxcore.errors import StoreError
from ctxcore.state import ConversationKey
from ctxcore.state.journal import JournalEntry, StageJournal
from ctxcore.summarize.redact import redact

__all__ = ["MAX_ERROR_CHARS", "error_entry", "result_entry", "write_entry"]

log = logging.getLogger(__name__)

MAX_ERROR_CHARS = 1000


def _message(text: str | None) -> str | None:
    if text is None:
        return None
    text = redact(text)
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "..."


def _elapsed_ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


def result_entry(
    stage: str, result: CoordinatorResult, started: float, error_message: str | None = None
) -> JournalEntry:
    """The entry of a stage the coordinator ran (``started``: its ``perf_counter``)."""
    saved = result.outcome == "compressed"
    return JournalEntry(
        stage=stage,
        outcome=result.outcome,
        at=JournalEntry.now(),
        tokens_before=result.tokens_before,
        tokens_after=result.tokens_after if result.outcome != "failed" else None,
        model_calls=result.model_calls,
        input_tokens=result.input_tokens,
        output_tokens=result.output_tokens,
        duration_ms=_elapsed_ms(started),
        error_kind=result.error_kind,
        error_message=_message(error_message or result.error),
        version=result.state.version if saved else None,
        detail=result.detail,
    )


def error_entry(
    stage: str,
    outcome: str,
    started: float | None,
    *,
    kind: str | None = None,
    message: str | None = None,
    detail: str = "",
    version: int | None = None,
) -> JournalEntry:
    """The entry of a stage that ended outside the coordinator's result (an error, a pause,
    a rollback)."""
    return JournalEntry(
        stage=stage,
        outcome=outcome,
        at=JournalEntry.now(),
        duration_ms=_elapsed_ms(started) if started is not None else 0.0,
        error_kind=kind,
        error_message=_message(message),
        version=version,
        detail=detail,
    )


def write_entry(journal: StageJournal, key: ConversationKey, entry: JournalEntry) -> None:
    """Append ``entry``; a store that refuses is logged with its cause, not raised."""
    try:
        journal.append(key, entry)
    except StoreError as exc:
        log.warning("journal entry of %s (%s %s) not written: %s", key, entry.stage, entry.outcome, exc)
