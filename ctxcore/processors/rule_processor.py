"""``RuleProcessor``: the hook wrappers around a pure rule function.

Offloaders and compressors act when messages are added: the rule sees the stored view
plus the new batch, the rewritten stored part is saved with ``ctx.set_messages`` and the
rewritten batch is returned for appending. Views act on each window and never persist:
what they leave out stays in the view and in the log.

A rule with ``act_only_over_budget`` (the default chain's) is a view whatever its ``kind``:
it needs the room of a window, which only ``get_context_window`` knows (the context's window
size minus system messages and tools, ctxcore's own included), so it runs there only and
never persists; at add time and in active compression it does nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, NoReturn, Protocol, TypeVar

from ctxcore.errors import ConfigError
from ctxcore.messages import AnyMessage
from ctxcore.processors.base import C, ContextProcessor, HeadroomConfig
from ctxcore.processors.events import ContextEvent
from ctxcore.processors.rules import RuleEnv, RuleResult
from ctxcore.window import ContextWindow

if TYPE_CHECKING:
    from ctxcore.processors.base import ProcessorContext

__all__ = ["RuleFunctions", "RuleProcessor"]

R = TypeVar("R", contravariant=True)


class _Apply(Protocol[R]):
    def __call__(
        self, messages: list[AnyMessage], config: R, env: RuleEnv, *, force: bool = False
    ) -> RuleResult: ...


@dataclass(frozen=True)
class RuleFunctions(Generic[C]):
    """A rule's two pure functions of (messages, config, env): the cheap passive check and
    the rewrite (``force``: active compression, thresholds bypassed)."""

    triggers: Callable[[list[AnyMessage], C, RuleEnv], bool]
    apply: _Apply[C]


def _no_rule(messages: list[AnyMessage], config: Any, env: RuleEnv, *, force: bool = False) -> NoReturn:
    raise ConfigError(
        f"the rule processor configured by {type(config).__name__} has no rule: set "
        "functions = RuleFunctions(triggers, apply) on its class, or override triggers and rule"
    )


def _ids(messages: list[AnyMessage]) -> frozenset[str]:
    return frozenset(m.context_message_id for m in messages if m.context_message_id)


class RuleProcessor(ContextProcessor[C]):
    """A processor whose work is one pure rule (``rule``) guarded by a cheap ``triggers``:
    by default its ``functions``, called with the processor's config."""

    # A subclass that sets neither ``functions`` nor ``triggers``/``rule`` fails at its first
    # use naming what to set, not with an AttributeError.
    functions: ClassVar[RuleFunctions[Any]] = RuleFunctions(_no_rule, _no_rule)

    @property
    def headroom_aware(self) -> bool:
        """True for a rule configured with ``act_only_over_budget``."""
        return isinstance(self.config, HeadroomConfig) and self.config.act_only_over_budget

    @property
    def acts_on_windows(self) -> bool:
        """Views and headroom-aware rules act on each window, never on the stored view."""
        return self.kind == "view" or self.headroom_aware

    def idle_for(self, tokens: int, tail_budget_tokens: int | None) -> bool:
        """True when the rule cannot act on messages of ``tokens`` tokens in all: a
        headroom-aware rule while they fit the room they have (``tail_budget_tokens``; None:
        no room is known, and it never acts). A chain of idle rules is not run at all."""
        return self.headroom_aware and (tail_budget_tokens is None or tokens <= tail_budget_tokens)

    def guarantees_budget(self) -> bool:
        """The default chain (its headroom-aware rules) promises windows within budget."""
        return self.headroom_aware

    def triggers(self, messages: list[AnyMessage], env: RuleEnv) -> bool:
        """Whether the rule would act on ``messages`` in passive mode (cheap)."""
        return self.functions.triggers(messages, self.config, env)

    def rule(self, messages: list[AnyMessage], env: RuleEnv, *, force: bool = False) -> RuleResult:
        """Apply the rule (``force``: active compression, thresholds bypassed)."""
        return self.functions.apply(messages, self.config, env, force=force)

    def _event(self, result: RuleResult) -> ContextEvent | None:
        return result.event(self.processor_type()) if result.changed else None

    # --- add (offloaders and compressors) ------------------------------------------------

    def trigger_add_messages(self, ctx: ProcessorContext, messages: list[AnyMessage], **kwargs: Any) -> bool:
        """Passive trigger over the stored view plus the batch."""
        if self.acts_on_windows:
            return False
        return self.triggers([*ctx.get_messages(), *messages], ctx.rule_env(new_ids=_ids(messages)))

    def on_add_messages(
        self, ctx: ProcessorContext, messages: list[AnyMessage], **kwargs: Any
    ) -> tuple[ContextEvent | None, list[AnyMessage]]:
        """Run the rule over view + batch; persist the stored part, return the batch part."""
        if self.acts_on_windows:
            return None, messages
        view = ctx.get_messages()
        batch_ids = _ids(messages)
        result = self.rule(
            [*view, *messages], ctx.rule_env(new_ids=batch_ids), force=bool(kwargs.get("force"))
        )
        if not result.changed:
            return None, messages
        if any(i < len(view) for i in (*result.modified, *result.removed)):
            ctx.set_messages([m for m in result.messages if m.context_message_id not in batch_ids])
        return self._event(result), [m for m in result.messages if m.context_message_id in batch_ids]

    # --- window (views) ----------------------------------------------------------------

    def trigger_get_context_window(self, ctx: ProcessorContext, window: ContextWindow, **kwargs: Any) -> bool:
        """Views trigger when their rule would act on the window's messages."""
        return self.acts_on_windows and self.triggers(window.context_messages, ctx.window_rule_env(window))

    def on_get_context_window(
        self, ctx: ProcessorContext, window: ContextWindow, **kwargs: Any
    ) -> tuple[ContextEvent | None, ContextWindow]:
        """Views rewrite the served window only (nothing is persisted)."""
        if not self.acts_on_windows:
            return None, window
        result = self.rule(window.context_messages, ctx.window_rule_env(window))
        if not result.changed:
            return None, window
        served = ContextWindow(
            system_messages=window.system_messages,
            context_messages=result.messages,
            tools=window.tools,
            statistic=window.statistic,
        )
        return self._event(result), served

    # --- active compression ------------------------------------------------------------

    def on_compress(
        self, ctx: ProcessorContext, messages: list[AnyMessage], **kwargs: Any
    ) -> tuple[ContextEvent | None, list[AnyMessage]]:
        """Run the rule over the whole view with thresholds bypassed (headroom-aware rules:
        nothing, they never persist)."""
        if self.headroom_aware:
            return None, messages
        result = self.rule(messages, ctx.rule_env(), force=True)
        return self._event(result), result.messages
