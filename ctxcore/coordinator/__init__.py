"""The Coordinator: the only writer of compaction state.

Each call loads the state, reads only the log after its cursor, runs one pure pipeline
stage and saves with compare-and-swap. A lost race is ``outcome="conflict"`` (re-plan), a
classified model failure (``ModelError``) ``"failed"`` with its ``kind`` and the previous
state untouched, a result whose view breaks the chat protocol ``"rejected"``
(``error_kind="invalid_summary"``, state untouched: it is deterministic, so retrying cannot
help). Nothing else is caught: a bug in a stage, a summarizer or a model client
(``TypeError``, ...), a store error or a cursor missing from the log
(``CursorNotFoundError``) propagates, so it surfaces as a failed task with its traceback
instead of degrading silently into truncation; the state is untouched then too, because a
save is the last thing a stage does.
"""

from ctxcore.coordinator.coordinator import DEFAULT_BUDGET, Coordinator
from ctxcore.coordinator.results import INVALID_SUMMARY, CoordinatorResult, Outcome, TriggerInput

__all__ = ["DEFAULT_BUDGET", "INVALID_SUMMARY", "Coordinator", "CoordinatorResult", "Outcome", "TriggerInput"]
