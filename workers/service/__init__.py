"""The fast path agents call: ``ContextService`` appends messages and serves windows
(``workers.service.context_service``).

Layout: ``ContextService`` in ``context_service``; what an append checks before it writes in
``append_checks``; the tail a window reads in ``tail``; deleting a conversation in ``delete``.

The names are loaded on first use, so importing a module of this package (``delete`` from
the HTTP routes) does not load the service and what it imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.service.context_service import AppendOutcome, CompactionQueue, ContextService, InlineQueue

__all__ = ["AppendOutcome", "CompactionQueue", "ContextService", "InlineQueue"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("workers.service.context_service"), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value
