"""ctxcore: a context engine for LLM agents.

Keeps every conversation inside the model's window without losing what matters:
rule-based views, semantic compression, incremental durable state, distributed compaction.
"""

from ctxcore.errors import (
    BudgetExceeded,
    ConfigError,
    ConflictError,
    CtxcoreError,
    CursorNotFoundError,
    InvalidKeyError,
    InvalidMessageError,
    InvalidWindowError,
    ModelError,
    StoreError,
    StoreUnavailable,
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
from ctxcore.window import ContextStats, ContextWindow, Violation, check_window, close_interrupted_tool_calls

__version__ = "0.1.0"

__all__ = [
    "AssistantMessage",
    "BudgetExceeded",
    "ConfigError",
    "ConflictError",
    "ContextStats",
    "ContextWindow",
    "CtxcoreError",
    "CursorNotFoundError",
    "EstimateCounter",
    "InvalidKeyError",
    "InvalidMessageError",
    "InvalidWindowError",
    "ModelError",
    "StoreError",
    "StoreUnavailable",
    "SystemMessage",
    "TiktokenCounter",
    "TokenCounter",
    "ToolCall",
    "ToolMessage",
    "UserMessage",
    "Violation",
    "check_window",
    "close_interrupted_tool_calls",
    "from_openai",
    "to_openai",
]
