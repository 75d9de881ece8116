"""``CompressionExecutor``: one summarisation call with the retry policy of spec 5.2.

* Transient kinds (rate limit, timeout, server unstable, unknown): retried unchanged with
  a short backoff, honouring a larger ``Retry-After`` up to a cap.
* Context overflow: the caller's ``shrink(ratio)`` rebuilds a smaller request for each
  ratio in turn (0.85, 0.65, 0.5 of the budget by default).
* Authentication and bad requests: given up at once; retrying cannot help.

Transient and overflow retries are counted independently. Synchronous and pure apart
from the injected ``sleep``, the optional diagnostics and the call counters.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxcore.errors import ConfigError, ModelError
from ctxcore.messages import AnyMessage
from ctxcore.summarize.dump import CompressionDump, DebugLog, dump_record
from ctxcore.summarize.errors import TRANSIENT_KINDS, ModelCallError, classify_error, status_code_of
from ctxcore.summarize.model import Completion, ModelClient, OutputContract, Usage
from ctxcore.summarize.redact import redact
from ctxcore.tokens import TokenCounter

__all__ = ["CallRecord", "CompressionExecutor", "ShrinkFn"]

logger = logging.getLogger(__name__)

ShrinkFn = Callable[[float], tuple[Sequence[AnyMessage], OutputContract | None] | None]
"""``shrink(ratio)`` -> a smaller ``(messages, contract)`` for ``ratio`` of the budget, or None."""

# A bug in a client (wrong argument, missing attribute) fails the same way every time;
# retrying it as "unknown" would only triple the noise.
_PROGRAMMING_ERRORS = (TypeError, AttributeError, NameError, AssertionError, NotImplementedError)


@dataclass(frozen=True)
class CallRecord:
    """The request and result of the last successful ``execute``, for dumps and provenance.

    ``budget_ratio`` is the overflow ratio the request was shrunk to (None when unshrunk).
    """

    messages: tuple[AnyMessage, ...]
    contract: OutputContract | None
    completion: Completion
    attempts: int
    budget_ratio: float | None


class CompressionExecutor:
    """Runs summarisation calls on a ``ModelClient`` with classification and retries.

    ``backoff`` holds the delays before transient retry 1, 2, ... (the last one doubles
    beyond its length); a server ``Retry-After`` larger than the delay wins, capped at
    ``max_retry_after`` seconds. ``retry_transient=False`` gives transient failures up at
    once (the distributed workers let Celery retry instead). ``calls`` and ``usage``
    accumulate over the executor's lifetime; failed calls count with zero tokens.
    """

    def __init__(
        self,
        client: ModelClient,
        counter: TokenCounter,
        *,
        transient_retries: int = 2,
        backoff: Sequence[float] = (0.05, 0.1),
        overflow_ratios: Sequence[float] = (0.85, 0.65, 0.5),
        sleep: Callable[[float], None] = time.sleep,
        dump: CompressionDump | None = None,
        debug: DebugLog | None = None,
        retry_transient: bool = True,
        max_retry_after: float = 30.0,
    ) -> None:
        if transient_retries < 0:
            raise ConfigError(
                f"CompressionExecutor: transient_retries must be >= 0, got {transient_retries}; pass 0 for no retries"
            )
        if any(d < 0 for d in backoff):
            raise ConfigError(
                f"CompressionExecutor: backoff delays must be >= 0, got {tuple(backoff)}; give seconds, e.g. (1, 2, 4)"
            )
        if any(not 0 < r < 1 for r in overflow_ratios):
            raise ConfigError(
                f"CompressionExecutor: overflow ratios must be in (0, 1), got {tuple(overflow_ratios)}; "
                "each is the share of the input kept after a context overflow, e.g. (0.7, 0.5)"
            )
        self.client = client
        self.counter = counter
        self.transient_retries = transient_retries
        self.backoff = tuple(backoff)
        self.overflow_ratios = tuple(overflow_ratios)
        self.retry_transient = retry_transient
        self.max_retry_after = max_retry_after
        self.dump = dump
        self.debug = debug
        self._sleep = sleep
        self._lock = threading.Lock()
        self._calls = 0
        self._usage = Usage.zero(client.name)
        self.last_call: CallRecord | None = None

    @property
    def calls(self) -> int:
        """Model calls made so far (failed ones included)."""
        with self._lock:
            return self._calls

    @property
    def usage(self) -> Usage:
        """Aggregated usage of every call so far."""
        with self._lock:
            return self._usage

    def backoff_delay(self, retry: int, retry_after: float | None = None) -> float:
        """Seconds to wait before transient retry number ``retry`` (1-based)."""
        if self.backoff:
            index = retry - 1
            last = len(self.backoff) - 1
            delay = self.backoff[min(index, last)] * 2.0 ** max(index - last, 0)
        else:
            delay = 0.0
        if retry_after is not None and retry_after > delay:
            delay = min(retry_after, self.max_retry_after)
        return delay

    def execute(
        self,
        messages: Sequence[AnyMessage],
        *,
        max_tokens: int,
        contract: OutputContract | None = None,
        shrink: ShrinkFn | None = None,
    ) -> Completion:
        """One summarisation with retries; the returned usage covers every attempt.

        Raises ``ModelCallError`` (``kind``, ``attempts``) when it gives up.
        """
        if max_tokens < 1:
            raise ConfigError(f"CompressionExecutor.complete: max_tokens must be >= 1, got {max_tokens}")
        current: Sequence[AnyMessage] = messages
        current_contract = contract
        attempts = transient = overflow = 0
        ratio: float | None = None
        spent = Usage.zero(self.client.name)
        while True:
            attempts += 1
            try:
                completion = self.client.complete(current, max_tokens=max_tokens, contract=current_contract)
            except Exception as exc:
                error = self._as_call_error(exc)
                spent = spent + self._record(Usage(0, 0, 0, calls=1, model=self.client.name))
                attempt_info = {"attempt": attempts, "error_message": error.message[:500]}
                if error.kind == "context_overflow":
                    if shrink is None or overflow >= len(self.overflow_ratios):
                        self._debug("context_overflow", False, "retry_budget_exhausted", attempt_info)
                        raise self._give_up(error, attempts) from exc
                    ratio = self.overflow_ratios[overflow]
                    overflow += 1
                    smaller = shrink(ratio)
                    if smaller is None:
                        self._debug(
                            "context_overflow",
                            False,
                            "no_smaller_span",
                            {**attempt_info, "budget_ratio": ratio},
                        )
                        raise self._give_up(error, attempts) from exc
                    current, current_contract = smaller
                    self._debug(
                        "context_overflow",
                        True,
                        "budget_ratio_shrink",
                        {**attempt_info, "budget_ratio": ratio},
                    )
                    continue
                retryable = (
                    error.kind in TRANSIENT_KINDS
                    and self.retry_transient
                    and not isinstance(exc, _PROGRAMMING_ERRORS)
                )
                if not retryable:
                    self._debug(error.kind, False, "not_retryable", attempt_info)
                    raise self._give_up(error, attempts) from exc
                if transient >= self.transient_retries:
                    self._debug(f"transient:{error.kind}", False, "retry_budget_exhausted", attempt_info)
                    raise self._give_up(error, attempts) from exc
                transient += 1
                delay = self.backoff_delay(transient, error.retry_after)
                self._debug(
                    f"transient:{error.kind}",
                    True,
                    "transient_backoff",
                    {**attempt_info, "delay_seconds": delay},
                )
                if delay > 0:
                    self._sleep(delay)
                continue
            usage = self._fill_usage(completion, current)
            spent = spent + self._record(usage)
            result = Completion(completion.text, spent)
            with self._lock:
                self.last_call = CallRecord(tuple(current), current_contract, result, attempts, ratio)
            return result

    def write_dump(
        self,
        processor_type: str,
        *,
        extracted_summary: str = "",
        context_after: Sequence[AnyMessage] = (),
        tokens_before: int = 0,
        tokens_after: int = 0,
        **fields: Any,
    ) -> Path | None:
        """Dump the last successful call (spec 5.3) if a dump is configured; the file or None.

        Call it only after the compressor applied the result. ``fields`` are passed to
        ``dump_record`` (``trigger``, ``span``, ``exclude_recent_messages``, ``tools``...).
        """
        record = self.last_call
        if self.dump is None or record is None:
            return None
        data = dump_record(
            processor_type=processor_type,
            session_id=self.dump.session_id,
            context_id=self.dump.context_id,
            messages_sent=record.messages,
            raw_content=record.completion.text,
            extracted_summary=extracted_summary,
            usage=record.completion.usage.as_dict(),
            context_after=context_after,
            tokens_before=tokens_before,
            tokens_after=tokens_after,
            **fields,
        )
        return self.dump.write(processor_type, data)

    # --- helpers -----------------------------------------------------------------------

    def _as_call_error(self, exc: Exception) -> ModelCallError:
        if isinstance(exc, ModelCallError):
            return exc
        kind = classify_error(exc)
        text = redact(" ".join(f"{type(exc).__name__}: {exc}".split())[:500])
        retry_after = exc.retry_after if isinstance(exc, ModelError) else None
        return ModelCallError(kind, text, status_code_of(exc), retry_after)

    def _give_up(self, error: ModelCallError, attempts: int) -> ModelCallError:
        logger.warning(
            "summarisation model %s gave up after %d call(s): %s", self.client.name, attempts, error.message
        )
        return ModelCallError(
            error.kind, error.message, error.status_code, error.retry_after, attempts=attempts
        )

    def _fill_usage(self, completion: Completion, messages: Sequence[AnyMessage]) -> Usage:
        usage = completion.usage
        if usage.input_tokens or usage.output_tokens:
            return Usage(usage.input_tokens, usage.output_tokens, usage.total_tokens, 1, usage.model)
        # Some OpenAI-compatible servers omit usage; count it ourselves so budgets and
        # cost reports still see the call.
        inp = self.counter.count_messages(messages)
        out = self.counter.count_text(completion.text)
        return Usage(inp, out, inp + out, calls=1, model=usage.model or self.client.name)

    def _record(self, usage: Usage) -> Usage:
        with self._lock:
            self._calls += usage.calls
            self._usage = self._usage + usage
        return usage

    def _debug(self, error_type: str, retried: bool, reason: str, extra: dict[str, Any]) -> None:
        if self.debug is not None:
            self.debug.event(
                "compression_retry", error_type=error_type, retried=retried, reason=reason, **extra
            )
