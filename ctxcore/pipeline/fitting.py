"""Fitting a summariser call into the model's context: the input budget left after the
output's room, grouping a stage's targets into calls that fit, and the smallest context a
pipeline can work in (refused at start-up below it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from ctxcore.errors import ConfigError, ErrorKind, ModelError
from ctxcore.messages import SystemMessage, UserMessage
from ctxcore.pipeline.models import PipelineConfig
from ctxcore.summarize.prompts import (
    BLOCK_SECTIONS,
    ROUND_LEVEL_AGGRESSIVE_SYSTEM_PROMPT,
    ROUND_LEVEL_OUTPUT_CONTRACT,
    ROUND_LEVEL_SYSTEM_PROMPT,
)
from ctxcore.summarize.sections import skeleton
from ctxcore.tokens import TokenCounter

__all__ = [
    "CallLimits",
    "CallTooLarge",
    "call_input_budget",
    "check_context_window",
    "group_to_fit",
    "minimum_context_window",
    "output_tokens_for",
    "reserved_output",
]

T = TypeVar("T")

# What one block's output may take beyond its target: the JSON wrapping, its id and the
# section headings (a model overshoots its target a little; max_tokens cuts the rest).
_OUTPUT_SLACK = 1.25
_OUTPUT_PER_BLOCK = 64
_OUTPUT_BASE = 64


@dataclass(frozen=True)
class CallLimits:
    """A summarisation model's limits a call is fitted to (``model.context_window_tokens``
    and ``model.max_tokens``; None: no limit)."""

    context_window_tokens: int | None = None
    max_output_tokens: int | None = None


class CallTooLarge(ModelError):
    """A summariser call does not fit the model's context even split to one target and
    trimmed to its fixed lines: the stage fails visibly (kind ``context_overflow``) with the
    sizes, instead of sending a request the server would refuse or cut."""

    def __init__(self, stage: str, needed: int, output: int, window: int) -> None:
        super().__init__(
            ErrorKind.CONTEXT_OVERFLOW,
            f"stage {stage}: the smallest summariser call needs {needed} input tokens plus {output} "
            f"for its output, over model.context_window_tokens ({window}); raise the model's context "
            "or lower the pass targets (a smaller budget)",
        )
        self.needed = needed
        self.output = output
        self.window = window


def output_tokens_for(target_tokens: Sequence[int]) -> int:
    """The ``max_tokens`` of one call producing blocks of these targets."""
    return int(sum(target_tokens) * _OUTPUT_SLACK) + _OUTPUT_PER_BLOCK * len(target_tokens) + _OUTPUT_BASE


def reserved_output(cfg: PipelineConfig, output_tokens: int) -> int:
    """The output room a call asking for ``output_tokens`` keeps: no more than the client
    sends for (``max_output_tokens``), so a small context is not spent on room never used."""
    if cfg.max_output_tokens is None:
        return output_tokens
    return min(output_tokens, cfg.max_output_tokens)


def call_input_budget(cfg: PipelineConfig, output_tokens: int) -> int:
    """The most tokens a call's input may take: the pipeline's call cap, and within the
    model's context what the output leaves (may be <= 0: nothing fits)."""
    budget = cfg.compression_call_max_tokens
    if cfg.context_window_tokens is not None:
        budget = min(budget, cfg.context_window_tokens - reserved_output(cfg, output_tokens))
    return budget


def group_to_fit(items: Sequence[T], fits: Callable[[Sequence[T]], bool]) -> list[list[T]]:
    """``items`` in order, cut into runs that each ``fits`` (greedy, longest first run).

    An item that does not fit even alone gets a run of its own: the caller trims it or
    fails with the sizes. All items in one run when they fit together (one check).
    """
    if not items:
        return []
    if fits(items):
        return [list(items)]
    groups: list[list[T]] = []
    current: list[T] = []
    for item in items:
        if current and fits([*current, item]):
            current.append(item)
            continue
        if current:
            groups.append(current)
        current = [item]
    groups.append(current)
    return groups


def minimum_context_window(counter: TokenCounter) -> int:
    """The smallest context a summariser call can work in: the longer system prompt, the
    task's fixed lines and output contract with one step's worth of lines, and the output of
    one block (its section headings at the least)."""
    system = max(ROUND_LEVEL_SYSTEM_PROMPT, ROUND_LEVEL_AGGRESSIVE_SYSTEM_PROMPT, key=len)
    step = (
        "[Compression Task]\nphase: l0_to_l1\n[Block: b1]\nscope: completed_react\n"
        "[000000000001] role=assistant | tool_calls=run({}) | content=\n"
        "[000000000002] role=tool | tool_call_id=c1 | content=ok\n" + ROUND_LEVEL_OUTPUT_CONTRACT
    )
    prompt = counter.count_messages([SystemMessage(content=system), UserMessage(content=step)])
    return prompt + output_tokens_for([counter.count_text(skeleton(BLOCK_SECTIONS))])


def check_context_window(window: int | None, counter: TokenCounter, where: str) -> None:
    """Refuse (``ConfigError`` with the sizes) a context smaller than the smallest call."""
    if window is None:
        return
    least = minimum_context_window(counter)
    if window < least:
        raise ConfigError(
            f"{where}: {window} tokens is below the smallest summariser call, {least} tokens (the "
            "system prompt, one step and one summary's output); use a model with a larger "
            "context or leave it unset"
        )
