"""``OpenAIChatModel``: any OpenAI-compatible chat endpoint through the official ``openai`` client."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Sequence
from typing import Any

import openai

from ctxcore.errors import ConfigError
from ctxcore.messages import AnyMessage, to_openai
from ctxcore.summarize.errors import ModelCallError, classify_error, status_code_of
from ctxcore.summarize.model import Completion, OutputContract, Usage
from ctxcore.summarize.redact import redact

__all__ = ["OpenAIChatModel", "parse_retry_after"]

_MAX_ERROR_CHARS = 500


def parse_retry_after(headers: Any) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or HTTP date)."""
    if headers is None:
        return None
    try:
        millis = headers.get("retry-after-ms")
        value = headers.get("retry-after")
    except Exception:
        return None
    if millis is not None:
        try:
            return max(float(millis) / 1000.0, 0.0)
        except ValueError:
            pass
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(str(value))
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def _retry_after_of(exc: BaseException) -> float | None:
    response = getattr(exc, "response", None)
    return parse_retry_after(getattr(response, "headers", None)) if response is not None else None


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    # The openai client's connection errors say only "Connection error."; the cause says
    # what happened ("[Errno 111] Connection refused"), which is what an operator needs.
    cause = exc.__cause__
    if cause is not None:
        reason = " ".join(str(cause).split())
        if reason and reason not in text:
            text = f"{text} ({type(cause).__name__}: {reason})"
    if len(text) > _MAX_ERROR_CHARS:
        text = text[:_MAX_ERROR_CHARS] + "..."
    # Provider errors sometimes echo the rejected key back; never let it reach a log.
    return redact(f"{type(exc).__name__}: {text}")


class OpenAIChatModel:
    """A ``ModelClient`` for an OpenAI-compatible ``/chat/completions`` endpoint.

    ``max_tokens`` (when set) caps every call below the caller's own ``max_tokens``.
    A call's timeout is ``timeout`` plus ``timeout_per_output_token`` seconds for each
    output token it asks for (a slow local model needs longer for a longer summary).
    ``max_retries`` is passed to the ``openai`` client and should stay 0: retries are the
    executor's job, which classifies errors and shrinks the request on overflow.
    Failures are raised as ``ModelCallError`` with a classified ``kind``, the HTTP status
    and the server's ``Retry-After`` in seconds.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        model: str = "gpt-4o-mini",
        timeout: float = 60.0,
        max_tokens: int | None = None,
        temperature: float = 0.0,
        max_retries: int = 0,
        timeout_per_output_token: float = 0.0,
    ) -> None:
        if timeout <= 0 or timeout_per_output_token < 0:
            raise ConfigError(
                f"OpenAIChatModel: timeout must be > 0 and timeout_per_output_token >= 0, got "
                f"{timeout} and {timeout_per_output_token}; give seconds"
            )
        self.base_url = base_url
        self.model = model
        self.timeout = timeout
        self.timeout_per_output_token = timeout_per_output_token
        self.max_tokens = max_tokens
        self.temperature = temperature
        # OpenAI-compatible local servers need no key, but the client refuses to start
        # without one; a placeholder keeps it from reading OPENAI_API_KEY by surprise.
        self._client = openai.OpenAI(
            base_url=base_url, api_key=api_key or "unused", timeout=timeout, max_retries=max_retries
        )

    @property
    def name(self) -> str:
        """The model name sent with each request."""
        return self.model

    def __repr__(self) -> str:
        return f"OpenAIChatModel(base_url={self.base_url!r}, model={self.model!r})"

    def call_timeout(self, output_tokens: int) -> float:
        """Seconds one call asking for ``output_tokens`` may take."""
        return self.timeout + self.timeout_per_output_token * max(output_tokens, 0)

    def close(self) -> None:
        """Close the underlying HTTP connection pool."""
        self._client.close()

    def __enter__(self) -> OpenAIChatModel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def complete(
        self,
        messages: Sequence[AnyMessage],
        *,
        max_tokens: int,
        contract: OutputContract | None = None,
    ) -> Completion:
        """One chat completion; the contract is not sent (the prompt already describes it)."""
        del contract
        limit = max_tokens if self.max_tokens is None else min(max_tokens, self.max_tokens)
        try:
            response: Any = self._client.chat.completions.create(
                model=self.model,
                messages=to_openai(messages),  # type: ignore[arg-type]
                max_tokens=max(limit, 1),
                temperature=self.temperature,
                timeout=self.call_timeout(max(limit, 1)),
            )
        except Exception as exc:
            raise ModelCallError(
                classify_error(exc), _describe(exc), status_code_of(exc), _retry_after_of(exc)
            ) from exc
        return self._completion(response)

    def _completion(self, response: Any) -> Completion:
        choices = getattr(response, "choices", None)
        if not choices:
            # A 200 whose body is not a chat completion (a proxy's HTML page, say) is as
            # useless as a 5xx, and retrying it is the right reaction.
            shown = redact(str(response)[:200])
            raise ModelCallError("unknown", f"the endpoint returned no completion choices: {shown!r}")
        message = getattr(choices[0], "message", None)
        text = getattr(message, "content", None)
        if not isinstance(text, str) or not text.strip():
            reason = getattr(choices[0], "finish_reason", None)
            raise ModelCallError("unknown", f"the model returned no text (finish_reason={reason})")
        usage = getattr(response, "usage", None)
        prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
        output = int(getattr(usage, "completion_tokens", 0) or 0)
        total = int(getattr(usage, "total_tokens", 0) or 0) or prompt + output
        model = getattr(response, "model", None)
        return Completion(
            text=text,
            usage=Usage(
                prompt, output, total, calls=1, model=model if isinstance(model, str) else self.model
            ),
            finish_reason=_finish_reason(choices[0]),
        )


def _finish_reason(choice: Any) -> str | None:
    reason = getattr(choice, "finish_reason", None)
    return reason if isinstance(reason, str) else None
