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
from collections.abc import Sequence
from dataclasses import replace

from ctxcore.config import Settings
from ctxcore.errors import BudgetExceeded, InvalidWindowError
from ctxcore.eval.accounting import CacheTracker, RawMessages, WindowCosts, parts, tools_key
from ctxcore.eval.baselines import StepsPolicy, truncate_window
from ctxcore.eval.data import Conversation, QAItem
from ctxcore.eval.policies import CountingModel, PolicySetup, make_policy
from ctxcore.eval.policy_base import Policy, message_cost, priming_tokens
from ctxcore.eval.probes import WindowText, score_probes
from ctxcore.eval.readability import readability
from ctxcore.eval.replay import Replay, conversation_tokens, score_checkpoint
from ctxcore.eval.results import CheckpointScore, ConversationResult, FinalWindow
from ctxcore.eval.scoring import (
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

__all__ = ["MATCHED_FILL", "REFERENCE_POLICY", "evaluate_conversation", "matched_fill"]

logger = logging.getLogger(__name__)

# The compacted questions of a conversation are those ``full`` compacted: one fixed set
# for every policy of the run.
REFERENCE_POLICY = "full"
# The matched-fill control: ``steps`` at each checkpoint given the tokens ``full`` served there
# as its budget (does ``full`` win by what it keeps, or lose by what it leaves unused?).
MATCHED_FILL = "steps@full-fill"


def _failure_kind(exc: Exception) -> str:
    if isinstance(exc, BudgetExceeded):
        return "budget_exceeded"
    if isinstance(exc, InvalidWindowError):
        return "invalid_window"
    return "internal"


def _replay_policy(
    replay: Replay, name: str, setup: PolicySetup
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
    replay = Replay.of(conv, step_stride, detector, counter)
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


def matched_fill(replay: Replay, reference: ConversationResult, setup: PolicySetup) -> ConversationResult:
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
