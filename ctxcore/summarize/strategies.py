"""The model ``Summarizer`` of the L0->L1 stage and the incremental coordinator.

A summarizer turns ``pending_steps`` (whole steps after the cursor) into the messages of one
new L1 block. ``previous_blocks`` are context only. Returning None or [] is a failure: the
caller keeps its previous state rather than record an empty history.
"""

from __future__ import annotations

from collections.abc import Sequence

from ctxcore.messages import AnyMessage, SystemMessage, UserMessage, message_text
from ctxcore.render import serialize_messages
from ctxcore.state.models import SummaryBlock
from ctxcore.summarize.blocks import Summarizer, parse_blocks
from ctxcore.summarize.model import ContractBlock, ModelClient, OutputContract
from ctxcore.summarize.prompts import BLOCK_SECTIONS, LINE_TAG_RULE, block_sections_rule
from ctxcore.summarize.redact import redact
from ctxcore.summarize.sections import conform_sections
from ctxcore.turns import is_real_user

__all__ = ["Summarizer", "model"]

DEFAULT_INSTRUCTION = (
    "Summarise the pending conversation steps for an agent that will continue the work. Keep the user's "
    "requests and corrections verbatim, decisions, identifiers, numbers, dates, names, file paths, errors "
    "and the latest state of each file or task. Do not repeat what the earlier summaries already say."
)


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
        context = [m for b in previous_blocks for m in b.messages]
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
