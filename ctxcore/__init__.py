"""ctxcore: a context engine for LLM agents.

Keeps every conversation inside the model's window without losing what matters:
rule-based views, semantic compression, incremental durable state, distributed compaction.

Every public name is loaded on first use (module ``__getattr__``): ``import ctxcore`` loads
neither the engine nor ``openai``, ``redis`` or ``sqlalchemy``. ``__all__`` is the pinned
public API (``tests/unit/test_public_api.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ctxcore.lazy import lazy_getattr

if TYPE_CHECKING:
    from ctxcore.assemble import assemble_window
    from ctxcore.client import AsyncCtxcoreClient, CtxcoreClient
    from ctxcore.client.errors import ApiError
    from ctxcore.coordinator import Coordinator
    from ctxcore.engine import AsyncModelContext, ContextEngine, ContextEngineConfig, ModelContext
    from ctxcore.errors import (
        AuthenticationError,
        BudgetExceeded,
        ConfigError,
        ConflictError,
        CtxcoreError,
        CursorNotFoundError,
        ErrorKind,
        InvalidKeyError,
        InvalidMessageError,
        InvalidRequestError,
        InvalidWindowError,
        ModelError,
        NotFoundError,
        OperationFailed,
        QuotaExceeded,
        RateLimited,
        RecallDisabled,
        StoreError,
        StoreUnavailable,
        TruncateRefused,
        UnsupportedItemError,
        UsageError,
        VersionNotKept,
    )
    from ctxcore.messages import (
        AssistantMessage,
        SystemMessage,
        ToolCall,
        ToolMessage,
        UserMessage,
        from_openai,
        to_openai,
    )
    from ctxcore.tokens import EstimateCounter, TiktokenCounter, TokenCounter
    from ctxcore.window import (
        ContextStats,
        ContextWindow,
        Violation,
        check_window,
        close_interrupted_tool_calls,
    )

__version__ = "0.1.0"

_ERRORS = (
    "AuthenticationError",
    "BudgetExceeded",
    "ConfigError",
    "ConflictError",
    "CtxcoreError",
    "CursorNotFoundError",
    "ErrorKind",
    "InvalidKeyError",
    "InvalidMessageError",
    "InvalidRequestError",
    "InvalidWindowError",
    "ModelError",
    "NotFoundError",
    "OperationFailed",
    "QuotaExceeded",
    "RateLimited",
    "RecallDisabled",
    "StoreError",
    "StoreUnavailable",
    "TruncateRefused",
    "UnsupportedItemError",
    "UsageError",
    "VersionNotKept",
)

# Public name -> the module defining it.
_LAZY: dict[str, str] = {
    "ApiError": "ctxcore.client.errors",
    "AsyncCtxcoreClient": "ctxcore.client",
    "CtxcoreClient": "ctxcore.client",
    "AsyncModelContext": "ctxcore.engine",
    "ContextEngine": "ctxcore.engine",
    "ContextEngineConfig": "ctxcore.engine",
    "ModelContext": "ctxcore.engine",
    "Coordinator": "ctxcore.coordinator",
    "assemble_window": "ctxcore.assemble",
    **dict.fromkeys(_ERRORS, "ctxcore.errors"),
    **dict.fromkeys(
        (
            "AssistantMessage",
            "SystemMessage",
            "ToolCall",
            "ToolMessage",
            "UserMessage",
            "from_openai",
            "to_openai",
        ),
        "ctxcore.messages",
    ),
    **dict.fromkeys(("EstimateCounter", "TiktokenCounter", "TokenCounter"), "ctxcore.tokens"),
    **dict.fromkeys(
        ("ContextStats", "ContextWindow", "Violation", "check_window", "close_interrupted_tool_calls"),
        "ctxcore.window",
    ),
}

__all__ = [
    "ApiError",
    "AssistantMessage",
    "AsyncCtxcoreClient",
    "AsyncModelContext",
    "AuthenticationError",
    "BudgetExceeded",
    "ConfigError",
    "ConflictError",
    "ContextEngine",
    "ContextEngineConfig",
    "ContextStats",
    "ContextWindow",
    "Coordinator",
    "CtxcoreClient",
    "CtxcoreError",
    "CursorNotFoundError",
    "ErrorKind",
    "EstimateCounter",
    "InvalidKeyError",
    "InvalidMessageError",
    "InvalidRequestError",
    "InvalidWindowError",
    "ModelContext",
    "ModelError",
    "NotFoundError",
    "OperationFailed",
    "QuotaExceeded",
    "RateLimited",
    "RecallDisabled",
    "StoreError",
    "StoreUnavailable",
    "SystemMessage",
    "TiktokenCounter",
    "TokenCounter",
    "ToolCall",
    "ToolMessage",
    "TruncateRefused",
    "UnsupportedItemError",
    "UsageError",
    "UserMessage",
    "VersionNotKept",
    "Violation",
    "assemble_window",
    "check_window",
    "close_interrupted_tool_calls",
    "from_openai",
    "to_openai",
]


__getattr__ = lazy_getattr(__name__, _LAZY, globals())


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
