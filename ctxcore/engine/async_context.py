"""``AsyncModelContext``: a ``ModelContext`` for asyncio agents (its methods as coroutines)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ctxcore.messages import AnyMessage
from ctxcore.processors.recall_tool import DEFAULT_RECALL_TOKENS
from ctxcore.window import ContextStats, ContextWindow

if TYPE_CHECKING:
    from ctxcore.engine.context import ModelContext
    from ctxcore.engine.hooks import CompressResult
    from ctxcore.recall.archive import RecallAnswer

__all__ = ["AsyncModelContext"]


class AsyncModelContext:
    """``ModelContext`` for asyncio agents: the same methods as coroutines.

    Each call runs the synchronous method in a worker thread (``asyncio.to_thread``), so
    a slow processor never blocks the event loop.
    """

    def __init__(self, context: ModelContext) -> None:
        self.context = context

    async def add_messages(self, messages: AnyMessage | Sequence[AnyMessage]) -> list[str]:
        """See ``ModelContext.add_messages``."""
        return await asyncio.to_thread(self.context.add_messages, messages)

    async def get_messages(self) -> list[AnyMessage]:
        """See ``ModelContext.get_messages``."""
        return await asyncio.to_thread(self.context.get_messages)

    async def get_raw_messages(self) -> list[AnyMessage]:
        """See ``ModelContext.get_raw_messages``."""
        return await asyncio.to_thread(self.context.get_raw_messages)

    async def set_messages(self, messages: Sequence[AnyMessage]) -> None:
        """See ``ModelContext.set_messages``."""
        await asyncio.to_thread(self.context.set_messages, messages)

    async def pop_messages(self, count: int = 1) -> list[AnyMessage]:
        """See ``ModelContext.pop_messages``."""
        return await asyncio.to_thread(self.context.pop_messages, count)

    async def get_context_window(
        self,
        system_messages: Sequence[AnyMessage] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        window_size: int | None = None,
        dialogue_round: int | None = None,
        **kwargs: Any,
    ) -> ContextWindow:
        """See ``ModelContext.get_context_window``."""
        return await asyncio.to_thread(
            self.context.get_context_window, system_messages, tools, window_size, dialogue_round, **kwargs
        )

    async def compress_context(
        self,
        processor_types: Sequence[str] | None = None,
        compression_trigger: str = "manual",
        preserve_instruction: str | None = None,
    ) -> CompressResult:
        """See ``ModelContext.compress_context``."""
        return await asyncio.to_thread(
            self.context.compress_context, processor_types, compression_trigger, preserve_instruction
        )

    async def statistic(self) -> ContextStats:
        """See ``ModelContext.statistic``."""
        return await asyncio.to_thread(self.context.statistic)

    async def save_state(self) -> dict[str, Any]:
        """See ``ModelContext.save_state``."""
        return await asyncio.to_thread(self.context.save_state)

    async def load_state(self, state: Mapping[str, Any]) -> None:
        """See ``ModelContext.load_state``."""
        await asyncio.to_thread(self.context.load_state, state)

    async def recall(self, query: str, max_tokens: int = DEFAULT_RECALL_TOKENS) -> RecallAnswer:
        """See ``ModelContext.recall``."""
        return await asyncio.to_thread(self.context.recall, query, max_tokens)

    async def reload(self, handle: str) -> list[AnyMessage]:
        """See ``ModelContext.reload``."""
        return await asyncio.to_thread(self.context.reload, handle)

    async def recover_from_model_exception(self, exc: BaseException, *, stream_started: bool = False) -> bool:
        """See ``ModelContext.recover_from_model_exception``."""
        return await asyncio.to_thread(
            self.context.recover_from_model_exception, exc, stream_started=stream_started
        )

    async def truncate_after(self, log_id: str, *, expected_last_id: str | None = None) -> list[str]:
        """See ``ModelContext.truncate_after``."""
        return await asyncio.to_thread(self.context.truncate_after, log_id, expected_last_id=expected_last_id)
