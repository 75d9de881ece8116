"""The exception hierarchy: one base, misuse apart from runtime failure.

Every message says what was wrong and what to do about it::

    CtxcoreError
    |-- UsageError              the call, its input or the configuration is wrong:
    |   |                       retried unchanged it fails again; fix the call
    |   |-- InvalidMessageError (ValueError)  a message or request field
    |   |   `-- UnsupportedItemError          a framework item with no chat form
    |   |-- ConfigError         (ValueError)  a setting or a component's config
    |   |-- InvalidKeyError     (ValueError)  a tenant or conversation id
    |   |-- InvalidRequestError (ValueError)  a request parameter out of its range
    |   |-- BudgetExceeded      the fixed part of the window is over the budget
    |   |-- RecallDisabled      recall asked for while it is off
    |   |-- NotFoundError       no such conversation, context or offload
    |   `-- AuthenticationError the bearer token is missing or unknown
    `-- OperationFailed         the call was right; what it needs failed or said no now:
        |                       retry later, re-read, or repair the state
        |-- StoreError          a store failed
        |   |-- StoreUnavailable      unreachable: retry later
        |   `-- CursorNotFoundError   the saved state names a missing log id
        |-- ConflictError       an optimistic-concurrency expectation did not hold
        |   |-- VersionNotKept
        |   `-- TruncateRefused
        |-- ModelError          a summarisation model call failed
        |-- InvalidWindowError  the saved state would serve a broken window
        |-- QuotaExceeded       the tenant's conversation limit is reached
        `-- RateLimited         the tenant's request rate is exceeded

How each answers over HTTP is the service's business
(``workers/api_common/error_statuses.py``); the HTTP client's own error for any other status
is ``ctxcore.client.errors.ApiError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class ErrorKind(StrEnum):
    """Why an operation failed: one vocabulary for model errors, stage failures and metric labels.

    Members are strings (``ErrorKind.TIMEOUT == "timeout"``), so stored and reported kinds
    stay plain text.
    """

    # A model call (spec 5.1): the executor's retry policy hangs on these seven.
    CONTEXT_OVERFLOW = "context_overflow"
    RATE_LIMIT = "rate_limit"
    AUTHENTICATION = "authentication"
    TIMEOUT = "timeout"
    SERVER_UNSTABLE = "server_unstable"
    API_REQUEST_ERROR = "api_request_error"
    UNKNOWN = "unknown"
    # A compaction stage (a stage without a model client is the caller's ConfigError).
    INVALID_SUMMARY = "invalid_summary"
    SUMMARIZER_EMPTY = "summarizer_empty"
    CIRCUIT_OPEN = "circuit_open"
    STORE_UNAVAILABLE = "store_unavailable"
    INTERNAL = "internal"


# The kinds a failed model call is classified as (``summarize.errors.classify_error``).
MODEL_CALL_KINDS: tuple[ErrorKind, ...] = (
    ErrorKind.CONTEXT_OVERFLOW,
    ErrorKind.RATE_LIMIT,
    ErrorKind.AUTHENTICATION,
    ErrorKind.TIMEOUT,
    ErrorKind.SERVER_UNSTABLE,
    ErrorKind.API_REQUEST_ERROR,
    ErrorKind.UNKNOWN,
)


@dataclass(frozen=True)
class Violation:
    """One protocol rule a message list breaks, at ``index`` (``protocol.check_window``).

    Defined here, with the error that carries it, so the error tree imports nothing.
    """

    index: int
    rule: str
    detail: str


class CtxcoreError(Exception):
    """Base class of every error ctxcore raises on purpose.

    Raised by the HTTP client, an error also carries the response's ``status`` and the
    body's ``error`` code (``code``); both are None for errors raised in-process.
    """

    status: int | None = None
    code: str | None = None


class UsageError(CtxcoreError):
    """Misuse: the call, its input or the configuration is wrong; fix it (a retry fails again)."""


class OperationFailed(CtxcoreError):
    """A runtime failure: the call was right, but a store, a model, the saved state or a limit
    said no now; retry later, re-read, or repair the conversation as the message says."""


class InvalidMessageError(UsageError, ValueError):
    """A message (or a sequence of messages) is malformed.

    ``index`` is the position of the offending message in the input (-1 when the
    input as a whole is wrong), ``field`` the offending key.
    """

    def __init__(self, index: int, field: str, detail: str) -> None:
        self.index = index
        self.field = field
        self.detail = detail
        where = f"message {index}" if index >= 0 else "messages"
        super().__init__(f"{where}: field {field!r}: {detail}")


class ConfigError(UsageError, ValueError):
    """A configuration value is invalid; the message names the component and field."""


class InvalidKeyError(UsageError, ValueError):
    """A tenant or conversation id is not a safe identifier."""


class BudgetExceeded(UsageError):
    """System messages, tools and the anchors alone do not fit the token budget.

    The window cannot be served without silently truncating the user's own words, so
    the caller must raise the budget or shorten the system prompt / tool list.
    """

    def __init__(self, budget: int, system_tokens: int, tools_tokens: int, anchor_tokens: int) -> None:
        self.budget = budget
        self.system_tokens = system_tokens
        self.tools_tokens = tools_tokens
        self.anchor_tokens = anchor_tokens
        super().__init__(
            f"budget of {budget} tokens cannot hold system messages ({system_tokens}) + tools "
            f"({tools_tokens}) + task/intent anchors ({anchor_tokens}) = "
            f"{system_tokens + tools_tokens + anchor_tokens} tokens; raise budget_tokens or send "
            "a shorter system prompt or fewer tools"
        )


class StoreError(OperationFailed):
    """A state, log or offload store failed."""


class StoreUnavailable(StoreError):
    """The store's infrastructure is unreachable; retry later (the cause is chained)."""


class ConflictError(OperationFailed):
    """An optimistic-concurrency expectation did not hold (e.g. ``expected_last_id``).

    ``last_id`` is the log's actual last id when the expectation was about the log (None
    for an empty log or another kind of conflict): a client can retry against it.
    """

    def __init__(
        self, message: str, *, last_id: str | None = None, expected_last_id: str | None = None
    ) -> None:
        self.last_id = last_id
        self.expected_last_id = expected_last_id
        super().__init__(message)


class VersionNotKept(ConflictError):
    """A rollback named a state version that is not among the kept ones; nothing changed.

    ``kept`` lists the versions that are (newest first).
    """

    def __init__(self, message: str, *, version: int = 0, kept: Sequence[int] = ()) -> None:
        self.version = version
        self.kept = list(kept)
        super().__init__(message)


class CursorNotFoundError(StoreError):
    """The compaction cursor names a log id that is not in the log.

    Compaction never silently restarts from the beginning; inspect or roll back the state.
    """


class ModelError(OperationFailed):
    """A summarisation model call failed; ``kind`` (an ``ErrorKind``) classifies why.

    ``retry_after`` is the pause in seconds the server asked for, None when it asked none.
    """

    def __init__(self, kind: ErrorKind | str, message: str, *, retry_after: float | None = None) -> None:
        self.kind = kind
        self.message = message
        self.retry_after = retry_after
        super().__init__(f"{kind}: {message}")


class InvalidWindowError(OperationFailed):
    """A window about to be served breaks the chat protocol (``check_window`` violations).

    Never served: the model would reject it. Usually the saved compaction state is at
    fault (e.g. written by an older version); roll the conversation back to an earlier
    version (``ctxcore rollback``) or delete it.
    """

    def __init__(
        self,
        violations: Sequence[Violation],
        state_version: int,
        *,
        where: str | None = None,
        remedy: str = "roll the conversation back to an earlier state version or delete it",
    ) -> None:
        self.violations = list(violations)
        self.state_version = state_version
        shown = "; ".join(f"{v.rule} at {v.index}: {v.detail}" for v in self.violations[:3])
        more = f" (+{len(self.violations) - 3} more)" if len(self.violations) > 3 else ""
        where = where or f"window of state version {state_version}"
        super().__init__(f"the {where} breaks the chat protocol: {shown}{more}; {remedy}")


class RecallDisabled(UsageError):
    """Recall was asked for while it is off for the conversation's tenant.

    ``setting`` names what to turn on (``recall.enabled``, ``tenants.<id>.recall.enabled``
    or ``compression_recall_config.enabled``).
    """

    def __init__(self, setting: str) -> None:
        self.setting = setting
        super().__init__(f"recall is off: set {setting} = true to archive compactions and search them")


class TruncateRefused(ConflictError):
    """``truncate_after`` would remove something it must not; nothing was removed.

    ``reason`` is ``covered`` (a compaction summarised or pinned a message after the id:
    the log behind a saved state cannot shrink), ``part_of_message`` (the newest session
    item shares its log message with others), ``busy`` (a compaction holds the
    conversation's lock: retry shortly) or ``moved`` (the log no longer ends at the id
    the caller expected).
    """

    def __init__(self, reason: str, message: str, *, last_id: str | None = None) -> None:
        self.reason = reason
        super().__init__(message, last_id=last_id)


class UnsupportedItemError(InvalidMessageError):
    """A framework item or message has no chat-format equivalent ctxcore can log.

    Reasoning items, hosted-tool calls and LangChain ``RemoveMessage`` are examples: the
    message names the type. Keep such items out of the logged history.
    """

    def __init__(self, index: int, kind: str, detail: str) -> None:
        self.kind = kind
        super().__init__(index, "type", f"{kind}: {detail}")


class AuthenticationError(UsageError):
    """The bearer token is missing or unknown (never retried: check the token)."""


class NotFoundError(UsageError):
    """No such conversation, context or offload (for this tenant)."""


class QuotaExceeded(OperationFailed):
    """The tenant's ``max_conversations`` is reached; delete a conversation first."""


class RateLimited(OperationFailed):
    """The tenant's request rate is exceeded; ``retry_after`` is the server's wait in seconds."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        self.retry_after = retry_after
        super().__init__(message)


class InvalidRequestError(UsageError, ValueError):
    """A request parameter is out of its range (HTTP 422 naming ``field``): fix it and retry."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field} {reason}")
