"""JSON read from messages (tool-call arguments, tool results): ``loads_shallow``.

A message's text is the agent's or a tool's, not ctxcore's: ``json.loads`` raises
``RecursionError`` on ``[[[[...`` a few thousand levels deep, and a document a little under
the parser's limit still overflows the stack of any recursive walk over it. Read here, such a
text is simply not JSON (``ValueError``), as a syntax error is, so one crafted tool result
cannot fail every compaction and window of its conversation.
"""

from __future__ import annotations

import json
from typing import Any, Final

__all__ = ["MAX_JSON_DEPTH", "loads_shallow"]

MAX_JSON_DEPTH: Final = 64
"""The deepest nesting read as JSON; tool arguments and results nest a handful of levels."""


def loads_shallow(text: str) -> Any:
    """``json.loads(text)``: ``json.JSONDecodeError`` (a ``ValueError``) for text that is not
    JSON, as ``json.loads`` raises it, and for text that nests arrays and objects deeper than
    ``MAX_JSON_DEPTH`` (every caller reads such text as text)."""
    try:
        value = json.loads(text)
    except RecursionError as exc:
        raise json.JSONDecodeError(f"nested deeper than {MAX_JSON_DEPTH} levels", text, 0) from exc
    # An explicit stack: the check itself must not recurse.
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, dict | list):
                if depth >= MAX_JSON_DEPTH:
                    raise json.JSONDecodeError(f"nested deeper than {MAX_JSON_DEPTH} levels", text, 0)
                stack.append((child, depth + 1))
    return value
