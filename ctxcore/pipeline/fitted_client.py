"""``FittedClient``: a ``ModelClient`` whose every call fits the summarisation model's
context, for callers that build their own prompts (the incremental ``Coordinator.compress``'s
summarizer): the same fitting as the pipeline's stages (``fitting.fit_to_limits``)."""

from __future__ import annotations

from collections.abc import Sequence

from ctxcore.messages import AnyMessage, SystemMessage
from ctxcore.pipeline.fitting import CallLimits, fit_to_limits
from ctxcore.summarize.model import Completion, ModelClient, OutputContract
from ctxcore.tokens import TokenCounter

__all__ = ["FittedClient"]


class FittedClient:
    """``inner`` with each call fitted to ``limits``: the messages other than system prompts
    cut to their head and tail (longest first) until the input leaves room for the output;
    ``CallTooLarge`` (kind ``context_overflow``, with the sizes) when even cut they do not
    fit, before anything is sent. Without a context limit calls pass unchanged."""

    def __init__(self, inner: ModelClient, limits: CallLimits, counter: TokenCounter, where: str) -> None:
        self.inner = inner
        self.limits = limits
        self.counter = counter
        self.where = where

    @property
    def name(self) -> str:
        """The wrapped client's name."""
        return self.inner.name

    def complete(
        self, messages: Sequence[AnyMessage], *, max_tokens: int, contract: OutputContract | None = None
    ) -> Completion:
        """One call of ``inner`` on the fitted messages."""
        trimmable = [i for i, m in enumerate(messages) if not isinstance(m, SystemMessage)]
        fitted = fit_to_limits(
            messages,
            trimmable,
            max_tokens=max_tokens,
            limits=self.limits,
            counter=self.counter,
            where=self.where,
        )
        return self.inner.complete(fitted, max_tokens=max_tokens, contract=contract)
