"""``RuleProcessor``: the hook wrappers around a pure rule function.

Offloaders and compressors act when messages are added: the rule sees the stored view
plus the new batch, the rewritten stored part is saved with ``ctx.set_messages`` and the
rewritten batch is returned for appending. Views act on each window and never persist:
what they leave out stays in the view and in the log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ctxcore.messages import AnyMessage
from ctxcore.processors.base import C, ContextProcessor
from ctxcore.processors.events import ContextEvent
from ctxcore.processors.rules import RuleEnv, RuleResult
from ctxcore.window import ContextWindow

if TYPE_CHECKING:
    from ctxcore.engine import ModelContext

__all__ = ["RuleProcessor"]


def _ids(messages: list[AnyMessage]) -> frozenset[str]:
    return frozenset(m.context_message_id for m in messages if m.context_message_id)


class RuleProcessor(ContextProcessor[C]):
    """A processor whose work is one pure rule (``rule``) guarded by a cheap ``triggers``."""

    def triggers(self, messages: list[AnyMessage], env: RuleEnv) -> bool:
        """Whether the rule would act on ``messages`` in passive mode (cheap)."""
        raise NotImplementedError

    def rule(self, messages: list[AnyMessage], env: RuleEnv, *, force: bool = False) -> RuleResult:
        """Apply the rule (``force``: active compression, thresholds bypassed)."""
        raise NotImplementedError

    def _event(self, result: RuleResult) -> ContextEvent | None:
        return result.event(self.processor_type()) if result.changed else None

    # --- add (offloaders and compressors) ------------------------------------------------

    def trigger_add_messages(self, ctx: ModelContext, messages: list[AnyMessage], **kwargs: Any) -> bool:
        """Passive trigger over the stored view plus the batch."""
        if self.kind == "view":
            return False
        return self.triggers([*ctx.get_messages(), *messages], ctx.rule_env(new_ids=_ids(messages)))

    def on_add_messages(
        self, ctx: ModelContext, messages: list[AnyMessage], **kwargs: Any
    ) -> tuple[ContextEvent | None, list[AnyMessage]]:
        """Run the rule over view + batch; persist the stored part, return the batch part."""
        if self.kind == "view":
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

    def trigger_get_context_window(self, ctx: ModelContext, window: ContextWindow, **kwargs: Any) -> bool:
        """Views trigger when their rule would act on the window's messages."""
        return self.kind == "view" and self.triggers(window.context_messages, ctx.rule_env())

    def on_get_context_window(
        self, ctx: ModelContext, window: ContextWindow, **kwargs: Any
    ) -> tuple[ContextEvent | None, ContextWindow]:
        """Views rewrite the served window only (nothing is persisted)."""
        if self.kind != "view":
            return None, window
        result = self.rule(window.context_messages, ctx.rule_env())
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
        self, ctx: ModelContext, messages: list[AnyMessage], **kwargs: Any
    ) -> tuple[ContextEvent | None, list[AnyMessage]]:
        """Run the rule over the whole view with thresholds bypassed."""
        result = self.rule(messages, ctx.rule_env(), force=True)
        return self._event(result), result.messages
