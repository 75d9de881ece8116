"""Fixed-width cells of the command line's text tables (``ctxcore demo``, ``ctxcore count``).

An id longer than its column is cut at the right and ends with an ellipsis: ids are read
from their start (a tenant's or a run's name comes first), and the ellipsis says the cell
is not the whole id (``--json`` or the API have it whole).
"""

from __future__ import annotations

from ctxcore.errors import UsageError

__all__ = ["ELLIPSIS", "cell"]

ELLIPSIS = "…"


def cell(text: str, width: int) -> str:
    """``text`` left-aligned in ``width`` characters, cut at the right with an ellipsis."""
    if width < 1:
        raise UsageError(f"a table cell needs a width of at least 1, got {width}")
    if len(text) > width:
        text = text[: width - 1] + ELLIPSIS
    return f"{text:<{width}}"
