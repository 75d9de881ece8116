"""What a window is scored on: protocol, anchors and QA answers (tool runs: ``probes``).

All functions are pure; every rate is in [0, 1].

QA (LoCoMo-style ``qa``): the gold answer and the window text are normalised the same way
(NFKC, case-folded, runs of anything but letters and digits become one space). The
*substring hit* asks for the whole normalised answer between word boundaries; *answer
recall* is the share of the answer's distinct content words (stopwords removed, all words
when nothing else is left) found among the window's words; a date answer recalls only as
one whole date (its day, month and year together in one date of the window: ``dates``). A question is *compacted* when
none of its evidence messages is verbatim (as a message of the same text) in the final
window of ``full`` at the same budget: one fixed set of questions for every policy of a run,
so policies are compared on the same questions.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ctxcore.eval.data import QAItem
from ctxcore.eval.dates import DateParts, dates_in, whole_date_match
from ctxcore.messages import AnyMessage, AssistantMessage, message_text
from ctxcore.turns import UserDetector, anchors
from ctxcore.window import check_window

__all__ = [
    "QATally",
    "anchors_verbatim",
    "compacted_questions",
    "content_words",
    "normalise",
    "score_qa",
    "score_qa_asking",
    "window_text",
]

_WORDS = re.compile(r"[^\W_]+")
# Function words that carry no answer: "the", "in", "of" match any window.
_STOPWORD_TEXT = "a an the of and or to in on at for with by from is was were are be been it its this that as"
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())


def normalise_words(text: str) -> list[str]:
    """Case-folded words (letters and digits) of ``text``, NFKC-normalised."""
    return _WORDS.findall(unicodedata.normalize("NFKC", text).casefold())


def normalise(text: str) -> str:
    """The words of ``text`` joined by single spaces (see ``normalise_words``)."""
    return " ".join(normalise_words(text))


def content_words(answer: str) -> frozenset[str]:
    """The answer's distinct content words; all its words when only stopwords are left."""
    words = normalise_words(answer)
    content = [w for w in words if w not in _STOPWORDS]
    return frozenset(content or words)


def window_text(messages: Sequence[AnyMessage]) -> str:
    """Everything a model would read in a window: message texts and tool-call arguments."""
    parts: list[str] = []
    for message in messages:
        parts.append(message_text(message))
        if isinstance(message, AssistantMessage):
            parts.extend(f"{call.name} {call.arguments}" for call in message.tool_calls)
    return "\n".join(parts)


def anchors_verbatim(
    window: Sequence[AnyMessage], history: Sequence[AnyMessage], detector: UserDetector
) -> bool:
    """True when both anchors of ``history`` are messages of ``window``, unchanged."""
    found = anchors(history, detector)
    for index in found.indices():
        anchor = history[index]
        if not any(anchor.role == m.role and anchor.content == m.content for m in window):
            return False
    return True


def violations(window: Sequence[AnyMessage]) -> int:
    """Number of ``check_window`` violations of a window."""
    return len(check_window(window))


# --- QA -------------------------------------------------------------------------------------


@dataclass
class QATally:
    """Sums over questions: hits and recall overall and for compacted questions."""

    questions: int = 0
    hits: int = 0
    recall: float = 0.0
    compacted: int = 0
    compacted_hits: int = 0
    compacted_recall: float = 0.0
    # Per question category: [questions, hits, recall sum].
    categories: dict[str, list[float]] = field(default_factory=dict)

    @classmethod
    def pooled(cls, tallies: Iterable[QATally]) -> QATally:
        """One tally of all of ``tallies``."""
        out = cls()
        for tally in tallies:
            out.add(tally)
        return out

    def add(self, other: QATally) -> None:
        """Pool another tally into this one."""
        self.questions += other.questions
        self.hits += other.hits
        self.recall += other.recall
        self.compacted += other.compacted
        self.compacted_hits += other.compacted_hits
        self.compacted_recall += other.compacted_recall
        for name, (n, hits, recall) in other.categories.items():
            mine = self.categories.setdefault(name, [0, 0, 0.0])
            mine[0] += n
            mine[1] += hits
            mine[2] += recall

    def by_category(self) -> dict[str, dict[str, float | int | None]]:
        """Hit rate and recall per question category."""
        return {
            name: {
                "questions": int(n),
                "substring_hit_rate": _ratio(hits, int(n)),
                "answer_recall": _ratio(recall, int(n)),
            }
            for name, (n, hits, recall) in sorted(self.categories.items())
        }

    def rates(self) -> dict[str, float | int | None]:
        """Hit rate and recall, overall and compacted (None where no question counts)."""
        return {
            "questions": self.questions,
            "substring_hit_rate": _ratio(self.hits, self.questions),
            "answer_recall": _ratio(self.recall, self.questions),
            "compacted_questions": self.compacted,
            "compacted_substring_hit_rate": _ratio(self.compacted_hits, self.compacted),
            "compacted_answer_recall": _ratio(self.compacted_recall, self.compacted),
        }


def _ratio(num: float, den: int) -> float | None:
    return round(num / den, 4) if den else None


def score_qa_asking(
    window: Sequence[AnyMessage],
    questions: Sequence[QAItem],
    compacted: Collection[int],
    asked: Mapping[int, Sequence[AnyMessage]],
) -> QATally:
    """The compacted questions, each scored on ``window`` plus what asking it added
    (``asked[n]``: a tool call and its result), pooled like ``score_qa``'s compacted set."""
    tally = QATally()
    for n in sorted(compacted):
        item = questions[n]
        if not item.answerable:
            continue
        hit, recall = _WindowIndex([*window, *asked.get(n, ())]).score(item.answer)
        tally.questions += 1
        tally.hits += int(hit)
        tally.recall += recall
        tally.compacted += 1
        tally.compacted_hits += int(hit)
        tally.compacted_recall += recall
    return tally


class _WindowIndex:
    """A window's normalised text and word set, built once for many questions."""

    def __init__(self, messages: Sequence[AnyMessage]) -> None:
        text = window_text(messages)
        words = normalise_words(text)
        self.padded = f" {' '.join(words)} "
        self.words = frozenset(words)
        self._text = text
        self._dates: set[DateParts] | None = None

    def score(self, answer: str) -> tuple[bool, float]:
        norm = normalise(answer)
        wanted = content_words(answer)
        if not norm or not wanted:
            return False, 0.0
        hit = f" {norm} " in self.padded
        answer_dates = dates_in(answer)
        if answer_dates:
            # A date answer recalls only as a whole date (see ``ctxcore.eval.dates``).
            if self._dates is None:
                self._dates = dates_in(self._text)
            return hit, float(whole_date_match(answer_dates, self._dates))
        return hit, len(wanted & self.words) / len(wanted)


def evidence_texts(history: Sequence[AnyMessage]) -> dict[str, str]:
    """Source message id (``metadata["extra"]["msg_id"]``) -> message text."""
    out: dict[str, str] = {}
    for message in history:
        extra = message.metadata.get("extra")
        if isinstance(extra, Mapping) and isinstance(extra.get("msg_id"), str):
            out[extra["msg_id"]] = message_text(message)
    return out


def compacted_questions(
    window: Sequence[AnyMessage], questions: Sequence[QAItem], evidence: Mapping[str, str]
) -> frozenset[int]:
    """Indices of the answerable ``questions`` with evidence none of which is verbatim in
    ``window`` (the reference window: ``full``'s final one at the same budget)."""
    texts = frozenset(message_text(m) for m in window)
    out: set[int] = set()
    for n, item in enumerate(questions):
        if not item.answerable:
            continue
        found = [evidence[e] for e in item.evidence if e in evidence]
        if found and not any(t in texts for t in found):
            out.add(n)
    return frozenset(out)


def score_qa(
    window: Sequence[AnyMessage],
    questions: Sequence[QAItem],
    compacted: Collection[int] = (),
) -> QATally:
    """Pooled QA figures of the answerable ``questions`` on ``window``; ``compacted`` are the
    indices of the fixed compacted set (see ``compacted_questions``), pooled apart too."""
    index = _WindowIndex(window)
    tally = QATally()
    for n, item in enumerate(questions):
        if not item.answerable:
            continue
        hit, recall = index.score(item.answer)
        tally.questions += 1
        tally.hits += int(hit)
        tally.recall += recall
        per = tally.categories.setdefault(item.category or "-", [0, 0, 0.0])
        per[0] += 1
        per[1] += int(hit)
        per[2] += recall
        if n in compacted:
            tally.compacted += 1
            tally.compacted_hits += int(hit)
            tally.compacted_recall += recall
    return tally
