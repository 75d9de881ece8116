"""What an append checks before it writes: the batch's own limits (``check_batch``), the
log tail the batch must follow (``validation_tail``), and what a conditional append
answered (``AppendOutcome``). ``ContextService.append`` and ``append_if_match`` use them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ctxcore.config import ServiceSettings
from ctxcore.errors import InvalidMessageError
from ctxcore.markers import RECALLED_CONTEXT
from ctxcore.messages import AnyMessage, SystemMessage, UserMessage, message_text
from ctxcore.protocol import drop_leading_tool_messages
from ctxcore.state import ConversationKey, MessageLog
from ctxcore.state.base import expected_seq, format_log_id, parse_log_id
from ctxcore.state.undecodable import without_undecodable

__all__ = ["AppendOutcome", "check_batch", "validation_tail"]

# Log entries an append is validated after at most: a tail of 50,000 entries (workers
# down) must not be read whole by every append; what a batch must follow is the log's end.
VALIDATION_SPAN = 512


@dataclass(frozen=True)
class AppendOutcome:
    """What ``append_if_match`` did: the batch's log ids, the id the log now ends at (the
    ``ETag``), and whether nothing new was logged (a replay of a call that succeeded)."""

    ids: list[str]
    last_id: str | None
    replay: bool


def check_batch(messages: Sequence[AnyMessage], limits: ServiceSettings) -> None:
    """``InvalidMessageError`` naming the first message the batch's limits reject: too many
    messages, a system message, an over-long one, or ctxcore's own recalled context."""
    if len(messages) > limits.max_messages_per_append:
        raise InvalidMessageError(
            -1, "messages", f"at most {limits.max_messages_per_append} messages per append"
        )
    for i, message in enumerate(messages):
        if isinstance(message, SystemMessage):
            raise InvalidMessageError(
                i, "role", "system messages are not logged; send them with each window request"
            )
        if len(message_text(message)) > limits.max_message_chars:
            raise InvalidMessageError(i, "content", f"longer than {limits.max_message_chars} characters")
        if isinstance(message, UserMessage) and message_text(message).lstrip().startswith(RECALLED_CONTEXT):
            # Auto-recall's message is served, never logged: logging it would archive
            # the archive and pin it as history.
            raise InvalidMessageError(
                i, "content", f"{RECALLED_CONTEXT} messages are ctxcore's own; do not send them back"
            )


def validation_tail(
    log: MessageLog, key: ConversationKey, cursor: str | None, expected_last_id: str | None
) -> list[AnyMessage]:
    """The log the new messages must follow: after the cursor, up to ``expected_last_id``.

    Under ``If-Match`` validation sees the log the conditional append will see (the
    append itself re-checks atomically); a replay is validated as its first call was.
    """
    return without_undecodable(_tail(log, key, cursor, expected_last_id))[0]


def _tail(
    log: MessageLog, key: ConversationKey, cursor: str | None, expected_last_id: str | None
) -> list[AnyMessage]:
    if expected_last_id is None:
        # The log's end is wherever it is: one read, newest first, and no last_id before it
        # (with StateStore.cursor: an agent step 8.8-14.2% shorter at tail 51, bench/README).
        newest = log.read_newest(key, cursor, VALIDATION_SPAN + 1)
        if len(newest) > VALIDATION_SPAN:
            # A long tail (workers behind): new messages follow its end, from a step start.
            return drop_leading_tool_messages(newest[-VALIDATION_SPAN:])
        return newest
    expected = expected_seq(expected_last_id)
    after = parse_log_id(cursor) if cursor is not None else 0
    if expected is None or expected < 1:
        last = log.last_id(key)
        expected = parse_log_id(last) if last is not None else 0
    if after < expected - VALIDATION_SPAN:
        # A long tail (workers behind): new messages follow its end, from a step start.
        first = format_log_id(expected - VALIDATION_SPAN + 1)
        return drop_leading_tool_messages(log.read_range(key, first, format_log_id(expected)))
    if after < expected:
        return log.read_range(key, format_log_id(after + 1), format_log_id(expected))
    if expected < 1:
        return []
    # The state already covers the expected id (compaction ran since): the context a
    # batch needs is the end of the last step before it, which starts after tool results.
    return drop_leading_tool_messages(
        log.read_range(key, format_log_id(max(expected - 63, 1)), format_log_id(expected))
    )
