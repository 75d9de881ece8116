"""Processors: the hook contract, the registry and every built-in rule processor.

Importing this package registers nothing: ``builtin_registry()`` is a new registry of the
built-ins (``BUILT_INS``), and each engine holds its own (``engine.registry``).
"""

from ctxcore.processors.base import ContextProcessor, Kind, ProcessorConfig, ProcessorContext
from ctxcore.processors.chain import (
    ChainResult,
    apply_rules,
    apply_rules_result,
    build_rule_chain,
    default_rule_chain,
)
from ctxcore.processors.compact_tool_turns import CompactCompletedToolTurns, CompactCompletedToolTurnsConfig

# The LLM compressors register themselves too (after the rule processors they build on).
from ctxcore.processors.current_round import CurrentRoundCompressor, CurrentRoundCompressorConfig
from ctxcore.processors.dialogue import DialogueCompressor
from ctxcore.processors.events import (
    CompressionStateEvent,
    ContextEvent,
    IdRange,
    ProcessorFailure,
    Sizes,
)
from ctxcore.processors.message_offloader import MessageOffloader, MessageOffloaderConfig
from ctxcore.processors.micro_compact import MicroCompactConfig, MicroCompactProcessor
from ctxcore.processors.registry import BUILT_INS, ProcessorRegistry, builtin_registry
from ctxcore.processors.round_level import RoundLevelCompressor, RoundLevelCompressorConfig
from ctxcore.processors.rule_processor import RuleProcessor
from ctxcore.processors.rules import RuleEnv, RuleResult
from ctxcore.processors.summary_offloader import MessageSummaryOffloader, MessageSummaryOffloaderConfig
from ctxcore.processors.tool_result_budget import ToolResultBudgetConfig, ToolResultBudgetProcessor
from ctxcore.processors.tool_result_cap import ToolResultCap, ToolResultCapConfig
from ctxcore.processors.tool_result_window import ToolResultWindowConfig, ToolResultWindowProcessor
from ctxcore.processors.window_limit import WindowLimit, WindowLimitConfig

__all__ = [
    "BUILT_INS",
    "ChainResult",
    "CompactCompletedToolTurns",
    "CompactCompletedToolTurnsConfig",
    "CompressionStateEvent",
    "ContextEvent",
    "ContextProcessor",
    "CurrentRoundCompressor",
    "CurrentRoundCompressorConfig",
    "DialogueCompressor",
    "IdRange",
    "Kind",
    "MessageOffloader",
    "MessageOffloaderConfig",
    "MessageSummaryOffloader",
    "MessageSummaryOffloaderConfig",
    "MicroCompactConfig",
    "MicroCompactProcessor",
    "ProcessorConfig",
    "ProcessorContext",
    "ProcessorFailure",
    "ProcessorRegistry",
    "RoundLevelCompressor",
    "RoundLevelCompressorConfig",
    "RuleEnv",
    "RuleProcessor",
    "RuleResult",
    "Sizes",
    "ToolResultBudgetConfig",
    "ToolResultBudgetProcessor",
    "ToolResultCap",
    "ToolResultCapConfig",
    "ToolResultWindowConfig",
    "ToolResultWindowProcessor",
    "WindowLimit",
    "WindowLimitConfig",
    "apply_rules",
    "apply_rules_result",
    "build_rule_chain",
    "builtin_registry",
    "default_rule_chain",
]
