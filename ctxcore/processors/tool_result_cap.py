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
oldest first and only until the messages fit their room. The default chain runs it last, so
older results are previewed, cleared or reduced first and the cap is what cuts the newest
step's output when nothing else frees enough. A cap that cut every large result whatever
the room served a 3,000-token file view at 8k as its head and tail while a plain truncation
served it whole (issue 32); compaction still plans each result at the cap (it does not
summarise history to make room for an output the window would cut when tight).

ctxcore's own processor (not in the reference); the only rule that touches the newest step.
"""

from __future__ import annotations

from pydantic import Field

from ctxcore.messages import AnyMessage, message_text
from ctxcore.processors.base import HeadroomConfig
from ctxcore.processors.rule_processor import RuleFunctions, RuleProcessor
from ctxcore.processors.rules import HeadroomBudget, Rewrite, RuleEnv, RuleResult

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
    """

    max_result_ratio: float = Field(default=0.25, gt=0, le=1)
    head_ratio: float = Field(default=0.5, ge=0, le=1)


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


def _over(messages: list[AnyMessage], config: ToolResultCapConfig, env: RuleEnv) -> list[int]:
    cap = _cap(config, env)
    return [i for i, m in enumerate(messages) if m.role == "tool" and env.tokens(m) > cap]


def triggers(messages: list[AnyMessage], config: ToolResultCapConfig, env: RuleEnv) -> bool:
    """True if some tool result is over the cap."""
    return bool(_over(messages, config, env))


def apply(
    messages: list[AnyMessage], config: ToolResultCapConfig, env: RuleEnv, *, force: bool = False
) -> RuleResult:
    """Cap every tool result over ``max_result_ratio`` of the window (headroom mode: the oldest
    first, while the messages are over their room; ``force`` is moot)."""
    rewrite = Rewrite(messages)
    cap = _cap(config, env)
    budget = HeadroomBudget(messages, env)
    for i in _over(messages, config, env):
        if config.act_only_over_budget and not budget.over:
            break
        original = env.original(messages[i])
        text = message_text(original)
        keep = int(len(text) * max(cap - _NOTE_TOKENS, 1) / max(env.tokens(original), 1))
        markers: list[str] = []

        def render(marker: str, keep: int = keep, text: str = text, markers: list[str] = markers) -> str:
            markers.append(marker)
            return capped_text(text, keep, config.head_ratio, marker)

        if not rewrite.offload_replace(i, env, render):
            continue
        # Characters per token vary along an output: shrink until it fits the cap.
        for _ in range(_FIT_ATTEMPTS):
            current = rewrite.current(i)
            if env.tokens(current) <= cap or keep == 0:
                break
            keep = int(keep * 0.85)
            content = capped_text(text, keep, config.head_ratio, markers[0])
            rewrite.replace(i, current.model_copy(update={"content": content}))
        budget.saved(messages[i], rewrite.current(i))
    return rewrite.result()


class ToolResultCap(RuleProcessor[ToolResultCapConfig]):
    """Caps each tool result at a share of the window, head and tail kept, original offloaded."""

    config_model = ToolResultCapConfig
    kind = "offloader"
    functions = RuleFunctions(triggers, apply)
