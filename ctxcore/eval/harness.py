"""The replay loop and the report: one policy over every conversation of a file.

Each conversation is appended group by group (a user message, or an assistant step with its
tool results) to a fresh policy; at the points chosen by ``window_points`` a window is taken
and scored (protocol violations, both anchors verbatim, tokens vs budget); the last window
is also scored on QA and on tool-run needles. Summariser calls go through ``CountingModel``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxcore.errors import BudgetExceeded, ConfigError
from ctxcore.eval.data import Conversation, QAItem, groups, load_conversations, window_points
from ctxcore.eval.policies import CountingModel, PolicySetup, make_policy, truncate_window
from ctxcore.eval.scoring import (
    NeedleScore,
    QATally,
    anchors_verbatim,
    evidence_texts,
    find_needles,
    score_needles,
    score_qa,
    violations,
)
from ctxcore.messages import AnyMessage
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.summarize.model import ModelClient
from ctxcore.tokens import TiktokenCounter, TokenCounter
from ctxcore.turns import DEFAULT_DETECTOR, UserDetector

__all__ = [
    "CONTROL_MARGIN",
    "ConversationResult",
    "EvalConfig",
    "evaluate_conversation",
    "evaluate_file",
]

# A policy whose control (another conversation's answers) beats truncation's by more than
# this is flagged: its windows match answers by volume of words, not by content.
CONTROL_MARGIN = 0.05
NEEDLES = ("task_anchor", "edited_paths", "last_error", "final_result")


@dataclass
class EvalConfig:
    """What to run: one policy at a fixed budget or a ratio of each conversation's size.

    ``budget_ratio`` R gives each conversation ``R x`` its total tokens (system messages,
    every message and tools, counted by ``counter``). ``model`` is the summariser
    (default ``ExtractiveModel``); ``limit`` keeps the first conversations of the file and
    ``ids`` only the named ones.
    """

    policy: str
    budget: int | None = None
    budget_ratio: float | None = None
    limit: int | None = None
    ids: Sequence[str] | None = None
    step_stride: int = 1
    keep_recent_messages: int = 4
    trigger_ratio: float = 0.9
    target_ratio: float = 0.75
    model: ModelClient | None = None
    counter: TokenCounter | None = None
    detector: UserDetector | None = None

    def __post_init__(self) -> None:
        if (self.budget is None) == (self.budget_ratio is None):
            raise ConfigError("give exactly one of budget and budget_ratio")
        if self.budget is not None and self.budget <= 0:
            raise ConfigError(f"budget must be > 0, got {self.budget}")
        if self.budget_ratio is not None and self.budget_ratio <= 0:
            raise ConfigError(f"budget_ratio must be > 0, got {self.budget_ratio}")
        if self.step_stride < 1:
            raise ConfigError(f"step_stride must be >= 1, got {self.step_stride}")


@dataclass
class ConversationResult:
    """Everything measured on one conversation."""

    id: str
    budget: int
    messages: int
    raw_tokens: int
    windows: int = 0
    budget_exceeded: int = 0
    violations: int = 0
    anchor_windows: int = 0
    over_budget_windows: int = 0
    fallback_windows: int = 0
    peak_tokens: int = 0
    final_tokens: int = 0
    stages: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    summariser_calls: int = 0
    summariser_input_tokens: int = 0
    summariser_output_tokens: int = 0
    elapsed_seconds: float = 0.0
    qa: QATally | None = None
    control: QATally | None = None
    control_truncate: QATally | None = None
    needles: NeedleScore | None = None
    series: list[tuple[int, int]] = field(default_factory=list)

    @property
    def scored_windows(self) -> int:
        """Windows actually served (``BudgetExceeded`` ones are counted apart)."""
        return self.windows - self.budget_exceeded

    @property
    def compression_ratio(self) -> float:
        """Raw tokens over final window tokens."""
        return self.raw_tokens / self.final_tokens if self.final_tokens else 0.0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record."""
        out: dict[str, Any] = {
            "id": self.id,
            "budget": self.budget,
            "messages": self.messages,
            "raw_tokens": self.raw_tokens,
            "windows": self.windows,
            "budget_exceeded": self.budget_exceeded,
            "violations": self.violations,
            "anchor_rate": round(self.anchor_windows / self.scored_windows, 4)
            if self.scored_windows
            else None,
            "over_budget_windows": self.over_budget_windows,
            "fallback_windows": self.fallback_windows,
            "peak_window_tokens": self.peak_tokens,
            "peak_budget_ratio": round(self.peak_tokens / self.budget, 4),
            "final_window_tokens": self.final_tokens,
            "compression_ratio": round(self.compression_ratio, 3),
            "stages": dict(self.stages),
            "failures": self.failures[:10],
            "summariser_calls": self.summariser_calls,
            "summariser_input_tokens": self.summariser_input_tokens,
            "summariser_output_tokens": self.summariser_output_tokens,
            "elapsed_seconds": round(self.elapsed_seconds, 3),
            "window_tokens": [list(p) for p in self.series],
        }
        if self.qa is not None:
            out["qa"] = self.qa.rates()
        if self.control is not None and self.control_truncate is not None:
            out["control"] = _control(self.control, self.control_truncate)
        if self.needles is not None:
            out["needles"] = {k: getattr(self.needles, k) for k in NEEDLES}
            if self.needles.detail:
                out["needles"]["missing"] = self.needles.detail
        return out


def _control(policy: QATally, truncate: QATally) -> dict[str, Any]:
    mine, base = policy.rates(), truncate.rates()
    out: dict[str, Any] = {
        "questions": mine["questions"],
        "answer_recall": mine["answer_recall"],
        "substring_hit_rate": mine["substring_hit_rate"],
        "truncate_answer_recall": base["answer_recall"],
        "truncate_substring_hit_rate": base["substring_hit_rate"],
    }
    # Which kinds of answer the window matches by chance (dates, for instance).
    out["by_category"] = {
        name: {
            "answer_recall": figures["answer_recall"],
            "truncate_answer_recall": base_cat.get(name, {}).get("answer_recall"),
            "substring_hit_rate": figures["substring_hit_rate"],
            "truncate_substring_hit_rate": base_cat.get(name, {}).get("substring_hit_rate"),
        }
        for base_cat in [truncate.by_category()]
        for name, figures in policy.by_category().items()
    }
    flagged = False
    for metric in ("answer_recall", "substring_hit_rate"):
        a, b = mine[metric], base[metric]
        if isinstance(a, float) and isinstance(b, float) and a - b > CONTROL_MARGIN:
            flagged = True
    out["flagged"] = flagged
    return out


def conversation_tokens(conv: Conversation, counter: TokenCounter) -> int:
    """Tokens of the whole conversation as one request (system, messages, tools)."""
    return counter.count_messages([*conv.system, *conv.messages]) + counter.count_tools(list(conv.tools))


def evaluate_conversation(
    conv: Conversation,
    policy_name: str,
    budget: int,
    *,
    model: ModelClient,
    counter: TokenCounter,
    detector: UserDetector = DEFAULT_DETECTOR,
    step_stride: int = 1,
    keep_recent_messages: int = 4,
    trigger_ratio: float = 0.9,
    target_ratio: float = 0.75,
    control_qa: Sequence[QAItem] = (),
) -> ConversationResult:
    """Replay ``conv`` through one policy and score its windows (see the module docstring)."""
    started = time.perf_counter()
    counting = CountingModel(model, counter)
    setup = PolicySetup(
        conversation_id=conv.id,
        budget=budget,
        system=list(conv.system),
        tools=list(conv.tools),
        counter=counter,
        model=counting,
        detector=detector,
        keep_recent_messages=keep_recent_messages,
        trigger_ratio=trigger_ratio,
        target_ratio=target_ratio,
    )
    policy = make_policy(policy_name, setup)
    result = ConversationResult(
        id=conv.id, budget=budget, messages=len(conv.messages), raw_tokens=conversation_tokens(conv, counter)
    )
    units = groups(conv.messages)
    points = set(window_points(units, step_stride=step_stride, detector=detector))
    history: list[AnyMessage] = []
    final: list[AnyMessage] = list(conv.system)
    stages: Counter[str] = Counter()
    for i, unit in enumerate(units):
        policy.append(unit)
        history.extend(unit)
        if i not in points:
            continue
        result.windows += 1
        try:
            served = policy.window()
        except BudgetExceeded as exc:
            result.budget_exceeded += 1
            result.failures.append(f"window {result.windows}: {exc}")
            final = list(conv.system)
            continue
        window = served.messages
        final = window
        tokens = counter.count_messages(window) + counter.count_tools(list(conv.tools))
        result.series.append((len(history), tokens))
        result.violations += violations(window)
        result.anchor_windows += int(anchors_verbatim(window, history, detector))
        result.over_budget_windows += int(tokens > budget)
        result.fallback_windows += int(served.fallback)
        result.peak_tokens = max(result.peak_tokens, tokens)
        result.final_tokens = tokens
        stages.update(served.stages)
        result.failures.extend(served.failures)
    result.stages = dict(stages)
    result.summariser_calls = counting.calls
    result.summariser_input_tokens = counting.input_tokens
    result.summariser_output_tokens = counting.output_tokens

    if conv.qa:
        result.qa = score_qa(final, conv.qa, evidence_texts(history))
    if control_qa:
        result.control = score_qa(final, control_qa)
        result.control_truncate = score_qa(truncate_window(setup, history), control_qa)
    if conv.has_tools:
        result.needles = score_needles(final, find_needles(history, detector))
    result.elapsed_seconds = time.perf_counter() - started
    return result


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(sum(present) / len(present), 4) if present else None


def aggregate(results: Sequence[ConversationResult]) -> dict[str, Any]:
    """The ``overall`` object: pooled windows and questions, needles averaged over runs."""
    scored = sum(r.scored_windows for r in results)
    final = sum(r.final_tokens for r in results)
    out: dict[str, Any] = {
        "conversations": len(results),
        "windows": sum(r.windows for r in results),
        "violations": sum(r.violations for r in results),
        "anchor_rate": round(sum(r.anchor_windows for r in results) / scored, 4) if scored else None,
        "budget_exceeded": sum(r.budget_exceeded for r in results),
        "over_budget_windows": sum(r.over_budget_windows for r in results),
        "fallback_windows": sum(r.fallback_windows for r in results),
        "compression_ratio": round(sum(r.raw_tokens for r in results) / final, 3) if final else None,
        "peak_window_tokens": max((r.peak_tokens for r in results), default=0),
        "peak_budget_ratio": round(max((r.peak_tokens / r.budget for r in results), default=0.0), 4),
        "summariser_calls": sum(r.summariser_calls for r in results),
        "summariser_input_tokens": sum(r.summariser_input_tokens for r in results),
        "summariser_output_tokens": sum(r.summariser_output_tokens for r in results),
        "failures": sum(len(r.failures) for r in results),
        "elapsed_seconds": round(sum(r.elapsed_seconds for r in results), 2),
    }
    stages: Counter[str] = Counter()
    for r in results:
        stages.update(r.stages)
    out["stages"] = dict(stages)
    with_qa = [r.qa for r in results if r.qa is not None]
    if with_qa:
        tally = QATally()
        for t in with_qa:
            tally.add(t)
        out.update(tally.rates())
    controls = [(r.control, r.control_truncate) for r in results if r.control and r.control_truncate]
    if controls:
        mine, base = QATally(), QATally()
        for a, b in controls:
            mine.add(a)
            base.add(b)
        out["control"] = _control(mine, base)
    runs = [r.needles for r in results if r.needles is not None]
    if runs:
        out["needle_retention"] = {k: _mean([getattr(n, k) for n in runs]) for k in NEEDLES}
        out["needle_retention"]["runs"] = len(runs)
        out["needle_retention"]["runs_with"] = {
            k: sum(1 for n in runs if getattr(n, k) is not None) for k in NEEDLES
        }
    return out


def evaluate_file(
    path: str | Path,
    config: EvalConfig,
    progress: Callable[[ConversationResult], None] | None = None,
) -> dict[str, Any]:
    """Evaluate ``config.policy`` on the conversations of a JSONL file; the JSON report.

    The control questions of a conversation are those of the next conversation of the file
    (cyclically), whatever ``limit`` or ``ids`` select.
    """
    counter = config.counter or TiktokenCounter()
    model = config.model or ExtractiveModel(counter)
    detector = config.detector or DEFAULT_DETECTOR
    convs = load_conversations(path)
    wanted = set(config.ids) if config.ids else None
    results: list[ConversationResult] = []
    started = time.perf_counter()
    for n, conv in enumerate(convs):
        if config.limit is not None and len(results) >= config.limit:
            break
        if wanted is not None and conv.id not in wanted:
            continue
        other = convs[(n + 1) % len(convs)] if len(convs) > 1 else None
        control = other.qa if other is not None and conv.qa and other.qa else ()
        if config.budget is not None:
            budget = config.budget
        else:
            assert config.budget_ratio is not None
            budget = max(int(conversation_tokens(conv, counter) * config.budget_ratio), 1)
        result = evaluate_conversation(
            conv,
            config.policy,
            budget,
            model=model,
            counter=counter,
            detector=detector,
            step_stride=config.step_stride,
            keep_recent_messages=config.keep_recent_messages,
            trigger_ratio=config.trigger_ratio,
            target_ratio=config.target_ratio,
            control_qa=control,
        )
        results.append(result)
        if progress is not None:
            progress(result)
    return {
        "file": str(path),
        "policy": config.policy,
        "budget": config.budget,
        "budget_ratio": config.budget_ratio,
        "settings": {
            "trigger_ratio": config.trigger_ratio,
            "target_ratio": config.target_ratio,
            "keep_recent_messages": config.keep_recent_messages,
            "step_stride": config.step_stride,
            "summariser": model.name,
            "tokenizer": getattr(counter, "encoding_name", type(counter).__name__),
        },
        "overall": aggregate(results),
        "conversations": [r.as_dict() for r in results],
        "elapsed_seconds": round(time.perf_counter() - started, 2),
    }
