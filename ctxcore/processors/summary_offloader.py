"""``MessageSummaryOffloader``, the rule-based generation (spec 4.10): no model call.

**Add pass** (every add, and the fast path): a new tool result above
``add_message_threshold_ratio`` of the window is rule-compressed by its kind
(``content_rules``) with the original offloaded; if rules save nothing it is offloaded
plainly behind a head/tail preview. A placeholder longer than the character budget is
cut head/tail, always keeping its trailing offload marker.

**TTL pass** (only in active compression or by calling ``ttl_apply``; never inside a
window build or the fast path): after ``ttl_seconds`` without a window request, and with
the view at least ``ttl_context_occupancy_ratio`` full, every remaining tool result above
``ttl_message_threshold_ratio`` is compressed the same way. The clock is the context's
(``ContextEngine(clock=...)``), so tests control time.

Deviations: no debug JSONL dump and no ``rule_compressed_at`` timestamp (the pass must stay
free of I/O and wall-clock input); a diff placeholder is cut to the budget like any other
(the reference kept every changed line, however long); an overflow-triggered compression
(``compression_trigger="model_context_overflow"``) skips the idle-time condition, since
waiting cannot help a request that already failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import NonNegativeFloat, PositiveFloat

from ctxcore.messages import AnyMessage, ToolCall, ToolMessage, message_text
from ctxcore.processors.base import ProcessorConfig
from ctxcore.processors.content_rules import ContentType, RuleBudget, compress, truncate_middle
from ctxcore.processors.events import ContextEvent
from ctxcore.processors.offload import has_offload_marker
from ctxcore.processors.rule_processor import RuleFunctions, RuleProcessor
from ctxcore.processors.rules import (
    ProtectedTools,
    Rewrite,
    RuleEnv,
    RuleResult,
    query_terms,
    tool_calls_of_results,
)
from ctxcore.turns import UserDetector
from ctxcore.window import resolve_ratio_token_threshold

if TYPE_CHECKING:
    from ctxcore.processors.base import ProcessorContext

__all__ = [
    "Limits",
    "MessageSummaryOffloader",
    "MessageSummaryOffloaderConfig",
    "apply",
    "triggers",
    "ttl_apply",
    "ttl_due",
]

PREVIEW_SIDE_CHARS = 2000
PLAIN_KEEP_CHARS = 4000
TRUNCATED_NOTE = "\n... [Content truncated and offloaded.] ...\n"
ORIGINAL_NOTE = "[Original content offloaded.]"
MIN_BODY_CHARS = 200
MARKER_RESERVE_CHARS = 64


class MessageSummaryOffloaderConfig(ProcessorConfig):
    """Ratios of ``MessageSummaryOffloader`` (relative to the model's window in tokens).

    Attributes:
        add_message_threshold_ratio: a new tool result above this share is compressed.
        ttl_seconds: idle time before the TTL pass may run (0 disables it).
        ttl_context_occupancy_ratio: the TTL pass needs the view at least this full.
        ttl_message_threshold_ratio: the TTL pass compresses results above this share.
        protected_tool_names: ``name`` or ``name:pattern`` of results never touched.
    """

    add_message_threshold_ratio: PositiveFloat = 0.1
    ttl_seconds: NonNegativeFloat = 300
    ttl_context_occupancy_ratio: PositiveFloat = 0.5
    ttl_message_threshold_ratio: PositiveFloat = 0.05
    protected_tool_names: tuple[str, ...] = ("read_file",)


@dataclass(frozen=True)
class Limits:
    """A per-message threshold in tokens and the matching budget in **characters** (4x)."""

    tokens: int
    chars: int

    @classmethod
    def of(cls, context_max: int, ratio: float) -> Limits:
        """Limits for ``ratio`` of a ``context_max``-token window."""
        return cls(resolve_ratio_token_threshold(context_max, ratio), max(int(context_max * 4 * ratio), 1))


def _processable(
    messages: list[AnyMessage], config: MessageSummaryOffloaderConfig, calls: dict[int, ToolCall]
) -> list[int]:
    protected = ProtectedTools(config.protected_tool_names)
    return [
        i
        for i, m in enumerate(messages)
        if isinstance(m, ToolMessage)
        and not has_offload_marker(m)
        and not protected.protects_result(m, calls.get(i))
    ]


def _latest_request(messages: list[AnyMessage], index: int, detector: UserDetector) -> str:
    for i in range(index, -1, -1):
        if detector.is_real(messages[i]):
            return message_text(messages[i])
    return ""


def _shrink(
    rewrite: Rewrite, index: int, env: RuleEnv, limits: Limits, pass_name: str, call: ToolCall | None
) -> bool:
    """Compress (or plainly offload) one tool result; False if it stays as it is."""
    messages = rewrite.messages
    text = message_text(messages[index])
    terms = query_terms(_latest_request(messages, index, env.detector), call.arguments if call else "")
    force_rules = pass_name == "ttl"
    # Leave room for the marker line so the placeholder usually fits on the first try.
    target = max(limits.chars - MARKER_RESERVE_CHARS, MIN_BODY_CHARS)
    compressed = (
        compress(text, RuleBudget(target, terms)) if force_rules or len(text) > limits.chars else None
    )
    if compressed is not None:
        body = compressed.text
        note = f"\n{ORIGINAL_NOTE}" if compressed.content_type is ContentType.GIT_DIFF else ""

        def render(marker: str) -> str:
            suffix = f"{note}\n{marker}"
            if len(body) + len(suffix) <= limits.chars:
                return body + suffix
            # The marker's length is known only now: compress again for the room left,
            # and cut head/tail only if the rules cannot get there.
            room = max(limits.chars - len(suffix), MIN_BODY_CHARS)
            tighter = compress(text, RuleBudget(room, terms))
            return truncate_middle(tighter.text if tighter else body, room) + suffix

        details = {"content_type": str(compressed.content_type), "original_chars": len(text)}
        return rewrite.offload_replace(
            index,
            env,
            render,
            rule_compression_type=str(compressed.content_type),
            rule_compression_pass=pass_name,
            rule_compression_details=details,
        )
    if force_rules and len(text) <= limits.chars:
        return False
    if len(text) <= PLAIN_KEEP_CHARS:
        preview = text
    else:
        preview = text[:PREVIEW_SIDE_CHARS] + TRUNCATED_NOTE + text[-PREVIEW_SIDE_CHARS:]
    return rewrite.offload_replace(index, env, lambda marker: f"{preview}\n{marker}")


def _large_new(messages: list[AnyMessage], env: RuleEnv, limits: Limits, everything: bool) -> list[int]:
    return [
        i
        for i, m in enumerate(messages)
        if isinstance(m, ToolMessage) and (everything or env.is_new(m)) and env.tokens(m) > limits.tokens
    ]


def triggers(messages: list[AnyMessage], config: MessageSummaryOffloaderConfig, env: RuleEnv) -> bool:
    """True if a new tool result is above the add threshold (protection is checked later)."""
    return bool(
        _large_new(messages, env, Limits.of(env.context_max, config.add_message_threshold_ratio), False)
    )


def apply(
    messages: list[AnyMessage], config: MessageSummaryOffloaderConfig, env: RuleEnv, *, force: bool = False
) -> RuleResult:
    """The add pass over new tool results (``force``: over every tool result)."""
    limits = Limits.of(env.context_max, config.add_message_threshold_ratio)
    large = _large_new(messages, env, limits, force)
    if not large:
        return RuleResult(messages)
    calls = tool_calls_of_results(messages)
    processable = set(_processable(messages, config, calls))
    rewrite = Rewrite(messages)
    for i in large:
        if i in processable:
            _shrink(rewrite, i, env, limits, "add", calls.get(i))
    return rewrite.result()


def ttl_due(
    config: MessageSummaryOffloaderConfig,
    *,
    now: float,
    last_access: float | None,
    view_tokens: int,
    context_max: int,
    ignore_idle: bool = False,
) -> bool:
    """Whether the TTL pass should run: enabled, idle long enough, view full enough."""
    if config.ttl_seconds <= 0:
        return False
    idle = last_access is not None and now - last_access >= config.ttl_seconds
    full = view_tokens >= resolve_ratio_token_threshold(context_max, config.ttl_context_occupancy_ratio)
    return (idle or ignore_idle) and full


def ttl_apply(messages: list[AnyMessage], config: MessageSummaryOffloaderConfig, env: RuleEnv) -> RuleResult:
    """The TTL pass over every processable tool result above the TTL threshold."""
    limits = Limits.of(env.context_max, config.ttl_message_threshold_ratio)
    calls = tool_calls_of_results(messages)
    rewrite = Rewrite(messages)
    for i in _processable(messages, config, calls):
        if env.tokens(messages[i]) > limits.tokens:
            _shrink(rewrite, i, env, limits, "ttl", calls.get(i))
    return rewrite.result()


class MessageSummaryOffloader(RuleProcessor[MessageSummaryOffloaderConfig]):
    """Rule-compresses large tool results as they arrive; a TTL pass catches the rest."""

    config_model = MessageSummaryOffloaderConfig
    kind = "offloader"
    functions = RuleFunctions(triggers, apply)

    def on_compress(
        self, ctx: ProcessorContext, messages: list[AnyMessage], **kwargs: Any
    ) -> tuple[ContextEvent | None, list[AnyMessage]]:
        """Active compression runs the TTL pass when it is due."""
        env = ctx.rule_env()
        due = ttl_due(
            self.config,
            now=ctx.clock(),
            last_access=ctx.last_window_access,
            view_tokens=env.counter.count_messages(messages),
            context_max=env.context_max,
            ignore_idle=kwargs.get("compression_trigger") == "model_context_overflow",
        )
        if not due:
            return None, messages
        result = ttl_apply(messages, self.config, env)
        return self._event(result), result.messages
