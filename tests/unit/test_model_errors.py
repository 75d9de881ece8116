"""Error classification (spec 5.1, status codes as codes) and the overflow matcher (spec 3.5)."""

from __future__ import annotations

import json

import httpx2
import openai
import pytest

from ctxcore.errors import ConfigError, ModelError
from ctxcore.summarize import ModelCallError, classify_error, is_context_overflow_error
from ctxcore.summarize.errors import ERROR_KINDS, TRANSIENT_KINDS, status_code_of


class StatusError(Exception):
    """An exception carrying an HTTP status the way many SDKs do."""

    def __init__(self, message: str, status_code: int | str | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


def openai_error(status: int, body: dict[str, object], headers: dict[str, str] | None = None) -> Exception:
    request = httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions")
    response = httpx2.Response(status, request=request, json=body, headers=headers)
    client = openai.OpenAI(api_key="x", base_url="http://127.0.0.1/v1")
    return client._make_status_error_from_response(response)


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (413, "context_overflow"),
        (429, "rate_limit"),
        (401, "authentication"),
        (403, "authentication"),
        (408, "timeout"),
        (500, "server_unstable"),
        (502, "server_unstable"),
        (503, "server_unstable"),
        (504, "server_unstable"),
        (400, "api_request_error"),
        (404, "api_request_error"),
        (422, "api_request_error"),
    ],
)
def test_status_codes_decide(status: int, kind: str) -> None:
    assert classify_error(StatusError("something went wrong", status)) == kind


def test_status_beats_text() -> None:
    # The text screams "rate limit" and "timeout", the code says bad request.
    assert classify_error(StatusError("rate limit? timeout? no.", 400)) == "api_request_error"
    assert classify_error(StatusError("invalid api key", 503)) == "server_unstable"


def test_request_id_with_500_is_not_a_server_error() -> None:
    # Spec 9.8: the reference matched "500" anywhere in the text.
    error = StatusError("Invalid value for 'temperature' (request id req_500abc)", 400)
    assert classify_error(error) == "api_request_error"
    assert classify_error(ValueError("request req_500abc failed with code 4130")) == "unknown"
    assert classify_error(ValueError("error 429 in line 413")) == "unknown"


def test_400_with_overflow_text_is_context_overflow() -> None:
    error = openai_error(
        400,
        {
            "error": {
                "message": "This model's maximum context length is 8192 tokens.",
                "type": "invalid_request_error",
                "code": "context_length_exceeded",
            }
        },
    )
    assert classify_error(error) == "context_overflow"
    assert is_context_overflow_error(error)


def test_status_found_on_response_and_cause_chain() -> None:
    class Response:
        status_code = 429

    class Wrapped(Exception):
        response = Response()

    assert classify_error(Wrapped("opaque")) == "rate_limit"
    try:
        try:
            raise StatusError("inner", "503")
        except StatusError as inner:
            raise RuntimeError("outer") from inner
    except RuntimeError as outer:
        assert status_code_of(outer) == 503
        assert classify_error(outer) == "server_unstable"


def test_bool_and_odd_status_values_are_ignored() -> None:
    assert status_code_of(StatusError("x", True)) is None  # type: ignore[arg-type]
    assert status_code_of(StatusError("x", "RESOURCE_EXHAUSTED")) is None
    assert status_code_of(StatusError("x", 42)) is None


def test_a_field_that_raises_reads_as_absent() -> None:
    # A lazy property (an unread HTTP body) may raise: classification must not.
    class Lazy(Exception):
        @property
        def status_code(self) -> int:
            raise RuntimeError("the response was not read")

        @property
        def body(self) -> str:
            raise RuntimeError("the response was not read")

    assert status_code_of(Lazy("Too Many Requests")) is None
    assert classify_error(Lazy("Too Many Requests")) == "rate_limit"


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (TimeoutError("slow"), "timeout"),
        (httpx2.ReadTimeout("read timed out"), "timeout"),
        (ConnectionResetError("peer reset"), "server_unstable"),
        (RuntimeError("Too Many Requests, slow down"), "rate_limit"),
        (RuntimeError("Unauthorized"), "authentication"),
        (RuntimeError("the read timed out"), "timeout"),
        (RuntimeError("Service Unavailable"), "server_unstable"),
        (RuntimeError("upstream overloaded"), "server_unstable"),
        (RuntimeError("Bad Request: field x"), "api_request_error"),
        (RuntimeError("prompt is too long: 210000 tokens > 200000 maximum"), "context_overflow"),
        (RuntimeError("something odd"), "unknown"),
    ],
)
def test_types_and_text_markers(exc: BaseException, kind: str) -> None:
    assert classify_error(exc) == kind


def test_openai_timeout_and_connection_errors() -> None:
    request = httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions")
    assert classify_error(openai.APITimeoutError(request)) == "timeout"
    assert classify_error(openai.APIConnectionError(request=request)) == "server_unstable"


def test_already_classified_errors_keep_their_kind() -> None:
    assert classify_error(ModelCallError("authentication", "no")) == "authentication"
    assert classify_error(ModelError("rate_limit", "slow down")) == "rate_limit"


def test_model_call_error_fields() -> None:
    error = ModelCallError("rate_limit", "slow down", 429, 2.5)
    assert (error.kind, error.status_code, error.retry_after, error.attempts) == ("rate_limit", 429, 2.5, 0)
    assert error.transient and isinstance(error, ModelError)
    assert not ModelCallError("authentication", "x").transient
    with pytest.raises(ConfigError, match="unknown model error kind"):
        ModelCallError("bogus", "x")
    assert set(TRANSIENT_KINDS) < set(ERROR_KINDS)


# --- spec 3.5 matcher -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "This model's maximum context length is 128000 tokens",
        "context_length_exceeded",
        "prompt is too long: 201000 tokens > 200000 maximum",
        "Input is too long for requested model",
        "The input token count exceeds the limit",
        "Request exceeds the context window",
        "token limit reached for this prompt",
        "input too long",
        "context-limit hit",
        "the prompt is over limit",
    ],
)
def test_overflow_matcher_positive(text: str) -> None:
    assert is_context_overflow_error(RuntimeError(text))


@pytest.mark.parametrize(
    "text",
    [
        "You exceeded your current quota, please check your plan and billing details.",
        "insufficient_quota: billing hard limit reached for input tokens",
        "maximum output tokens exceeded",
        "output token limit reached",
        "network timeout",
        "completion token limit reached",
        "Rate limit exceeded for input tokens per minute",
        "internal server error",
    ],
)
def test_overflow_matcher_negative(text: str) -> None:
    assert not is_context_overflow_error(RuntimeError(text))


def test_overflow_matcher_walks_fields_and_causes() -> None:
    class Provider(Exception):
        def __init__(self) -> None:
            super().__init__("request failed")
            self.body = {"error": {"details": [{"reason": "CONTEXT_LENGTH_EXCEEDED"}]}}

    assert is_context_overflow_error(Provider())
    try:
        try:
            raise RuntimeError("prompt too long")
        except RuntimeError as inner:
            raise ValueError("wrapper") from inner
    except ValueError as outer:
        assert is_context_overflow_error(outer)


def test_overflow_matcher_depth_limit_and_cycles() -> None:
    nested: dict[str, object] = {"message": "context length exceeded"}
    for _ in range(10):
        nested = {"error": nested}

    class Deep(Exception):
        body = nested

    assert not is_context_overflow_error(Deep("x"))

    a = RuntimeError("a")
    b = RuntimeError("b")
    a.__cause__ = b
    b.__cause__ = a
    cyclic: dict[str, object] = {}
    cyclic["self"] = cyclic

    class Cyclic(Exception):
        body = cyclic

    assert not is_context_overflow_error(a)
    assert not is_context_overflow_error(Cyclic("y"))
    assert classify_error(a) == "unknown"


def test_overflow_matcher_on_raw_json_body() -> None:
    body = json.dumps(
        {"error": {"message": "Please reduce the length of the messages", "code": "context_length_exceeded"}}
    )
    assert is_context_overflow_error(StatusError(body, 400))
