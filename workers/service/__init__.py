"""The fast path agents call: ``ContextService`` appends messages and serves windows
(``workers.service.context_service``).

Layout: ``ContextService`` in ``context_service``; what an append checks before it writes in
``append_checks``; the tail a window reads in ``tail``. Deleting a conversation reaches every
store of the runtime, which builds this service: it is ``workers.delete``, above both.

The names are loaded on first use, so importing a module of this package does not load the
service and what it imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ctxcore.lazy import lazy_getattr

if TYPE_CHECKING:
    from workers.service.context_service import AppendOutcome, CompactionQueue, ContextService, InlineQueue

__all__ = ["AppendOutcome", "CompactionQueue", "ContextService", "InlineQueue"]


__getattr__ = lazy_getattr(__name__, dict.fromkeys(__all__, "workers.service.context_service"), globals())
