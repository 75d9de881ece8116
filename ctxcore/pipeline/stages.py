"""Planning and running pipeline stages: pure functions over a ``View``.

``plan_next_stage`` picks the first stage, in the fixed order L0->L1, recursive merge,
aggressive keep-recent, aggressive full-context, hard truncate, that has work to do on a
view over its target. ``run_stage`` runs exactly one and returns the full new block list;
it never mutates the view. ``compress_until_target`` loops the two (embedded use); the
distributed workers run one stage per task and save each result with compare-and-swap.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxcore.errors import ModelError
from ctxcore.messages import AnyMessage, SystemMessage, UserMessage, message_text
from ctxcore.pipeline.checks import rejected_view_error, view_violations
from ctxcore.pipeline.models import STAGE_ORDER, PipelineConfig, Stage, StageKind, StageResult
from ctxcore.pipeline.render import head_tail, serialize_messages
from ctxcore.pipeline.targets import (
    Target,
    build_targets,
    message_tokens,
    served_tokens,
    summary_cap,
    targets_for_stage,
)
from ctxcore.pipeline.truncate import truncate_blocks
from ctxcore.pipeline.view import BLOCK_META, View, block_message
from ctxcore.state.models import SummaryBlock
from ctxcore.summarize.blocks import Summarizer, parse_blocks
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

__all__ = [
    "PipelineRun",
    "Summarizer",
    "compress_until_target",
    "parse_blocks",
    "plan_next_stage",
    "run_stage",
]

# Below this many raw tokens an L1 block's header would cost more than it saves.
MIN_L1_SOURCE_TOKENS = 200
# The earlier blocks a summarizer gets as context are at most this share of the pending
# steps' tokens (or the floor, so a short pending run still sees the newest summaries).
# Handing it every earlier block made incremental compaction send O(compactions^2) tokens
# (bench/incremental.py: 6.9x the conversation's own tokens over 40 compactions); with the
# cap each raw token is sent about once, plus at most a quarter (1,000 tokens for a short run).
SUMMARIZER_CONTEXT_RATIO = 0.25
SUMMARIZER_CONTEXT_FLOOR = 1000


# --- planning ---------------------------------------------------------------------------


def plan_next_stage(
    view: View, config: PipelineConfig, counter: TokenCounter, *, exhausted: Collection[str] = ()
) -> Stage | None:
    """The next stage to run on ``view``, or None when it is within target or nothing can help.

    ``exhausted`` lists stage kinds that already failed to improve this view; they are
    skipped so the pipeline escalates instead of repeating itself.
    """
    if served_tokens(view, config, counter) <= config.target_tokens:
        return None
    for kind in _stage_order(view, config, counter):
        if kind in exhausted:
            continue
        if kind == "hard_truncate":
            if view.blocks:
                return Stage(
                    kind=kind,
                    based_on_version=view.version,
                    target_tokens=config.target_tokens,
                    block_ids=[b.block_id for b in view.blocks],
                )
            continue
        targets = build_targets(kind, view, config, counter)
        if kind == "l0_to_l1" and sum(t.source_tokens for t in targets) < MIN_L1_SOURCE_TOKENS:
            continue
        if targets:
            raw_ids = [m.context_message_id for t in targets for m in t.raw if m.context_message_id]
            return Stage(
                kind=kind,
                based_on_version=view.version,
                target_tokens=config.target_tokens,
                first_id=min(raw_ids) if raw_ids else None,
                last_id=max(raw_ids) if raw_ids else None,
                block_ids=[b.block_id for t in targets for b in t.blocks],
            )
    return None


def _stage_order(view: View, config: PipelineConfig, counter: TokenCounter) -> tuple[StageKind, ...]:
    """``STAGE_ORDER``, but merges first while the blocks are over their share of the target:
    folding old summaries together then makes the room, rather than summarising the newest
    steps of the tail."""
    cap = summary_cap(view, config)
    if (
        cap is None
        or len(view.blocks) < 2
        or sum(message_tokens(counter, b.messages) for b in view.blocks) <= cap
    ):
        return STAGE_ORDER
    return ("recursive_merge", *(k for k in STAGE_ORDER if k != "recursive_merge"))


# --- running ----------------------------------------------------------------------------


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

    calls = input_tokens = output_tokens = 0
    summaries: dict[str, list[AnyMessage]] = {}
    model_name = getattr(model_client, "name", "") if model_client is not None else ""
    if stage.kind == "l0_to_l1" and summarizer is not None:
        for target in targets:
            limit = max(int(target.source_tokens * SUMMARIZER_CONTEXT_RATIO), SUMMARIZER_CONTEXT_FLOOR)
            previous = _recent_blocks(view.blocks, limit, counter)
            produced = summarizer(previous, list(target.raw), target.target_tokens)
            if not produced:
                raise ModelError(
                    "summarizer_empty", f"the summarizer returned nothing for {target.target_id}"
                )
            summaries[target.target_id] = _as_block_messages(produced, target, cfg, model_name)
    else:
        if model_client is None:
            raise ModelError("no_model", f"stage {stage.kind} needs a model client")
        aggressive = stage.kind.startswith("aggressive")
        texts, raw_text, usage_in, usage_out = _llm_blocks(
            stage, targets, view, cfg, model_client, counter, aggressive
        )
        calls, input_tokens, output_tokens = 1, usage_in, usage_out
        if not texts and raw_text.strip() and _one_segment(targets, view):
            merged = _merge_targets(targets, view, cfg, counter)
            targets = [merged]
            texts = {
                merged.target_id: conform_sections(raw_text.strip(), BLOCK_SECTIONS, where="a non-JSON reply")
            }
        for target in targets:
            text = texts.get(target.target_id)
            if text:
                summaries[target.target_id] = [_summary_message(text, target, cfg, model_name)]

    blocks, covered, applied = _apply(targets, summaries, view, cfg, counter)
    if not applied:
        return _unchanged(stage, view, before, "no summary was usable", calls, input_tokens, output_tokens)
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
    )
    return result


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


def _merge_targets(
    targets: Sequence[Target], view: View, cfg: PipelineConfig, counter: TokenCounter
) -> Target:
    blocks = tuple(b for t in targets for b in t.blocks)
    raw = tuple(m for t in targets for m in t.raw)
    source = sum(t.source_tokens for t in targets)
    return Target(
        target_id="raw_fallback",
        scope="mixed_context",
        blocks=blocks,
        raw=raw,
        level=max(t.level for t in targets),
        source_tokens=source,
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


# --- the model call ---------------------------------------------------------------------


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
    lines += ["[Protected Recent Context]", serialize_messages(protected), "", ROUND_LEVEL_OUTPUT_CONTRACT]
    return "\n".join(lines)


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


# --- hard truncate ----------------------------------------------------------------------


# --- the loop ---------------------------------------------------------------------------


@dataclass
class PipelineRun:
    """The outcome of ``compress_until_target``."""

    view: View
    results: list[StageResult] = field(default_factory=list)
    errors: list[tuple[str, Exception]] = field(default_factory=list)


def compress_until_target(
    view: View,
    config: PipelineConfig,
    model_client: ModelClient | None,
    counter: TokenCounter,
    summarizer: Summarizer | None = None,
    *,
    max_stages: int = 32,
) -> PipelineRun:
    """Run stages until ``view`` fits ``config.target_tokens`` or no stage can help.

    A stage whose model call fails, that does not make the view smaller or whose result
    breaks the chat protocol (a custom summariser's orphan tool result, say: skipped, with
    an ``InvalidWindowError`` in ``errors``) is marked exhausted and the next kind is tried,
    ending with the deterministic hard truncate.
    """
    run = PipelineRun(view=view)
    exhausted: set[str] = set()
    for _ in range(max_stages):
        stage = plan_next_stage(run.view, config, counter, exhausted=exhausted)
        if stage is None:
            break
        try:
            result = run_stage(stage, run.view, model_client, counter, summarizer, config=config)
        except ModelError as exc:
            run.errors.append((stage.kind, exc))
            exhausted.add(stage.kind)
            continue
        run.results.append(result)
        if not result.changed:
            exhausted.add(stage.kind)
            continue
        adopted = run.view.with_blocks(result.blocks, result.covered_until, version=run.view.version + 1)
        violations = view_violations(adopted)
        if violations:
            run.errors.append((stage.kind, rejected_view_error(run.view, stage.kind, "view", violations)))
            exhausted.add(stage.kind)
            continue
        run.view = adopted
    return run
