"""Shared pieces of the chaos tests and the soak bench: state validation, synthetic
conversations and a block-writing model responder (the processes they start are in
``tests/chaos/processes.py``).

Everything here talks to 127.0.0.1 only and every process it starts is stopped by its
own handle (never by name).
"""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.state import HISTORY_LIMIT, ConversationKey, MessageLog, StateStore
from ctxcore.state.models import CompressionState

LONG = os.environ.get("CTXCORE_LONG", "").strip().lower() in ("1", "true", "yes")

# --- state validation -------------------------------------------------------------------


def state_problems(state: CompressionState, log_ids: Sequence[str]) -> list[str]:
    """What is wrong with one saved state against the conversation's log ids (empty: valid).

    Valid: block ids unique; blocks ordered by log id and non-overlapping; every log id up to
    ``covered_until`` lies in exactly one block's range or is pinned; block ends and pinned
    ids exist in the log.
    """
    problems: list[str] = []
    v = state.version
    ids = [b.block_id for b in state.blocks]
    if len(set(ids)) != len(ids):
        problems.append(f"v{v}: duplicate block ids {ids}")
    known = set(log_ids)
    previous_last: str | None = None
    for block in state.blocks:
        if block.first_id > block.last_id:
            problems.append(f"v{v}: block {block.block_id} range {block.first_id}..{block.last_id} reversed")
        if block.first_id not in known or block.last_id not in known:
            problems.append(f"v{v}: block {block.block_id} ends outside the log")
        if previous_last is not None and block.first_id <= previous_last:
            problems.append(
                f"v{v}: block {block.block_id} overlaps or is out of order (after {previous_last})"
            )
        previous_last = block.last_id
    if state.covered_until is None:
        if state.blocks:
            problems.append(f"v{v}: blocks without a cursor")
        return problems
    if state.covered_until not in known:
        problems.append(f"v{v}: cursor {state.covered_until} not in the log")
    covered = [i for i in log_ids if i <= state.covered_until]
    owners: dict[str, int] = {i: 0 for i in covered}
    for block in state.blocks:
        for i in covered:
            if block.first_id <= i <= block.last_id:
                owners[i] += 1
        if block.last_id > state.covered_until:
            problems.append(f"v{v}: block {block.block_id} ends after the cursor")
    for pinned in state.pinned:
        if pinned not in owners:
            problems.append(f"v{v}: pinned {pinned} not in the covered log")
        else:
            owners[pinned] += 1
    if len(set(state.pinned)) != len(state.pinned):
        problems.append(f"v{v}: duplicate pinned ids {state.pinned}")
    bad = {i: n for i, n in owners.items() if n != 1}
    if bad:
        shown = dict(list(bad.items())[:5])
        problems.append(f"v{v}: {len(bad)} covered log ids not in exactly one block/pin, e.g. {shown}")
    return problems


def conversation_problems(
    store: StateStore, log: MessageLog, key: ConversationKey, appended: Sequence[AnyMessage] | None = None
) -> list[str]:
    """Every problem of one conversation: contiguous history, each kept state valid, and
    (when ``appended`` is given) the log exactly equal to what was appended."""
    problems: list[str] = []
    logged = log.read_after(key, None)
    log_ids = [m.context_message_id or "" for m in logged]
    if appended is not None:
        bare = [m.model_copy(update={"context_message_id": None}) for m in logged]
        if bare != list(appended):
            problems.append(f"{key}: log differs from what was appended ({len(bare)} vs {len(appended)})")
    if log_ids != sorted(log_ids) or len(set(log_ids)) != len(log_ids):
        problems.append(f"{key}: log ids not strictly increasing")
    current = store.load(key)
    history = store.history(key, HISTORY_LIMIT)
    if current is None:
        if history:
            problems.append(f"{key}: history without a current state")
        return problems
    versions = [s.version for s in history]
    if not versions or versions[0] != current.version:
        problems.append(f"{key}: history head {versions[:1]} is not the current version {current.version}")
    if versions != list(range(versions[0], versions[0] - len(versions), -1)) if versions else False:
        problems.append(f"{key}: history versions not contiguous: {versions}")
    if versions and current.version <= HISTORY_LIMIT and versions[-1] != 1:
        problems.append(f"{key}: history does not start at version 1: {versions}")
    for state in history:
        problems += [f"{key}: {p}" for p in state_problems(state, log_ids)]
    return problems


# --- synthetic conversations ------------------------------------------------------------

_WORDS = [
    "alpha",
    "build",
    "cache",
    "deploy",
    "error",
    "fixture",
    "gateway",
    "handler",
    "index",
    "journal",
    "kernel",
    "latency",
    "migration",
    "network",
    "offset",
    "payload",
    "queue",
    "replica",
    "schema",
    "token",
    "upstream",
    "vector",
    "worker",
    "yaml",
    "zone",
    "compile",
    "branch",
    "commit",
    "rebase",
    "module",
    "import",
    "config",
    "service",
    "timeout",
    "retry",
]


def _prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def agent_round(rng: random.Random, tag: str, steps: int = 3, tool_words: int = 220) -> list[AnyMessage]:
    """One turn of an agent: a real user request, ``steps`` tool steps (parallel calls, ids
    reused across steps as real agents do) and a final answer. Every message has a unique
    ``message_id`` so appends are idempotent."""
    out: list[AnyMessage] = [UserMessage(content=f"[{tag}] please {_prose(rng, 25)}", message_id=f"{tag}-u")]
    for s in range(steps):
        width = rng.randint(1, 2)
        calls = [
            ToolCall(id=f"call_{k}", name="bash", arguments=json.dumps({"cmd": _prose(rng, 4)}))
            for k in range(width)
        ]
        out.append(
            AssistantMessage(
                content=f"step {s}: {_prose(rng, 12)}", tool_calls=calls, message_id=f"{tag}-a{s}"
            )
        )
        for k in range(width):
            out.append(
                ToolMessage(
                    tool_call_id=f"call_{k}", content=_prose(rng, tool_words), message_id=f"{tag}-t{s}.{k}"
                )
            )
    out.append(AssistantMessage(content=f"done: {_prose(rng, 20)}", message_id=f"{tag}-f"))
    return out


# --- a model that writes valid blocks -----------------------------------------------------

_BLOCK = re.compile(r"^\[Block: ([^\]\n]+)\]$", re.MULTILINE)


def last_user_text(request: Mapping[str, Any]) -> str:
    """The text of the last user message of a chat request."""
    for message in reversed(request.get("messages") or []):
        if isinstance(message, Mapping) and message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


def block_responder(request: dict[str, Any]) -> str:
    """Answer a pipeline stage's prompt with valid JSON: one short summary per requested
    block (``[Block: id]`` lines); the strategies' single ``summary`` block otherwise."""
    text = last_user_text(request)
    ids = _BLOCK.findall(text) or ["summary"]
    blocks = [
        {"block_id": i, "summary": f"Summary of {i}: the agent ran tools and reported results."} for i in ids
    ]
    return json.dumps({"blocks": blocks})
