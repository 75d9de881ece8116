"""Processor configs: every documented invalid value and any unknown key raise ConfigError."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from ctxcore.engine import ContextEngine
from ctxcore.errors import ConfigError
from ctxcore.processors import (
    MicroCompactConfig,
    MicroCompactProcessor,
    WindowLimitConfig,
    builtin_registry,
    default_rule_chain,
)
from ctxcore.processors.rule_processor import RuleProcessor
from ctxcore.processors.rules import RuleEnv
from ctxcore.state import ConversationKey
from ctxcore.tokens import EstimateCounter

INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("MessageOffloader", {"messages_threshold": 0}, "messages_threshold"),
    ("MessageOffloader", {"tokens_threshold": 0}, "tokens_threshold"),
    ("MessageOffloader", {"large_message_threshold": -5}, "large_message_threshold"),
    ("MessageOffloader", {"offload_message_type": ["system"]}, "offload_message_type"),
    ("MessageOffloader", {"trim_size": 0}, "trim_size"),
    ("MessageOffloader", {"trim_size": 100, "large_message_threshold": 100}, "trim_size"),
    ("MessageOffloader", {"messages_to_keep": 0}, "messages_to_keep"),
    ("MessageOffloader", {"messages_to_keep": 5, "messages_threshold": 5}, "messages_to_keep"),
    ("MessageSummaryOffloader", {"add_message_threshold_ratio": 0}, "add_message_threshold_ratio"),
    ("MessageSummaryOffloader", {"ttl_seconds": -1}, "ttl_seconds"),
    ("MessageSummaryOffloader", {"ttl_context_occupancy_ratio": 0}, "ttl_context_occupancy_ratio"),
    ("MessageSummaryOffloader", {"ttl_message_threshold_ratio": -0.1}, "ttl_message_threshold_ratio"),
    ("ToolResultBudgetProcessor", {"tokens_threshold": 0}, "tokens_threshold"),
    ("ToolResultBudgetProcessor", {"large_message_threshold": 0}, "large_message_threshold"),
    ("ToolResultBudgetProcessor", {"trim_size": 0}, "trim_size"),
    ("ToolResultBudgetProcessor", {"trim_size": 20000}, "trim_size"),
    ("ToolResultWindowProcessor", {"keep_last_k": 0}, "keep_last_k"),
    ("ToolResultWindowProcessor", {"trim_size": -1}, "trim_size"),
    ("ToolResultWindowProcessor", {"min_offload_chars": -1}, "min_offload_chars"),
    ("ToolResultWindowProcessor", {"small_result_trim_size": 0}, "small_result_trim_size"),
    ("MicroCompactProcessor", {"trigger_threshold": 0}, "trigger_threshold"),
    ("MicroCompactProcessor", {"keep_recent_per_tool": -1}, "keep_recent_per_tool"),
    ("MicroCompactProcessor", {"compactable_tool_names": "grep"}, "compactable_tool_names"),
    ("WindowLimit", {"max_attached_turns": 0}, "max_attached_turns"),
    ("WindowLimit", {"max_attached_messages": -3}, "max_attached_messages"),
    ("CompactCompletedToolTurns", {"keep_recent_turns": -1}, "keep_recent_turns"),
]


@pytest.mark.parametrize(("name", "config", "field"), INVALID)
def test_invalid_values_are_rejected_naming_processor_and_field(
    name: str, config: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError) as info:
        ContextEngine().create_context("c", processors=[(name, config)])
    message = str(info.value)
    assert message.startswith(f"{name}: invalid config")
    assert field in message


BUILT_INS = sorted(
    {
        "MessageOffloader",
        "MessageSummaryOffloader",
        "ToolResultBudgetProcessor",
        "ToolResultWindowProcessor",
        "MicroCompactProcessor",
        "WindowLimit",
        "CompactCompletedToolTurns",
    }
)


@pytest.mark.parametrize("name", BUILT_INS)
def test_unknown_keys_are_rejected_not_ignored(name: str) -> None:
    with pytest.raises(
        ConfigError, match=rf"{name}: invalid config: field 'tokens_threshhold': unknown field"
    ):
        builtin_registry().create(name, {"tokens_threshhold": 5})


@pytest.mark.parametrize("name", BUILT_INS)
def test_every_built_in_is_registered_and_accepts_its_defaults(name: str) -> None:
    processor = builtin_registry().create(name, None)
    assert processor.processor_type() == name
    assert processor.kind in ("offloader", "compressor", "view")
    assert processor.save_state() == {}


def test_a_config_model_instance_is_accepted_and_another_models_instance_is_not() -> None:
    processor = MicroCompactProcessor(MicroCompactConfig(keep_recent_per_tool=1))
    assert processor.config.keep_recent_per_tool == 1
    with pytest.raises(ConfigError, match="expected a MicroCompactConfig"):
        MicroCompactProcessor(WindowLimitConfig())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="must be a MicroCompactConfig or a dict"):
        MicroCompactProcessor(["keep_recent_per_tool", 1])  # type: ignore[arg-type]


def test_configs_are_immutable() -> None:
    config = MicroCompactConfig()
    with pytest.raises(ValidationError):
        config.keep_recent_per_tool = 3  # type: ignore[misc]


def test_processors_must_be_name_config_pairs() -> None:
    with pytest.raises(ConfigError, match="expected \\(name, config\\) pairs"):
        ContextEngine().create_context("c", processors=["MicroCompactProcessor"])  # type: ignore[list-item]


@pytest.mark.parametrize("window", [1000, 16_000, 128_000, 200_000, 1_000_000])
def test_the_default_chain_is_valid_for_any_window(window: int) -> None:
    ctx = ContextEngine({"context_window_tokens": window}).create_context(
        "c", processors=default_rule_chain(window)
    )
    assert [name for name, _ in ctx.processors] == [
        "ToolResultCap",
        "ToolResultCap",
        "CompactCompletedToolTurns",
        "WindowLimit",
        "ToolResultBudgetProcessor",
        "MicroCompactProcessor",
        "ToolResultCap",
    ]
    assert all(p.config.act_only_over_budget for _, p in ctx.processors)
    caps = [p.config.scope for name, p in ctx.processors if name == "ToolResultCap"]
    assert caps == ["newest_step", "older_steps", "all"]


@pytest.mark.parametrize("ratio", [0.0, -0.1, 1.5])
def test_the_cap_ratio_is_validated(ratio: float) -> None:
    with pytest.raises(ConfigError, match="max_result_ratio"):
        default_rule_chain(16_000, max_result_ratio=ratio)
    with pytest.raises(ConfigError, match="max_result_ratio"):
        ContextEngine().create_context("c", processors=[("ToolResultCap", {"max_result_ratio": ratio})])


def test_a_rule_processor_without_a_rule_says_what_to_set() -> None:
    class NoRule(RuleProcessor[MicroCompactConfig]):
        config_model = MicroCompactConfig

    env = RuleEnv(counter=EstimateCounter(), key=ConversationKey("t", "c"))
    for use in (lambda p: p.triggers([], env), lambda p: p.rule([], env)):
        with pytest.raises(ConfigError, match=r"functions = RuleFunctions\(triggers, apply\)"):
            use(NoRule())
