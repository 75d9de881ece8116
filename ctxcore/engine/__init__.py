"""The embedded engine: ``ContextEngine`` -> ``ModelContext`` with a chain of processors.

A context is composed of parts, one module each, each importing only the ones below it::

    engine         ContextEngine: the pool, the registry, processor construction
    async_context  AsyncModelContext: ModelContext's methods as coroutines
    context        ModelContext: what processors see; has a store and a hook runner
    hooks          HookRunner: add, window (fallback, auto-recall), active compression
    store          ContextStore: the log, the view, ids, locks, reads, direct writes
    snapshot       the snapshot format (JSON-ready dicts, formats 1 and 2)
    config         ContextEngineConfig

Every name importable from ``ctxcore.engine`` before it became a package still is.
"""

from ctxcore.engine.async_context import AsyncModelContext
from ctxcore.engine.config import ContextEngineConfig
from ctxcore.engine.context import ModelContext
from ctxcore.engine.engine import ContextEngine
from ctxcore.engine.hooks import CompressResult
from ctxcore.engine.store import LOCK_WARN_SECONDS

__all__ = [
    "LOCK_WARN_SECONDS",
    "AsyncModelContext",
    "CompressResult",
    "ContextEngine",
    "ContextEngineConfig",
    "ModelContext",
]
