"""``RoundLevelCompressor``: the multi-pass fallback compressor over the shared pipeline.

Spec 4.5's semantics (Python generation): a trigger at ``trigger_total_tokens`` (>=) when
set, else ``trigger_context_ratio`` of the effective budget; then L0->L1, recursive merges,
aggressive keep-recent, aggressive full-context and a deterministic hard truncate, stopping
as soon as the window is within ``target_total_tokens``. The stages are the same pure
functions the distributed workers run (``ctxcore.pipeline``) over ``View.from_messages``.

Deviations: anchors are never folded into a block or truncated (blocks form on either side
of them); compression runs on the window path (and in active compression), where system
messages and tools are known and every message has its log id, not on add; the window path
keeps ``keep_recent_messages`` (the reference uses 0 there); no team-collaboration
re-injection.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar, Self

from pydantic import Field, model_validator

from ctxcore.errors import ConfigError
from ctxcore.markers import ROUND_LEVEL_MEMORY_BLOCK, TRUNCATED
from ctxcore.messages import AnyMessage, message_text
from ctxcore.pipeline import PipelineConfig, View, compress_until_target
from ctxcore.processors.base import ContextProcessor, ProcessorConfig
from ctxcore.processors.events import ContextEvent, IdRange
from ctxcore.processors.llm_support import (
    ExecutorClient,
    ModelClientSpec,
    api_key_env_of,
    call_limits,
    client_name,
    resolve_client,
)
from ctxcore.processors.usage_trigger import window_trigger_tokens
from ctxcore.recall.marking import is_verbatim, mark_archived
from ctxcore.summarize.dump import debug_outputs
from ctxcore.summarize.executor import CompressionExecutor
from ctxcore.window import ContextWindow

if TYPE_CHECKING:
    from ctxcore.processors.base import ProcessorContext
    from ctxcore.state.models import SummaryBlock

__all__ = ["RoundLevelCompressor", "RoundLevelCompressorConfig"]


class RoundLevelCompressorConfig(ProcessorConfig):
    """Thresholds and targets in tokens (counted with the context's token counter)."""

    model_config = ProcessorConfig.model_config | {"arbitrary_types_allowed": True}

    trigger_total_tokens: int | None = Field(default=None, gt=0)
    trigger_context_ratio: float = Field(default=0.9, gt=0, le=1)
    target_total_tokens: int = Field(default=160_000, gt=0)
    keep_recent_messages: int = Field(default=0, ge=0)
    model_client: ModelClientSpec = None
    # The summarisation model's context: each call is split or trimmed to fit it with room
    # for its output (None: model_client's context_window_tokens when given as settings).
    model_context_window_tokens: int | None = Field(default=None, gt=0)
    compression_call_max_tokens: int = Field(default=250_000, gt=0)
    first_pass_target_tokens: int | None = Field(default=None, gt=0)
    second_pass_target_tokens: int | None = Field(default=None, gt=0)
    third_pass_target_tokens: int | None = Field(default=None, gt=0)
    truncate_head_ratio: float = Field(default=0.2, gt=0, lt=1)
    truncated_marker: str = TRUNCATED
    compression_marker: str = ROUND_LEVEL_MEMORY_BLOCK
    # Trigger on the provider's reported usage plus an estimate of what came after it
    # (spec 2.5 ``usage_aware``); targets and statistics stay exact counts.
    usage_aware_trigger: bool = False

    @model_validator(mode="after")
    def _order(self) -> Self:
        first, second, third = self.pipeline().pass_targets()
        if not third <= second <= first < self.target_total_tokens:
            raise ConfigError(
                f"pass targets must satisfy third ({third}) <= second ({second}) <= first ({first}) "
                f"< target_total_tokens ({self.target_total_tokens})"
            )
        if self.trigger_total_tokens is not None and self.target_total_tokens > self.trigger_total_tokens:
            raise ConfigError(
                f"target_total_tokens ({self.target_total_tokens}) must be <= trigger_total_tokens "
                f"({self.trigger_total_tokens})"
            )
        return self

    def pipeline(self) -> PipelineConfig:
        """The equivalent pipeline configuration."""
        limits = call_limits(self.model_client, self.model_context_window_tokens)
        return PipelineConfig(
            context_window_tokens=limits.context_window_tokens,
            max_output_tokens=limits.max_output_tokens,
            target_tokens=self.target_total_tokens,
            ceiling_tokens=self.trigger_total_tokens,
            keep_recent_messages=self.keep_recent_messages,
            first_pass_target_tokens=self.first_pass_target_tokens,
            second_pass_target_tokens=self.second_pass_target_tokens,
            third_pass_target_tokens=self.third_pass_target_tokens,
            truncate_head_ratio=self.truncate_head_ratio,
            compression_call_max_tokens=self.compression_call_max_tokens,
            truncated_marker=self.truncated_marker,
            compression_marker=self.compression_marker,
        )


class RoundLevelCompressor(ContextProcessor[RoundLevelCompressorConfig]):
    """Compress the whole context until it fits ``target_total_tokens`` (see module docstring)."""

    config_model: ClassVar[type[ProcessorConfig]] = RoundLevelCompressorConfig
    kind = "compressor"

    def model_name(self) -> str:
        """The configured summarisation model's name."""
        return client_name(self.config.model_client)

    def api_key_env(self) -> str | None:
        """The configured model's API-key variable (None for an in-process client)."""
        return api_key_env_of(self.config.model_client)

    def guarantees_budget(self) -> bool:
        """LLM compressors promise windows within the context's window (ctxcore's guarantee)."""
        return True

    def _threshold(self, ctx: ProcessorContext) -> int:
        if self.config.trigger_total_tokens is not None:
            return self.config.trigger_total_tokens
        return max(int(ctx.context_max * self.config.trigger_context_ratio), 1)

    # --- hooks -------------------------------------------------------------------------

    def trigger_get_context_window(self, ctx: ProcessorContext, window: ContextWindow, **kwargs: Any) -> bool:
        """Over the trigger as served (usage-aware when ``usage_aware_trigger``)."""
        total = window_trigger_tokens(ctx, window, usage_aware=self.config.usage_aware_trigger)
        return total >= self._threshold(ctx)

    def on_get_context_window(
        self, ctx: ProcessorContext, window: ContextWindow, **kwargs: Any
    ) -> tuple[ContextEvent | None, ContextWindow]:
        """Compress the window until it fits the target; the rewrite persists in the view."""
        event, new = self._compress(
            ctx, window.context_messages, window.system_messages, window.tools, kwargs.get("force", False)
        )
        if event is None:
            return None, window
        ctx.set_messages(new)
        return event, ContextWindow(
            system_messages=window.system_messages, context_messages=new, tools=window.tools
        )

    # --- work --------------------------------------------------------------------------

    def _compress(
        self,
        ctx: ProcessorContext,
        messages: list[AnyMessage],
        system: list[AnyMessage],
        tools: list[Any],
        force: bool,
    ) -> tuple[ContextEvent | None, list[AnyMessage]]:
        counter = ctx.token_counter
        cfg = self.config.pipeline()
        view = View.from_messages(messages, system=system, tools=tools, detector=ctx.detector)
        if not force and view.tokens(counter) <= cfg.target_tokens:
            return None, messages
        _, debug = debug_outputs(
            ctx.debug_dir, self.processor_type(), ctx.key.tenant_id, ctx.key.conversation_id
        )
        executor = CompressionExecutor(
            resolve_client(self.config.model_client, counter, ctx.api_key), counter, debug=debug
        )
        run = compress_until_target(view, cfg, ExecutorClient(executor), counter)
        if not any(r.changed for r in run.results):
            if run.errors:
                raise run.errors[0][1]  # surfaced as the processor's failed event
            return None, messages
        before_ids = {b.block_id for b in view.blocks}
        fresh = [b for b in run.view.blocks if b.block_id not in before_ids]
        if ctx.archive is not None:
            # Each new summary block ends with the archive's note; with every one marked (the
            # most the marking adds) the messages must still be smaller than before, or every
            # later turn would compress them again (the service's save makes the same check).
            marked = {b.block_id: mark_archived(b) for b in fresh if not is_verbatim(b)}
            if _with_blocks(run.view, marked).tokens(counter) >= view.tokens(counter):
                return None, messages
            # Archived after the benefit check, before the messages change (spec 4.1 step 5).
            kept = {m.context_message_id for m in (*run.view.pinned, *run.view.tail)}
            ctx.archive_folded([m for m in (*view.pinned, *view.tail) if m.context_message_id not in kept])
            pinned = frozenset(str(m.context_message_id) for m in run.view.pinned)
            covered = {
                bid: b for bid, b in marked.items() if ctx.archive.covers(b.first_id, b.last_id, pinned)
            }
            run.view = _with_blocks(run.view, covered)
        new = run.view.context_messages()
        summary = "\n\n".join(
            message_text(m)
            for b in run.view.blocks
            for m in b.messages
            if message_text(m).startswith(cfg.compression_marker)
        )
        usage = executor.usage
        event = ContextEvent(
            event_type=self.processor_type(),
            messages_to_modify=list(range(len(messages))),
            compact_summary=summary,
            compression_usage={
                "calls": usage.calls,
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "total_tokens": usage.total_tokens,
                "model_name": usage.model,
                "stages": [r.stage.kind for r in run.results if r.changed],
            },
            removed_ranges=[IdRange(b.first_id, b.last_id) for b in fresh],
        )
        return event, new


def _with_blocks(view: View, replaced: dict[str, SummaryBlock]) -> View:
    """``view`` with the blocks named in ``replaced`` swapped for their new versions."""
    return replace(view, blocks=tuple(replaced.get(b.block_id, b) for b in view.blocks))
