"""The API's operations as data (``Call``): path, body, headers and how to read the answer.

``CtxcoreClient`` and ``AsyncCtxcoreClient`` send the same calls, one with a blocking and
one with an asyncio transport, so every operation is defined once, here.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx
from pydantic import BaseModel

from ctxcore.client.models import (
    AppendResponse,
    CompactResponse,
    ConversationList,
    JournalResponse,
    MessagesPage,
    OffloadResponse,
    RecallRequest,
    RecallResponse,
    RollbackRequest,
    RollbackResponse,
    StateResponse,
    TruncateResponse,
    UsageResponse,
    WindowFormat,
    WindowResponse,
)
from ctxcore.errors import InvalidMessageError
from ctxcore.messages import (
    AnyMessage,
    AssistantMessage,
    SystemMessage,
    ToolMessage,
    UserMessage,
    from_openai,
    to_openai,
)
from ctxcore.state.base import parse_log_id
from ctxcore.state.keys import validate_id

__all__ = ["Call", "MessageLike", "calls", "message_dicts"]

T = TypeVar("T")
MessageLike = AnyMessage | Mapping[str, Any] | Any
"""A ctxcore message, an OpenAI chat dict, or an OpenAI SDK message object (``model_dump``)."""

_CONV = "/v1/conversations"


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and the reading of its successful response.

    ``accept`` reads an error response to a *retry*: a 1-tuple holding the result when the
    error means the first attempt landed (a 404 to a repeated DELETE), else None.
    """

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    json: Any = None
    params: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    accept: Callable[[httpx.Response], tuple[T] | None] | None = None


def _message_dict(index: int, message: MessageLike) -> dict[str, Any]:
    if isinstance(message, SystemMessage | UserMessage | AssistantMessage | ToolMessage):
        out = to_openai([message], include_extra=True)[0]
    elif isinstance(message, Mapping):
        out = dict(message)
    elif isinstance(message, BaseModel):
        out = dict(message.model_dump(exclude_none=True))
    else:
        raise InvalidMessageError(
            index,
            "message",
            f"expected a ctxcore message, an OpenAI dict or SDK object, got {type(message).__name__}",
        )
    out.pop("context_message_id", None)
    return out


def message_dicts(messages: Iterable[MessageLike], *, assign_ids: bool) -> list[dict[str, Any]]:
    """Messages as API dicts, validated here (``InvalidMessageError`` before any request).

    With ``assign_ids`` each message without a ``message_id`` gets a random one, so a retry
    of the same append is recognised by the server and returns the same log ids.
    """
    if isinstance(messages, str | bytes | Mapping):
        raise InvalidMessageError(-1, "messages", "expected a list of messages")
    dicts = [_message_dict(i, m) for i, m in enumerate(messages)]
    from_openai(dicts)  # names the index and field of the first problem
    if assign_ids:
        for d in dicts:
            d["message_id"] = d.get("message_id") or uuid.uuid4().hex
    return dicts


def _system(system: str | Sequence[MessageLike] | None) -> list[dict[str, Any]]:
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    return message_dicts(system, assign_ids=False)


def _conv(conversation_id: str) -> str:
    return f"{_CONV}/{validate_id(conversation_id, 'conversation_id')}"


def _etag(log_id: str | None) -> dict[str, str]:
    return {"If-Match": f'"{log_id}"'} if log_id is not None else {}


def _model(cls: type[T]) -> Callable[[httpx.Response], T]:
    def parse(response: httpx.Response) -> T:
        return cls.model_validate(response.json())  # type: ignore[attr-defined, no-any-return]

    return parse


class calls:
    """Builders of every API call (validating ids before anything is sent)."""

    @staticmethod
    def append(
        conversation_id: str, messages: Iterable[MessageLike], if_match: str | None = None
    ) -> Call[AppendResponse]:
        """``POST .../messages``."""
        path = f"{_conv(conversation_id)}/messages"
        body = {"messages": message_dicts(messages, assign_ids=True)}
        for i, message in enumerate(body["messages"]):
            if message.get("role") == "system":
                raise InvalidMessageError(i, "role", "system messages are not logged: pass them to window()")
        return Call("POST", path, _model(AppendResponse), json=body, headers=_etag(if_match))

    @staticmethod
    def window(
        conversation_id: str,
        budget_tokens: int | None,
        system: str | Sequence[MessageLike] | None,
        tools: Sequence[Mapping[str, Any]] | None,
        model: str | None,
        format: WindowFormat,
        preview: bool = False,
    ) -> Call[WindowResponse]:
        """``POST .../window`` (``?preview=true``: records nothing)."""
        body = {
            "system_messages": _system(system),
            "tools": [dict(t) for t in tools or []],
            "budget_tokens": budget_tokens,
            "model": model,
        }
        return Call(
            "POST",
            f"{_conv(conversation_id)}/window",
            _model(WindowResponse),
            # An absent budget or model is left out (the server's default), not sent as null.
            json={name: value for name, value in body.items() if value is not None},
            params={"format": format, "preview": "true"} if preview else {"format": format},
        )

    @staticmethod
    def compact(conversation_id: str) -> Call[CompactResponse]:
        """``POST .../compact``."""
        return Call("POST", f"{_conv(conversation_id)}/compact", _model(CompactResponse))

    @staticmethod
    def state(conversation_id: str, history: bool) -> Call[StateResponse]:
        """``GET .../state``."""
        params = {"history": "1"} if history else {}
        return Call("GET", f"{_conv(conversation_id)}/state", _model(StateResponse), params=params)

    @staticmethod
    def offload(conversation_id: str, handle: str) -> Call[OffloadResponse]:
        """``GET .../offloads/{handle}``."""
        return Call("GET", f"{_conv(conversation_id)}/offloads/{handle}", _model(OffloadResponse))

    @staticmethod
    def journal(conversation_id: str, limit: int) -> Call[JournalResponse]:
        """``GET .../journal`` (newest first)."""
        if not 1 <= limit <= 200:
            raise InvalidMessageError(-1, "limit", "must be 1-200 entries")
        return Call(
            "GET", f"{_conv(conversation_id)}/journal", _model(JournalResponse), params={"limit": limit}
        )

    @staticmethod
    def rollback(conversation_id: str, version: int) -> Call[RollbackResponse]:
        """``POST .../rollback`` (the body validated before it is sent)."""
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise InvalidMessageError(-1, "version", "must be a positive state version")
        body = RollbackRequest(version=version).model_dump()
        return Call("POST", f"{_conv(conversation_id)}/rollback", _model(RollbackResponse), json=body)

    @staticmethod
    def conversations(after: str | None, limit: int) -> Call[ConversationList]:
        """``GET /v1/conversations`` (one page)."""
        params = {"limit": limit} if after is None else {"limit": limit, "after": validate_id(after, "after")}
        return Call("GET", _CONV, _model(ConversationList), params=params)

    @staticmethod
    def messages(conversation_id: str, after: str | None, limit: int) -> Call[MessagesPage]:
        """``GET .../messages`` (one page of the raw log)."""
        params: dict[str, Any] = {"limit": limit}
        if after is not None:
            parse_log_id(after)
            params["after"] = after
        return Call("GET", f"{_conv(conversation_id)}/messages", _model(MessagesPage), params=params)

    @staticmethod
    def recall(conversation_id: str, query: str, max_tokens: int) -> Call[RecallResponse]:
        """``POST .../recall`` (the body validated before it is sent)."""
        if not query.strip():
            raise InvalidMessageError(-1, "query", "must name the words to look for")
        if max_tokens <= 0:
            raise InvalidMessageError(-1, "max_tokens", "must be a positive number of tokens")
        body = RecallRequest(query=query, max_tokens=max_tokens).model_dump()
        return Call("POST", f"{_conv(conversation_id)}/recall", _model(RecallResponse), json=body)

    @staticmethod
    def usage() -> Call[UsageResponse]:
        """``GET /v1/usage``."""
        return Call("GET", "/v1/usage", _model(UsageResponse))

    @staticmethod
    def delete(conversation_id: str) -> Call[None]:
        """``DELETE .../{id}``: a retry answered 404 means the first attempt deleted it."""
        return Call(
            "DELETE",
            _conv(conversation_id),
            lambda _: None,
            accept=lambda r: (None,) if r.status_code == 404 else None,
        )

    @staticmethod
    def truncate_after(conversation_id: str, log_id: str, if_match: str | None) -> Call[TruncateResponse]:
        """``DELETE .../messages?after=``: a retry refused as ``moved`` with the log ending at
        ``log_id`` means the first attempt removed the messages (their ids are then not known)."""
        parse_log_id(log_id)

        def landed(response: httpx.Response) -> tuple[TruncateResponse] | None:
            body = response.json() if response.status_code == 409 else {}
            if body.get("reason") == "moved" and body.get("last_id") == log_id:
                return (TruncateResponse(removed=[], last_id=log_id),)
            return None

        return Call(
            "DELETE",
            f"{_conv(conversation_id)}/messages",
            _model(TruncateResponse),
            params={"after": log_id},
            headers=_etag(if_match),
            accept=landed,
        )
