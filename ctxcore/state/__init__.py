"""Conversation keys, compaction state and the stores that keep it.

The Redis and SQL backends are imported on first use, so importing this package (or using
the memory backends) does not pay for loading redis-py and SQLAlchemy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ctxcore.lazy import lazy_getattr
from ctxcore.state.base import HISTORY_LIMIT, MessageLog, OffloadStore, StateStore
from ctxcore.state.filesystem import FilesystemOffloadStore
from ctxcore.state.keys import ConversationKey, validate_id
from ctxcore.state.memory import MemoryMessageLog, MemoryOffloadStore, MemoryStateStore
from ctxcore.state.models import CompressionState, SummaryBlock

if TYPE_CHECKING:
    from ctxcore.state.redis import RedisMessageLog, RedisOffloadStore, RedisStateStore
    from ctxcore.state.sql import SqlOffloadStore, SqlStateStore
    from ctxcore.state.sql.log import SqlMessageLog

__all__ = [
    "HISTORY_LIMIT",
    "CompressionState",
    "ConversationKey",
    "FilesystemOffloadStore",
    "MemoryMessageLog",
    "MemoryOffloadStore",
    "MemoryStateStore",
    "MessageLog",
    "OffloadStore",
    "RedisMessageLog",
    "RedisOffloadStore",
    "RedisStateStore",
    "SqlMessageLog",
    "SqlOffloadStore",
    "SqlStateStore",
    "StateStore",
    "SummaryBlock",
    "validate_id",
]

_LAZY = {
    "RedisMessageLog": "ctxcore.state.redis",
    "RedisOffloadStore": "ctxcore.state.redis",
    "RedisStateStore": "ctxcore.state.redis",
    "SqlMessageLog": "ctxcore.state.sql.log",
    "SqlOffloadStore": "ctxcore.state.sql",
    "SqlStateStore": "ctxcore.state.sql",
}


__getattr__ = lazy_getattr(__name__, _LAZY, globals())
