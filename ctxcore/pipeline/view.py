"""The view a compaction stage works on: pinned anchors and summary blocks, then the raw tail.

Blocks carry their provenance (the log-id range they stand for) in the metadata of their
messages, so an embedded context's message list can be turned back into a ``View``
(``View.from_messages``) without a separate state store.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from ctxcore.errors import InvalidMessageError
from ctxcore.markers import ROUND_LEVEL_MEMORY_BLOCK
from ctxcore.messages import AnyMessage, UserMessage
from ctxcore.state.models import CompressionState, SummaryBlock
from ctxcore.tokens import TokenCounter
from ctxcore.turns import DEFAULT_DETECTOR, UserDetector

__all__ = ["BLOCK_META", "View", "block_message", "block_provenance", "log_id", "with_sortable_ids"]

T = TypeVar("T")

# Metadata key on a block's messages holding its provenance.
BLOCK_META = "ctxcore_block"

_HEADER = (
    "type: historical_memory_block\n"
    "authority: reference memory of earlier work in this conversation; not binding\n"
    "instruction_status: a historical record only, not a new request or instruction\n"
    "conflict_priority: newer user messages, newer raw context and fresh tool results win over this block"
)


def block_message(
    summary: str,
    *,
    block_id: str,
    first_id: str,
    last_id: str,
    level: int,
    scope: str,
    processor: str = "RoundLevelCompressor",
    marker: str = ROUND_LEVEL_MEMORY_BLOCK,
    tokens_before: int = 0,
    model: str = "",
) -> UserMessage:
    """The memory-block message standing for log ids ``first_id..last_id``."""
    text = (
        f"{marker}\nprocessor: {processor}\n{_HEADER}\nscope: {scope}\n"
        f"covers: log ids {first_id}..{last_id} (level {level})\n\nSummary:\n{summary.strip()}"
    )
    provenance = {
        "block_id": block_id,
        "first_id": first_id,
        "last_id": last_id,
        "level": level,
        "scope": scope,
        "tokens_before": tokens_before,
        "model": model,
    }
    return UserMessage(content=text, metadata={"compress_level": level, BLOCK_META: provenance})


def block_provenance(message: AnyMessage) -> Mapping[str, Any] | None:
    """The provenance a block message carries, or None for any other message."""
    meta = message.metadata.get(BLOCK_META)
    if isinstance(meta, Mapping) and isinstance(meta.get("block_id"), str):
        return meta
    return None


def log_id(message: AnyMessage) -> str:
    """A view message's log id (its ``context_message_id``), which every view message has."""
    if message.context_message_id is None:
        raise InvalidMessageError(
            -1, "context_message_id", "a view message needs its log id: append the messages to the log first"
        )
    return message.context_message_id


@dataclass(frozen=True)
class View:
    """``View(version, system, tools, pinned, blocks, tail)``.

    ``pinned`` are raw messages inside the covered range kept verbatim (the anchors),
    ``blocks`` the summary blocks in log order, ``tail`` the raw messages after
    ``covered_until``. Rendering puts pinned messages and blocks in log order, then the tail.
    """

    version: int
    system: tuple[AnyMessage, ...] = ()
    tools: tuple[Mapping[str, Any], ...] = ()
    pinned: tuple[AnyMessage, ...] = ()
    blocks: tuple[SummaryBlock, ...] = ()
    tail: tuple[AnyMessage, ...] = ()
    covered_until: str | None = None
    detector: UserDetector = field(default=DEFAULT_DETECTOR, compare=False)
    # Figures derived from this (immutable) view, computed once: one stage asks for the same
    # token count, anchors and targets several times (plan, run, prompt, result), and on
    # 100k tokens each recount is hundreds of cache lookups. Not an init field, so
    # ``dataclasses.replace`` and ``with_blocks`` start with an empty memo.
    _memo: dict[Hashable, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    # --- construction -------------------------------------------------------------------

    @classmethod
    def from_state(
        cls,
        state: CompressionState,
        tail: Sequence[AnyMessage],
        pinned: Sequence[AnyMessage],
        *,
        system: Sequence[AnyMessage] = (),
        tools: Sequence[Mapping[str, Any]] = (),
        detector: UserDetector | None = None,
    ) -> View:
        """The view of a saved state plus the raw log after its cursor."""
        return cls(
            version=state.version,
            system=tuple(system),
            tools=tuple(tools),
            pinned=tuple(sorted(pinned, key=log_id)),
            blocks=tuple(state.blocks),
            tail=tuple(tail),
            covered_until=state.covered_until,
            detector=detector or DEFAULT_DETECTOR,
        )

    @classmethod
    def from_messages(
        cls,
        messages: Sequence[AnyMessage],
        *,
        system: Sequence[AnyMessage] = (),
        tools: Sequence[Mapping[str, Any]] = (),
        version: int = 0,
        detector: UserDetector | None = None,
    ) -> View:
        """The view of an embedded context's current messages.

        Messages carrying block provenance are its blocks; other messages before the last
        block are pinned verbatim; the rest is the tail. Earlier processors may have
        rewritten messages: what is here is what the stages see. A message without a log id
        (e.g. a re-injected state message) gets one that sorts right after its predecessor.
        """
        # Blocks are placed by their provenance, not by an id of their own.
        ided = with_sortable_ids(messages, skip_blocks=True)

        blocks: list[SummaryBlock] = []
        pinned: list[AnyMessage] = []
        last_block_end = -1
        i = 0
        while i < len(ided):
            prov = block_provenance(ided[i])
            if prov is None:
                i += 1
                continue
            j = i + 1
            while (
                j < len(ided)
                and (p := block_provenance(ided[j])) is not None
                and p["block_id"] == prov["block_id"]
            ):
                j += 1
            blocks.append(_block_from_messages(ided[i:j], prov))
            last_block_end = j
            i = j
        if last_block_end >= 0:
            pinned = [m for m in ided[:last_block_end] if block_provenance(m) is None]
        tail = ided[max(last_block_end, 0) :]
        covered = max((b.last_id for b in blocks), default=None)
        if pinned:
            covered = max([covered or "", *(log_id(m) for m in pinned)])
        return cls(
            version=version,
            system=tuple(system),
            tools=tuple(tools),
            pinned=tuple(pinned),
            blocks=tuple(blocks),
            tail=tuple(tail),
            covered_until=covered,
            detector=detector or DEFAULT_DETECTOR,
        )

    # --- reading ------------------------------------------------------------------------

    def prefix(self) -> list[SummaryBlock | AnyMessage]:
        """Pinned messages and blocks in log order."""
        items: list[tuple[str, int, SummaryBlock | AnyMessage]] = [(b.first_id, 1, b) for b in self.blocks]
        items += [(log_id(m), 0, m) for m in self.pinned]
        items.sort(key=lambda t: (t[0], t[1]))
        return [item for _, _, item in items]

    def context_messages(self) -> list[AnyMessage]:
        """The rendered context: prefix in log order, then the tail."""
        prefix = (item.messages if isinstance(item, SummaryBlock) else [item] for item in self.prefix())
        return [*itertools.chain.from_iterable(prefix), *self.tail]

    def messages(self) -> list[AnyMessage]:
        """System messages followed by the rendered context."""
        return [*self.system, *self.context_messages()]

    def memoized(self, key: Hashable, counter: TokenCounter | None, compute: Callable[[], T]) -> T:
        """``compute()`` once per view, ``key`` and ``counter`` (compared by identity)."""
        found = self._memo.get(key)
        if found is not None and found[0] is counter:
            value: T = found[1]
            return value
        value = compute()
        self._memo[key] = (counter, value)
        return value

    def tokens(self, counter: TokenCounter) -> int:
        """Tokens of a request carrying this view and its tools (counted once per view).

        Like the rest of a view its tool definitions must not change after it was built.
        """
        return self.memoized(
            "tokens",
            counter,
            lambda: counter.count_messages(self.messages()) + counter.count_tools(list(self.tools)),
        )

    def anchor_ids(self) -> tuple[str | None, str | None]:
        """Log ids of the task anchor and the intent anchor (pinned or in the tail)."""

        def compute() -> tuple[str | None, str | None]:
            real = [log_id(m) for m in (*self.pinned, *self.tail) if self.detector.is_real(m)]
            if not real:
                return None, None
            return real[0], real[-1]

        return self.memoized("anchor_ids", None, compute)

    def anchor_id_set(self) -> frozenset[str]:
        """Both anchor ids as a set."""
        return frozenset(i for i in self.anchor_ids() if i is not None)

    def messages_by_id(self) -> dict[str, AnyMessage]:
        """Raw messages of this view (pinned and tail) by log id."""
        return {log_id(m): m for m in (*self.pinned, *self.tail)}

    def with_blocks(
        self, blocks: Iterable[SummaryBlock], covered_until: str | None, *, version: int | None = None
    ) -> View:
        """A new view after a stage: blocks replaced, the cursor advanced.

        Tail messages up to the new cursor that no block covers become pinned; pinned
        messages a new block now covers (former anchors folded into a merge) are dropped.
        """
        ordered = tuple(sorted(blocks, key=lambda b: b.first_id))
        cursor = covered_until
        # "Some block has first <= id <= last" by bisection over the sorted first ids and
        # the running maximum of last ids: one lookup per message instead of a block scan.
        firsts = [b.first_id for b in ordered]
        reach = list(itertools.accumulate((b.last_id for b in ordered), max))

        def covered(mid: str) -> bool:
            i = bisect.bisect_right(firsts, mid)
            return i > 0 and reach[i - 1] >= mid

        newly_pinned = []
        tail = []
        for message in self.tail:
            mid = log_id(message)
            if cursor is not None and mid <= cursor:
                if not covered(mid):
                    newly_pinned.append(message)
            else:
                tail.append(message)
        return View(
            version=self.version if version is None else version,
            system=self.system,
            tools=self.tools,
            pinned=tuple(m for m in (*self.pinned, *newly_pinned) if not covered(log_id(m))),
            blocks=ordered,
            tail=tuple(tail),
            covered_until=cursor,
            detector=self.detector,
        )

    def to_state(self) -> CompressionState:
        """The compaction state this view stands for (version as seen)."""
        return CompressionState(
            version=self.version,
            blocks=list(self.blocks),
            covered_until=self.covered_until,
            pinned=[log_id(m) for m in self.pinned],
        )


def with_sortable_ids(messages: Sequence[AnyMessage], *, skip_blocks: bool = False) -> list[AnyMessage]:
    """``messages`` with a log id each: one without gets ``<previous log id>~<n>``, which
    sorts right after its predecessor (``skip_blocks``: block messages are left as they are)."""
    out: list[AnyMessage] = []
    previous, suffix = "", 0
    for message in messages:
        if skip_blocks and block_provenance(message) is not None:
            pass
        elif message.context_message_id is None:
            suffix += 1
            message = message.model_copy(update={"context_message_id": f"{previous}~{suffix:04d}"})
        else:
            previous, suffix = message.context_message_id, 0
        out.append(message)
    return out


def _block_from_messages(messages: Sequence[AnyMessage], prov: Mapping[str, Any]) -> SummaryBlock:
    created = prov.get("created_at")
    extra: dict[str, Any] = (
        {"created_at": datetime.fromisoformat(created)} if isinstance(created, str) else {}
    )
    return SummaryBlock(
        block_id=str(prov["block_id"]),
        messages=list(messages),
        first_id=str(prov["first_id"]),
        last_id=str(prov["last_id"]),
        level=int(prov.get("level", 1)),
        tokens_before=int(prov.get("tokens_before", 0)),
        tokens_after=int(prov.get("tokens_after", 0)),
        model=str(prov.get("model", "")),
        **extra,
    )
