"""The simulated agent of ``bench/turn_latency.py``: LoCoMo conversations as a script of turns,
replayed against one system's append and window, with the latencies and answer recall it
records."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ctxcore.eval.data import Conversation, QAItem, load_conversations
from ctxcore.eval.scoring import QATally, compacted_questions, evidence_texts, score_qa
from ctxcore.messages import AnyMessage, message_text
from ctxcore.tokens import TiktokenCounter
from ctxcore.turns import DEFAULT_DETECTOR


@dataclass
class Turn:
    """What the agent appends before asking for a window, and the reply it appends after."""

    user: list[AnyMessage]
    reply: list[AnyMessage]


@dataclass
class Script:
    """Turns to replay and the questions whose evidence they contain."""

    turns: list[Turn]
    questions: list[tuple[list[QAItem], dict[str, str]]]
    conversations: list[str]


def build_script(path: Path, turns: int) -> Script:
    """LoCoMo conversations in file order, cut after ``turns`` real user turns."""
    out: list[Turn] = []
    questions: list[tuple[list[QAItem], dict[str, str]]] = []
    used: list[str] = []
    for conv in load_conversations(path):
        if len(out) >= turns:
            break
        messages = _with_date_line(conv)
        replayed: list[AnyMessage] = []
        for message in messages:
            if DEFAULT_DETECTOR.is_real(message):
                if len(out) >= turns:
                    break
                out.append(Turn([message], []))
            elif out:
                out[-1].reply.append(message)
            else:
                out.append(Turn([], [message]))
            replayed.append(message)
        evidence = evidence_texts(replayed)
        kept = [q for q in conv.qa if q.answerable and q.evidence and all(e in evidence for e in q.evidence)]
        questions.append((kept, evidence))
        used.append(conv.id)
    return Script(out, questions, used)


def _with_date_line(conv: Conversation) -> list[AnyMessage]:
    messages = list(conv.messages)
    date = " ".join(message_text(m) for m in conv.system)
    if date and messages:
        first = messages[0]
        messages[0] = first.model_copy(update={"content": f"{date}\n{message_text(first)}"})
    return messages


@dataclass
class Result:
    """One system's run."""

    name: str
    latencies_ms: list[float] = field(default_factory=list)
    fallbacks: int = 0
    summariser_calls: int = 0
    final_window: list[AnyMessage] = field(default_factory=list)
    final_tokens: int = 0
    over_budget: int = 0
    seconds: float = 0.0
    note: str = ""
    qa: QATally = field(default_factory=QATally)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    index = min(round(q * (len(ordered) - 1)), len(ordered) - 1)
    return ordered[index]


def replay(
    script: Script,
    agent_delay: float,
    append: Callable[[list[AnyMessage]], None],
    window: Callable[[], tuple[list[AnyMessage], bool]],
    result: Result,
    counter: TiktokenCounter,
    budget: int,
) -> None:
    started = time.perf_counter()
    for turn in script.turns:
        if turn.user:
            append(turn.user)
        t0 = time.perf_counter()
        messages, fallback = window()
        result.latencies_ms.append((time.perf_counter() - t0) * 1000)
        result.fallbacks += int(fallback)
        result.over_budget += int(counter.count_messages(messages) > budget)
        if agent_delay:
            time.sleep(agent_delay)
        if turn.reply:
            append(turn.reply)
    messages, _ = window()
    result.final_window = messages
    result.final_tokens = counter.count_messages(messages)
    result.seconds = time.perf_counter() - started
    for questions, evidence in script.questions:
        # Compacted by this system's own final window (the bench compares systems, not a run).
        result.qa.add(score_qa(messages, questions, compacted_questions(messages, questions, evidence)))
