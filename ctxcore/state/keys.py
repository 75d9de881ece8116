"""Conversation keys: the (tenant, conversation) pair every store is keyed by.

Validation here is what keeps crafted ids (``:``, ``{``, ``/``, ``..``) from reaching
another tenant's Redis keys, SQL rows or offload files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ctxcore.errors import InvalidKeyError

__all__ = ["ConversationKey", "listing_wanted", "validate_id"]

_ID = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,127}")


def validate_id(value: object, what: str) -> str:
    """Return ``value`` if it is a safe id (1-128 of letters, digits, ``-_.``, not starting with ``.``)."""
    if not isinstance(value, str) or _ID.fullmatch(value) is None:
        shown = repr(value) if not isinstance(value, str) or len(value) <= 80 else repr(value[:80] + "...")
        raise InvalidKeyError(
            f"invalid {what} {shown}: use 1-128 characters from letters, digits, '-', '_' and '.', "
            "not starting with '.'"
        )
    return value


def listing_wanted(tenant_id: str, after: str | None, limit: int) -> bool:
    """Check the ids of a ``list_conversations`` call; False when ``limit`` asks for nothing."""
    validate_id(tenant_id, "tenant_id")
    if after is not None:
        validate_id(after, "conversation_id")
    return limit >= 1


@dataclass(frozen=True, order=True)
class ConversationKey:
    """Identifies one conversation of one tenant."""

    tenant_id: str
    conversation_id: str

    def __post_init__(self) -> None:
        validate_id(self.tenant_id, "tenant_id")
        validate_id(self.conversation_id, "conversation_id")

    @property
    def hash_tag(self) -> str:
        """``{tenant:conversation}``: keeps all Redis keys of a conversation in one cluster slot."""
        return f"{{{self.tenant_id}:{self.conversation_id}}}"

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.conversation_id}"
