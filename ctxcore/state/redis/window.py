"""One window's reads in one round trip on Redis.

The state, the pinned entries, the tail, the compaction hash (failure record and the
scheduler's mirrored status) and the log's end, with the budget written only when it
changed: all keys in the conversation's slot, so on Redis Cluster the round trip goes to one
node. With a retention the read also returns the log counter's ``PTTL``, and
``refresh_due`` says when the caller should ``refresh`` the conversation's expiry (at most
hourly: windows rarely write for it). With ``index_version`` it returns the recall index
when the state names a newer one than the caller holds.

The tail is read inside the script, newest first until the stored counts fill the budget
(``READ_TAIL_FN_LUA``): one shape for every window. A second shape (the cursor remembered
per conversation, a native ``XREVRANGE`` page pipelined beside a script without the tail
read) saved 4-7% of an agent step at a 51-message tail (bench/fast_path.py ``--caches``,
issue 41) and went: a cache must save more than 20% of the step.
"""

from __future__ import annotations

import base64
from typing import Any

import redis

from ctxcore.state.base import check_pinned, format_log_id
from ctxcore.state.budget import BudgetTokens
from ctxcore.state.decoded import DecodedEntries
from ctxcore.state.keys import ConversationKey
from ctxcore.state.models import CompressionState
from ctxcore.state.redis.common import as_bytes, text, translated
from ctxcore.state.redis.retention import RedisRetention
from ctxcore.state.redis.tail import decode_rows
from ctxcore.state.redis.window_scripts import WINDOW_KEY_SUFFIXES, WINDOW_LUA
from ctxcore.state.tail import TAIL_PAGE, TailRead
from ctxcore.state.window_read import WindowRead

__all__ = ["RedisWindowReader"]


class RedisWindowReader:
    """Reads windows for the stores of one prefix (``RedisStateStore``/``RedisMessageLog``)."""

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
        self._script = client.register_script(WINDOW_LUA)
        self.retention = retention or RedisRetention(client, prefix)

    def refresh(self, key: ConversationKey) -> None:
        """Give the conversation its full retention again (when ``refresh_due``)."""
        self.retention.refresh(key)

    def _keys(self, key: ConversationKey) -> list[str]:
        return [f"{self.prefix}:{key.hash_tag}:{s}" for s in WINDOW_KEY_SUFFIXES]

    def read(
        self,
        key: ConversationKey,
        budget_tokens: BudgetTokens,
        encoding: str,
        index_version: int | None = None,
    ) -> WindowRead:
        """The window's reads; the budget recorded when it differs from the stored one.
        ``index_version``: the recall index version the caller holds (None: recall off)."""
        ttl = self.retention.ttl_ms(key)
        args: list[str | int] = [
            budget_tokens,
            TAIL_PAGE,
            encoding,
            ttl,
            "" if index_version is None else index_version,
        ]
        with translated(f"window read of {key}"):
            state, pinned, tail, compaction, last, left, _, index = self._script(
                keys=self._keys(key), args=args
            )
        first, omitted_last, omitted, entries, anchors = tail
        messages, counts = decode_rows(entries, self.decoded)
        last_seq = int(last)
        pinned_messages, _ = decode_rows(pinned, self.decoded)
        extra, _ = decode_rows(anchors, self.decoded)
        fields: list[Any] = list(compaction)
        decoded = CompressionState.model_validate_json(as_bytes(state)) if state is not None else None
        check_pinned(key, decoded, pinned_messages)
        return WindowRead(
            state=decoded,
            pinned=pinned_messages,
            tail=TailRead(
                messages=messages,
                counts=counts,
                omitted=(format_log_id(int(first)), format_log_id(int(omitted_last))) if int(first) else None,
                omitted_tokens=int(omitted),
                anchors=extra,
            ),
            compaction={text(fields[i]): text(fields[i + 1]) for i in range(0, len(fields), 2)},
            compaction_key=self._keys(key)[7],
            last_id=format_log_id(last_seq) if last_seq > 0 else None,
            refresh_due=bool(ttl)
            and (state is not None or last_seq > 0)
            and self.retention.refresh_due(key, int(left)),
            # Stored base64 (a client with decode_responses=True must be able to read it back).
            index=base64.b64decode(as_bytes(index)) if index is not None else None,
        )
