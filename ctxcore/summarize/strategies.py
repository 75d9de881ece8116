"""``Summarizer`` strategies for the L0->L1 stage and the incremental coordinator.

A summarizer turns ``pending_steps`` (whole steps after the cursor) into the messages of one
new L1 block. ``previous_blocks`` are context only. Returning None or [] is a failure: the
caller keeps its previous state rather than record an empty history.
"""

from __future__ import annotations

from collections.abc import Sequence

from ctxcore.errors import ConfigError
from ctxcore.messages import (
    AnyMessage,
    AssistantMessage,
    SystemMessage,
    ToolMessage,
    UserMessage,
    message_text,
)
from ctxcore.render import head_tail, serialize_messages
from ctxcore.state.models import SummaryBlock
from ctxcore.summarize.blocks import Summarizer, parse_blocks
from ctxcore.summarize.model import ContractBlock, ModelClient, OutputContract
from ctxcore.summarize.prompts import BLOCK_SECTIONS, LINE_TAG_RULE, block_sections_rule
from ctxcore.summarize.redact import redact
from ctxcore.summarize.sections import conform_sections
from ctxcore.turns import is_real_user, turns

__all__ = [
    "Summarizer",
    "chain",
    "compact_completed_turns",
    "identity",
    "model",
    "per_message_model",
    "text_excerpt",
]

DEFAULT_INSTRUCTION = (
    "Summarise the pending conversation steps for an agent that will continue the work. Keep the user's "
    "requests and corrections verbatim, decisions, identifiers, numbers, dates, names, file paths, errors "
    "and the latest state of each file or task. Do not repeat what the earlier summaries already say."
)


def identity() -> Summarizer:
    """Pending steps as they are (a verbatim block)."""

    def summarize(
        previous_blocks: Sequence[SummaryBlock], pending_steps: Sequence[AnyMessage], target_tokens: int
    ) -> list[AnyMessage]:
        return list(pending_steps)

    return summarize


def compact_completed_turns() -> Summarizer:
    """Each completed turn becomes its user message(s) and final assistant reply.

    Work of an unfinished turn stays as it is; work that ends a turn begun before the
    pending range keeps only that final reply.
    """

    def summarize(
        previous_blocks: Sequence[SummaryBlock], pending_steps: Sequence[AnyMessage], target_tokens: int
    ) -> list[AnyMessage]:
        pending = list(pending_steps)
        found = turns(pending)
        out: list[AnyMessage] = []
        first_start = found[0].start if found else len(pending)
        lead = pending[:first_start]
        finals = [i for i, m in enumerate(lead) if isinstance(m, AssistantMessage) and not m.tool_calls]
        if finals and finals[-1] == len(lead) - 1:
            out.append(lead[-1])
        else:
            out.extend(lead)
        for turn in found:
            if turn.complete and turn.final is not None:
                out.extend(m for m in pending[turn.start : turn.final] if isinstance(m, UserMessage))
                out.append(pending[turn.final])
            else:
                out.extend(pending[turn.start : turn.end])
        return out

    return summarize


def text_excerpt(max_chars: int) -> Summarizer:
    """Deterministic excerpt: head and tail of each message's text within ``max_chars``."""
    if max_chars < 1:
        raise ConfigError(f"text_excerpt: max_chars must be >= 1, got {max_chars}")

    def summarize(
        previous_blocks: Sequence[SummaryBlock], pending_steps: Sequence[AnyMessage], target_tokens: int
    ) -> list[AnyMessage]:
        out: list[AnyMessage] = []
        for message in pending_steps:
            text = message_text(message)
            if len(text) > max_chars:
                message = message.model_copy(update={"content": head_tail(text, max_chars, 0.5, "...")})
            out.append(message)
        return out

    return summarize


def _context(previous_blocks: Sequence[SummaryBlock]) -> list[AnyMessage]:
    return [m for b in previous_blocks for m in b.messages]


def model(
    client: ModelClient, instruction: str = DEFAULT_INSTRUCTION, *, redact_secrets: bool = True
) -> Summarizer:
    """One summary message of the pending steps, written with previous blocks as context.

    ``redact_secrets`` cuts API keys, tokens, passwords and private keys from the prompt.
    """

    def summarize(
        previous_blocks: Sequence[SummaryBlock], pending_steps: Sequence[AnyMessage], target_tokens: int
    ) -> list[AnyMessage] | None:
        if not pending_steps:
            return None
        context = _context(previous_blocks)
        prompt = (
            f"[Earlier summaries, reference only]\n{serialize_messages(context)}\n\n"
            f"[Pending steps to summarise]\n{serialize_messages(pending_steps)}\n\n"
            f'Return JSON only: {{"blocks": [{{"block_id": "summary", "summary": "..."}}]}} '
            f"with a summary of at most {target_tokens} tokens. {block_sections_rule()} {LINE_TAG_RULE}"
        )
        if redact_secrets:
            prompt = redact(prompt)
        query = next((message_text(m) for m in reversed(pending_steps) if is_real_user(m)), "")
        contract = OutputContract(
            kind="blocks",
            blocks=[
                ContractBlock(
                    block_id="summary", target_tokens=max(target_tokens, 1), source=list(pending_steps)
                )
            ],
            sections=list(BLOCK_SECTIONS),
            context=context,
            query=query,
        )
        completion = client.complete(
            [SystemMessage(content=instruction), UserMessage(content=prompt)],
            max_tokens=int(target_tokens * 1.25) + 64,
            contract=contract,
        )
        summary = parse_blocks(completion.text).get("summary") or completion.text.strip()
        if not summary:
            return None
        return [UserMessage(content=conform_sections(summary, BLOCK_SECTIONS, where="an L1 summary"))]

    return summarize


def per_message_model(
    client: ModelClient, instruction: str = DEFAULT_INSTRUCTION, *, redact_secrets: bool = True
) -> Summarizer:
    """One summary per user/assistant message (roles, ids and tool calls kept; tool results untouched).

    ``redact_secrets`` cuts API keys, tokens, passwords and private keys from the prompt.
    """

    def summarize(
        previous_blocks: Sequence[SummaryBlock], pending_steps: Sequence[AnyMessage], target_tokens: int
    ) -> list[AnyMessage] | None:
        pending = list(pending_steps)
        chosen = [
            i for i, m in enumerate(pending) if not isinstance(m, ToolMessage) and message_text(m).strip()
        ]
        if not chosen:
            return pending or None
        per = max(target_tokens // len(chosen), 1)
        blocks = [ContractBlock(block_id=f"m{i}", target_tokens=per, source=[pending[i]]) for i in chosen]
        prompt = (
            f"[Messages to shorten one by one]\n{serialize_messages([pending[i] for i in chosen])}\n\n"
            'Return JSON only: {"blocks": [{"block_id": "m<index>", "summary": "..."}]}, one entry per message, '
            f"ids {', '.join(b.block_id for b in blocks)}, each at most {per} tokens."
        )
        if redact_secrets:
            prompt = redact(prompt)
        contract = OutputContract(kind="blocks", blocks=blocks, context=_context(previous_blocks))
        completion = client.complete(
            [SystemMessage(content=instruction), UserMessage(content=prompt)],
            max_tokens=int(target_tokens * 1.25) + 64,
            contract=contract,
        )
        texts = parse_blocks(completion.text)
        if not texts:
            return None
        out = list(pending)
        for i in chosen:
            text = texts.get(f"m{i}")
            if text and len(text) < len(message_text(pending[i])):
                out[i] = pending[i].model_copy(update={"content": text})
        return out

    return summarize


def chain(*strategies: Summarizer) -> Summarizer:
    """Apply strategies in turn, each to the previous one's result."""
    if not strategies:
        raise ConfigError("chain() needs at least one strategy: pass the summarizers to apply in turn")

    def summarize(
        previous_blocks: Sequence[SummaryBlock], pending_steps: Sequence[AnyMessage], target_tokens: int
    ) -> list[AnyMessage] | None:
        current: list[AnyMessage] | None = list(pending_steps)
        for strategy in strategies:
            current = strategy(previous_blocks, current or [], target_tokens)
            if not current:
                return None
        return current

    return summarize
