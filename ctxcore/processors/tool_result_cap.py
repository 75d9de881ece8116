"""``ToolResultCap``: no single tool result may take more than a share of the window.

A result over ``max_result_ratio`` of the window (``RuleEnv.context_max``: the model's
window, or the request's budget on the fast path) is offloaded whole and served as its head
and its tail around the offload marker, filling the cap: the start of an output (what ran,
the first lines) and its end (the verdict, the traceback's last frames) are what the model
reads first, and everything else stays one reload away. Text is taken from the original as
logged (list content by its text parts), so a result capped for a large window is capped
again, from the original, for a smaller one.

With ``act_only_over_budget`` (the default chain's mode) the cap is headroom-aware: a result
is served whole while the window fits, and once it does not, results over the cap are cut
oldest first and only until the messages fit their room. A cap that cut every large result
whatever the room served a 3,000-token file view at 8k as its head and tail while a plain
truncation served it whole (issue 32); compaction still plans each result at the cap (it
does not summarise history to make room for an output the window would cut when tight).

The default chain runs it three times. First with ``scope="newest_step"``: when the newest step
would not fit its room even with every older tool result cleared, its outputs over the cap
are cut only as far as the window is over (never below the cap), so they take the room the
older messages leave; a newest step that would fit is left to the older rules, which free
room for it to be served whole. Without that pass the older rules, which act while the
window is over, previewed and cleared every older result although no amount of freeing
there could make a 20k-token output fit an 8k window, and the cap then cut that output to a
quarter of the window: the agent read 4.7k of its 57k characters in a window a quarter
full, where a plain truncation served 21.8k (``bench/README.md``, "The newest output"). Its
cut fills the room itself, not a chunk below it (``RuleEnv.chunk_tokens``): the newest
output is rewritten on the next window whatever its size. Second, with
``scope="older_steps"``: results before the newest step are cut to the cap before any other
rule previews or clears them, as compaction plans them (a preview of a huge older log left
the room between the cap and the preview unused until the next compaction). Last, with
``scope="all"``: what is still over the cap (a newest-step result the older rules could not
make room for) is cut to the cap, a size that stays put from one window to the next, which
the prompt cache needs.

ctxcore's own processor (not in the reference); the only rule that touches the newest step.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ctxcore.messages import AnyMessage, message_text
from ctxcore.processors.base import HeadroomConfig
from ctxcore.processors.rule_processor import RuleFunctions, RuleProcessor
from ctxcore.processors.rules import HeadroomBudget, Rewrite, RuleEnv, RuleResult
from ctxcore.turns import newest_step_start

__all__ = ["ToolResultCap", "ToolResultCapConfig", "apply", "capped_text", "triggers"]

# Room for the cut note and the marker, and the slack of estimating characters per token.
_NOTE_TOKENS = 48
_FIT_ATTEMPTS = 8


class ToolResultCapConfig(HeadroomConfig):
    """Settings of ``ToolResultCap``.

    Attributes:
        max_result_ratio: the most of the window one tool result may use, in (0, 1].
        head_ratio: the share of the kept text taken from the head, in [0, 1].
        act_only_over_budget: headroom-aware mode (see the module docstring).
        scope: ``all`` results, only those of the ``newest_step`` or only the
            ``older_steps`` before it; in headroom mode a newest-step result is cut only as
            far as the window is over, to no less than the cap (see the module docstring).
    """

    max_result_ratio: float = Field(default=0.25, gt=0, le=1)
    head_ratio: float = Field(default=0.5, ge=0, le=1)
    scope: Literal["all", "newest_step", "older_steps"] = "all"


def _cap(config: ToolResultCapConfig, env: RuleEnv) -> int:
    return max(int(config.max_result_ratio * env.context_max), 1)


def _snap_head(text: str, end: int) -> int:
    """End the head at a line break when one is in its last quarter."""
    cut = text.rfind("\n", 0, end)
    return cut + 1 if cut >= end - max(end // 4, 1) and cut >= 0 else end


def _snap_tail(text: str, start: int) -> int:
    """Start the tail after a line break when one is in its first quarter."""
    span = len(text) - start
    cut = text.find("\n", start, start + max(span // 4, 1))
    return cut + 1 if cut >= 0 else start


def capped_text(text: str, keep: int, head_ratio: float, marker: str) -> str:
    """``text`` as its head and tail (``keep`` characters in all) around a note with ``marker``."""
    if keep >= len(text):
        return text
    head_end = _snap_head(text, int(keep * head_ratio))
    tail_start = _snap_tail(text, len(text) - (keep - head_end))
    cut = tail_start - head_end
    return f"{text[:head_end]}\n[... {cut} characters cut; the whole output: {marker}]\n{text[tail_start:]}"


def _newest_step_cannot_fit(messages: list[AnyMessage], first: int, env: RuleEnv) -> bool:
    """True when the newest step (from ``first``) would not fit its room even with every older
    tool result cleared: only then is it the newest output that must give way."""
    if env.tail_budget_tokens is None:
        return True
    kept = [m for m in messages[:first] if m.role != "tool"]
    return env.tail_tokens(kept + messages[first:]) > env.tail_budget_tokens


def _over(messages: list[AnyMessage], config: ToolResultCapConfig, env: RuleEnv) -> list[int]:
    cap = _cap(config, env)
    first, end = 0, len(messages)
    if config.scope == "newest_step":
        first = newest_step_start(messages)
        if config.act_only_over_budget and not _newest_step_cannot_fit(messages, first, env):
            return []
    elif config.scope == "older_steps":
        end = newest_step_start(messages)
    return [i for i in range(first, end) if messages[i].role == "tool" and env.tokens(messages[i]) > cap]


def triggers(messages: list[AnyMessage], config: ToolResultCapConfig, env: RuleEnv) -> bool:
    """True if some tool result is over the cap."""
    return bool(_over(messages, config, env))


def apply(
    messages: list[AnyMessage], config: ToolResultCapConfig, env: RuleEnv, *, force: bool = False
) -> RuleResult:
    """Cap every tool result in scope over ``max_result_ratio`` of the window (headroom mode:
    the oldest first, while the messages are over their room, a newest-step result only as
    far as they are over; ``force`` is moot)."""
    rewrite = Rewrite(messages)
    cap = _cap(config, env)
    # The newest output is rewritten on the next window whatever its size: it fills the
    # room, not a chunk below it (windows at a 150k-character output, lag 0: 0.85-0.91 of
    # the budget with the chunk, 1.00 without; bench/newest_output.py).
    budget = HeadroomBudget(messages, env, in_chunks=config.scope != "newest_step")
    for i in _over(messages, config, env):
        if config.act_only_over_budget and not budget.over:
            break
        limit = cap
        if config.act_only_over_budget and config.scope == "newest_step" and budget.limit is not None:
            limit = max(cap, env.tokens(messages[i]) - (budget.total - budget.limit))
        original = env.original(messages[i])
        text = message_text(original)
        keep = int(len(text) * max(limit - _NOTE_TOKENS, 1) / max(env.tokens(original), 1))
        markers: list[str] = []

        def render(marker: str, keep: int = keep, text: str = text, markers: list[str] = markers) -> str:
            markers.append(marker)
            return capped_text(text, keep, config.head_ratio, marker)

        if not rewrite.offload_replace(i, env, render):
            continue
        # Characters per token vary along an output: shrink until it fits, by the share it is
        # over (a fixed 15% step left a 6k-token cut up to 900 tokens short of its room).
        for _ in range(_FIT_ATTEMPTS):
            current = rewrite.current(i)
            tokens = env.tokens(current)
            if tokens <= limit or keep == 0:
                break
            ratio = (limit - _NOTE_TOKENS) / max(tokens - _NOTE_TOKENS, 1)
            keep = max(min(int(keep * ratio * 0.99), keep - 1), 0)
            content = capped_text(text, keep, config.head_ratio, markers[0])
            rewrite.replace(i, current.model_copy(update={"content": content}))
        budget.saved(messages[i], rewrite.current(i))
    return rewrite.result()


class ToolResultCap(RuleProcessor[ToolResultCapConfig]):
    """Caps each tool result at a share of the window, head and tail kept, original offloaded."""

    config_model = ToolResultCapConfig
    kind = "offloader"
    functions = RuleFunctions(triggers, apply)
