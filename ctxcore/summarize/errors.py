"""Classifying model-call failures (spec 5.1) and recognising context overflow (spec 3.5).

The executor's retry policy hangs on one of seven kinds, so classification must be
precise. Two deliberate deviations from the reference:

* HTTP status codes are read as codes (``status_code``, ``status``, ``response.status_code``
  along the cause chain) and beat any text. The reference also matched "400", "500", "413"
  ... as substrings of the collected text (spec 9.8), so a request id such as
  ``req_500abc`` turned a bad request into a retried server error.
* Overflow text is matched with the spec 3.5 matcher, which knows that an *output* token
  limit or a billing quota is not a context overflow.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, Final

import openai

from ctxcore.errors import MODEL_CALL_KINDS, ConfigError, ErrorKind, ModelError

__all__ = [
    "ERROR_KINDS",
    "TRANSIENT_KINDS",
    "ModelCallError",
    "classify_error",
    "is_context_overflow_error",
    "status_code_of",
]

ERROR_KINDS: Final = MODEL_CALL_KINDS
TRANSIENT_KINDS: Final = frozenset(
    {ErrorKind.RATE_LIMIT, ErrorKind.TIMEOUT, ErrorKind.SERVER_UNSTABLE, ErrorKind.UNKNOWN}
)

_CHAIN_DEPTH = 8
_MATCH_DEPTH = 6


class ModelCallError(ModelError):
    """A model call failed for good (or failed once, inside the executor).

    ``kind`` is one of ``ERROR_KINDS``; ``status_code`` the HTTP status when there was one;
    ``retry_after`` the server's requested pause in seconds; ``attempts`` how many calls the
    executor made before giving up (0 when the error comes straight from a client).
    """

    def __init__(
        self,
        kind: ErrorKind | str,
        message: str,
        status_code: int | None = None,
        retry_after: float | None = None,
        *,
        attempts: int = 0,
    ) -> None:
        if kind not in ERROR_KINDS:
            raise ConfigError(
                f"unknown model error kind {kind!r}; pass one of {[str(k) for k in ERROR_KINDS]}"
            )
        super().__init__(kind, message, retry_after=retry_after)
        self.status_code = status_code
        self.attempts = attempts

    @property
    def transient(self) -> bool:
        """True for kinds worth retrying unchanged (rate limit, timeout, server, unknown)."""
        return self.kind in TRANSIENT_KINDS


# --- foreign fields and the cause chain ------------------------------------------------------


def _field(value: object, name: str) -> Any:
    """The field ``name`` of a provider's exception (or of its parts), None when it has none.

    The one place fields are read by name: the exceptions come from whatever SDK a model
    client or an agent's own call uses, so spec 3.5 and 5.1 name fields, not classes. A lazy
    property (an unread HTTP body, say) may raise; that reads as no field.
    """
    try:
        return getattr(value, name, None)
    except Exception:
        return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception and its causes (``__cause__``, ``__context__``, ``.cause``), cycle-safe."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending and len(seen) < _CHAIN_DEPTH:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for nxt in (current.__cause__, current.__context__, _field(current, "cause")):
            if isinstance(nxt, BaseException) and id(nxt) not in seen:
                pending.append(nxt)


def _as_status(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        code = value
    elif isinstance(value, str) and len(value) == 3 and value.isdigit():
        code = int(value)
    else:
        return None
    return code if 100 <= code <= 599 else None


def status_code_of(exc: BaseException) -> int | None:
    """The first HTTP status code found on the exception or its causes, else None."""
    for current in _chain(exc):
        # A status is 100-599, never 0: ``or`` moves on only when a field holds none.
        code = (
            _as_status(_field(current, "status_code"))
            or _as_status(_field(current, "status"))
            or _as_status(_field(_field(current, "response"), "status_code"))
        )
        if code is not None:
            return code
    return None


def _error_text(exc: BaseException) -> str:
    """The chain's messages and descriptive fields, casefolded, for marker matching."""
    parts: list[str] = []
    for current in _chain(exc):
        parts += [type(current).__name__, str(current)]
        for attr in ("code", "type", "param", "errmsg", "details", "body"):
            value = _field(current, attr)
            if value is not None and not callable(value):
                parts.append(str(value)[:4000])
    return "\n".join(parts).casefold()


# --- overflow matcher (spec 3.5) ------------------------------------------------------------

_MATCH_FIELDS: Final = (
    "message",
    "body",
    "details",
    "error",
    "errors",
    "response",
    "code",
    "type",
    "param",
    "status_code",
    "status",
    "text",
    "content",
    "cause",
    "__cause__",
    "__context__",
)
_STRONG_OVERFLOW: Final = (
    "context length",
    "context window",
    "maximum context",
    "max context",
    "context limit",
    "prompt is too long",
    "prompt too long",
    "input is too long",
    "input too long",
    "too many tokens",
    "request too large",
)
_SUBJECT = re.compile(r"\b(?:context|prompt|input)\b")
_OUTPUT_SIDE = re.compile(r"\b(?:output|completion|response)\b")
_NOT_OVERFLOW = re.compile(r"\b(?:quota|billing|rate limit)\b")
_SEPARATORS = re.compile(r"[_\-\s]+")


def _normalise(text: str) -> str:
    return _SEPARATORS.sub(" ", text.casefold())


def _text_is_overflow(text: str) -> bool:
    """Spec 3.5 rules on one piece of text (already normalised)."""
    if any(marker in text for marker in _STRONG_OVERFLOW):
        return True
    # The weaker rules need a subject (context/prompt/input) and must not be about output
    # size or billing, which look alike ("exceeded your quota", "output token limit").
    if _NOT_OVERFLOW.search(text):
        return False
    if "token limit" in text and not _OUTPUT_SIDE.search(text):
        return True
    subject = _SUBJECT.search(text) is not None
    if subject and "too long" in text:
        return True
    return subject and ("exceed" in text or "over limit" in text) and not _OUTPUT_SIDE.search(text)


def _texts(value: Any, depth: int, seen: set[int]) -> Iterator[str]:
    """Text pieces of an exception and the fields of spec 3.5, depth-limited and cycle-safe."""
    if depth > _MATCH_DEPTH or value is None:
        return
    if isinstance(value, str | bytes):
        yield value[:20000] if isinstance(value, str) else value[:20000].decode("utf-8", "replace")
        return
    if isinstance(value, int | float):
        return
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, dict | list | tuple):
        for item in (list(value.values()) if isinstance(value, dict) else value)[:50]:
            yield from _texts(item, depth + 1, seen)
        return
    if isinstance(value, BaseException):
        yield str(value)[:20000]
    for name in _MATCH_FIELDS:
        field = _field(value, name)
        if field is not None and not callable(field):
            yield from _texts(field, depth + 1, seen)


def is_context_overflow_error(exc: BaseException) -> bool:
    """True when an exception says the request did not fit the model's context window.

    Walks the exception, its descriptive fields and its causes (depth <= 6, cycle-safe).
    False for billing/quota errors, output-token limits and network timeouts.
    """
    return any(
        isinstance(current, ModelError) and current.kind == ErrorKind.CONTEXT_OVERFLOW
        for current in _chain(exc)
    ) or any(_text_is_overflow(_normalise(piece)) for piece in _texts(exc, 0, set()))


# --- classification (spec 5.1) ----------------------------------------------------------------

_RATE_LIMIT = ("rate_limit", "rate limit", "too many requests")
_AUTH = ("authentication", "unauthorized", "invalid api key", "api key invalid", "invalid_api_key")
_TIMEOUT = ("timeout", "timed out")
_SERVER = (
    "internal server error",
    "service unavailable",
    "bad gateway",
    "gateway timeout",
    "overloaded",
    "temporarily unavailable",
    "connection error",
    "connection reset",
    "connection refused",
)
_BAD_REQUEST = ("bad request", "invalid request", "invalid_request")


def _is_timeout_type(exc: BaseException) -> bool:
    if isinstance(exc, TimeoutError | openai.APITimeoutError):
        return True
    # httpx and httpx2 both name their base class TimeoutException; matching the name
    # covers either without importing both.
    return any(
        cls.__name__ == "TimeoutException" and cls.__module__.startswith("httpx") for cls in type(exc).__mro__
    )


def _kind_from_status(status: int, text: str, exc: BaseException) -> ErrorKind | None:
    if status == 413:
        return ErrorKind.CONTEXT_OVERFLOW
    if status == 429:
        return ErrorKind.RATE_LIMIT
    if status in (401, 403):
        return ErrorKind.AUTHENTICATION
    if status == 408:
        return ErrorKind.TIMEOUT
    if status >= 500:
        return ErrorKind.SERVER_UNSTABLE
    if 400 <= status < 500:
        # Providers report a prompt that is too long as a plain 400 (OpenAI:
        # context_length_exceeded), so only the overflow text can refine a 4xx.
        if is_context_overflow_error(exc) or "context_length" in text:
            return ErrorKind.CONTEXT_OVERFLOW
        return ErrorKind.API_REQUEST_ERROR
    return None


def classify_error(exc: BaseException) -> ErrorKind:
    """The kind of a failed model call: one of ``ERROR_KINDS``.

    Order: an already-classified ``ModelError``; the HTTP status code (status beats text);
    timeout and connection exception types; then casefolded text markers (spec 5.1 without
    the bare numbers); ``unknown`` otherwise.
    """
    for current in _chain(exc):
        if isinstance(current, ModelError) and current.kind in ERROR_KINDS:
            return ErrorKind(current.kind)
    text = _error_text(exc)
    status = status_code_of(exc)
    if status is not None:
        kind = _kind_from_status(status, text, exc)
        if kind is not None:
            return kind
    chain = list(_chain(exc))
    if any(_is_timeout_type(c) for c in chain):
        return ErrorKind.TIMEOUT
    if any(isinstance(c, openai.APIConnectionError | ConnectionError) for c in chain):
        return ErrorKind.SERVER_UNSTABLE
    if is_context_overflow_error(exc) or "context_length" in text:
        return ErrorKind.CONTEXT_OVERFLOW
    if any(m in text for m in _RATE_LIMIT):
        return ErrorKind.RATE_LIMIT
    if any(m in text for m in _AUTH):
        return ErrorKind.AUTHENTICATION
    if any(m in text for m in _TIMEOUT):
        return ErrorKind.TIMEOUT
    if any(m in text for m in _SERVER):
        return ErrorKind.SERVER_UNSTABLE
    if any(m in text for m in _BAD_REQUEST):
        return ErrorKind.API_REQUEST_ERROR
    return ErrorKind.UNKNOWN
