"""``StatusWatch``: what the adapters tell their agent's log about background compaction.

A window says ``paused`` while no job starts (``compaction_detail.reason``: ``no_progress``,
``budget_exhausted``), ``failing`` while the last job failed, or ``unknown`` for a status
this client does not know (a newer server). The agent's windows are still served (rules and
the fallback), so the adapters never raise for it: they log one WARNING when a conversation
enters such a status and one INFO when it leaves it.
"""

from __future__ import annotations

import logging

from ctxcore.client.models import WindowResponse

__all__ = ["StatusWatch"]

log = logging.getLogger("ctxcore.client")

_NOTED = frozenset({"paused", "failing", "unknown"})


class StatusWatch:
    """Remembers each conversation's last compaction status and logs its changes."""

    def __init__(self) -> None:
        self._last: dict[str, str] = {}

    def seen(self, conversation: str, window: WindowResponse) -> str:
        """Note ``window``'s status for ``conversation``; returns it."""
        status = window.compaction
        before = self._last.get(conversation)
        if status == before:
            return status
        self._last[conversation] = status
        detail = window.compaction_detail
        if status in _NOTED:
            cause = detail.hold.why if detail.hold else detail.last_error.message if detail.last_error else ""
            reason = detail.reason or (detail.last_error.kind if detail.last_error else None)
            log.warning(
                "ctxcore compaction of %s is %s%s%s; windows are served by the rules and the fallback",
                conversation,
                status,
                f" ({reason})" if reason else "",
                f": {cause}" if cause else "",
            )
        elif before in _NOTED:
            log.info("ctxcore compaction of %s is %s again", conversation, status)
        return status
