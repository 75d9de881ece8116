"""One window's reads in one round trip on Redis (``WINDOW_LUA``).

The state, the pinned entries, the newest-first tail page(s), the compaction hash (failure
record and the scheduler's mirrored status) and the log's end, with the budget written only
when it changed: all keys in the conversation's slot, so on Redis Cluster the script is one
call to one node. With a retention the script also returns the log counter's ``PTTL``, and
``refresh_due`` says when the caller should ``refresh`` the conversation's expiry (at most
hourly: windows rarely write for it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import redis

from ctxcore.messages import AnyMessage
from ctxcore.state.base import check_budget, format_log_id
from ctxcore.state.decoded import DecodedEntries, DecodedStates
from ctxcore.state.keys import ConversationKey
from ctxcore.state.models import CompressionState
from ctxcore.state.redis_common import as_bytes, text, translated
from ctxcore.state.redis_retention import RedisRetention
from ctxcore.state.redis_scripts import WINDOW_LUA
from ctxcore.state.redis_tail import decode_rows
from ctxcore.state.tail import TAIL_PAGE, TailRead

__all__ = ["RedisWindowReader", "WindowRead"]


@dataclass
class WindowRead:
    """What a window reads from its conversation's slot."""

    state: CompressionState | None
    pinned: list[AnyMessage]
    tail: TailRead
    # The compaction hash's fields (``workers.failures``): last error, backoff, mirrored status.
    compaction: dict[str, str] = field(default_factory=dict)
    last_id: str | None = None
    # True when the conversation's expiry is more than an hour below its full retention.
    refresh_due: bool = False


class RedisWindowReader:
    """Runs ``WINDOW_LUA`` for the stores of one prefix (``RedisStateStore``/``RedisMessageLog``)."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = "ctxcore",
        retention: RedisRetention | None = None,
        decoded: DecodedEntries | None = None,
    ) -> None:
        self.client = client
        self.prefix = prefix
        # Consecutive windows read the same page: its entries are decoded once per process.
        self.decoded = decoded if decoded is not None else DecodedEntries()
        self.states = DecodedStates()
        self._script = client.register_script(WINDOW_LUA)
        self.retention = retention or RedisRetention(client, prefix)

    def refresh(self, key: ConversationKey) -> None:
        """Give the conversation its full retention again (when ``refresh_due``)."""
        self.retention.refresh(key)

    def _keys(self, key: ConversationKey) -> list[str]:
        suffixes = (
            "state:history",
            "state:head",
            "budget",
            "log",
            "log:run",
            "log:real",
            "log:other",
            "compaction",
            "log:seq",
            "log:end",
        )
        return [f"{self.prefix}:{key.hash_tag}:{s}" for s in suffixes]

    def read(self, key: ConversationKey, budget_tokens: int, encoding: str) -> WindowRead:
        """The window's reads; the budget recorded when it differs from the stored one."""
        check_budget(budget_tokens)
        ttl = self.retention.ttl_ms(key)
        with translated(f"window read of {key}"):
            state, pinned, tail, compaction, last, left = self._script(
                keys=self._keys(key), args=[budget_tokens, TAIL_PAGE, encoding, ttl]
            )
        first, omitted_last, omitted, entries, anchors = tail
        messages, counts = decode_rows(entries, self.decoded)
        pinned_messages, _ = decode_rows(pinned, self.decoded)
        extra, _ = decode_rows(anchors, self.decoded)
        fields: list[Any] = list(compaction)
        last_seq = int(last)
        return WindowRead(
            state=self.states.decode(as_bytes(state)) if state is not None else None,
            pinned=pinned_messages,
            tail=TailRead(
                messages=messages,
                counts=counts,
                omitted=(format_log_id(int(first)), format_log_id(int(omitted_last))) if int(first) else None,
                omitted_tokens=int(omitted),
                anchors=extra,
            ),
            compaction={text(fields[i]): text(fields[i + 1]) for i in range(0, len(fields), 2)},
            last_id=format_log_id(last_seq) if last_seq > 0 else None,
            refresh_due=bool(ttl)
            and (state is not None or last_seq > 0)
            and self.retention.refresh_due(key, int(left)),
        )
