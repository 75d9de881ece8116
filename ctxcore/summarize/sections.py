"""Block summaries with the contract's sections, whatever the model wrote.

A model asked for ``## <title>`` headings may drop one, reorder them or write none at all.
``conform_sections`` rebuilds the summary with every heading in contract order: a missing
one gets ``(none)``, text before the first known heading stays in front. Nothing the
model wrote is dropped, so a reply without headings is accepted as it is (and logged).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

__all__ = ["conform_sections", "render_sections", "skeleton", "split_sections"]

logger = logging.getLogger(__name__)

_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$")
_NONE = "(none)"


def split_sections(text: str, sections: Sequence[str]) -> tuple[list[str], dict[str, list[str]], list[str]]:
    """``(lead, lines by section, titles found)`` of a summary: the non-blank lines before
    the first known heading, then each known section's lines (``(none)`` left out)."""
    titles = {title.casefold(): title for title in sections}
    lead: list[str] = []
    bodies: dict[str, list[str]] = {title: [] for title in sections}
    found: list[str] = []
    current: list[str] = lead
    for line in text.splitlines():
        heading = _HEADING.match(line)
        title = titles.get(heading.group(1).strip().rstrip(":").casefold()) if heading else None
        if title is not None:
            current = bodies[title]
            found.append(title)
            continue
        if line.strip() and line.strip().casefold() != _NONE:
            current.append(line.rstrip())
    return lead, bodies, found


def render_sections(lead: Sequence[str], bodies: dict[str, list[str]], sections: Sequence[str]) -> str:
    """``lead``, then one ``## <title>`` per section with its lines or ``(none)``."""
    parts = [*lead]
    for title in sections:
        parts.append(f"## {title}")
        parts.extend(bodies.get(title) or [_NONE])
    return "\n".join(parts)


def conform_sections(text: str, sections: Sequence[str], *, where: str = "") -> str:
    """``text`` with one ``## <title>`` per entry of ``sections``, in order.

    Lines under a known heading (matched case-insensitively) stay under it; lines before
    the first one stay in front; an unknown heading stays as a line of its section. A
    heading the reply lacks is added with ``(none)`` under it and a warning naming it.
    """
    if not sections:
        return text
    lead, bodies, found = split_sections(text, sections)
    missing = [title for title in sections if title not in found]
    if missing:
        logger.warning(
            "summary%s lacks the heading(s) %s; accepted with those sections empty",
            f" of {where}" if where else "",
            ", ".join(repr(t) for t in missing),
        )
    return render_sections(lead, bodies, sections)


def skeleton(sections: Sequence[str]) -> str:
    """The summary with every section empty: each heading with ``(none)`` under it."""
    return "\n".join(f"## {title}\n{_NONE}" for title in sections)
