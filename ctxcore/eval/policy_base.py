"""What every replayed policy shares: its set-up, the window it serves, the counting model."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ctxcore.config import Settings
from ctxcore.messages import AnyMessage, UserMessage
from ctxcore.recall.auto import RecallStats
from ctxcore.state import ConversationKey
from ctxcore.summarize.model import Completion, ModelClient, OutputContract
from ctxcore.tokens import TokenCounter
from ctxcore.turns import UserDetector

__all__ = [
    "CountingModel",
    "Policy",
    "PolicySetup",
    "PolicyWindow",
    "conversation_key",
    "message_cost",
    "priming_tokens",
]

# The embedded compressors keep the reference's own trigger (their configs need it < 1).
EMBEDDED_TRIGGER_RATIO = 0.9


class CountingModel:
    """A ``ModelClient`` wrapper that counts summariser calls and the tokens sent to it."""

    def __init__(self, inner: ModelClient, counter: TokenCounter) -> None:
        self.inner = inner
        self.counter = counter
        self.calls = 0
        self.input_tokens = 0
        self.output_tokens = 0

    @property
    def name(self) -> str:
        """The wrapped client's name."""
        return self.inner.name

    def complete(
        self, messages: Sequence[AnyMessage], *, max_tokens: int, contract: OutputContract | None = None
    ) -> Completion:
        """Count the request (with this counter, whatever the model reports), then forward it."""
        self.calls += 1
        self.input_tokens += self.counter.count_messages(list(messages))
        completion = self.inner.complete(messages, max_tokens=max_tokens, contract=contract)
        self.output_tokens += completion.usage.output_tokens
        return completion


@dataclass
class PolicySetup:
    """What every policy of one conversation shares.

    ``settings`` are the service's: ``full`` takes its trigger, target, keep-recent and rule
    chain from them (``Settings()`` defaults unless told otherwise), never from constants of
    its own. ``lag`` is how many windows after its trigger a compaction lands (a worker that
    lags; 0: before the window that triggered it is served, as a synchronous compaction).
    """

    conversation_id: str
    budget: int
    system: Sequence[AnyMessage]
    tools: Sequence[Mapping[str, Any]]
    counter: TokenCounter
    model: CountingModel
    detector: UserDetector
    settings: Settings = field(default_factory=Settings)
    lag: int = 0

    @property
    def keep_recent_messages(self) -> int:
        """``engine.keep_recent_messages``."""
        return self.settings.engine.keep_recent_messages

    @property
    def trigger_ratio(self) -> float:
        """``service.trigger_ratio``."""
        return self.settings.service.trigger_ratio

    @property
    def target_ratio(self) -> float:
        """``service.target_ratio``."""
        return self.settings.service.target_ratio


@dataclass
class PolicyWindow:
    """A served window (system messages first), the tools sent with it, and how it was made.

    ``tools`` are every tool definition the request would carry, ctxcore's own included,
    so the harness counts the window as the budget check must.
    """

    messages: list[AnyMessage]
    tools: list[Mapping[str, Any]] = field(default_factory=list)
    fallback: bool = False
    stages: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    # What auto-recall added to this window (policies with recall only).
    recall: RecallStats | None = None


class Policy(ABC):
    """Receives appended message groups and serves windows."""

    name: ClassVar[str] = ""
    # A reference row (``lossless``): no budget, outside over-budget counts, wins and goals.
    reference: ClassVar[bool] = False
    # Its windows carry the recall tool: ``tool_recall`` answers it.
    offers_recall: ClassVar[bool] = False

    def __init__(self, setup: PolicySetup) -> None:
        self.setup = setup

    @abstractmethod
    def append(self, messages: Sequence[AnyMessage]) -> None:
        """Append one group (a user message, or an assistant step with its tool results)."""

    @abstractmethod
    def window(self) -> PolicyWindow:
        """The window the model would be sent now (may raise ``BudgetExceeded``)."""

    def tool_recall(self, question: str) -> list[AnyMessage]:
        """What the window's recall tool answers when the agent asks ``question`` (the
        messages a tool call and its result add), or nothing: this policy has no such tool."""
        return []


def conversation_key(conversation_id: str) -> ConversationKey:
    """A store key for a conversation id of a data file (any characters)."""
    safe = re.sub(r"[^A-Za-z0-9_.\-]", "_", conversation_id)[:120].lstrip(".") or "conversation"
    return ConversationKey("eval", safe)


def priming_tokens(counter: TokenCounter) -> int:
    """Tokens a request costs beyond its messages (the reply priming)."""
    probe = UserMessage(content="x")
    one = counter.count_messages([probe])
    return 2 * one - counter.count_messages([probe, probe])


def message_cost(counter: TokenCounter, message: AnyMessage, priming: int) -> int:
    """What adding ``message`` to a request costs."""
    return counter.count_messages([message]) - priming
