"""``TracedModel``: a summariser ``ModelClient`` whose every call is a span under the
OpenTelemetry GenAI semantic conventions (``gen_ai.*``)."""

from __future__ import annotations

from collections.abc import Sequence

from ctxcore.messages import AnyMessage
from ctxcore.summarize.errors import ModelCallError
from ctxcore.summarize.model import Completion, ModelClient, OutputContract
from ctxcore.telemetry import AttributeValue, Tracer

__all__ = ["TracedModel"]


class TracedModel:
    """``client`` with a ``chat <model>`` span around each call (one attempt: the executor's
    retries are calls of their own)."""

    def __init__(self, client: ModelClient, tracer: Tracer, provider: str) -> None:
        self.client = client
        self.tracer = tracer
        self.provider = provider

    @property
    def name(self) -> str:
        """The wrapped client's model name."""
        return self.client.name

    def complete(
        self, messages: Sequence[AnyMessage], *, max_tokens: int, contract: OutputContract | None = None
    ) -> Completion:
        """Call the model in a span; its usage and finish reason become attributes."""
        attributes: dict[str, AttributeValue] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": self.provider,
            "gen_ai.request.model": self.client.name,
            "gen_ai.request.max_tokens": max_tokens,
        }
        with self.tracer.span(f"chat {self.client.name}", attributes) as span:
            try:
                completion = self.client.complete(messages, max_tokens=max_tokens, contract=contract)
            except ModelCallError as exc:
                span.set("error.type", exc.kind)
                raise
            usage = completion.usage
            if usage.model:
                span.set("gen_ai.response.model", usage.model)
            span.set("gen_ai.usage.input_tokens", usage.input_tokens)
            span.set("gen_ai.usage.output_tokens", usage.output_tokens)
            if completion.finish_reason is not None:
                span.set("gen_ai.response.finish_reasons", [completion.finish_reason])
            return completion
