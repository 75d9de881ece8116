"""The repairs every embedded window gets before it is served (log and view keep the raw messages)."""

from __future__ import annotations

from collections.abc import Sequence

from ctxcore.errors import InvalidWindowError
from ctxcore.messages import AnyMessage
from ctxcore.protocol import check_window, close_interrupted_tool_calls, drop_leading_orphans
from ctxcore.state.keys import ConversationKey

__all__ = ["served_context"]


def served_context(messages: Sequence[AnyMessage], key: ConversationKey) -> list[AnyMessage]:
    """Context messages as served: leading orphans dropped, interrupted calls answered.

    Raises ``InvalidWindowError`` when the result still breaks the protocol (e.g. a late
    result for an interrupted call, or a processor that broke pairing): the model would
    answer 400, so the caller learns now, with the violations, instead.
    """
    served = close_interrupted_tool_calls(drop_leading_orphans(messages))
    problems = check_window(served)
    if problems:
        raise InvalidWindowError(
            problems,
            0,
            where=f"window of context {key}",
            remedy="fix the context's messages (set_messages / pop_messages) or the processor that wrote them",
        )
    return served
