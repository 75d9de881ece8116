"""The replay loop: several policies over every conversation of a file, side by side.

Each conversation is appended group by group (a user message, or an assistant step with its
tool results) to a fresh instance of each policy; at the points chosen by ``window_points``
a window is taken and scored: protocol violations, both anchors verbatim, tokens (messages
and the tools sent, ctxcore's own included) vs budget, and the probes of the raw run so far.
The last window is also scored on QA. A window that raises stays in every denominator and
scores 0; its kind is counted in the conversation's failure row. Summariser calls go
through a ``CountingModel`` per policy.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ctxcore.config import Settings
from ctxcore.errors import BudgetExceeded, InvalidWindowError
from ctxcore.eval.accounting import CacheTracker, RawMessages, WindowCosts, parts, tools_key
from ctxcore.eval.baselines import StepsPolicy, truncate_window
from ctxcore.eval.data import Conversation, QAItem, groups, window_points
from ctxcore.eval.policies import CountingModel, PolicySetup, make_policy
from ctxcore.eval.policy_base import Policy, message_cost, priming_tokens
from ctxcore.eval.probes import Probes, ProbeTracker, WindowText, score_probes
from ctxcore.eval.readability import readability
from ctxcore.eval.references import Checkpoint, checkpoints, held, window_text
from ctxcore.eval.scoring import (
    QATally,
    anchors_verbatim,
    compacted_questions,
    evidence_texts,
    score_qa,
    score_qa_asking,
    violations,
)
from ctxcore.messages import AnyMessage
from ctxcore.summarize.model import ModelClient
from ctxcore.tokens import TokenCounter
from ctxcore.turns import DEFAULT_DETECTOR, UserDetector, anchors

__all__ = [
    "MATCHED_FILL",
    "REFERENCE_POLICY",
    "CheckpointScore",
    "ConversationResult",
    "FinalWindow",
    "conversation_tokens",
    "evaluate_conversation",
]

logger = logging.getLogger(__name__)

# The compacted questions of a conversation are those ``full`` compacted: one fixed set
# for every policy of the run.
REFERENCE_POLICY = "full"
# The matched-fill control: ``steps`` at each checkpoint given the tokens ``full`` served there
# as its budget (does ``full`` win by what it keeps, or lose by what it leaves unused?).
MATCHED_FILL = "steps@full-fill"


@dataclass
class CheckpointScore:
    """One checkpoint's window under one policy: the references it holds (``hits``, in the
    order of ``checkpoint.references``), its tokens (None: the window raised), and whether the
    run up to there is over the budget by at least its newest step (``pressed``: the window
    must leave something out)."""

    checkpoint: Checkpoint
    hits: tuple[bool, ...]
    tokens: int | None
    budget: int
    pressed: bool

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record: the references held and missed by kind."""
        refs = self.checkpoint.references
        return {
            "share": self.checkpoint.share,
            "message": self.checkpoint.index,
            "references": len(refs),
            "held": sum(self.hits),
            "missed": [r.text for r, hit in zip(refs, self.hits, strict=True) if not hit][:20],
            "fill": None if self.tokens is None else round(self.tokens / self.budget, 4),
        }


@dataclass
class FinalWindow:
    """The last window of a replay as it would be sent (empty with ``error`` when it raised)."""

    messages: list[AnyMessage] = field(default_factory=list)
    tools: list[Mapping[str, Any]] = field(default_factory=list)
    tokens: int = 0
    error: str | None = None


@dataclass
class ConversationResult:
    """Everything measured on one conversation under one policy."""

    id: str
    policy: str
    budget: int
    messages: int
    raw_tokens: int
    reference: bool = False
    windows: int = 0
    failed: int = 0
    failure_kinds: Counter[str] = field(default_factory=Counter)
    violations: int = 0
    anchor_windows: int = 0
    over_budget_windows: int = 0
    fallback_windows: int = 0
    peak_tokens: int = 0
    final_tokens: int = 0
    stages: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    stage_failures: int = 0
    summariser_calls: int = 0
    summariser_input_tokens: int = 0
    summariser_output_tokens: int = 0
    elapsed_seconds: float = 0.0
    qa: QATally | None = None
    control: QATally | None = None
    control_truncate: QATally | None = None
    # The fixed compacted set scored on the final window plus one recall-tool call with the
    # question (policies with the tool only): what the agent can find by asking.
    qa_tool: QATally | None = None
    # The control asked the same way: other conversations' questions put to this one's tool.
    control_tool: QATally | None = None
    probes_final: dict[str, float] = field(default_factory=dict)
    probes_windows: dict[str, float] = field(default_factory=dict)
    malformed_calls: int = 0
    recall_windows: int = 0
    recall_passages: int = 0
    recall_tokens: int = 0
    recall_query_ms: list[float] = field(default_factory=list)
    series: list[tuple[int, int]] = field(default_factory=list)
    final: FinalWindow = field(default_factory=FinalWindow)
    # Summary lines of the final window's blocks (``ctxcore.eval.readability``).
    readability: dict[str, int] = field(default_factory=dict)
    checkpoints: list[CheckpointScore] = field(default_factory=list)
    # Tokens of each part of the budget summed over the served windows that had to leave
    # something out (``accounting.PARTS``; ``_Replay.pressed``), and how many there were.
    parts: Counter[str] = field(default_factory=Counter)
    pressed_windows: int = 0
    # Input tokens of every served window, and how many of them repeat the previous window's
    # leading messages exactly (what a prefix cache serves).
    input_tokens: int = 0
    cached_tokens: int = 0

    @property
    def budget_exceeded(self) -> int:
        """Windows that raised ``BudgetExceeded``."""
        return self.failure_kinds.get("budget_exceeded", 0)

    @property
    def anchor_rate(self) -> float | None:
        """Windows with both anchors verbatim, over every window (failed ones included)."""
        return round(self.anchor_windows / self.windows, 4) if self.windows else None

    @property
    def compression_ratio(self) -> float:
        """Raw tokens over final window tokens."""
        return self.raw_tokens / self.final_tokens if self.final_tokens else 0.0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record."""
        out: dict[str, Any] = {
            "id": self.id,
            "policy": self.policy,
            "budget": self.budget,
            "messages": self.messages,
            "raw_tokens": self.raw_tokens,
            "windows": self.windows,
            "failed": self.failed,
            "failure_row": dict(self.failure_kinds),
            "budget_exceeded": self.budget_exceeded,
            "violations": self.violations,
            "anchor_rate": self.anchor_rate,
            "over_budget_windows": None if self.reference else self.over_budget_windows,
            "fallback_windows": self.fallback_windows,
            "peak_window_tokens": self.peak_tokens,
            "peak_budget_ratio": round(self.peak_tokens / self.budget, 4),
            "final_window_tokens": self.final_tokens,
            "budget_use": round(self.final_tokens / self.budget, 4),
            "compression_ratio": round(self.compression_ratio, 3),
            "stages": dict(self.stages),
            "failures": self.failures[:10],
            "stage_failures": self.stage_failures,
            "summariser_calls": self.summariser_calls,
            "summariser_input_tokens": self.summariser_input_tokens,
            "summariser_output_tokens": self.summariser_output_tokens,
            "elapsed_seconds": round(self.elapsed_seconds, 3),
            "window_tokens": [list(p) for p in self.series],
        }
        if self.qa is not None:
            out["qa"] = self.qa.rates()
        if self.recall_query_ms:
            out["recall"] = {
                "windows": self.recall_windows,
                "passages": self.recall_passages,
                "tokens": self.recall_tokens,
            }
        if self.probes_final or self.probes_windows:
            out["probes"] = {
                name: {"final": round(self.probes_final[name], 4), "windows": self.probes_windows.get(name)}
                for name in self.probes_final
            }
            out["malformed_calls"] = self.malformed_calls
        if self.readability:
            out["readability"] = dict(self.readability)
        if self.checkpoints:
            out["checkpoints"] = [c.as_dict() for c in self.checkpoints]
        out["window_input_tokens"] = self.input_tokens
        out["cached_tokens"] = self.cached_tokens
        out["parts"] = dict(self.parts)
        out["pressed_windows"] = self.pressed_windows
        return out


def conversation_tokens(conv: Conversation, counter: TokenCounter) -> int:
    """Tokens of the whole conversation as one request (system, messages, tools)."""
    return counter.count_messages([*conv.system, *conv.messages]) + counter.count_tools(list(conv.tools))


@dataclass
class _Replay:
    """A conversation cut into the groups and window points every policy replays."""

    conv: Conversation
    units: list[list[AnyMessage]]
    points: list[int]
    # Probes of the raw run up to each window point (empty for a run without tools).
    probes: dict[int, Probes]
    # The checkpoints, by the group after which their window is taken.
    checkpoints: dict[int, Checkpoint]
    # The raw run's tokens up to each group (system and tools included) and each group's own.
    raw_tokens: list[int]
    unit_tokens: list[int]

    @classmethod
    def of(
        cls, conv: Conversation, step_stride: int, detector: UserDetector, counter: TokenCounter
    ) -> _Replay:
        units = groups(conv.messages)
        points = window_points(units, step_stride=step_stride, detector=detector)
        priming = priming_tokens(counter)
        unit_tokens = [sum(message_cost(counter, m, priming) for m in unit) for unit in units]
        total = counter.count_messages(list(conv.system)) + counter.count_tools(list(conv.tools))
        total += 0 if conv.system else priming
        raw_tokens: list[int] = []
        starts: dict[int, int] = {}
        at = 0
        for i, unit in enumerate(units):
            starts[at] = i
            at += len(unit)
            total += unit_tokens[i]
            raw_tokens.append(total)
        found: dict[int, Checkpoint] = {}
        for checkpoint in checkpoints(conv.messages, conv.system):
            at_unit = starts[checkpoint.index]
            if at_unit > 0:  # with nothing before it no window is asked for
                found[at_unit - 1] = checkpoint
        # The agent asks for a window before every model call: a checkpoint's is taken
        # whatever the stride.
        points = sorted({*points, *found})
        probes: dict[int, Probes] = {}
        if conv.has_tools:
            tracker = ProbeTracker()
            wanted = set(points)
            for i, unit in enumerate(units):
                for message in unit:
                    tracker.add(message)
                if i in wanted:
                    probes[i] = tracker.snapshot()
        return cls(conv, units, points, probes, found, raw_tokens, unit_tokens)

    def pressed(self, unit: int, budget: int) -> bool:
        """The run up to ``unit`` exceeds ``budget`` by at least its newest group: a window
        there must leave something out."""
        return self.raw_tokens[unit] >= budget + self.unit_tokens[unit]


def score_checkpoint(
    checkpoint: Checkpoint, window: Sequence[AnyMessage], tokens: int, budget: int, pressed: bool
) -> CheckpointScore:
    """Which of the checkpoint's references ``window`` holds."""
    text = window_text(window)
    hits = tuple(held(r, text) for r in checkpoint.references)
    return CheckpointScore(checkpoint, hits, tokens, budget, pressed)


def _failure_kind(exc: Exception) -> str:
    if isinstance(exc, BudgetExceeded):
        return "budget_exceeded"
    if isinstance(exc, InvalidWindowError):
        return "invalid_window"
    return "internal"


def _replay_policy(
    replay: _Replay, name: str, setup: PolicySetup
) -> tuple[ConversationResult, list[AnyMessage], Policy]:
    """One policy over one conversation; the result and the history at the end."""
    conv = replay.conv
    counter = setup.counter
    policy = make_policy(name, setup)
    result = ConversationResult(
        id=conv.id,
        policy=name,
        budget=setup.budget,
        messages=len(conv.messages),
        raw_tokens=conversation_tokens(conv, counter),
        reference=policy.reference,
    )
    points = set(replay.points)
    history: list[AnyMessage] = []
    stages: Counter[str] = Counter()
    window_scores: dict[str, list[float]] = {}
    raw = RawMessages()
    cache = CacheTracker()
    priming = priming_tokens(counter)
    for i, unit in enumerate(replay.units):
        policy.append(unit)
        history.extend(unit)
        raw.add(unit)
        if i not in points:
            continue
        result.windows += 1
        probes = replay.probes.get(i)
        checkpoint = replay.checkpoints.get(i)
        pressed = replay.pressed(i, setup.budget)
        try:
            served = policy.window()
        except Exception as exc:  # every failure is a row of the report, never a skipped window
            kind = _failure_kind(exc)
            if kind != "budget_exceeded":
                logger.exception("%s on %s: window %d raised", name, conv.id, result.windows)
            result.failed += 1
            result.failure_kinds[kind] += 1
            result.failures.append(f"window {result.windows}: {kind}: {type(exc).__name__}: {exc}")
            result.final = FinalWindow(error=f"{kind}: {type(exc).__name__}: {exc}")
            result.final_tokens = 0
            if probes is not None:
                for probe, score in score_probes(None, probes).items():
                    window_scores.setdefault(probe, []).append(score)
            if checkpoint is not None:
                misses = (False,) * len(checkpoint.references)
                result.checkpoints.append(CheckpointScore(checkpoint, misses, None, setup.budget, pressed))
            continue
        window = served.messages
        tools_tokens = counter.count_tools(list(served.tools))
        tokens = counter.count_messages(window) + tools_tokens
        costs = WindowCosts(
            window,
            [message_cost(counter, m, priming) for m in window],
            tools_tokens,
            tokens,
            tools_key(served.tools),
        )
        if pressed:
            raw.set_anchors(history[k] for k in anchors(history, setup.detector).indices())
            result.parts.update(parts(costs, raw, setup.budget))
            result.pressed_windows += 1
        result.input_tokens += tokens
        result.cached_tokens += cache.shared(costs)
        if checkpoint is not None:
            result.checkpoints.append(score_checkpoint(checkpoint, window, tokens, setup.budget, pressed))
        result.final = FinalWindow(window, list(served.tools), tokens)
        result.series.append((len(history), tokens))
        result.violations += violations(window)
        result.anchor_windows += int(anchors_verbatim(window, history, setup.detector))
        result.over_budget_windows += int(tokens > setup.budget)
        result.fallback_windows += int(served.fallback)
        result.peak_tokens = max(result.peak_tokens, tokens)
        result.final_tokens = tokens
        stages.update(served.stages)
        if served.recall is not None:
            result.recall_query_ms.append(served.recall.query_ms)
            if served.recall.passages:
                result.recall_windows += 1
                result.recall_passages += served.recall.passages
                result.recall_tokens += served.recall.tokens
        result.failures.extend(served.failures)
        result.stage_failures += len(served.failures)
        if probes is not None:
            for probe, score in score_probes(WindowText(window), probes).items():
                window_scores.setdefault(probe, []).append(score)
    result.stages = dict(stages)
    if replay.probes:
        last = replay.probes[replay.points[-1]]
        final_text = WindowText(result.final.messages) if result.final.error is None else None
        result.probes_final = score_probes(final_text, last)
        result.probes_windows = {k: round(sum(v) / len(v), 4) for k, v in window_scores.items() if v}
        result.malformed_calls = last.malformed_calls
    return result, history, policy


def evaluate_conversation(
    conv: Conversation,
    policies: Sequence[str],
    budget: int,
    *,
    model: ModelClient,
    counter: TokenCounter,
    detector: UserDetector = DEFAULT_DETECTOR,
    step_stride: int = 1,
    settings: Settings | None = None,
    lag: int = 0,
    control_qa: Sequence[QAItem] = (),
) -> dict[str, ConversationResult]:
    """Replay ``conv`` through each policy and score its windows (see the module docstring).

    With QA, ``full`` is replayed first (listed or not): its final window fixes the
    compacted questions every policy is scored on. ``settings`` are the service's (the
    ``Settings()`` defaults when None); ``lag`` delays ``full``'s compactions by that many
    windows. When ``full`` and ``steps`` both run, the result also holds ``MATCHED_FILL``:
    ``steps`` at each checkpoint within the tokens ``full`` served there.
    """
    settings = settings or Settings()
    replay = _Replay.of(conv, step_stride, detector, counter)
    order = list(dict.fromkeys(policies))
    if conv.qa and REFERENCE_POLICY not in order:
        order.insert(0, REFERENCE_POLICY)
    elif conv.qa:
        order.remove(REFERENCE_POLICY)
        order.insert(0, REFERENCE_POLICY)
    results: dict[str, ConversationResult] = {}
    compacted: frozenset[int] = frozenset()
    for name in order:
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
            settings=settings,
            lag=lag,
        )
        result, history, policy = _replay_policy(replay, name, setup)
        result.summariser_calls = counting.calls
        result.summariser_input_tokens = counting.input_tokens
        result.summariser_output_tokens = counting.output_tokens
        final = result.final.messages or list(conv.system)
        result.readability = readability(result.final.messages, history).as_dict()
        if conv.qa:
            if name == REFERENCE_POLICY:
                compacted = compacted_questions(final, conv.qa, evidence_texts(history))
            result.qa = score_qa(final, conv.qa, compacted)
            if result.final.error is None and policy.offers_recall:
                asked = {n: policy.tool_recall(conv.qa[n].question) for n in compacted}
                result.qa_tool = score_qa_asking(final, conv.qa, compacted, asked)
        if control_qa:
            result.control = score_qa(final, control_qa)
            result.control_truncate = score_qa(truncate_window(setup, history), control_qa)
            if result.final.error is None and policy.offers_recall:
                every = [n for n, item in enumerate(control_qa) if item.answerable]
                asked_control = {n: policy.tool_recall(control_qa[n].question) for n in every}
                result.control_tool = score_qa_asking(final, control_qa, every, asked_control)
        result.elapsed_seconds = time.perf_counter() - started
        results[name] = result
    ordered = {name: results[name] for name in dict.fromkeys(policies)}
    if REFERENCE_POLICY in ordered and "steps" in ordered:
        ordered[MATCHED_FILL] = matched_fill(replay, ordered[REFERENCE_POLICY], setup)
    return ordered


def matched_fill(replay: _Replay, reference: ConversationResult, setup: PolicySetup) -> ConversationResult:
    """``steps`` (filling its room) at each checkpoint, given the tokens ``reference`` served
    there as its budget; a checkpoint where ``reference`` failed is failed here too."""
    conv = replay.conv
    result = ConversationResult(
        id=conv.id,
        policy=MATCHED_FILL,
        budget=setup.budget,
        messages=len(conv.messages),
        raw_tokens=reference.raw_tokens,
    )
    served = {c.checkpoint.index: c.tokens for c in reference.checkpoints}
    history: list[AnyMessage] = []
    for i, unit in enumerate(replay.units):
        history.extend(unit)
        cp = replay.checkpoints.get(i)
        if cp is None:
            continue
        tokens = served.get(cp.index)
        pressed = replay.pressed(i, setup.budget)
        result.windows += 1
        if tokens is None:
            result.failed += 1
            result.checkpoints.append(
                CheckpointScore(cp, (False,) * len(cp.references), None, setup.budget, pressed)
            )
            continue
        policy = StepsPolicy(replace(setup, budget=tokens))
        policy.fill = True
        policy.append(history)
        window = policy.window()
        used = setup.counter.count_messages(window.messages) + setup.counter.count_tools(list(window.tools))
        result.checkpoints.append(score_checkpoint(cp, window.messages, used, setup.budget, pressed))
    return result
