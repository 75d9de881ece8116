"""OpenAI Agents SDK: ``CtxcoreSession`` and its ``call_model_input_filter``.

A ``Session`` is read once per run, and within a run the model's input only grows, so a
session alone never compacts a long run. ``CtxcoreSession`` persists the run's items in
ctxcore's log, and its ``call_model_input_filter`` (``RunConfig.call_model_input_filter``,
built by ``ctxcore_run_config(session)``) replaces the input of *every* model call by
ctxcore's window::

    session = CtxcoreSession("run-42", client=AsyncCtxcoreClient(url, token), budget_tokens=16000)
    result = await Runner.run(agent, "fix the bug", session=session, run_config=ctxcore_run_config(session))

Each item is logged once whatever the order in which the runner calls the session and the
filter: an item's position in the session and its content identify it (the message id of
its log message derives from the session id, the position and the hash). One session
object per conversation at a time: it remembers what it logged. Needs
``pip install 'ctxcore[agents]'`` (pinned to the tested minor: the chat-format conversion
is ``agents.models.chatcmpl_converter.Converter``, which the SDK does not export).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

try:
    from agents import Agent, Handoff, RunConfig, handoff
    from agents.exceptions import UserError
    from agents.models.chatcmpl_converter import Converter
    from agents.run_config import CallModelData, ModelInputData
except ImportError as exc:  # pragma: no cover - the dev extra installs it
    raise ImportError(
        "ctxcore.integrations.openai_agents needs the OpenAI Agents SDK: pip install 'ctxcore[agents]'"
    ) from exc

from ctxcore.client import AsyncCtxcoreClient
from ctxcore.client.status import StatusWatch
from ctxcore.engine import AsyncModelContext
from ctxcore.errors import ConfigError, NotFoundError, TruncateRefused, UnsupportedItemError
from ctxcore.integrations.agents_items import (
    group_items,
    item_dict,
    item_hash,
    items_message,
    message_items,
    window_items,
)
from ctxcore.messages import AnyMessage, SystemMessage, from_openai
from ctxcore.state.base import format_log_id
from ctxcore.state.keys import validate_id

__all__ = ["CtxcoreSession", "ctxcore_run_config"]


@dataclass
class _Logged:
    """One log message of the session: its log id, its items and their hashes."""

    log_id: str
    items: list[dict[str, Any]]
    hashes: list[str]


def _tools(agent: Agent[Any]) -> list[dict[str, Any]]:
    """The agent's function tools and handoffs as chat-format tools (what the model is sent)."""
    out: list[dict[str, Any]] = []
    for index, tool in enumerate(agent.tools):
        try:
            out.append(dict(Converter.tool_to_openai(tool)))
        except UserError as exc:
            raise UnsupportedItemError(index, type(tool).__name__, str(exc)) from exc
    for target in agent.handoffs:
        spec: Handoff[Any, Any] = target if isinstance(target, Handoff) else handoff(target)
        out.append(dict(Converter.convert_handoff_tool(spec)))
    return out


class CtxcoreSession:
    """An Agents SDK ``Session`` whose history is ctxcore's log (see the module docstring).

    Args:
        session_id: the conversation id (1-128 of letters, digits, ``-_.``).
        context: an embedded ``AsyncModelContext`` (its window size is the budget), or
        client: an ``AsyncCtxcoreClient`` with ``budget_tokens``; ``model`` picks the
            server's tokenizer.
    """

    session_settings = None

    def __init__(
        self,
        session_id: str,
        *,
        context: AsyncModelContext | None = None,
        client: AsyncCtxcoreClient | None = None,
        budget_tokens: int | None = None,
        model: str | None = None,
    ) -> None:
        if (context is None) == (client is None):
            raise ConfigError("CtxcoreSession: pass exactly one of context= or client=")
        if client is not None and (budget_tokens is None or budget_tokens <= 0):
            raise ConfigError("CtxcoreSession: client= needs budget_tokens > 0")
        self.session_id = validate_id(session_id, "session_id")
        self.context = context
        self.client = client
        self.budget_tokens = budget_tokens or 0
        self.model = model
        self._logged: list[_Logged] | None = None
        self._confirmed = 0  # items the runner has added (the rest were logged by the filter)
        self._status = StatusWatch()  # logs when compaction turns paused/failing
        self.windows: int = 0

    # --- the log ----------------------------------------------------------------------

    async def _read_log(self) -> list[AnyMessage]:
        if self.context is not None:
            return await self.context.get_raw_messages()
        if self.client is None:  # pragma: no cover - the constructor requires one
            raise ConfigError("CtxcoreSession: no context or client")
        try:
            return [m async for m in self.client.messages(self.session_id)]
        except NotFoundError:
            return []

    async def _reload(self) -> list[_Logged]:
        logged = []
        for message in await self._read_log():
            items = message_items(message)
            logged.append(_Logged(str(message.context_message_id), items, [item_hash(i) for i in items]))
        self._logged = logged
        self._confirmed = self._count()
        return logged

    async def _mirror(self) -> list[_Logged]:
        return self._logged if self._logged is not None else await self._reload()

    def _count(self) -> int:
        return sum(len(entry.items) for entry in self._logged or [])

    def _hashes(self) -> list[str]:
        return [h for entry in self._logged or [] for h in entry.hashes]

    async def _log(self, items: list[dict[str, Any]]) -> None:
        """Append ``items`` after everything logged, grouped into log messages."""
        mirror = await self._mirror()
        position = self._count()
        groups = group_items(items, position)
        messages = []
        for group in groups:
            members = [items[i] for i in group]
            digest = item_hash({"items": members})
            messages.append(
                items_message(members, f"agents:{self.session_id}:{position + group[0]}:{digest}")
            )
        if self.context is not None:
            ids = await self.context.add_messages(messages)
        elif self.client is not None:
            ids = (await self.client.append(self.session_id, messages)).ids
        for log_id, group in zip(ids, groups, strict=True):
            members = [items[i] for i in group]
            mirror.append(_Logged(log_id, members, [item_hash(i) for i in members]))

    # --- Session -----------------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The raw log as Responses input items (the latest ``limit`` of them)."""
        logged = await self._reload()
        items = [item for entry in logged for item in entry.items]
        return items if limit is None else items[-limit:] if limit > 0 else []

    async def add_items(self, items: list[Any]) -> None:
        """Log items the runner adds (those the model-input filter logged already are skipped)."""
        await self._mirror()
        hashes = self._hashes()
        fresh: list[dict[str, Any]] = []
        for index, raw in enumerate(items):
            item = item_dict(index, raw)
            if not fresh and self._confirmed < len(hashes) and hashes[self._confirmed] == item_hash(item):
                self._confirmed += 1
            else:
                fresh.append(item)
        if fresh:
            await self._log(fresh)
            self._confirmed = self._count()

    async def pop_item(self) -> Any | None:
        """Remove the newest item if it is a whole log message no compaction covers.

        None for an empty session; ``TruncateRefused`` (reason ``part_of_message``,
        ``covered``, ``busy``) when it cannot be removed, nothing removed then.
        """
        logged = await self._reload()
        if not logged:
            return None
        last = logged[-1]
        if len(last.items) > 1:
            raise TruncateRefused(
                "part_of_message",
                f"session {self.session_id}: the newest item shares log message {last.log_id} with "
                f"{len(last.items) - 1} other item(s) of the same model turn; only whole messages can be removed",
                last_id=last.log_id,
            )
        keep = logged[-2].log_id if len(logged) > 1 else format_log_id(0)
        if self.context is not None:
            await self.context.truncate_after(keep, expected_last_id=last.log_id)
        elif self.client is not None:
            await self.client.truncate_after(self.session_id, keep, if_match=last.log_id)
        logged.pop()
        self._confirmed = min(self._confirmed, self._count())
        return last.items[0]

    async def clear_session(self) -> None:
        """Delete the conversation (embedded: remove every message, refused once compacted)."""
        if self.context is not None:
            await self.context.truncate_after(format_log_id(0))
        elif self.client is not None:
            with contextlib.suppress(NotFoundError):  # already gone
                await self.client.delete(self.session_id)
        self._logged, self._confirmed = [], 0

    # --- the model-input filter ----------------------------------------------------------

    def _unlogged(self, hashes: list[str]) -> int:
        """How many trailing input items are not in the log: the shortest suffix whose
        removal leaves a run of items that ends the log (the input may hold only its end)."""
        logged = self._hashes()
        for new in range(len(hashes) + 1):
            body = hashes[: len(hashes) - new]
            if len(body) <= len(logged) and logged[len(logged) - len(body) :] == body:
                return new
        return len(hashes)  # pragma: no cover - an empty body always matches

    async def call_model_input_filter(self, data: CallModelData[Any]) -> ModelInputData:
        """``RunConfig.call_model_input_filter``: log the input's unlogged items, then return
        ctxcore's window (counting ``instructions`` and the agent's tools) as the input."""
        await self._mirror()
        items = [item_dict(i, raw) for i, raw in enumerate(data.model_data.input)]
        new = self._unlogged([item_hash(i) for i in items])
        if new:
            await self._log(items[len(items) - new :])
        instructions = data.model_data.instructions
        system = [SystemMessage(content=instructions)] if instructions else []
        tools = _tools(data.agent)
        if self.context is not None:
            window = await self.context.get_context_window(system_messages=system, tools=tools)
            messages = window.get_messages()
        elif self.client is not None:
            served = await self.client.window(
                self.session_id, self.budget_tokens, system=system, tools=tools, model=self.model
            )
            messages = from_openai(served.messages)
            self._status.seen(self.session_id, served)
        self.windows += 1
        return ModelInputData(input=window_items(messages), instructions=instructions)  # type: ignore[arg-type]


def ctxcore_run_config(session: CtxcoreSession, **kwargs: Any) -> RunConfig:
    """A ``RunConfig`` whose ``call_model_input_filter`` serves ``session``'s window."""
    return RunConfig(call_model_input_filter=session.call_model_input_filter, **kwargs)
