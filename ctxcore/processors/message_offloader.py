"""``MessageOffloader`` (spec 4.8): trim large messages of chosen roles, original offloaded.

Sizes are compared in **characters** (the reference documents them as tokens but compares
characters; ctxcore keeps the behaviour and says so). Anchors and internal user messages
(memory blocks, reminders) are never offloaded. Deviation from the reference's
keep-last-round quirk (spec 9.6): "the last round" starts after the last assistant message
*without* tool calls, as intended, not after the last assistant message of any kind.
"""

from __future__ import annotations

from functools import partial
from typing import Literal

from pydantic import PositiveInt, model_validator

from ctxcore.errors import ConfigError
from ctxcore.messages import AnyMessage, AssistantMessage, UserMessage, message_text
from ctxcore.processors.base import ProcessorConfig
from ctxcore.processors.offload import has_offload_marker
from ctxcore.processors.rule_processor import RuleFunctions, RuleProcessor
from ctxcore.processors.rules import (
    ProtectedTools,
    Rewrite,
    RuleEnv,
    RuleResult,
    anchor_indices,
    tool_calls_of_results,
)

__all__ = ["MessageOffloader", "MessageOffloaderConfig", "apply", "triggers"]


class MessageOffloaderConfig(ProcessorConfig):
    """Thresholds of ``MessageOffloader``.

    Attributes:
        messages_threshold: act when the context holds more messages than this.
        tokens_threshold: act when the context holds more tokens than this.
        large_message_threshold: a message is large above this many **characters**.
        offload_message_type: roles that may be offloaded.
        protected_tool_names: ``name`` or ``name:pattern`` of tool results never offloaded.
        trim_size: **characters** of the original kept in the view; below the large threshold.
        messages_to_keep: the newest messages never offloaded; below ``messages_threshold``.
        keep_last_round: never offload the round after the last final assistant reply.
    """

    messages_threshold: PositiveInt | None = None
    tokens_threshold: PositiveInt = 20000
    large_message_threshold: PositiveInt = 1000
    offload_message_type: tuple[Literal["user", "assistant", "tool"], ...] = ("tool",)
    protected_tool_names: tuple[str, ...] = ("read_file",)
    trim_size: PositiveInt = 100
    messages_to_keep: PositiveInt | None = None
    keep_last_round: bool = True

    @model_validator(mode="after")
    def _consistent(self) -> MessageOffloaderConfig:
        if self.trim_size >= self.large_message_threshold:
            raise ConfigError(
                f"trim_size ({self.trim_size}) must be smaller than large_message_threshold "
                f"({self.large_message_threshold})"
            )
        if (
            self.messages_to_keep is not None
            and self.messages_threshold is not None
            and self.messages_to_keep >= self.messages_threshold
        ):
            raise ConfigError(
                f"messages_to_keep ({self.messages_to_keep}) must be smaller than messages_threshold "
                f"({self.messages_threshold})"
            )
        return self


def _candidates(messages: list[AnyMessage], config: MessageOffloaderConfig, env: RuleEnv) -> list[int]:
    end = len(messages)
    if config.messages_to_keep is not None:
        end -= config.messages_to_keep
    if config.keep_last_round:
        last_final = next(
            (
                i
                for i in range(len(messages) - 1, -1, -1)
                if isinstance(messages[i], AssistantMessage) and not messages[i].tool_calls  # type: ignore[union-attr]
            ),
            -1,
        )
        end = min(end, last_final)
    pinned = anchor_indices(messages, env.detector)
    calls = tool_calls_of_results(messages)
    protected = ProtectedTools(config.protected_tool_names)
    found = []
    for i in range(max(end, 0)):
        message = messages[i]
        if (
            i in pinned
            or message.role not in config.offload_message_type
            # Internal user messages (memory blocks, reminders) stay whole: trimmed, one
            # would lose its marker prefix and pass for a user request.
            or (isinstance(message, UserMessage) and not env.detector.is_real(message))
            or len(message_text(message)) <= config.large_message_threshold
            or has_offload_marker(message)
            or (message.role == "tool" and protected.protects_result(message, calls.get(i)))
        ):
            continue
        found.append(i)
    return found


def _trimmed(head: str, marker: str) -> str:
    return f"{head}...\n{marker}"


def _over_threshold(messages: list[AnyMessage], config: MessageOffloaderConfig, env: RuleEnv) -> bool:
    if config.messages_to_keep is not None and len(messages) <= config.messages_to_keep:
        return False
    if config.messages_threshold is not None and len(messages) > config.messages_threshold:
        return True
    return env.counter.count_messages(messages) > config.tokens_threshold


def triggers(messages: list[AnyMessage], config: MessageOffloaderConfig, env: RuleEnv) -> bool:
    """True if a threshold is exceeded and some message could be offloaded."""
    return _over_threshold(messages, config, env) and bool(_candidates(messages, config, env))


def apply(
    messages: list[AnyMessage], config: MessageOffloaderConfig, env: RuleEnv, *, force: bool = False
) -> RuleResult:
    """Replace each candidate by its first ``trim_size`` characters + ``...`` + marker."""
    if not force and not _over_threshold(messages, config, env):
        return RuleResult(messages)
    rewrite = Rewrite(messages)
    for i in _candidates(messages, config, env):
        rewrite.offload_replace(i, env, partial(_trimmed, message_text(messages[i])[: config.trim_size]))
    return rewrite.result()


class MessageOffloader(RuleProcessor[MessageOffloaderConfig]):
    """Offloads large messages of the configured roles once the context is over a threshold."""

    config_model = MessageOffloaderConfig
    kind = "offloader"
    functions = RuleFunctions(triggers, apply)
