"""The round-level stages' model call: the task prompt, fitted to the call budget and
redacted, sent with its output contract; the reply parsed into one text per block."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ctxcore.messages import AnyMessage, SystemMessage, UserMessage, message_text
from ctxcore.pipeline.fitting import (
    CallLimits,
    CallTooLarge,
    call_input_budget,
    fit_messages,
    group_to_fit,
    least_input,
    output_tokens_for,
    reserved_output,
)
from ctxcore.pipeline.models import PipelineConfig, Stage
from ctxcore.pipeline.sizing import as_served
from ctxcore.pipeline.targets import Target
from ctxcore.pipeline.view import View
from ctxcore.render import head_tail, serialize_messages
from ctxcore.state.models import SummaryBlock
from ctxcore.summarize.blocks import is_blocks_reply, parse_blocks
from ctxcore.summarize.model import ContractBlock, ModelClient, OutputContract
from ctxcore.summarize.prompts import (
    BLOCK_SECTIONS,
    ROUND_LEVEL_AGGRESSIVE_SYSTEM_PROMPT,
    ROUND_LEVEL_OUTPUT_CONTRACT,
    ROUND_LEVEL_SYSTEM_PROMPT,
)
from ctxcore.summarize.redact import redact
from ctxcore.summarize.sections import conform_sections
from ctxcore.tokens import TokenCounter

# Lines of the task prompt that no summary has reason to contain.
_PROMPT_MARKERS = (
    "[Compression Task]",
    "[Selected Targets]",
    "[Protected Recent Context]",
    "[Output Contract]",
)

# Used by the pipeline only: running.py calls llm_blocks.
__all__ = ["llm_blocks"]


def _task_prompt(
    stage: Stage,
    targets: Sequence[Target],
    view: View,
    cfg: PipelineConfig,
    window_tokens: int,
    counter: TokenCounter,
) -> str:
    first = min(t.first_id for t in targets)
    last = max(t.last_id for t in targets)
    replaced = {b.block_id for t in targets for b in t.blocks}
    reference: list[AnyMessage] = []
    for item in view.prefix():
        if isinstance(item, SummaryBlock):
            if item.block_id not in replaced and item.first_id < first:
                reference.extend(item.messages)
        elif (item.context_message_id or "") < first:
            reference.append(item)
    protected = [m for m in view.tail if (m.context_message_id or "") > last]
    lines = [
        "[Compression Task]",
        f"phase: {stage.kind}",
        f"target_summary_tokens: {sum(t.target_tokens for t in targets)}",
        f"keep_recent_messages: {cfg.keep_recent_messages}",
        f"selected_blocks: {', '.join(t.target_id for t in targets)}",
        f"current_context_window_tokens: {window_tokens}",
        f"compression_call_budget_limit: {cfg.compression_call_max_tokens}",
        f"selected_range: {first}..{last}",
        "",
        "[Reference Context]",
        serialize_messages(reference),
        "",
        "[Selected Targets]",
    ]
    for target in targets:
        lines += [
            f"[Block: {target.target_id}]",
            f"scope: {target.scope}",
            f"replace_range: {target.first_id}..{target.last_id}",
            f"current_level: l{max((b.level for b in target.blocks), default=0)}",
            f"next_level: l{target.level}",
            f"source_block_count: {max(len(target.blocks), 1)}",
            f"target_summary_tokens: {target.target_tokens}",
            serialize_messages(as_served(target.source_messages(), cfg, counter)),
            "",
        ]
    if cfg.protected_preview_chars:
        protected = [_preview(m, cfg.protected_preview_chars, cfg) for m in protected]
    lines += ["[Protected Recent Context]", serialize_messages(protected), "", ROUND_LEVEL_OUTPUT_CONTRACT]
    return "\n".join(lines)


def _preview(message: AnyMessage, chars: int, cfg: PipelineConfig) -> AnyMessage:
    """``message`` with its text cut to ``chars`` characters (head and tail), tool calls kept."""
    text = message_text(message)
    if len(text) <= chars:
        return message
    return message.model_copy(update={"content": head_tail(text, chars, 0.5, cfg.truncated_marker)})


@dataclass(frozen=True)
class BlockTexts:
    """What a stage's summariser calls returned: one text per block id, the raw reply (only
    when one call carried every target: the non-JSON fallback covers them all), and usage."""

    texts: dict[str, str]
    raw_text: str
    input_tokens: int
    output_tokens: int
    calls: int


def llm_blocks(
    stage: Stage,
    targets: Sequence[Target],
    view: View,
    cfg: PipelineConfig,
    client: ModelClient,
    counter: TokenCounter,
    aggressive: bool,
) -> BlockTexts:
    system = ROUND_LEVEL_AGGRESSIVE_SYSTEM_PROMPT if aggressive else ROUND_LEVEL_SYSTEM_PROMPT
    window_tokens = view.tokens(counter)

    def prompt_of(group: Sequence[Target]) -> str:
        prompt = _task_prompt(stage, group, view, cfg, window_tokens, counter)
        return redact(prompt) if cfg.redact_secrets else prompt

    limits = CallLimits(cfg.context_window_tokens, cfg.max_output_tokens)
    ceiling = limits.output_ceiling()
    # A summary asked for beyond what the client sends for would be cut mid-JSON.
    targets = [replace(t, target_tokens=limits.target_tokens(t.target_tokens)) for t in targets]

    def fits(group: Sequence[Target]) -> bool:
        output = output_tokens_for([t.target_tokens for t in group])
        if ceiling is not None and len(group) > 1 and output > ceiling:
            return False
        prompt: list[AnyMessage] = [SystemMessage(content=system), UserMessage(content=prompt_of(group))]
        return counter.count_messages(prompt) <= call_input_budget(cfg, output)

    limited = ceiling is not None
    groups = group_to_fit(targets, fits) if limited else [list(targets)]
    texts: dict[str, str] = {}
    raw_text = ""
    input_tokens = output_tokens = 0
    for group in groups:
        max_tokens = output_tokens_for([t.target_tokens for t in group])
        budget = call_input_budget(cfg, max_tokens)
        messages: list[AnyMessage] = [SystemMessage(content=system), UserMessage(content=prompt_of(group))]
        fitted = fit_messages(
            messages, [1], budget, counter, head_ratio=cfg.truncate_head_ratio, marker=cfg.truncated_marker
        )
        if fitted is None:
            if cfg.context_window_tokens is None:
                # Only the pipeline's own call cap is in the way: the stage cannot summarise.
                return BlockTexts({}, "", 0, 0, 0)
            raise CallTooLarge(
                stage.kind,
                least_input(messages, [1], counter, cfg.truncated_marker),
                reserved_output(cfg, max_tokens),
                cfg.context_window_tokens,
            )
        completion = client.complete(
            fitted,
            max_tokens=max_tokens,
            contract=_contract(group, view, cfg, counter),
        )
        input_tokens += completion.usage.input_tokens
        output_tokens += completion.usage.output_tokens
        reply = "" if _echoes_prompt(completion.text) else completion.text
        # Only prose stands in as a summary: a blocks reply with empty summaries (an
        # extractive model with no room for a line) is no answer, and its JSON is no summary.
        raw_text = reply if len(groups) == 1 and not is_blocks_reply(reply) else ""
        for bid, text in parse_blocks(reply).items():
            texts[bid] = conform_sections(text, BLOCK_SECTIONS, where=f"block {bid}")
    return BlockTexts(texts, raw_text, input_tokens, output_tokens, len(groups))


def _echoes_prompt(text: str) -> bool:
    """True for a reply that repeats the task prompt (a small model's frequent answer): its
    scaffolding lines would otherwise pass for a summary of the non-JSON fallback."""
    return any(marker in text for marker in _PROMPT_MARKERS)


def _contract(
    targets: Sequence[Target], view: View, cfg: PipelineConfig, counter: TokenCounter
) -> OutputContract:
    task_id, intent_id = view.anchor_ids()
    by_id = view.messages_by_id()
    query = message_text(by_id[intent_id]) if intent_id in by_id else ""
    replaced = {b.block_id for t in targets for b in t.blocks}
    context = [m for b in view.blocks if b.block_id not in replaced for m in b.messages]
    if task_id in by_id:
        context.insert(0, by_id[task_id])
    return OutputContract(
        kind="blocks",
        blocks=[
            ContractBlock(
                block_id=t.target_id,
                target_tokens=t.target_tokens,
                source=as_served(t.source_messages(), cfg, counter),
                scope=t.scope,
            )
            for t in targets
        ],
        sections=list(BLOCK_SECTIONS),
        context=context,
        query=query,
    )
