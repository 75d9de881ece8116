"""The message model and its OpenAI chat-format conversion.

Messages are immutable pydantic models: a processor that wants to change one makes a
copy (``replace_content``), so the raw log can never be rewritten by accident.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from ctxcore.errors import InvalidMessageError

__all__ = [
    "AssistantMessage",
    "ContentPart",
    "Message",
    "SystemMessage",
    "ToolCall",
    "ToolMessage",
    "UsageMetadata",
    "UserMessage",
    "from_openai",
    "message_text",
    "messages_from_json",
    "messages_to_json",
    "replace_content",
    "sanitize_text",
    "to_openai",
]

ContentPart: TypeAlias = dict[str, Any] | str
Content: TypeAlias = str | list[ContentPart] | None

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class ToolCall(BaseModel):
    """One function call requested by an assistant message (stored flat)."""

    model_config = _FROZEN

    id: str
    name: str
    arguments: str = "{}"
    type: str = "function"


class UsageMetadata(BaseModel):
    """Token usage a provider reported for the call that produced an assistant message."""

    model_config = ConfigDict(frozen=True, extra="allow")

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    cache_tokens: int = 0
    reasoning_tokens: int = 0
    model_name: str = ""


class _BaseMessage(BaseModel):
    model_config = _FROZEN

    content: Content = ""
    name: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    # A client-chosen id used to deduplicate appends (ctxcore extension key).
    message_id: str | None = None
    # The message's id in its context or log; its string order is append order.
    context_message_id: str | None = None

    @property
    def text(self) -> str:
        """The content flattened to plain, sanitised text."""
        return message_text(self)  # type: ignore[arg-type]


class SystemMessage(_BaseMessage):
    """Instructions for the model; never logged, sent with each window request."""

    role: Literal["system"] = "system"


class UserMessage(_BaseMessage):
    """A message from the user (or an internal user-role message such as a memory block)."""

    role: Literal["user"] = "user"


class AssistantMessage(_BaseMessage):
    """A model reply, possibly requesting tool calls."""

    role: Literal["assistant"] = "assistant"
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage_metadata: UsageMetadata | None = None


class ToolMessage(_BaseMessage):
    """The result of one tool call; ``tool_call_id`` names the call it answers."""

    role: Literal["tool"] = "tool"
    tool_call_id: str


Message = Annotated[SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")]
AnyMessage: TypeAlias = SystemMessage | UserMessage | AssistantMessage | ToolMessage

_MESSAGE_LIST = TypeAdapter(list[Message])

_OPENAI_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id"})
_EXTENSION_KEYS = frozenset({"message_id", "metadata", "context_message_id"})
_CLASS_BY_ROLE: dict[str, type[_BaseMessage]] = {
    "system": SystemMessage,
    "user": UserMessage,
    "assistant": AssistantMessage,
    "tool": ToolMessage,
}

# --- text flattening -------------------------------------------------------------------

_DATA_URL = re.compile(r"data:image/[A-Za-z0-9.+-]+;base64,[A-Za-z0-9+/=]+")
DATA_URL_PLACEHOLDER = "[image:data-url-omitted]"
BASE64_PLACEHOLDER = "[image:base64-omitted]"


def sanitize_text(text: str) -> str:
    """Replace inline base64 images by a short placeholder (they are priced separately)."""
    if "data:image/" not in text:
        return text
    return _DATA_URL.sub(DATA_URL_PLACEHOLDER, text)


def part_text(part: ContentPart) -> str:
    """Plain text of one content part; image parts become placeholders."""
    if isinstance(part, str):
        return sanitize_text(part)
    kind = part.get("type")
    if isinstance(part.get("text"), str):
        return sanitize_text(part["text"])
    if kind == "image_url":
        url = part.get("image_url")
        url = url.get("url", "") if isinstance(url, Mapping) else url
        if isinstance(url, str) and url.startswith("data:"):
            return DATA_URL_PLACEHOLDER
        return f"[image:{url}]" if isinstance(url, str) else "[image]"
    if kind == "image":
        source = part.get("source")
        if isinstance(source, Mapping) and source.get("type") == "base64":
            return BASE64_PLACEHOLDER
        return "[image]"
    return ""


def content_text(content: Content) -> str:
    """Plain text of a content value (string, list of parts, or None)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return sanitize_text(content)
    return "\n".join(t for t in (part_text(p) for p in content) if t)


def message_text(message: AnyMessage) -> str:
    """The message content as plain, sanitised text (no tool calls)."""
    return content_text(message.content)


def replace_content(message: AnyMessage, content: Content, **metadata: Any) -> AnyMessage:
    """A copy of ``message`` with new content and ``metadata`` merged into its metadata."""
    update: dict[str, Any] = {"content": content}
    if metadata:
        update["metadata"] = {**message.metadata, **metadata}
    return message.model_copy(update=update)


# --- OpenAI format in -------------------------------------------------------------------


def _parse_tool_call(index: int, pos: int, raw: Any) -> ToolCall:
    field = f"tool_calls[{pos}]"
    if not isinstance(raw, Mapping):
        raise InvalidMessageError(index, field, f"expected an object, got {type(raw).__name__}")
    function = raw.get("function")
    if function is not None:
        if not isinstance(function, Mapping):
            raise InvalidMessageError(
                index, f"{field}.function", "expected an object with name and arguments"
            )
        name, arguments = function.get("name"), function.get("arguments", "{}")
    else:
        name, arguments = raw.get("name"), raw.get("arguments", "{}")
    call_id = raw.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise InvalidMessageError(index, f"{field}.id", "a tool call needs a non-empty string id")
    if not isinstance(name, str) or not name:
        raise InvalidMessageError(index, f"{field}.name", "a tool call needs a non-empty function name")
    if not isinstance(arguments, str):
        raise InvalidMessageError(
            index, f"{field}.arguments", f"arguments must be a JSON string, got {type(arguments).__name__}"
        )
    call_type = raw.get("type", "function")
    if not isinstance(call_type, str):
        raise InvalidMessageError(index, f"{field}.type", "expected a string")
    return ToolCall(id=call_id, name=name, arguments=arguments, type=call_type)


def _check_content(index: int, content: Any) -> Content:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        for pos, part in enumerate(content):
            if not isinstance(part, str | dict):
                raise InvalidMessageError(
                    index,
                    f"content[{pos}]",
                    f"a content part must be a string or object, not {type(part).__name__}",
                )
        return list(content)
    raise InvalidMessageError(
        index, "content", f"expected a string, a list of parts or null, not {type(content).__name__}"
    )


def _parse_one(index: int, raw: Any) -> AnyMessage:
    if not isinstance(raw, Mapping):
        raise InvalidMessageError(index, "message", f"expected an object, got {type(raw).__name__}")
    role = raw.get("role")
    if role not in _CLASS_BY_ROLE:
        raise InvalidMessageError(
            index, "role", f"unknown role {role!r}; expected system, user, assistant or tool"
        )
    fields: dict[str, Any] = {"content": _check_content(index, raw.get("content", ""))}

    name = raw.get("name")
    if name is not None and not isinstance(name, str):
        raise InvalidMessageError(index, "name", "expected a string")
    fields["name"] = name

    tool_calls = raw.get("tool_calls")
    if tool_calls not in (None, []):
        if role != "assistant":
            raise InvalidMessageError(
                index, "tool_calls", f"only assistant messages carry tool calls, not {role}"
            )
        if not isinstance(tool_calls, list):
            raise InvalidMessageError(index, "tool_calls", "expected a list")
        calls = [_parse_tool_call(index, pos, c) for pos, c in enumerate(tool_calls)]
        seen: set[str] = set()
        for pos, call in enumerate(calls):
            if call.id in seen:
                raise InvalidMessageError(
                    index, f"tool_calls[{pos}].id", f"duplicate tool call id {call.id!r}"
                )
            seen.add(call.id)
        fields["tool_calls"] = calls

    tool_call_id = raw.get("tool_call_id")
    if role == "tool":
        if not isinstance(tool_call_id, str) or not tool_call_id:
            raise InvalidMessageError(
                index, "tool_call_id", "a tool message needs the id of the call it answers"
            )
        fields["tool_call_id"] = tool_call_id
    elif tool_call_id is not None:
        raise InvalidMessageError(index, "tool_call_id", f"only tool messages carry tool_call_id, not {role}")

    metadata = raw.get("metadata")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise InvalidMessageError(index, "metadata", "expected an object")
    metadata = dict(metadata or {})
    for key in ("message_id", "context_message_id"):
        value = raw.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            raise InvalidMessageError(index, key, "expected a non-empty string")
        fields[key] = value

    extra = {k: v for k, v in raw.items() if k not in _OPENAI_KEYS and k not in _EXTENSION_KEYS}
    if extra:
        previous = metadata.get("extra")
        metadata["extra"] = {**previous, **extra} if isinstance(previous, Mapping) else extra
    fields["metadata"] = metadata
    return _CLASS_BY_ROLE[role](**fields)  # type: ignore[return-value]


def from_openai(messages: Iterable[Any]) -> list[AnyMessage]:
    """Parse OpenAI chat messages (nested or flat tool calls) into message objects.

    ``message_id`` and ``metadata`` are ctxcore extension keys; any other key outside
    the OpenAI schema (e.g. a dataset's ``msg_id``) is kept in ``metadata["extra"]``.
    Raises ``InvalidMessageError`` naming the index and field of the first problem.
    """
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Iterable):
        raise InvalidMessageError(-1, "messages", "expected a list of message objects")
    return [_parse_one(i, raw) for i, raw in enumerate(messages)]


# --- OpenAI format out ------------------------------------------------------------------


def _present(value: Any) -> bool:
    return value is not None and value != []


def _to_openai_one(message: AnyMessage, include_extra: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role}
    if _present(message.content):
        out["content"] = message.content
    if message.name is not None:
        out["name"] = message.name
    if isinstance(message, AssistantMessage) and message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": c.type, "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    if isinstance(message, ToolMessage):
        out["tool_call_id"] = message.tool_call_id
    if include_extra:
        if message.message_id is not None:
            out["message_id"] = message.message_id
        if message.context_message_id is not None:
            out["context_message_id"] = message.context_message_id
        metadata = {k: v for k, v in message.metadata.items() if k != "extra"}
        if metadata:
            out["metadata"] = metadata
        extra = message.metadata.get("extra")
        if isinstance(extra, Mapping):
            for key, value in extra.items():
                if key not in out and _present(value):
                    out[key] = value
    return out


def to_openai(messages: Sequence[AnyMessage], include_extra: bool = False) -> list[dict[str, Any]]:
    """Render messages as OpenAI chat dicts (nested tool calls, content exactly as given).

    Only OpenAI keys are emitted unless ``include_extra`` is set, which adds
    ``message_id``, ``context_message_id``, ``metadata`` and the kept extra keys.
    """
    return [_to_openai_one(m, include_extra) for m in messages]


# --- storage round trip -----------------------------------------------------------------


def messages_to_json(messages: Sequence[AnyMessage]) -> bytes:
    """Serialise messages losslessly (every field) for the stores."""
    return _MESSAGE_LIST.dump_json(list(messages))


def messages_from_json(data: bytes | str) -> list[AnyMessage]:
    """Inverse of ``messages_to_json``."""
    return _MESSAGE_LIST.validate_json(data)
