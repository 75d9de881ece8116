"""Conversation keys, compaction state and the stores that keep it."""

from ctxcore.state.base import HISTORY_LIMIT, MessageLog, OffloadStore, StateStore
from ctxcore.state.keys import ConversationKey, validate_id
from ctxcore.state.models import CompressionState, SummaryBlock

__all__ = [
    "HISTORY_LIMIT",
    "CompressionState",
    "ConversationKey",
    "MessageLog",
    "OffloadStore",
    "StateStore",
    "SummaryBlock",
    "validate_id",
]
