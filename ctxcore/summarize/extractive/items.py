"""The extractive summariser's candidate line (``Item``), its priors and the state lines'
labels, shared by extraction and selection."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

__all__ = ["BASE_SCORE", "Item", "user_key"]

# Prior value of a line by what it is; the words it covers and its features add to it.
BASE_SCORE: Final = MappingProxyType(
    {
        "request": 8.0,
        "constraint": 12.0,
        "error": 10.0,
        "file": 15.0,
        "tool": 6.0,
        "pending": 6.0,
        "decision": 6.0,
        "work": 2.0,
        "fact": 3.0,
        "paths": 2.0,
        "other": 1.0,
        # A sentence of a dialogue: no prior at all, it is worth what it says.
        "chat": 0.0,
    }
)


@dataclass
class Item:
    """A candidate line: where it came from, what it is and what it is worth.

    ``static`` is its prior plus its features; ``words`` the content words it would add
    to the summary (each worth its rarity in the source, once); ``decay`` discounts a
    dialogue question.
    """

    order: tuple[int, int]
    category: str
    text: str
    static: float
    key: str
    words: frozenset[str] = frozenset()
    must: bool = False
    # For anchors: the largest share of the budget they may take whole.
    share: float = 1.0
    decay: float = 1.0
    tokens: int = field(default=-1, compare=False)
    # Who wrote what the line says: ``user``, ``assistant`` or ``tool <name>`` ("" unknown).
    tag: str = ""
    # For a line of an earlier summary: the section heading it sat under.
    section: str = ""
    # Shortened from its end only, never head and tail: an error line's start names the
    # error, and a list (newest first) loses its oldest entries.
    keep_head: bool = False
    # For a dialogue sentence: the "Name: " label it opens with (``text`` starts with it).
    # Sentences of one speaker that print one after another share a line and its label.
    speaker: str = ""
    # Shortened: the words after ``text`` in its source are left out.
    trimmed: bool = False

    @property
    def weight(self) -> float:
        """The line's value without coverage, used to drop the weakest line first."""
        return self.static * self.decay


def user_key(text: str) -> str:
    """The deduplication key of a user message."""
    # Harness messages repeat word for word (format reminders); one copy is enough.
    return "user:" + " ".join(text.split()).casefold()
