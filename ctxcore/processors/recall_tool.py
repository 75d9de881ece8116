"""The tool an agent gives its model to search what compaction folded:
``recall_compressed_context(query, max_tokens)``.

A summary block whose range is archived ends with ``[[COMPRESSION_RECALL: id=...]]``; the
model calls the tool with words to look for, and the agent answers with the archived
originals (``execute_recall_tool``; over HTTP the ``POST .../recall`` route does the same).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Protocol

from ctxcore.json_text import loads_shallow

__all__ = [
    "DEFAULT_RECALL_TOKENS",
    "RECALL_TOOL_NAME",
    "Recaller",
    "execute_recall_tool",
    "recall_answer_text",
    "recall_tool_definition",
]

RECALL_TOOL_NAME = "recall_compressed_context"
DEFAULT_RECALL_TOKENS = 2000

# Kept short: the definition is counted in every window's budget while recall is on.
_DEFINITION: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": RECALL_TOOL_NAME,
        "description": "Search the originals that [[COMPRESSION_RECALL]] summaries replaced.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Words to find"},
                "max_tokens": {"type": "integer"},
            },
            "required": ["query"],
        },
    },
}


def recall_tool_definition() -> dict[str, Any]:
    """The OpenAI tool definition (a fresh copy each call)."""
    return copy.deepcopy(_DEFINITION)


class Recaller(Protocol):
    """Whatever can search a conversation's archive (a ``ModelContext``, a service binding)."""

    def recall(self, query: str, max_tokens: int = DEFAULT_RECALL_TOKENS) -> Any:
        """The recall answer for ``query``."""
        ...


def recall_answer_text(answer: Any) -> str:
    """The tool result the model reads: each hit headed by its range and score, or the note."""
    if not answer.hits:
        return answer.note or "no archived text matches: try broader or different words"
    parts = [f"[archived log ids {h.range_id}, score {h.score:.2f}]\n{h.text}" for h in answer.hits]
    if answer.query_truncated:
        parts.insert(0, "(the query was cut to its first 512 tokens)")
    return "\n\n".join(parts)


def _arguments(arguments: str | Mapping[str, Any]) -> tuple[str, int] | str:
    if isinstance(arguments, str):
        try:
            arguments = loads_shallow(arguments or "{}")
        except ValueError:
            return 'error: pass {"query": "words to look for"} as JSON'
    if not isinstance(arguments, Mapping):
        return 'error: pass {"query": "words to look for"}'
    query = arguments.get("query")
    if not isinstance(query, str) or not query.strip():
        return 'error: "query" must name the words to look for'
    limit = arguments.get("max_tokens", DEFAULT_RECALL_TOKENS)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        return 'error: "max_tokens" must be a positive integer'
    return query, limit


def execute_recall_tool(recaller: Recaller, arguments: str | Mapping[str, Any]) -> str:
    """Run the tool: the archived passages as text, or an error the model can act on
    (never raises for bad input)."""
    parsed = _arguments(arguments)
    if isinstance(parsed, str):
        return parsed
    query, limit = parsed
    return recall_answer_text(recaller.recall(query, limit))
