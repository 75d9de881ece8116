"""Fitting a summariser call into the model's context: the input budget left after the
output's room, grouping a stage's targets into calls that fit, trimming a call's messages to
what is left, and the smallest context a pipeline can work in (refused at start-up below it).

Every model call in ctxcore goes through here: the pipeline's stages (``model_call``), the
incremental ``Coordinator.compress`` and the embedded compressors (``FittedClient`` and
``fit_to_limits``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from ctxcore.errors import ConfigError, ErrorKind, ModelError
from ctxcore.markers import TRUNCATED
from ctxcore.messages import AnyMessage, SystemMessage, UserMessage, message_text
from ctxcore.pipeline.models import PipelineConfig
from ctxcore.render import head_tail
from ctxcore.summarize.prompts import (
    BLOCK_SECTIONS,
    ROUND_LEVEL_AGGRESSIVE_SYSTEM_PROMPT,
    ROUND_LEVEL_OUTPUT_CONTRACT,
    ROUND_LEVEL_SYSTEM_PROMPT,
)
from ctxcore.summarize.sections import skeleton
from ctxcore.tokens import TokenCounter

if TYPE_CHECKING:
    from ctxcore.config import ModelSettings

__all__ = [
    "CallLimits",
    "CallTooLarge",
    "call_input_budget",
    "check_context_window",
    "check_output_cap",
    "fit_messages",
    "fit_to_limits",
    "group_to_fit",
    "least_input",
    "minimum_context_window",
    "minimum_output",
    "output_tokens_for",
    "reserved_output",
    "target_within_output",
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

    @classmethod
    def of(cls, model: ModelSettings) -> CallLimits:
        """The limits ``model``'s settings put on a call. ``max_tokens`` caps only an endpoint's
        client (``OpenAIChatModel``): the offline model writes what a call asks for."""
        return cls(model.context_window_tokens, None if model.offline else model.max_tokens)

    def output_ceiling(self) -> int | None:
        """The most output one call may ask for: the client's cap, and half the model's
        context (a summary is shorter than its source, which must fit beside it)."""
        caps = [c for c in (self.max_output_tokens, self.half_window()) if c is not None]
        return min(caps) if caps else None

    def half_window(self) -> int | None:
        """Half the model's context (None: no limit)."""
        return None if self.context_window_tokens is None else max(self.context_window_tokens // 2, 1)

    def target_tokens(self, wanted: int) -> int:
        """``wanted`` summary tokens within what one call's output may hold."""
        ceiling = self.output_ceiling()
        return wanted if ceiling is None else min(wanted, target_within_output(ceiling))

    def reserved(self, output_tokens: int) -> int:
        """The output room a call asking for ``output_tokens`` keeps (see ``reserved_output``)."""
        return output_tokens if self.max_output_tokens is None else min(output_tokens, self.max_output_tokens)


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


def target_within_output(max_output_tokens: int) -> int:
    """The largest block target one call's output of ``max_output_tokens`` holds: a summary
    asked for beyond it would be cut at ``max_tokens`` mid-JSON and be lost whole."""
    return max(int((max_output_tokens - _OUTPUT_PER_BLOCK - _OUTPUT_BASE) / _OUTPUT_SLACK), 1)


def reserved_output(cfg: PipelineConfig, output_tokens: int) -> int:
    """The output room a call asking for ``output_tokens`` keeps: no more than the client
    sends for (``max_output_tokens``), so a small context is not spent on room never used."""
    return CallLimits(cfg.context_window_tokens, cfg.max_output_tokens).reserved(output_tokens)


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


def _with_text(message: AnyMessage, text: str) -> AnyMessage:
    return message.model_copy(update={"content": text})


def least_input(
    messages: Sequence[AnyMessage], trimmable: Sequence[int], counter: TokenCounter, marker: str = TRUNCATED
) -> int:
    """The input tokens of ``messages`` with every ``trimmable`` one cut to the marker: the
    smallest this call can be made."""
    cut = {
        i: _with_text(messages[i], head_tail(message_text(messages[i]), 0, 0.5, marker)) for i in trimmable
    }
    return counter.count_messages([cut.get(i, m) for i, m in enumerate(messages)])


def fit_messages(
    messages: Sequence[AnyMessage],
    trimmable: Sequence[int],
    budget: int,
    counter: TokenCounter,
    *,
    head_ratio: float = 0.2,
    marker: str = TRUNCATED,
) -> list[AnyMessage] | None:
    """``messages`` within ``budget`` input tokens: the ``trimmable`` ones (by index) cut to
    their head and tail around ``marker``, the longest first and only as far as needed (None:
    not even all of them cut to the marker fit). The others (system prompt, instructions, tool
    calls) are kept whole, and so are the messages' roles: the chat stays well-formed."""
    out = list(messages)
    if counter.count_messages(out) <= budget:
        return out
    for i in sorted(trimmable, key=lambda j: len(message_text(out[j])), reverse=True):
        text = message_text(out[i])

        def cut(keep: int, i: int = i, text: str = text) -> AnyMessage:
            return _with_text(out[i], head_tail(text, keep, head_ratio, marker))

        def cost(keep: int, i: int = i) -> int:
            return counter.count_messages([*out[:i], cut(keep), *out[i + 1 :]])

        if cost(0) > budget:
            out[i] = cut(0)
            continue
        lo, hi, best = 0, len(text), 0
        while lo <= hi:
            mid = (lo + hi) // 2
            if cost(mid) <= budget:
                best, lo = mid, mid + 1
            else:
                hi = mid - 1
        out[i] = cut(best)
        return out
    return None


def fit_to_limits(
    messages: Sequence[AnyMessage],
    trimmable: Sequence[int],
    *,
    max_tokens: int,
    limits: CallLimits,
    counter: TokenCounter,
    where: str,
    head_ratio: float = 0.2,
    marker: str = TRUNCATED,
) -> list[AnyMessage]:
    """``messages`` fitted to ``limits.context_window_tokens`` with room for ``max_tokens`` of
    output (``fit_messages``); ``CallTooLarge`` with the sizes when they cannot be."""
    window = limits.context_window_tokens
    if window is None:
        return list(messages)
    output = limits.reserved(max_tokens)
    fitted = fit_messages(messages, trimmable, window - output, counter, head_ratio=head_ratio, marker=marker)
    if fitted is None:
        raise CallTooLarge(where, least_input(messages, trimmable, counter, marker), output, window)
    return fitted


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
    return prompt + minimum_output(counter)


def minimum_output(counter: TokenCounter) -> int:
    """The smallest output a summariser call needs: one block of its section headings."""
    return output_tokens_for([counter.count_text(skeleton(BLOCK_SECTIONS))])


def check_output_cap(max_tokens: int, counter: TokenCounter, where: str) -> None:
    """Refuse (``ConfigError`` with the sizes) an output cap below the smallest summary's
    output: every reply would be cut at ``max_tokens`` and none could be saved."""
    least = minimum_output(counter)
    if max_tokens < least:
        raise ConfigError(
            f"{where}: {max_tokens} tokens is below the smallest summary's output, {least} tokens "
            "(one block's JSON and section headings); raise it"
        )


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
