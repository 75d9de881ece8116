"""Shared pieces of the LLM compressors: the model-client config field and usage records."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer

from ctxcore.config import ModelSettings
from ctxcore.errors import ConfigError
from ctxcore.messages import AnyMessage
from ctxcore.pipeline.fitting import CallLimits
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.summarize.model import Completion, ModelClient, OutputContract, Usage
from ctxcore.tokens import TokenCounter

__all__ = [
    "ExecutorClient",
    "ModelClientSpec",
    "api_key_env_of",
    "call_limits",
    "client_name",
    "resolve_client",
    "usage_dict",
]

_MODEL_KEYS = {
    "base_url",
    "name",
    "api_key_env",
    "timeout",
    "timeout_per_output_token",
    "max_tokens",
    "temperature",
    "context_window_tokens",
}


def _check_client(value: Any) -> Any:
    if value is None or isinstance(value, ModelClient):
        return value
    if isinstance(value, Mapping):
        unknown = set(value) - _MODEL_KEYS
        if unknown:
            raise ConfigError(f"unknown model_client keys {sorted(unknown)}; expected {sorted(_MODEL_KEYS)}")
        return ModelSettings.model_validate(dict(value))
    raise ConfigError("model_client must be a ModelClient instance or a dict with the keys of Settings.model")


# A ModelClient instance (in process) or the keys of ``Settings.model`` (built on first use).
ModelClientSpec = Annotated[
    Any,
    BeforeValidator(_check_client),
    PlainSerializer(
        lambda v: v.model_dump() if isinstance(v, ModelSettings) else (None if v is None else v.name)
    ),
]


def client_name(spec: Any) -> str:
    """The model name a ``model_client`` spec stands for (``extractive`` when none is set)."""
    if spec is None:
        return "extractive"
    # A validated spec is a ModelClient or a ModelSettings: both carry ``name``.
    return str(spec.name or "")


def api_key_env_of(spec: Any) -> str | None:
    """The environment variable a ``model_client`` spec takes its API key from (None: none)."""
    if isinstance(spec, ModelSettings):
        return spec.api_key_env or None
    return None


def resolve_client(
    spec: Any, counter: TokenCounter, api_key: Callable[[str], str | None] | None = None
) -> ModelClient:
    """The configured client; ``ExtractiveModel`` (offline, deterministic) when none is set.

    ``api_key`` looks up the value of the spec's ``api_key_env`` (``ProcessorContext.api_key``:
    this module never reads the environment; ``ContextEngine`` does, at start-up).
    """
    if spec is None:
        return ExtractiveModel(counter)
    if not isinstance(spec, ModelSettings):
        client: ModelClient = spec  # validated by the config: an in-process ModelClient
        return client
    from ctxcore.summarize.openai_chat import OpenAIChatModel

    return OpenAIChatModel(
        base_url=spec.base_url or "http://127.0.0.1:8000/v1",
        api_key=api_key(spec.api_key_env) if api_key is not None and spec.api_key_env else None,
        model=spec.name,
        timeout=spec.timeout,
        timeout_per_output_token=spec.timeout_per_output_token,
        max_tokens=spec.max_tokens,
        temperature=spec.temperature,
    )


def call_limits(spec: Any, context_window_tokens: int | None) -> CallLimits:
    """The limits a compressor's summariser calls are fitted to: the model's context
    (``context_window_tokens``, the processor's ``model_context_window_tokens``, else the
    ``model_client`` settings' own) and, for settings, their output cap."""
    limits = CallLimits.of(spec) if isinstance(spec, ModelSettings) else CallLimits()
    if context_window_tokens is None:
        return limits
    return CallLimits(context_window_tokens, limits.max_output_tokens)


class ExecutorClient:
    """A ``ModelClient`` whose calls go through a ``CompressionExecutor`` (retries, classification)."""

    def __init__(self, executor: Any) -> None:
        self.executor = executor

    @property
    def name(self) -> str:
        """The wrapped client's name."""
        return str(self.executor.client.name)

    def complete(
        self, messages: Sequence[AnyMessage], *, max_tokens: int, contract: OutputContract | None = None
    ) -> Completion:
        """One call with the executor's retry policy."""
        result: Completion = self.executor.execute(messages, max_tokens=max_tokens, contract=contract)
        return result


def usage_dict(usage: Usage) -> dict[str, Any]:
    """The reference's compression-usage record."""
    return {
        "calls": usage.calls,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
        "model_name": usage.model,
    }
