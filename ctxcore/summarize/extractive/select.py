"""Budgeted selection: which candidate lines fit a token target, and how they print.

Lines are picked greedily by value per token, where a line's value is its prior and
features plus the rarity of the words it would add that the summary does not hold yet.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import math
from collections.abc import Iterable, Sequence

from ctxcore.summarize.bare import bare_line
from ctxcore.summarize.extractive.features import ELLIPSIS, collapse, head_words, meaningful, tail_words
from ctxcore.summarize.extractive.items import Item
from ctxcore.tokens import TokenCounter

__all__ = [
    "MIN_FILL_TOKENS",
    "Budgeter",
    "Selection",
    "bullet",
    "line_key",
    "render_lines",
    "splitters",
    "spoken",
]

MIN_FILL_TOKENS = 6
# After this many candidates in a row that do not fit, the rest will not either.
_MAX_SKIPS = 400
# Value per cost**_COST_EXPONENT: below 1 so that the selection does not degrade into a
# heap of three-word fragments, close to 1 so that long low-content lines lose.
_COST_EXPONENT = 0.75
_LINE_OVERHEAD = 2


class Budgeter:
    """Token counting and trimming with one counter."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter

    def count(self, text: str) -> int:
        """Tokens of ``text``."""
        return self.counter.count_text(text)

    def fit(self, text: str, limit: int, *, head_tail: bool) -> str:
        """The longest prefix (or head + tail) of ``text`` within ``limit`` tokens."""
        if limit <= 0:
            return ""
        if self.count(text) <= limit:
            return text
        lo, hi = 0, len(text)
        best = ""
        while lo <= hi:
            mid = (lo + hi) // 2
            candidate = self._cut(text, mid, head_tail)
            if self.count(candidate) <= limit:
                best, lo = candidate, mid + 1
            else:
                hi = mid - 1
        return best

    @staticmethod
    def _cut(text: str, chars: int, head_tail: bool) -> str:
        # Cuts fall between words: an elision has whole words on both sides and a cut
        # text ends at a word end.
        if chars <= 0:
            return ""
        if not head_tail:
            return head_words(text, chars)
        head = head_words(text, (chars * 2 + 2) // 3)
        tail = tail_words(text, chars - len(head))
        if not head or not tail:
            return head or tail
        return head + ELLIPSIS + tail


def line_key(text: str) -> str:
    """What two summary lines are compared by: the text after the tag, whitespace collapsed."""
    return collapse(text).casefold()


def _lines(item: Item) -> Iterable[str]:
    prefix = f"- {item.tag}: " if item.tag else "- "
    # A multi-line message prints one tagged line per line; a line without a word
    # (blank, a rule of dashes, a code fence) is no summary line.
    for raw in item.text.splitlines():
        line = raw.strip()
        if meaningful(line):
            yield prefix + line


def bullet(item: Item) -> str:
    """The printed lines of an item, each with its source tag."""
    return "".join(f"{line}\n" for line in _lines(item))


def spoken(item: Item) -> bool:
    """True for a speaker's sentence, which may share a line with the speaker's others.
    A tool's output has no speaker: its "Result: ..." lines stay lines of their own."""
    return bool(item.speaker) and not item.tag.startswith("tool") and "\n" not in item.text


def _joins(previous: Item | None, item: Item) -> bool:
    """True when ``item`` continues the line of ``previous``: the same speaker with the
    same tag, printed right after it. Its tag and label would repeat what the line says."""
    return (
        previous is not None
        and spoken(item)
        and item.speaker == previous.speaker
        and item.tag == previous.tag
    )


def _next_to(previous: Item, item: Item) -> bool:
    """True when ``item`` is the sentence right after ``previous`` in their source."""
    return (
        not previous.trimmed and item.order[0] == previous.order[0] and item.order[1] == previous.order[1] + 1
    )


def splitters(chosen: Sequence[Item], items: Iterable[Item]) -> set[int]:
    """The ``id``s of those ``items`` that would print inside a speaker's run of ``chosen``
    (in order) without joining it: the run splits in two and both halves pay tag and label."""
    orders = [it.order for it in chosen]
    out: set[int] = set()
    for item in items:
        at = bisect.bisect_left(orders, item.order)
        if 0 < at < len(chosen):
            before, after = chosen[at - 1], chosen[at]
            if _joins(before, after) and not _joins(before, item):
                out.add(id(item))
    return out


def render_lines(items: Iterable[Item], seen: set[str] | None = None) -> list[str]:
    """The printed lines of ``items`` in order, each line once (``seen``: keys printed so far).

    Sentences of one speaker in a row share one line: a space between sentences next to
    each other in the source, an elision where the source has more between them.
    """
    seen = set() if seen is None else seen
    out: list[str] = []
    previous: Item | None = None
    for item in items:
        for line in _lines(item):
            key = line_key(line[len(f"- {item.tag}: ") if item.tag else 2 :])
            if key in seen:
                continue
            seen.add(key)
            if _joins(previous, item) and previous is not None:
                gap = " " if _next_to(previous, item) else ELLIPSIS
                out[-1] = out[-1][:-1] + gap + item.text[len(item.speaker) :].strip() + "\n"
            else:
                out.append(f"{line}\n")
            previous = item
    return out


class Selection:
    """Greedy choice of lines within a budget, valuing each word once (lazy re-scoring).

    Covering words is submodular, so a line's value only falls as others are chosen:
    a popped line whose fresh value still beats the next best in the heap is the true
    best, and the others need not be re-scored (the classic lazy greedy).
    """

    def __init__(self, idf: dict[str, float], covered: frozenset[str], budgeter: Budgeter) -> None:
        self.idf = idf
        self.covered = set(covered)
        self.budgeter = budgeter

    def value(self, item: Item) -> float:
        """What ``item`` would add now: its weight plus the rarity of its uncovered words."""
        # fsum: a set's order follows the string hash, so a plain sum rounded differently in
        # each process and broke ties differently (LoCoMo's windows changed with PYTHONHASHSEED).
        fresh = math.fsum(self.idf.get(w, 0.0) for w in item.words if w not in self.covered)
        return item.decay * (item.static + fresh)

    @staticmethod
    def cost(item: Item) -> float:
        """What ``item`` costs, sublinear in its tokens."""
        tokens = item.tokens if item.tokens >= 0 else len(item.text) / 4.0
        return float((tokens + _LINE_OVERHEAD) ** _COST_EXPONENT)

    def tokens(self, item: Item) -> int:
        """Tokens of ``item``'s printed line (counted once)."""
        if item.tokens < 0:
            item.tokens = self.budgeter.count(bullet(item))
        return item.tokens

    def _overhead(self, item: Item) -> int:
        """Tokens a line costs beyond its text: bullet, tag, newline."""
        return self.budgeter.count(f"- {item.tag}: \n" if item.tag else "- \n")

    def run(self, items: Sequence[Item], budget: int, *, fill: bool = True) -> list[Item]:
        """The chosen items (some shortened) in original order; ``fill``: the best line
        that did not fit fills what is left of the budget, shortened."""
        chosen, used = self._musts(items, budget)
        rest = [it for it in items if not it.must]
        taken, used, skipped = self._greedy(rest, budget, used)
        chosen.extend(taken)
        remaining = budget - used
        if fill and skipped is not None and remaining >= MIN_FILL_TOKENS + _LINE_OVERHEAD:
            # The best line that did not fit fills the rest of the budget, shortened.
            text = self.budgeter.fit(skipped.text, remaining - self._overhead(skipped), head_tail=False)
            # A speaker's label alone says nothing, nor does a line cut to its names
            # ("FAILED", "THOUGHT:").
            if text and text != skipped.speaker.rstrip() and not bare_line(text):
                trimmed = dataclasses.replace(skipped, text=text, words=frozenset(), tokens=-1, trimmed=True)
                if self.tokens(trimmed) <= remaining:
                    chosen.append(trimmed)
        return sorted(chosen, key=lambda it: it.order)

    def _musts(self, items: Sequence[Item], budget: int) -> tuple[list[Item], int]:
        """The items that are always kept, shortened to their share when they must be."""
        chosen: list[Item] = []
        used = 0
        for item in sorted((it for it in items if it.must), key=lambda it: (-it.static, it.order)):
            remaining = budget - used
            # The share is for the words; the line's tag comes on top.
            share = max(int(budget * item.share), MIN_FILL_TOKENS) + self._overhead(item) - _LINE_OVERHEAD
            room = min(remaining, share)
            if self.tokens(item) > room:
                # The user's own words are kept even when they must be shortened.
                text = self.budgeter.fit(item.text, room - self._overhead(item), head_tail=not item.keep_head)
                if item.keep_head:
                    text = text.rstrip(", ")
                # A list shortened to its label says nothing.
                if not text or text.endswith(":"):
                    continue
                item = dataclasses.replace(item, text=text, tokens=-1, share=1.0, trimmed=True)
            used += self.tokens(item)
            chosen.append(item)
            self.covered.update(item.words)
        return chosen, used

    def _greedy(self, items: Sequence[Item], budget: int, used: int) -> tuple[list[Item], int, Item | None]:
        """Lazy greedy by value per cost up to ``budget``; (taken, used, best item that missed)."""
        taken: list[Item] = []
        heap = [(-self.value(it) / self.cost(it), it.order, n) for n, it in enumerate(items)]
        heapq.heapify(heap)
        skipped: Item | None = None
        misses = 0
        while heap and budget - used >= MIN_FILL_TOKENS:
            _, order, n = heapq.heappop(heap)
            item = items[n]
            fresh = self.value(item) / self.cost(item)
            if heap and fresh < -heap[0][0]:
                heapq.heappush(heap, (-fresh, order, n))
                continue
            if self.tokens(item) <= budget - used:
                taken.append(item)
                used += item.tokens
                self.covered.update(item.words)
                misses = 0
                continue
            skipped = skipped or item
            misses += 1
            if misses > _MAX_SKIPS:
                break
        return taken, used, skipped
