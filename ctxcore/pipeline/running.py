"""Running one stage: ``run_stage`` returns the full new block list (a custom ``Summarizer``
for L0->L1, else the model call), and never mutates the view."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ctxcore.errors import ConfigError, ModelError
from ctxcore.messages import AnyMessage, UserMessage, message_text
from ctxcore.pipeline.fitting import CallLimits
from ctxcore.pipeline.model_call import llm_blocks
from ctxcore.pipeline.models import PipelineConfig, Stage, StageResult
from ctxcore.pipeline.sizing import message_tokens
from ctxcore.pipeline.targets import Target, targets_for_stage
from ctxcore.pipeline.truncate import truncate_blocks
from ctxcore.pipeline.verify import verify_block
from ctxcore.pipeline.view import BLOCK_META, View, block_message
from ctxcore.state.models import SummaryBlock
from ctxcore.summarize.blocks import Summarizer
from ctxcore.summarize.model import ModelClient
from ctxcore.summarize.prompts import BLOCK_SECTIONS
from ctxcore.summarize.sections import conform_sections
from ctxcore.tokens import TokenCounter

__all__ = ["SUMMARIZER_CONTEXT_FLOOR", "SUMMARIZER_CONTEXT_RATIO", "run_stage"]

# The earlier blocks a summarizer gets as context are at most this share of the pending
# steps' tokens (or the floor, so a short pending run still sees the newest summaries).
# Handing it every earlier block made incremental compaction send O(compactions^2) tokens
# (bench/incremental.py: 6.9x the conversation's own tokens over 40 compactions); with the
# cap each raw token is sent about once, plus at most a quarter (1,000 tokens for a short run).
SUMMARIZER_CONTEXT_RATIO = 0.25
SUMMARIZER_CONTEXT_FLOOR = 1000


def run_stage(
    stage: Stage,
    view: View,
    model_client: ModelClient | None,
    counter: TokenCounter,
    summarizer: Summarizer | None = None,
    *,
    config: PipelineConfig | None = None,
) -> StageResult:
    """Run one stage on ``view``; model errors propagate (``ModelError``), nothing is mutated."""
    cfg = config or PipelineConfig(target_tokens=stage.target_tokens)
    before = view.tokens(counter)
    if stage.kind == "hard_truncate":
        blocks = truncate_blocks(view, cfg, counter, stage.target_tokens)
        return _result(stage, view, blocks, view.covered_until, before, counter, detail="hard truncate")

    targets = targets_for_stage(stage, view, cfg, counter)
    if not targets:
        return _unchanged(stage, view, before, "no targets left for this stage")

    calls = input_tokens = output_tokens = restored = kept_raw = 0
    summaries: dict[str, list[AnyMessage]] = {}
    model_name = model_client.name if model_client is not None else ""
    if stage.kind == "l0_to_l1" and summarizer is not None:
        for target in targets:
            limit = max(int(target.source_tokens * SUMMARIZER_CONTEXT_RATIO), SUMMARIZER_CONTEXT_FLOOR)
            previous = _recent_blocks(view.blocks, limit, counter)
            # No more than one call's output returns whole.
            wanted = CallLimits(cfg.context_window_tokens, cfg.max_output_tokens).target_tokens(
                target.target_tokens
            )
            produced = summarizer(previous, list(target.raw), wanted)
            if not produced:
                raise ModelError(
                    "summarizer_empty", f"the summarizer returned nothing for {target.target_id}"
                )
            summaries[target.target_id] = _as_block_messages(produced, target, cfg, model_name)
    else:
        if model_client is None:
            # The caller's mistake, not a failed call: no retry or backoff can mend it.
            raise ConfigError(
                f"stage {stage.kind} needs a model client: pass one (ExtractiveModel(counter) runs "
                "offline), or plan only l0_to_l1 (with a summarizer) and hard_truncate"
            )
        aggressive = stage.kind.startswith("aggressive")
        replies = llm_blocks(stage, targets, view, cfg, model_client, counter, aggressive)
        texts, raw_text = replies.texts, replies.raw_text
        calls, input_tokens, output_tokens = replies.calls, replies.input_tokens, replies.output_tokens
        if not texts and raw_text.strip() and _one_segment(targets, view):
            merged = _merge_targets(targets)
            targets = [merged]
            texts = {
                merged.target_id: conform_sections(raw_text.strip(), BLOCK_SECTIONS, where="a non-JSON reply")
            }
        for target in targets:
            text = texts.get(target.target_id)
            if text:
                verdict = verify_block(
                    text, target.source_messages(), _newer(view, target), target.target_tokens, counter
                )
                restored += verdict.restored
                kept_raw += int(verdict.text is None)
                if verdict.text is not None:
                    summaries[target.target_id] = [_summary_message(verdict.text, target, cfg, model_name)]

    checked = f"working set: {restored} lines restored, {kept_raw} kept raw"
    blocks, covered, applied = _apply(targets, summaries, view, cfg, counter)
    if not applied:
        unchanged = _unchanged(
            stage, view, before, f"no summary was usable ({checked})", calls, input_tokens, output_tokens
        )
        return unchanged.model_copy(update={"restored_lines": restored, "kept_raw": kept_raw})
    result = _result(
        stage,
        view,
        blocks,
        covered,
        before,
        counter,
        calls=calls,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        detail=checked if restored or kept_raw else "",
    )
    return result.model_copy(update={"restored_lines": restored, "kept_raw": kept_raw})


def _newer(view: View, target: Target) -> list[AnyMessage]:
    """The raw messages after ``target``: what the agent is doing now."""
    return [m for m in view.tail if (m.context_message_id or "") > target.last_id]


def _recent_blocks(blocks: Sequence[SummaryBlock], limit: int, counter: TokenCounter) -> list[SummaryBlock]:
    """The newest blocks whose messages fit ``limit`` tokens together, in log order."""
    chosen: list[SummaryBlock] = []
    used = 0
    for block in reversed(blocks):
        used += message_tokens(counter, block.messages)
        if used > limit:
            break
        chosen.append(block)
    chosen.reverse()
    return chosen


def _as_block_messages(
    produced: Sequence[AnyMessage], target: Target, cfg: PipelineConfig, model: str
) -> list[AnyMessage]:
    if (
        len(produced) == 1
        and isinstance(produced[0], UserMessage)
        and not message_text(produced[0]).lstrip().startswith(("[", "<"))
    ):
        return [_summary_message(message_text(produced[0]), target, cfg, model)]
    prov = _provenance(target, model)
    return [m.model_copy(update={"metadata": {**m.metadata, BLOCK_META: prov}}) for m in produced]


def _block_id(target: Target, prefix: str = "L") -> str:
    return f"{prefix}{target.level}-{target.first_id}-{target.last_id}"


def _provenance(target: Target, model: str) -> dict[str, Any]:
    return {
        "block_id": _block_id(target),
        "first_id": target.first_id,
        "last_id": target.last_id,
        "level": target.level,
        "scope": target.scope,
        "tokens_before": target.raw_tokens,
        "model": model,
    }


def _summary_message(text: str, target: Target, cfg: PipelineConfig, model: str) -> UserMessage:
    return block_message(
        text,
        block_id=_block_id(target),
        first_id=target.first_id,
        last_id=target.last_id,
        level=target.level,
        scope=target.scope,
        marker=cfg.compression_marker,
        tokens_before=target.raw_tokens,
        model=model,
    )


def _apply(
    targets: Sequence[Target],
    summaries: dict[str, list[AnyMessage]],
    view: View,
    cfg: PipelineConfig,
    counter: TokenCounter,
) -> tuple[list[SummaryBlock], str | None, bool]:
    """Replace what each useful summary stands for; keep the cursor contiguous.

    A raw target whose summary is missing or not smaller than its source becomes a
    verbatim block when a later raw target succeeded (so everything up to the cursor stays
    covered); otherwise its messages stay in the tail.
    """
    replaced: set[str] = set()
    new_blocks: list[SummaryBlock] = []
    covered = view.covered_until
    useful = {}
    for target in targets:
        messages = summaries.get(target.target_id)
        if messages is None:
            continue
        tokens = message_tokens(counter, messages)
        if tokens < target.source_tokens and tokens <= cfg.compression_call_max_tokens:
            useful[target.target_id] = (messages, tokens)
    last_useful_raw = max(
        (i for i, t in enumerate(targets) if t.raw and not t.blocks and t.target_id in useful), default=-1
    )
    for i, target in enumerate(targets):
        got = useful.get(target.target_id)
        if got is None:
            if target.blocks or not target.raw or i > last_useful_raw:
                continue
            messages = _verbatim(target)
            tokens = message_tokens(counter, messages)
        else:
            messages, tokens = got
        replaced.update(b.block_id for b in target.blocks)
        new_blocks.append(
            SummaryBlock(
                block_id=str(messages[0].metadata[BLOCK_META]["block_id"]),
                messages=list(messages),
                first_id=target.first_id,
                last_id=target.last_id,
                level=target.level if got is not None else max(target.level, 1),
                tokens_before=target.raw_tokens,
                tokens_after=tokens,
                model=str(messages[0].metadata[BLOCK_META].get("model", "")),
            )
        )
        if target.raw and (covered is None or target.last_id > covered):
            covered = target.last_id
    if not useful:
        return list(view.blocks), view.covered_until, False
    blocks = [b for b in view.blocks if b.block_id not in replaced] + new_blocks
    blocks.sort(key=lambda b: b.first_id)
    return blocks, covered, True


def _verbatim(target: Target) -> list[AnyMessage]:
    prov = {
        "block_id": _block_id(target, "V"),
        "first_id": target.first_id,
        "last_id": target.last_id,
        "level": max(target.level, 1),
        "scope": "verbatim",
        "tokens_before": target.raw_tokens,
        "model": "",
    }
    return [
        m.model_copy(update={"metadata": {**m.metadata, BLOCK_META: prov}}) for m in target.source_messages()
    ]


def _one_segment(targets: Sequence[Target], view: View) -> bool:
    if len(targets) == 1:
        return True
    barriers = view.anchor_id_set() | {m.context_message_id for m in view.pinned if m.context_message_id}
    first = min(t.first_id for t in targets)
    last = max(t.last_id for t in targets)
    return not any(first <= b <= last for b in barriers)


def _merge_targets(targets: Sequence[Target]) -> Target:
    return Target(
        target_id="raw_fallback",
        scope="mixed_context",
        blocks=tuple(b for t in targets for b in t.blocks),
        raw=tuple(m for t in targets for m in t.raw),
        level=max(t.level for t in targets),
        source_tokens=sum(t.source_tokens for t in targets),
        target_tokens=sum(t.target_tokens for t in targets),
        raw_tokens=sum(t.raw_tokens for t in targets),
    )


def _unchanged(
    stage: Stage,
    view: View,
    tokens: int,
    detail: str,
    calls: int = 0,
    input_tokens: int = 0,
    output_tokens: int = 0,
) -> StageResult:
    return StageResult(
        stage=stage,
        blocks=list(view.blocks),
        covered_until=view.covered_until,
        pinned=[m.context_message_id or "" for m in view.pinned],
        changed=False,
        tokens_before=tokens,
        tokens_after=tokens,
        model_calls=calls,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        detail=detail,
    )


def _result(
    stage: Stage,
    view: View,
    blocks: list[SummaryBlock],
    covered: str | None,
    before: int,
    counter: TokenCounter,
    *,
    calls: int = 0,
    input_tokens: int = 0,
    output_tokens: int = 0,
    detail: str = "",
) -> StageResult:
    after_view = view.with_blocks(blocks, covered)
    after = after_view.tokens(counter)
    changed = after < before
    return StageResult(
        stage=stage,
        blocks=list(after_view.blocks) if changed else list(view.blocks),
        covered_until=after_view.covered_until if changed else view.covered_until,
        pinned=[m.context_message_id or "" for m in (after_view if changed else view).pinned],
        changed=changed,
        tokens_before=before,
        tokens_after=after if changed else before,
        model_calls=calls,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        detail=detail or ("" if changed else "not smaller than before"),
    )
