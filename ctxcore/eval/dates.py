"""Dates in QA answers and windows, for scoring a date answer as one whole date.

A date answer ("7 May 2023", "the week before June 9, 2023", "May 2023") recalls only when
the window holds a date with the same components together (day, month and year as the
answer gives them, in one expression): scattered words ("may" in one place, "2023" in a
session header) no longer count, which is what made other conversations' answers match
by chance (the control). The rule is the scorer's own; no compressor or recall code reads it.
"""

from __future__ import annotations

import re

__all__ = ["DateParts", "dates_in"]

_MONTHS = {
    name: n
    for n, names in enumerate(
        (
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ),
        1,
    )
    for name in names
}
_MONTH = "|".join(sorted(_MONTHS, key=len, reverse=True))
_DAY = r"(?P<day>[0-3]?\d)(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>(?:19|20)\d\d)"
_PATTERNS = (
    # 7 May 2023, 7th of May, 2023, 7 May
    re.compile(rf"\b{_DAY}\s+(?:of\s+)?(?P<month>{_MONTH})\.?(?:,?\s+{_YEAR})?\b", re.IGNORECASE),
    # May 7, 2023, May 7th 2023, May 7
    re.compile(rf"\b(?P<month>{_MONTH})\.?\s+{_DAY}(?:,?\s+{_YEAR})?\b", re.IGNORECASE),
    # May 2023, May, 2023
    re.compile(rf"\b(?P<month>{_MONTH})\.?,?\s+{_YEAR}\b", re.IGNORECASE),
    # 2023-05-07
    re.compile(r"\b(?P<year>(?:19|20)\d\d)-(?P<month>[01]\d)-(?P<day>[0-3]\d)\b"),
)

DateParts = tuple[int | None, int, int | None]  # (day, month, year)


def _month(value: str) -> int | None:
    if value.isdigit():
        number = int(value)
        return number if 1 <= number <= 12 else None
    return _MONTHS.get(value.casefold().rstrip("."))


def dates_in(text: str) -> set[DateParts]:
    """Every date expression of ``text`` as (day, month, year), missing parts None."""
    found: set[DateParts] = set()
    for pattern in _PATTERNS:
        for match in pattern.finditer(text):
            parts = match.groupdict()
            month = _month(parts["month"])
            if month is None:
                continue
            day = int(parts["day"]) if parts.get("day") else None
            if day is not None and not 1 <= day <= 31:
                continue
            year = int(parts["year"]) if parts.get("year") else None
            found.add((day, month, year))
    return found


def whole_date_match(answer: set[DateParts], window: set[DateParts]) -> bool:
    """True when every date of the answer is in the window with the same given parts together."""
    return all(
        any(
            w[1] == a[1] and (a[0] is None or w[0] == a[0]) and (a[2] is None or w[2] == a[2]) for w in window
        )
        for a in answer
    )
