"""``AsyncModelContext``: a ``ModelContext`` for asyncio agents (its methods as coroutines)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ctxcore.messages import AnyMessage
from ctxcore.processors.recall_tool import DEFAULT_RECALL_TOKENS
from ctxcore.window import ContextStats, ContextWindow

if TYPE_CHECKING:
    from ctxcore.engine_context import ModelContext
    from ctxcore.engine_hooks import CompressResult
    from ctxcore.recall.archive import RecallAnswer

__all__ = ["AsyncModelContext"]

T = TypeVar("T")


class AsyncModelContext:
    """``ModelContext`` for asyncio agents: the same methods as coroutines.

    Each call runs the synchronous method in a worker thread (``asyncio.to_thread``), so
    a slow processor never blocks the event loop.
    """

    def __init__(self, context: ModelContext) -> None:
        self.context = context

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def add_messages(self, messages: AnyMessage | Sequence[AnyMessage]) -> list[str]:
        """See ``ModelContext.add_messages``."""
        return await self._call(self.context.add_messages, messages)

    async def get_messages(self) -> list[AnyMessage]:
        """See ``ModelContext.get_messages``."""
        return await self._call(self.context.get_messages)

    async def get_raw_messages(self) -> list[AnyMessage]:
        """See ``ModelContext.get_raw_messages``."""
        return await self._call(self.context.get_raw_messages)

    async def set_messages(self, messages: Sequence[AnyMessage]) -> None:
        """See ``ModelContext.set_messages``."""
        await self._call(self.context.set_messages, messages)

    async def pop_messages(self, count: int = 1) -> list[AnyMessage]:
        """See ``ModelContext.pop_messages``."""
        return await self._call(self.context.pop_messages, count)

    async def get_context_window(
        self,
        system_messages: Sequence[AnyMessage] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        window_size: int | None = None,
        dialogue_round: int | None = None,
        **kwargs: Any,
    ) -> ContextWindow:
        """See ``ModelContext.get_context_window``."""
        return await self._call(
            self.context.get_context_window, system_messages, tools, window_size, dialogue_round, **kwargs
        )

    async def compress_context(
        self,
        processor_types: Sequence[str] | None = None,
        compression_trigger: str = "manual",
        preserve_instruction: str | None = None,
    ) -> CompressResult:
        """See ``ModelContext.compress_context``."""
        return await self._call(
            self.context.compress_context, processor_types, compression_trigger, preserve_instruction
        )

    async def statistic(self) -> ContextStats:
        """See ``ModelContext.statistic``."""
        return await self._call(self.context.statistic)

    async def save_state(self) -> dict[str, Any]:
        """See ``ModelContext.save_state``."""
        return await self._call(self.context.save_state)

    async def load_state(self, state: Mapping[str, Any]) -> None:
        """See ``ModelContext.load_state``."""
        await self._call(self.context.load_state, state)

    async def recall(self, query: str, max_tokens: int = DEFAULT_RECALL_TOKENS) -> RecallAnswer:
        """See ``ModelContext.recall``."""
        return await self._call(self.context.recall, query, max_tokens)

    async def reload(self, handle: str) -> list[AnyMessage]:
        """See ``ModelContext.reload``."""
        return await self._call(self.context.reload, handle)

    async def recover_from_model_exception(self, exc: BaseException, *, stream_started: bool = False) -> bool:
        """See ``ModelContext.recover_from_model_exception``."""
        return await self._call(self.context.recover_from_model_exception, exc, stream_started=stream_started)

    async def truncate_after(self, log_id: str, *, expected_last_id: str | None = None) -> list[str]:
        """See ``ModelContext.truncate_after``."""
        return await self._call(self.context.truncate_after, log_id, expected_last_id=expected_last_id)
