"""How the proxy matches a chat-completions request against the conversation's log.

Both sides are compared in canonical form: the message parsed by ``from_openai``, rendered
by ``to_openai`` without extension keys, hashed. The hash of each message the proxy appends
is stored in its metadata (``PROXY_HASH_KEY``), so matching reads hashes, not renderings.

The request may omit a prefix of the log (client-side trimming): the alignment is the
smallest log offset ``k`` where the request and the log from ``k`` agree over their common
length (at least one message when the log is not empty). Request messages past the log's
end are new; a request ending inside the log is a replay when the next log message is its
stored reply, else it diverged.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from ctxcore.messages import AnyMessage, to_openai

__all__ = [
    "PROXY_HASH_KEY",
    "Divergence",
    "Match",
    "canonical_hash",
    "entry_hash",
    "match_request",
    "new_message_id",
    "reply_message_id",
]

PROXY_HASH_KEY = "ctxcore_proxy_hash"


def canonical_hash(message: AnyMessage) -> str:
    """sha256 of the message's canonical form (OpenAI keys only, sorted JSON).

    Empty content counts as none: OpenAI answers a tool call with ``"content": null``, and
    SDKs echo it back as ``null``, ``""`` or no key at all (``model_dump(exclude_none=True)``).
    """
    form = to_openai([message])[0]
    if form.get("content") == "":
        del form["content"]
    rendered = json.dumps(form, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(rendered.encode("utf-8")).hexdigest()


def entry_hash(message: AnyMessage) -> str:
    """The canonical hash of a logged message: stored at append, else computed."""
    stored = message.metadata.get(PROXY_HASH_KEY)
    return stored if isinstance(stored, str) else canonical_hash(message)


def new_message_id(conversation: str, position: int, digest: str) -> str:
    """The ``message_id`` of a request message at log ``position`` (0-based): a retried
    request computes the same ids, so the log appends nothing twice."""
    return "px-" + hashlib.sha256(f"{conversation}\x00{position}\x00{digest}".encode()).hexdigest()[:40]


def reply_message_id(conversation: str, position: int, request_hashes: Sequence[str]) -> str:
    """The ``message_id`` of the reply to a request whose messages end before ``position``."""
    joined = "\x00".join(request_hashes)
    return "pr-" + hashlib.sha256(f"{conversation}\x00{position}\x00{joined}".encode()).hexdigest()[:40]


@dataclass(frozen=True)
class Divergence:
    """The request does not follow the log: its first differing index and the log id there."""

    index: int
    log_id: str | None


@dataclass(frozen=True)
class Match:
    """Where a request stands against the log: ``offset`` is the log position of its first
    message, ``new_from`` the index of its first message past the log's end
    (``len(request)`` when none is new)."""

    offset: int
    new_from: int

    def end(self, request_length: int) -> int:
        """The log position right after the request's last message."""
        return self.offset + request_length


def match_request(
    log_ids: Sequence[str], log_hashes: Sequence[str], request_hashes: Sequence[str]
) -> Match | Divergence:
    """Align the request with the log (see the module docstring); ``Divergence`` names the
    first differing request index of the longest partial agreement and the log id there."""
    total = len(log_hashes)
    if total == 0 or not request_hashes:
        return Match(offset=total, new_from=0)
    best = (0, 0)  # (agreeing, k) of the longest partial agreement
    first = request_hashes[0]
    for k in range(total):
        if log_hashes[k] != first:
            continue
        # How many request messages agree with the log from offset k, in order.
        common = min(len(request_hashes), total - k)
        pairs = enumerate(zip(log_hashes[k:], request_hashes, strict=False))
        agreeing = next((i for i, (a, b) in pairs if a != b), common)
        if agreeing == common:
            return Match(offset=k, new_from=min(total - k, len(request_hashes)))
        if agreeing > best[0]:
            best = (agreeing, k)
    index, k = best
    return Divergence(index=index, log_id=log_ids[k + index])
