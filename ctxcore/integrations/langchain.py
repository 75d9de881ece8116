"""LangChain v1: ``CtxcoreMiddleware``, ctxcore's window in front of every model call.

``create_agent(model, tools, middleware=[CtxcoreMiddleware(client=client, budget_tokens=16000)])``
(or ``CtxcoreMiddleware(context)`` over an embedded ``ModelContext``). Before each model
call the middleware logs the state's messages that are not logged yet (LangChain's ``id``
is the ``message_id``) and calls the model with ctxcore's window instead of the whole
history, through ``request.override(messages=...)``: the graph state (and its checkpoints)
keep every message unchanged, only what the model sees is compacted. When the agent
finishes (the ``after_agent`` hook), the messages no model call logged, its final reply
above all, are logged too: the log holds the whole run as soon as ``invoke`` returns.

Needs ``pip install 'ctxcore[langchain]'``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

try:
    from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        HumanMessage,
        RemoveMessage,
        SystemMessage,
        ToolMessage,
        convert_to_messages,
        convert_to_openai_messages,
    )
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from langgraph.runtime import Runtime
except ImportError as exc:  # pragma: no cover - the dev extra installs it
    raise ImportError(
        "ctxcore.integrations.langchain needs LangChain v1: pip install 'ctxcore[langchain]'"
    ) from exc

from ctxcore.client import AsyncCtxcoreClient, CtxcoreClient
from ctxcore.client.status import StatusWatch
from ctxcore.engine import AsyncModelContext, ModelContext
from ctxcore.errors import ConfigError, UnsupportedItemError
from ctxcore.messages import AnyMessage, from_openai, to_openai
from ctxcore.messages import SystemMessage as CtxSystemMessage
from ctxcore.state.keys import validate_id

__all__ = ["CtxcoreMiddleware", "from_langchain", "to_langchain"]

_LOGGABLE = (HumanMessage, AIMessage, ToolMessage)


def _derived_id(conversation_id: str, index: int, message: BaseMessage) -> str:
    # A message without an id (a graph that does not assign them) is identified by its
    # position and content, so logging it twice is recognised as a duplicate.
    digest = hashlib.sha256(
        json.dumps(message.model_dump(), sort_keys=True, default=str).encode()
    ).hexdigest()
    return f"lc:{conversation_id}:{index}:{digest[:16]}"


def from_langchain(
    messages: Sequence[BaseMessage], conversation_id: str = "", start: int = 0
) -> tuple[list[AnyMessage], list[AnyMessage]]:
    """LangChain messages as ctxcore messages: (loggable messages, system messages).

    Each loggable message's ``message_id`` is its LangChain ``id``; a tool message with
    ``status="error"`` gets ``metadata.is_error``. ``RemoveMessage`` and types without a
    chat role (``ChatMessage``, ``FunctionMessage``...) raise ``UnsupportedItemError``
    naming the type.
    """
    loggable: list[AnyMessage] = []
    system: list[AnyMessage] = []
    for offset, message in enumerate(messages):
        index = start + offset
        if isinstance(message, RemoveMessage) or not isinstance(message, (*_LOGGABLE, SystemMessage)):
            raise UnsupportedItemError(
                index,
                type(message).__name__,
                "ctxcore logs Human, AI, Tool and System messages only; the log is append-only, "
                "so removals cannot be replayed (use DELETE .../messages?after= for the newest)",
            )
        (converted,) = convert_to_openai_messages([message])
        data: dict[str, Any] = dict(converted)
        if isinstance(message, SystemMessage):
            system.extend(from_openai([data]))
            continue
        data["message_id"] = message.id or _derived_id(conversation_id, index, message)
        if isinstance(message, ToolMessage) and message.status == "error":
            data["metadata"] = {"is_error": True}
        loggable.extend(from_openai([data]))
    return loggable, system


def to_langchain(messages: Sequence[AnyMessage]) -> list[BaseMessage]:
    """ctxcore messages (a window) as LangChain messages."""
    return list(convert_to_messages(to_openai(messages)))


class _Progress:
    """How far a conversation's state messages are logged: (count, id of the last one)."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[int, str | None]] = {}

    def new(self, conversation_id: str, state: Sequence[BaseMessage]) -> int:
        """Where the unlogged messages start: after the ones logged last time if the state
        still holds them, else 0 (all are sent again, deduplicated by ``message_id``)."""
        count, last = self.seen.get(conversation_id, (0, None))
        return count if 0 < count <= len(state) and state[count - 1].id == last else 0

    def done(self, conversation_id: str, state: Sequence[BaseMessage]) -> None:
        self.seen[conversation_id] = (len(state), state[-1].id if state else None)


class CtxcoreMiddleware(AgentMiddleware):
    """Serves ctxcore's window to every model call of a LangChain v1 agent.

    Args:
        context: an embedded ``ModelContext`` (sync and async calls) or
            ``AsyncModelContext`` (async calls only); its window size is the budget.
        client: a ``CtxcoreClient`` (sync and async calls) or ``AsyncCtxcoreClient``
            (async calls only), with ``budget_tokens``.
        conversation_id: the conversation; default: the run's ``thread_id``
            (``config={"configurable": {"thread_id": ...}}``), else ``ConfigError``.
        model: the model name choosing the tokenizer on the server (client mode).

    The window counts ``request.system_message`` (never logged) and ``request.tools``.
    """

    def __init__(
        self,
        context: ModelContext | AsyncModelContext | None = None,
        *,
        client: CtxcoreClient | AsyncCtxcoreClient | None = None,
        budget_tokens: int | None = None,
        conversation_id: str | None = None,
        model: str | None = None,
    ) -> None:
        super().__init__()
        if (context is None) == (client is None):
            raise ConfigError("CtxcoreMiddleware: pass exactly one of context= or client=")
        if client is not None and (budget_tokens is None or budget_tokens <= 0):
            raise ConfigError("CtxcoreMiddleware: client= needs budget_tokens > 0")
        if conversation_id is not None:
            validate_id(conversation_id, "conversation_id")
        self.context = context
        self.client = client
        self.budget_tokens = budget_tokens or 0
        self.conversation_id = conversation_id
        self.model = model
        self._progress = _Progress()
        # Logs when a conversation's compaction turns paused/failing (served windows go on).
        self._status = StatusWatch()

    # --- the conversation and the request ------------------------------------------

    def _conversation(self, runtime: Runtime[Any] | None) -> str:
        """The conversation id (``runtime``: the request's or the hook's LangGraph runtime)."""
        if self.context is not None:
            inner = self.context.context if isinstance(self.context, AsyncModelContext) else self.context
            return inner.context_id
        if self.conversation_id is not None:
            return self.conversation_id
        # execution_info is declared by every langgraph langchain>=1.5 accepts (>=1.2.12); it is
        # None before LangGraph prepares the task, and a request built by hand has no runtime.
        info = runtime.execution_info if runtime is not None else None
        thread = info.thread_id if info is not None else None
        if thread is None:
            from langgraph.config import get_config

            try:
                thread = get_config().get("configurable", {}).get("thread_id")
            except RuntimeError:  # outside a runnable context
                thread = None
        if not thread:
            raise ConfigError(
                "CtxcoreMiddleware: no conversation id: pass conversation_id= or run the agent with "
                'config={"configurable": {"thread_id": ...}}'
            )
        return validate_id(str(thread), "thread_id")

    def _prepare(
        self, request: ModelRequest[Any]
    ) -> tuple[str, list[AnyMessage], list[AnyMessage], list[dict[str, Any]], list[BaseMessage]]:
        conversation = self._conversation(request.runtime)
        state: list[BaseMessage] = list(request.state.get("messages", []))
        fresh = self._unlogged(conversation, state)
        _, system = from_langchain([m for m in state if isinstance(m, SystemMessage)], conversation)
        if request.system_message is not None:
            (head,) = from_openai(convert_to_openai_messages([request.system_message]))
            system = [head, *system]
        tools = [convert_to_openai_tool(t) for t in request.tools]
        return conversation, fresh, system, tools, state

    def _unlogged(self, conversation: str, state: Sequence[BaseMessage]) -> list[AnyMessage]:
        """The state's messages not logged yet (since the last call's), as ctxcore messages."""
        start = self._progress.new(conversation, state)
        fresh, _ = from_langchain(state[start:], conversation, start)
        return fresh

    def _override(self, request: ModelRequest[Any], window: Sequence[AnyMessage]) -> ModelRequest[Any]:
        served = list(window)
        if request.system_message is not None and served and isinstance(served[0], CtxSystemMessage):
            served = served[1:]  # it stays the request's system message
        return request.override(messages=to_langchain(served))  # type: ignore[arg-type]

    # --- sync -------------------------------------------------------------------------

    def _window_sync(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        conversation, fresh, system, tools, state = self._prepare(request)
        self._log_sync(conversation, fresh)
        if isinstance(self.context, ModelContext):
            window = self.context.get_context_window(system_messages=system, tools=tools).get_messages()
        elif isinstance(self.client, CtxcoreClient):
            served = self.client.window(
                conversation,
                self.budget_tokens,
                system=system,
                tools=tools,
                model=self.model,
                format="openai",
            )
            window = from_openai(served.messages)
            self._status.seen(conversation, served)
        self._progress.done(conversation, state)
        return self._override(request, window)

    def _log_sync(self, conversation: str, fresh: Sequence[AnyMessage]) -> None:
        """Append ``fresh`` (an embedded context skips what it already holds; the server
        recognises a logged ``message_id``)."""
        if isinstance(self.context, ModelContext):
            logged = {m.message_id for m in self.context.get_raw_messages()}
            new = [m for m in fresh if m.message_id not in logged]
            if new:
                self.context.add_messages(new)
        elif isinstance(self.client, CtxcoreClient):
            if fresh:
                self.client.append(conversation, fresh)
        else:
            raise ConfigError(
                "CtxcoreMiddleware over an async context or client: run the agent with ainvoke/astream"
            )

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        """Log the new state messages, then call the model with ctxcore's window."""
        return handler(self._window_sync(request))

    def after_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        """The agent finished: log what no model call logged (its final reply)."""
        conversation = self._conversation(runtime)
        messages: list[BaseMessage] = list(state.get("messages", []))
        self._log_sync(conversation, self._unlogged(conversation, messages))
        self._progress.done(conversation, messages)
        return None

    # --- async ------------------------------------------------------------------------

    async def _window_async(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        if not isinstance(self.context, AsyncModelContext) and not isinstance(
            self.client, AsyncCtxcoreClient
        ):
            return await asyncio.to_thread(self._window_sync, request)
        conversation, fresh, system, tools, state = self._prepare(request)
        await self._log_async(conversation, fresh)
        if isinstance(self.context, AsyncModelContext):
            window = (
                await self.context.get_context_window(system_messages=system, tools=tools)
            ).get_messages()
        elif isinstance(self.client, AsyncCtxcoreClient):
            served = await self.client.window(
                conversation,
                self.budget_tokens,
                system=system,
                tools=tools,
                model=self.model,
                format="openai",
            )
            window = from_openai(served.messages)
            self._status.seen(conversation, served)
        else:  # pragma: no cover - excluded by the check at the top
            raise ConfigError("CtxcoreMiddleware: no context or client")
        self._progress.done(conversation, state)
        return self._override(request, window)

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        """``wrap_model_call`` for ``ainvoke``/``astream``."""
        return await handler(await self._window_async(request))

    async def _log_async(self, conversation: str, fresh: Sequence[AnyMessage]) -> None:
        """``_log_sync`` over an async context or client."""
        if isinstance(self.context, AsyncModelContext):
            logged = {m.message_id for m in await self.context.get_raw_messages()}
            new = [m for m in fresh if m.message_id not in logged]
            if new:
                await self.context.add_messages(new)
        elif isinstance(self.client, AsyncCtxcoreClient):
            if fresh:
                await self.client.append(conversation, fresh)
        else:
            await asyncio.to_thread(self._log_sync, conversation, fresh)

    async def aafter_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        """``after_agent`` for ``ainvoke``/``astream``."""
        conversation = self._conversation(runtime)
        messages: list[BaseMessage] = list(state.get("messages", []))
        await self._log_async(conversation, self._unlogged(conversation, messages))
        self._progress.done(conversation, messages)
        return None
