"""``ContextEngine``: creates and pools ``ModelContext`` objects with their processor chains.

It owns what its contexts share (config, offload store, clock, processor registry, token
counter). The package's other modules are listed in ``ctxcore/engine/__init__.py``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ctxcore.config.base import validate_config
from ctxcore.engine.async_context import AsyncModelContext
from ctxcore.engine.config import ContextEngineConfig
from ctxcore.engine.context import ModelContext
from ctxcore.engine.hooks import CompressResult
from ctxcore.errors import ConfigError, NotFoundError
from ctxcore.messages import AnyMessage
from ctxcore.processors import ContextProcessor, ProcessorRegistry, builtin_registry
from ctxcore.processors.events import Subscriber
from ctxcore.state.base import OffloadStore
from ctxcore.state.memory import MemoryOffloadStore
from ctxcore.tokens import EstimateCounter, TiktokenCounter, TokenCounter
from ctxcore.turns import UserDetector

__all__ = ["ContextEngine"]

ProcessorSpec = tuple[str, Any] | ContextProcessor[Any]

# Overrides the price of every image content part (spec 2.6), in tokens.
IMAGE_TOKENS_ENV = "CTXCORE_IMAGE_PLACEHOLDER_TOKENS"


class ContextEngine:
    """Creates and pools contexts; owns the offload store, the clock and the registry.

    Args:
        config: a ``ContextEngineConfig`` or a dict of its fields.
        offload_store: where offloaded originals go (default: a ``MemoryOffloadStore``).
        clock: seconds source for TTL decisions (default ``time.time``).
        registry: this engine's processor registry, used as given (default: a new
            ``builtin_registry()``; register your processors on ``engine.registry``).
        environ: the environment, read here only (default ``os.environ``): the image price
            override ``CTXCORE_IMAGE_PLACEHOLDER_TOKENS`` and the API keys that processors'
            ``model_client.api_key_env`` name, which each context hands its processors.
    """

    def __init__(
        self,
        config: ContextEngineConfig | Mapping[str, Any] | None = None,
        *,
        offload_store: OffloadStore | None = None,
        clock: Callable[[], float] = time.time,
        registry: ProcessorRegistry | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        # The embedded engine's start-up is one of the two places that read the environment
        # (the other is Settings.from_env); read once, here.
        env = dict(os.environ if environ is None else environ)
        override = env.get(IMAGE_TOKENS_ENV, "")
        self.image_tokens: int | None = int(override) if override.isdigit() else None
        self._environ = env
        self.config = validate_config(ContextEngineConfig, config, "ContextEngineConfig")
        self.offload_store: OffloadStore = (
            offload_store if offload_store is not None else MemoryOffloadStore()
        )
        self.clock = clock
        # Its own: registering on one engine must not change what another engine can build.
        self.registry = registry if registry is not None else builtin_registry()
        self.detector = UserDetector(
            extra_prefixes=self.config.internal_user_prefixes,
            patterns=self.config.internal_user_patterns,
            harness_structure=self.config.harness_structure,
        )
        self._contexts: dict[tuple[str, str], ModelContext] = {}
        self._lock = threading.Lock()
        self._subscribers: list[Subscriber] = []
        self._counter: TokenCounter | None = None

    def default_counter(self) -> TokenCounter:
        """The engine's shared counter: tiktoken for ``model_name`` unless disabled."""
        if self._counter is None:
            self._counter = (
                TiktokenCounter(self.config.model_name, image_tokens=self.image_tokens)
                if self.config.enable_tiktoken_counter
                else EstimateCounter(image_tokens=self.image_tokens)
            )
        return self._counter

    def _build_processors(self, specs: Sequence[ProcessorSpec]) -> list[tuple[str, ContextProcessor[Any]]]:
        built = []
        for spec in specs:
            if isinstance(spec, ContextProcessor):
                built.append((spec.processor_type(), spec))
                continue
            if not isinstance(spec, tuple) or len(spec) != 2 or not isinstance(spec[0], str):
                raise ConfigError(f"processors: expected (name, config) pairs, got {spec!r}")
            name, config = spec
            built.append((name, self.registry.create(name, config)))
        return built

    def create_context(
        self,
        context_id: str,
        session_id: str | None = None,
        processors: Sequence[ProcessorSpec] | None = None,
        history_messages: Sequence[AnyMessage] | None = None,
        token_counter: TokenCounter | None = None,
    ) -> ModelContext:
        """The context for (session, context id), created on first use.

        An existing context is returned as it is (its processors and history stay).
        ``history_messages`` are logged and put in the view without running processors.

        Raises:
            ConfigError: an unknown processor name or an invalid processor config.
            InvalidKeyError: an id that is not a safe identifier.
        """
        pool_key = (session_id or "default", context_id)
        with self._lock:
            existing = self._contexts.get(pool_key)
            if existing is not None:
                return existing
            built = self._build_processors(processors or [])
            names = {n for _, p in built if (n := p.api_key_env())}
            context = ModelContext(
                context_id=context_id,
                session_id=session_id,
                config=self.config,
                processors=built,
                api_keys={n: self._environ[n] for n in names if n in self._environ},
                token_counter=token_counter or self.default_counter(),
                offload_store=self.offload_store,
                clock=self.clock,
                detector=self.detector,
                subscribers=self._subscribers,
                history_messages=history_messages or (),
            )
            self._contexts[pool_key] = context
            return context

    def create_async_context(
        self, context_id: str, session_id: str | None = None, **kwargs: Any
    ) -> AsyncModelContext:
        """``create_context`` wrapped in an ``AsyncModelContext``."""
        return AsyncModelContext(self.create_context(context_id, session_id, **kwargs))

    def get_context(self, context_id: str, session_id: str | None = None) -> ModelContext | None:
        """The pooled context, or None."""
        with self._lock:
            return self._contexts.get((session_id or "default", context_id))

    def clear_context(self, context_id: str, session_id: str | None = None) -> None:
        """Forget a pooled context (its offloads stay in the store)."""
        with self._lock:
            self._contexts.pop((session_id or "default", context_id), None)

    def _require(self, context_id: str, session_id: str | None) -> ModelContext:
        context = self.get_context(context_id, session_id)
        if context is None:
            raise NotFoundError(f"no context {context_id!r} in session {session_id or 'default'!r}")
        return context

    def compress_context(
        self, context_id: str, session_id: str | None = None, **kwargs: Any
    ) -> CompressResult:
        """``ModelContext.compress_context`` of a pooled context (missing -> ``NotFoundError``)."""
        return self._require(context_id, session_id).compress_context(**kwargs)

    def recover_from_model_exception(
        self,
        exc: BaseException,
        context_id: str,
        session_id: str | None = None,
        *,
        stream_started: bool = False,
    ) -> bool:
        """``ModelContext.recover_from_model_exception`` of a pooled context."""
        return self._require(context_id, session_id).recover_from_model_exception(
            exc, stream_started=stream_started
        )

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Receive the compression-state events of every context; returns an unsubscribe."""
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

        return unsubscribe
