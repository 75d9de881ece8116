"""The round-level stages' model call: the task prompt, fitted to the call budget and
redacted, sent with its output contract; the reply parsed into one text per block."""

from __future__ import annotations

from collections.abc import Sequence

from ctxcore.messages import AnyMessage, SystemMessage, UserMessage, message_text
from ctxcore.pipeline.models import PipelineConfig, Stage
from ctxcore.pipeline.render import head_tail, serialize_messages
from ctxcore.pipeline.targets import Target
from ctxcore.pipeline.view import View
from ctxcore.state.models import SummaryBlock
from ctxcore.summarize.blocks import parse_blocks
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

# Private to the pipeline: running.py calls _llm_blocks.
__all__: list[str] = []


def _task_prompt(
    stage: Stage, targets: Sequence[Target], view: View, cfg: PipelineConfig, window_tokens: int
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
            serialize_messages(target.source_messages()),
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


def _fit_call_budget(system: str, prompt: str, cfg: PipelineConfig, counter: TokenCounter) -> str | None:
    """Shrink the task prompt by head/tail truncation until the call fits its budget."""
    budget = cfg.compression_call_max_tokens

    def cost(text: str) -> int:
        return counter.count_messages([SystemMessage(content=system), UserMessage(content=text)])

    if cost(prompt) <= budget:
        return prompt
    skeleton = f"[Compression Task]\n{cfg.truncated_marker}\n[Output Contract]\nJSON only."
    if cost(skeleton) > budget:
        return None
    lo, hi = 0, len(prompt)
    best = skeleton
    while lo <= hi:
        mid = (lo + hi) // 2
        candidate = head_tail(prompt, mid, cfg.truncate_head_ratio, cfg.truncated_marker)
        if cost(candidate) <= budget:
            best, lo = candidate, mid + 1
        else:
            hi = mid - 1
    return best


def _llm_blocks(
    stage: Stage,
    targets: Sequence[Target],
    view: View,
    cfg: PipelineConfig,
    client: ModelClient,
    counter: TokenCounter,
    aggressive: bool,
) -> tuple[dict[str, str], str, int, int]:
    system = ROUND_LEVEL_AGGRESSIVE_SYSTEM_PROMPT if aggressive else ROUND_LEVEL_SYSTEM_PROMPT
    prompt = _fit_call_budget(
        system, _task_prompt(stage, targets, view, cfg, view.tokens(counter)), cfg, counter
    )
    if prompt is None:
        return {}, "", 0, 0
    if cfg.redact_secrets:
        prompt = redact(prompt)
    task_id, intent_id = view.anchor_ids()
    by_id = view.messages_by_id()
    query = message_text(by_id[intent_id]) if intent_id in by_id else ""
    replaced = {b.block_id for t in targets for b in t.blocks}
    context = [m for b in view.blocks if b.block_id not in replaced for m in b.messages]
    if task_id in by_id:
        context.insert(0, by_id[task_id])
    contract = OutputContract(
        kind="blocks",
        blocks=[
            ContractBlock(
                block_id=t.target_id, target_tokens=t.target_tokens, source=t.source_messages(), scope=t.scope
            )
            for t in targets
        ],
        sections=list(BLOCK_SECTIONS),
        context=context,
        query=query,
    )
    max_tokens = int(sum(t.target_tokens for t in targets) * 1.25) + 64 * len(targets) + 64
    completion = client.complete(
        [SystemMessage(content=system), UserMessage(content=prompt)], max_tokens=max_tokens, contract=contract
    )
    usage = completion.usage
    texts = {
        bid: conform_sections(text, BLOCK_SECTIONS, where=f"block {bid}")
        for bid, text in parse_blocks(completion.text).items()
    }
    return texts, completion.text, usage.input_tokens, usage.output_tokens
