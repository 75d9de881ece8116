"""The shared base of ``CurrentRoundCompressor`` and ``DialogueCompressor`` (spec 4.1-4.3).

A subclass picks a span ``(preserved prefix, messages to compress, protected tail)``; the
model writes a ``<state_snapshot>`` of the span (the prompt and a machine-readable contract
with the section titles are sent together); the snapshot replaces the span as one memory
block carrying its log-id provenance, optionally followed by a ``<recovered_context>``.
The span never holds an anchor or an unfinished tool step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from ctxcore.messages import AnyMessage, UserMessage
from ctxcore.pipeline.fitting import fit_to_limits
from ctxcore.pipeline.view import BLOCK_META
from ctxcore.processors.base import ContextProcessor, ProcessorConfig
from ctxcore.processors.events import ContextEvent, IdRange
from ctxcore.processors.llm_support import (
    ModelClientSpec,
    api_key_env_of,
    call_limits,
    client_name,
    resolve_client,
    usage_dict,
)
from ctxcore.processors.reinjection import build_recovered_context
from ctxcore.processors.usage_trigger import window_trigger_tokens
from ctxcore.recall.marking import mark_snapshot
from ctxcore.summarize.dump import CompressionDump, DebugLog, debug_outputs
from ctxcore.summarize.executor import CompressionExecutor
from ctxcore.summarize.model import OutputContract
from ctxcore.summarize.prompts import with_preserve_instruction
from ctxcore.summarize.redact import redact_messages
from ctxcore.tokens import TokenCounter
from ctxcore.turns import steps
from ctxcore.window import ContextWindow

if TYPE_CHECKING:
    from ctxcore.processors.base import ProcessorContext

__all__ = ["SnapshotCompressor", "SnapshotCompressorConfig", "Span"]

_SNAPSHOT = re.compile(r"<state_snapshot>(.*?)</state_snapshot>", re.DOTALL | re.IGNORECASE)


class SnapshotCompressorConfig(ProcessorConfig):
    """Ratios are of the model's context window (``ModelContext.context_max``)."""

    model_config = ProcessorConfig.model_config | {"arbitrary_types_allowed": True}

    trigger_context_ratio: float = Field(default=0.8, gt=0, lt=1)
    min_target_context_ratio: float = Field(default=0.1, ge=0, lt=1)
    model_client: ModelClientSpec = None
    # The summarisation model's context: the span is cut to the steps that fit it with room
    # for the output, then trimmed (None: model_client's context_window_tokens when given
    # as settings, else no limit).
    model_context_window_tokens: int | None = Field(default=None, gt=0)
    summary_max_tokens: int = Field(default=8000, gt=0)
    enable_compression_dump: bool = False
    compression_dump_dir: str | None = None
    workspace_dir: str | None = None
    # Cut secrets from the text sent to the summarisation model (off only for a trusted model).
    redact_secrets: bool = True
    # Trigger on the provider's reported usage plus an estimate of what came after it
    # (spec 2.5 ``usage_aware``); the span's size and the benefit check stay exact counts.
    usage_aware_trigger: bool = False


@dataclass(frozen=True)
class Span:
    """``prefix`` stays, ``target`` is summarised, ``tail`` stays after the summary."""

    prefix: list[AnyMessage]
    target: list[AnyMessage]
    tail: list[AnyMessage]


def complete_prefix(messages: list[AnyMessage]) -> int:
    """Length of the longest prefix made of complete steps (never cut an open tool call)."""
    return (_step_ends(messages) or [0])[-1]


def extract_snapshot(text: str) -> str:
    """The ``<state_snapshot>`` body, or the whole stripped response when there is none."""
    match = _SNAPSHOT.search(text)
    if match and match.group(1).strip():
        return match.group(1).strip()
    return text.strip()


def _step_ends(messages: list[AnyMessage]) -> list[int]:
    """The end of each complete step of the longest complete prefix, in order."""
    ends: list[int] = []
    for step in steps(messages):
        if not step.complete:
            break
        ends.append(step.end)
    return ends


def _fitting_steps(messages: list[AnyMessage], room: int, counter: TokenCounter) -> int:
    """The longest prefix of whole steps within ``room`` tokens (0: not even the first)."""
    return max((e for e in _step_ends(messages) if counter.count_messages(messages[:e]) <= room), default=0)


class SnapshotCompressor(ContextProcessor[SnapshotCompressorConfig]):
    """Base class; subclasses set the tag, meaning, prompt, sections, builders and ``span``."""

    config_model: ClassVar[type[ProcessorConfig]] = SnapshotCompressorConfig
    kind = "compressor"

    def guarantees_budget(self) -> bool:
        """LLM compressors promise windows within the context's window (ctxcore's guarantee)."""
        return True

    tag: ClassVar[str] = ""
    meaning: ClassVar[str] = ""
    prompt: ClassVar[str] = ""
    sections: ClassVar[tuple[str, ...]] = ()
    builders: ClassVar[tuple[str, ...]] = ()

    def span(self, ctx: ProcessorContext, messages: list[AnyMessage]) -> Span:
        """Which messages to summarise (no anchors, whole steps only)."""
        raise NotImplementedError

    def model_name(self) -> str:
        """The configured summarisation model's name."""
        return client_name(self.config.model_client)

    def api_key_env(self) -> str | None:
        """The configured model's API-key variable (None for an in-process client)."""
        return api_key_env_of(self.config.model_client)

    # --- hooks -------------------------------------------------------------------------

    def trigger_get_context_window(self, ctx: ProcessorContext, window: ContextWindow, **kwargs: Any) -> bool:
        """Over ``trigger_context_ratio`` of the window, with a span worth summarising; with
        debug records on, the decision is a ``threshold_check`` record (spec 4.1, 5.4)."""
        total = window_trigger_tokens(ctx, window, usage_aware=self.config.usage_aware_trigger)
        threshold = max(int(ctx.context_max * self.config.trigger_context_ratio), 1)
        reason = "below_threshold" if total < threshold else self.shortfall(ctx, window.context_messages)
        debug = self._outputs(ctx)[1]
        if debug is not None:
            debug.event(
                "threshold_check",
                phase=kwargs.get("phase", ""),
                total_tokens=total,
                context_max=ctx.context_max,
                threshold=threshold,
                hit=reason is None,
                reason=reason or "reached_threshold",
            )
        return reason is None

    def shortfall(self, ctx: ProcessorContext, messages: list[AnyMessage]) -> str | None:
        """Why the span is not worth summarising (``no_compressible_span``,
        ``target_below_min``), else None."""
        span = self.span(ctx, messages)
        if not span.target:
            return "no_compressible_span"
        floor = int(ctx.context_max * self.config.min_target_context_ratio)
        return "target_below_min" if ctx.token_counter.count_messages(span.target) < floor else None

    def _outputs(self, ctx: ProcessorContext) -> tuple[CompressionDump | None, DebugLog | None]:
        # Its own dump settings, else the engine's enable_context_debug directory (as the
        # reference's rail fills them in), else nowhere.
        own = self.config.compression_dump_dir if self.config.enable_compression_dump else None
        return debug_outputs(
            own or ctx.debug_dir, self.processor_type(), ctx.key.tenant_id, ctx.key.conversation_id
        )

    def on_get_context_window(
        self, ctx: ProcessorContext, window: ContextWindow, **kwargs: Any
    ) -> tuple[ContextEvent | None, ContextWindow]:
        """Summarise the span; on success the rewrite replaces the view."""
        new, event = self._compress(ctx, window, kwargs.get("preserve_instruction"), kwargs.get("phase", ""))
        if event is None:
            return None, window
        ctx.set_messages(new)
        return event, ContextWindow(
            system_messages=window.system_messages, context_messages=new, tools=window.tools
        )

    # --- work --------------------------------------------------------------------------

    def _compress(
        self, ctx: ProcessorContext, window: ContextWindow, preserve_instruction: str | None, phase: str
    ) -> tuple[list[AnyMessage], ContextEvent | None]:
        original = list(window.context_messages)
        span = self.span(ctx, original)
        if not span.target:
            return original, None
        counter = ctx.token_counter
        dump, debug = self._outputs(ctx)
        if debug is not None:
            first_kept = len(original) - len(span.tail)
            debug.event(
                "span_built",
                phase=phase,
                preserved_prefix=len(span.prefix),
                messages_to_compress=len(span.target),
                protected_tail=[
                    {
                        "idx": first_kept + i,
                        "role": m.role,
                        "tokens": counter.count_messages([m]),
                        "preview": m.text[:200],
                    }
                    for i, m in enumerate(span.tail)
                ],
            )
        source_tokens = counter.count_messages(span.target)
        target_tokens = max(min(source_tokens // 3, self.config.summary_max_tokens), 64)
        prompt = with_preserve_instruction(self.prompt, preserve_instruction)
        query = next((m.text for m in reversed(original) if ctx.detector.is_real(m)), "")
        contract = OutputContract(
            kind="state_snapshot",
            sections=list(self.sections),
            source=span.target,
            target_tokens=target_tokens,
            context=span.prefix,
            instruction=preserve_instruction or "",
            query=query,
        )
        executor = CompressionExecutor(
            resolve_client(self.config.model_client, counter, ctx.api_key), counter, dump=dump, debug=debug
        )
        state = {"target": list(span.target), "tail": list(span.tail)}
        limits = call_limits(self.config.model_client, self.config.model_context_window_tokens)
        max_tokens = target_tokens + 512

        def request() -> list[AnyMessage]:
            sent = [*window.system_messages, *span.prefix, *state["target"], UserMessage(content=prompt)]
            sent = redact_messages(sent) if self.config.redact_secrets else sent
            # The earlier context and the span may be trimmed; the system prompt and the
            # instruction stay whole.
            trimmable = list(range(len(window.system_messages), len(sent) - 1))
            return fit_to_limits(
                sent,
                trimmable,
                max_tokens=max_tokens,
                limits=limits,
                counter=counter,
                where=self.processor_type(),
            )

        def room(budget: int) -> int:
            return budget - counter.count_messages(
                [*window.system_messages, *span.prefix, UserMessage(content=prompt)]
            )

        def keep_steps(keep: int) -> None:
            # The steps after ``keep`` move to the front of the protected tail (spec 5.2).
            target = state["target"]
            state["tail"] = target[keep:] + state["tail"]
            state["target"] = target[:keep]

        def shrink(ratio: float) -> tuple[list[AnyMessage], OutputContract] | None:
            # Keep the longest leading run of the span that fits the smaller budget.
            target = state["target"]
            space = room(max(int(ctx.context_max * ratio), 1))
            if space <= 0 or len(target) <= 1:
                return None
            keep = _fitting_steps(target, space, counter)
            if keep == 0 or keep == len(target):
                keep = complete_prefix(target[: len(target) - 1])
            if keep == 0:
                return None
            keep_steps(keep)
            return request(), contract.model_copy(update={"source": state["target"]})

        if limits.context_window_tokens is not None:
            # Split before sending: the steps that fit the summariser's context are summarised
            # now, the rest stays raw for the next compaction (at least one step is kept:
            # request() trims it when it is alone too large).
            space = room(limits.context_window_tokens - limits.reserved(max_tokens))
            keep = max(
                _fitting_steps(state["target"], space, counter), next(iter(_step_ends(state["target"])), 0)
            )
            if 0 < keep < len(state["target"]):
                keep_steps(keep)
                contract = contract.model_copy(update={"source": state["target"]})

        completion = executor.execute(request(), max_tokens=max_tokens, contract=contract, shrink=shrink)
        summary = extract_snapshot(completion.text)
        if not summary:
            return original, None
        target, tail = state["target"], state["tail"]
        first = target[0].context_message_id or ""
        last = target[-1].context_message_id or ""
        memory = UserMessage(
            content=(
                f"{self.tag}\n<meaning>{self.meaning}</meaning>\n<conflict_policy>Newer raw messages, fresh tool "
                "results and the latest explicit user intent win over this block.</conflict_policy>\n"
                f"<summary>\n{summary}\n</summary>\n{self.tag.replace('<', '</', 1)}"
            ),
            metadata={
                BLOCK_META: {
                    "block_id": f"{self.processor_type()}-{first}-{last}",
                    "first_id": first,
                    "last_id": last,
                    "level": 1,
                    "scope": self.processor_type(),
                    "tokens_before": counter.count_messages(target),
                    "model": completion.usage.model,
                }
            },
        )
        new = [*span.prefix, memory]
        recovered = build_recovered_context(
            target, [*span.prefix, *tail], self.builders, workspace=self.config.workspace_dir
        )
        if recovered is not None:
            new.append(recovered)
        new.extend(tail)
        if counter.count_messages(new) >= counter.count_messages(original):
            return original, None  # no benefit: keep the context as it was
        if ctx.archive is not None:
            # Archived after the benefit check, before the messages change (spec 4.1 step 5);
            # the marker goes after </summary> once the range is archived (spec 6).
            ctx.archive_folded(target)
            if ctx.archive.covers(first, last):
                marked = memory.model_copy(
                    update={"content": mark_snapshot(str(memory.content), first, last)}
                )
                new = [marked if m is memory else m for m in new]
                memory = marked
        executor.write_dump(
            self.processor_type(),
            extracted_summary=summary,
            context_after=new,
            tokens_before=counter.count_messages(original),
            tokens_after=counter.count_messages(new),
            span={"messages_to_compress": len(target), "protected_tail": len(tail)},
        )
        event = ContextEvent(
            event_type=self.processor_type(),
            messages_to_modify=list(range(len(original))),
            compact_summary=str(memory.content),
            compression_usage=usage_dict(executor.usage),
            removed_ranges=[IdRange(first, last)],
        )
        return new, event
