"""Protocol checks of a view before it is saved or adopted: a stage must not leave a view
that no window can be served from."""

from __future__ import annotations

import logging

from ctxcore.errors import InvalidWindowError
from ctxcore.messages import SystemMessage
from ctxcore.pipeline.view import View
from ctxcore.protocol import Violation, check_window, close_interrupted_tool_calls

__all__ = ["rejected_view_error", "view_violations"]

log = logging.getLogger(__name__)


def view_violations(view: View) -> list[Violation]:
    """What ``assemble_window`` would refuse to serve from ``view`` (before any rule or fallback).

    The view is rendered as served: blocks and pinned messages as they are, the raw tail
    with interrupted calls answered. A system message inside the context (a summariser's
    output, say) is a violation even at its head: the request's own system messages go first.
    """
    rendered = view.context_messages()
    context = [*rendered[: len(rendered) - len(view.tail)], *close_interrupted_tool_calls(view.tail)]
    found = [
        Violation(i, "system_in_context", "a system message inside the context (e.g. in a summary block)")
        for i, m in enumerate(context)
        if isinstance(m, SystemMessage)
    ]
    found += [v for v in check_window(context) if v.rule != "system_after_non_system"]
    return sorted(found, key=lambda v: v.index)


def rejected_view_error(
    view: View, stage_kind: str, conversation: object, violations: list[Violation]
) -> InvalidWindowError:
    """The error standing for a rejected stage result, logged once as a WARNING."""
    log.warning(
        "stage %s of %s rejected: its result breaks the chat protocol (%s); the state stays at version %s",
        stage_kind,
        conversation,
        "; ".join(f"{v.rule} at {v.index}: {v.detail}" for v in violations[:3]),
        view.version,
    )
    return InvalidWindowError(
        violations,
        view.version,
        where=f"view after stage {stage_kind}",
        remedy="the summariser's output was discarded; the stage counts as exhausted",
    )
