"""The path and header parameters several HTTP routers take (``ApiState``, which they share
with the proxy and the UI, is ``workers.api_common.state``)."""

from typing import Annotated

from fastapi import Header, Path

__all__ = ["ConversationId", "IfMatch", "parse_if_match"]

ConversationId = Annotated[str, Path(description="Conversation id: 1-128 of letters, digits, '-', '_', '.'")]
IfMatch = Annotated[
    str | None, Header(alias="If-Match", description="The log id the log must end at (else 409)")
]


def parse_if_match(value: str | None) -> str | None:
    """The log id in an ``If-Match`` header: a bare id or an entity tag (``"id"``, ``W/"id"``)."""
    if value is None:
        return None
    text = value.strip().removeprefix("W/")
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1]
    return text
