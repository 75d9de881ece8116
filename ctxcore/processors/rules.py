"""The pure core shared by every rule processor: environment, result, rewrite helpers.

A rule is a function ``apply(messages, config, env, force=False) -> RuleResult`` with no
I/O except writing offloaded originals to ``env.offloads`` and no clock. The embedded
processors wrap these functions in hooks; the distributed fast path calls them directly
on the raw log tail (``ctxcore.processors.chain.apply_rules``).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ctxcore.json_text import loads_shallow
from ctxcore.messages import AnyMessage, ToolCall, ToolMessage, replace_content
from ctxcore.processors.events import ContextEvent, IdRange
from ctxcore.processors.offload import Offload, store_offload
from ctxcore.state.base import OffloadStore
from ctxcore.state.keys import ConversationKey
from ctxcore.tokens import TokenCounter
from ctxcore.turns import DEFAULT_DETECTOR, UserDetector, anchors, tool_callers, turns
from ctxcore.window import DEFAULT_CONTEXT_MAX_TOKENS

__all__ = [
    "HeadroomBudget",
    "ProtectedTools",
    "Rewrite",
    "RuleEnv",
    "RuleResult",
    "anchor_indices",
    "id_ranges",
    "query_terms",
    "rounds",
    "tool_calls_of_results",
    "tool_name",
]


_SUMS_KEPT = 64  # lists whose sums an env remembers (a chain sizes a handful)


@dataclass(frozen=True)
class RuleEnv:
    """Everything a rule needs besides its config and the messages.

    Attributes:
        counter: token counter of the conversation's model.
        key: the conversation, for offload handles and the store.
        offloads: where originals go; None means nothing can be offloaded (rules that
            need an offload then leave the message as it is).
        detector: tells real user messages from internal ones.
        originals: log id -> the message as it was added; an offload always stores the
            original, never another processor's placeholder.
        context_max: the model's window in tokens (ratio thresholds are relative to it).
        new_ids: log ids of the batch being added (add hooks); None = every message is new.
        tail_budget_tokens: the tokens the messages a rule sees may use in the window
            (the budget minus system messages, tools, anchors and blocks). Rules with
            ``act_only_over_budget`` act only while the messages are over it, and not at
            all when it is None (the reference behaviour: no budget is known).
        chunk_tokens: > 0: a rule over that room frees it in whole chunks of this size
            (``HeadroomBudget``): while a worker lags behind, the windows that follow, each
            one step longer, ask the rules for the same saving and get the same rewritten
            prefix until the next chunk is due, and a provider's prompt cache keeps serving it.
    """

    counter: TokenCounter
    key: ConversationKey
    offloads: OffloadStore | None = None
    detector: UserDetector = DEFAULT_DETECTOR
    originals: Mapping[str, AnyMessage] = field(default_factory=dict)
    context_max: int = DEFAULT_CONTEXT_MAX_TOKENS
    new_ids: frozenset[str] | None = None
    tail_budget_tokens: int | None = None
    chunk_tokens: int = 0
    # Handles of originals offloaded by earlier windows (a service's; None: hash each time).
    # ``tail_tokens`` of the lists seen, keyed by their messages' identities (the list is
    # held so the ids cannot be reused): each headroom rule of a chain sizes its input, and
    # a rule that changes nothing hands the next one the same messages. Messages are
    # immutable, so a sum is fixed for the env's life (one chain call).
    _sums: dict[tuple[int, ...], tuple[tuple[AnyMessage, ...], int]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def original(self, message: AnyMessage) -> AnyMessage:
        """The message as it entered the log (itself when it has no known log id)."""
        log_id = message.context_message_id
        return self.originals.get(log_id, message) if log_id else message

    def tokens(self, message: AnyMessage) -> int:
        """Tokens of one message (without the per-request priming)."""
        return self.counter.count_message(message)

    def tail_tokens(self, messages: Sequence[AnyMessage]) -> int:
        """What ``messages`` cost in the window (the sum of their tokens)."""
        key = tuple(map(id, messages))
        found = self._sums.get(key)
        if found is not None:
            return found[1]
        total = self.counter.sum_messages(messages)
        if len(self._sums) >= _SUMS_KEPT:
            self._sums.clear()
        self._sums[key] = (tuple(messages), total)
        return total

    def is_new(self, message: AnyMessage) -> bool:
        """True if the message belongs to the batch being added."""
        return self.new_ids is None or message.context_message_id in self.new_ids

    def offload(self, message: AnyMessage) -> Offload | None:
        """Store the original of ``message``; None if that is impossible."""
        if self.offloads is None:
            return None
        return store_offload(self.offloads, self.key, [self.original(message)])


@dataclass(frozen=True)
class RuleResult:
    """What a rule did.

    Attributes:
        messages: the new message list.
        modified: input indices rewritten in place.
        removed: input indices dropped.
        removed_ranges: log-id spans of dropped or cut content (recoverable from the log).
        offloaded: handles of originals stored (or found already stored).
    """

    messages: list[AnyMessage]
    modified: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()
    removed_ranges: tuple[IdRange, ...] = ()
    offloaded: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        """True if anything differs from the input."""
        return bool(self.modified or self.removed)

    def event(self, event_type: str) -> ContextEvent:
        """The ``ContextEvent`` reporting this result."""
        return ContextEvent(
            event_type=event_type,
            messages_to_modify=sorted({*self.modified, *self.removed}),
            removed_ranges=list(self.removed_ranges),
            offload_handles=list(dict.fromkeys(self.offloaded)),
        )


def id_ranges(messages: Sequence[AnyMessage], indices: Iterable[int]) -> tuple[IdRange, ...]:
    """Log-id spans of the runs of consecutive ``indices`` (messages without ids are skipped)."""
    spans: list[IdRange] = []
    run: list[str] = []
    previous = -2
    for i in sorted(set(indices)):
        log_id = messages[i].context_message_id
        if i != previous + 1 and run:
            spans.append(IdRange(run[0], run[-1]))
            run = []
        if log_id:
            run.append(log_id)
        previous = i
    if run:
        spans.append(IdRange(run[0], run[-1]))
    return tuple(spans)


class Rewrite:
    """Collects replacements, removals and offloads over one input list."""

    def __init__(self, messages: Sequence[AnyMessage]) -> None:
        self.messages = list(messages)
        self.replaced: dict[int, AnyMessage] = {}
        self.removed: set[int] = set()
        self.cut: set[int] = set()
        self.offloaded: list[str] = []

    def current(self, index: int) -> AnyMessage:
        """The message at ``index`` as rewritten so far."""
        return self.replaced.get(index, self.messages[index])

    def replace(self, index: int, message: AnyMessage, *, cut: bool = False) -> None:
        """Rewrite ``index``; ``cut`` = content left the view without an offload."""
        self.replaced[index] = message
        if cut:
            self.cut.add(index)

    def remove(self, index: int) -> None:
        """Drop ``index`` from the output."""
        self.removed.add(index)

    def offload_replace(
        self, index: int, env: RuleEnv, render: Callable[[str], str], **metadata: object
    ) -> bool:
        """Offload the original of ``index`` and replace it by ``render(marker)``.

        Returns False (and changes nothing) when the original could not be stored.
        """
        message = self.current(index)
        stored = env.offload(message)
        if stored is None:
            return False
        self.offloaded.append(stored.handle)
        self.replace(
            index, replace_content(message, render(stored.marker), offload_handle=stored.handle, **metadata)
        )
        return True

    def result(self) -> RuleResult:
        """The finished ``RuleResult``."""
        if not self.replaced and not self.removed:
            return RuleResult(self.messages)
        out = [self.replaced.get(i, m) for i, m in enumerate(self.messages) if i not in self.removed]
        modified = tuple(sorted(i for i in self.replaced if i not in self.removed))
        return RuleResult(
            messages=out,
            modified=modified,
            removed=tuple(sorted(self.removed)),
            removed_ranges=id_ranges(self.messages, self.removed | self.cut),
            offloaded=tuple(self.offloaded),
        )


class HeadroomBudget:
    """The running size of a rule's input against ``env.tail_budget_tokens``.

    Headroom-aware rules act one message at a time, oldest first, and stop as soon as the
    messages fit: ``over`` says whether they still do not, ``saved`` records a rewrite. Over
    the room, the limit is lowered so that a whole number of ``env.chunk_tokens`` is freed
    (``in_chunks=False``: the room itself, for what is rewritten on every window anyway).
    """

    def __init__(self, messages: Sequence[AnyMessage], env: RuleEnv, *, in_chunks: bool = True) -> None:
        self.limit = env.tail_budget_tokens
        self.total = env.tail_tokens(messages) if self.limit is not None else 0
        self._env = env
        chunk = env.chunk_tokens if in_chunks else 0
        if self.limit is not None and chunk > 0 and self.total > self.limit:
            chunks = -(-(self.total - self.limit) // chunk)  # what is over, in whole chunks
            self.limit = self.total - chunks * chunk

    @property
    def over(self) -> bool:
        """True while the messages are over the tail budget (False when there is none)."""
        return self.limit is not None and self.total > self.limit

    def saved(self, before: AnyMessage, after: AnyMessage | None) -> None:
        """``before`` became ``after`` (None: removed)."""
        self.total -= self._env.tokens(before) - (self._env.tokens(after) if after is not None else 0)

    def rewrite_oldest_first(
        self, rewrite: Rewrite, candidates: Iterable[int], act: Callable[[int], object]
    ) -> None:
        """``act`` on each candidate in order while still over, recording what each saved."""
        for i in candidates:
            if not self.over:
                return
            act(i)
            self.saved(rewrite.messages[i], rewrite.current(i))


def anchor_indices(messages: Sequence[AnyMessage], detector: UserDetector) -> frozenset[int]:
    """Indices of the task and intent anchors (never rewritten by any rule)."""
    return frozenset(anchors(messages, detector).indices())


def rounds(messages: Sequence[AnyMessage], detector: UserDetector) -> list[range]:
    """Index ranges of the turns, with any messages before the first turn as one more round."""
    found = [range(t.start, t.end) for t in turns(messages, detector)]
    first = found[0].start if found else len(messages)
    return ([range(0, first)] if first > 0 else []) + found


def tool_calls_of_results(messages: Sequence[AnyMessage]) -> dict[int, ToolCall]:
    """Tool message index -> the call it answers (matched within its step)."""
    found: dict[int, ToolCall] = {}
    for result, caller in tool_callers(messages).items():
        call_id = messages[result].tool_call_id  # type: ignore[union-attr]
        for call in messages[caller].tool_calls:  # type: ignore[union-attr]
            if call.id == call_id:
                found[result] = call
                break
    return found


def tool_name(message: AnyMessage, call: ToolCall | None) -> str:
    """The tool's name: from the call it answers, else the tool message's own ``name``."""
    if call is not None:
        return call.name
    return (message.name or "") if isinstance(message, ToolMessage) else ""


def _string_values(arguments: str) -> list[str]:
    try:
        parsed = loads_shallow(arguments)
    except (ValueError, TypeError):
        return [arguments]
    out: list[str] = []
    stack = [parsed]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return out


@dataclass(frozen=True)
class ProtectedTools:
    """Tool results never offloaded: ``name`` or ``name:pattern`` entries (spec 4.8).

    With a pattern, the result is protected only if one of the call's string argument
    values matches it (``fnmatch``: ``*``, ``?``, ``[...]``).
    """

    entries: tuple[str, ...]

    def protects(self, name: str, arguments: str) -> bool:
        """True if a call of ``name`` with ``arguments`` is protected."""
        return any(
            tool == name
            and (not sep or any(fnmatch.fnmatchcase(v, pattern) for v in _string_values(arguments)))
            for tool, sep, pattern in (entry.partition(":") for entry in self.entries)
        )

    def protects_result(self, message: AnyMessage, call: ToolCall | None) -> bool:
        """True if the tool result ``message`` (answering ``call``) is protected."""
        return self.protects(tool_name(message, call), call.arguments if call else "{}")


_TERM = re.compile(r"[A-Za-z_][A-Za-z0-9_./\-]{2,}")
_STOPWORD_TEXT = (
    "the and for with that this from have what when where which will would could should please about "
    "into there their them then than your you are was were can not but all any how why who its also "
    "just like need want make use using file files"
)
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())


def query_terms(*texts: str, limit: int = 40) -> tuple[str, ...]:
    """Distinct lowercase terms (3+ chars, no stopwords) of ``texts``, first ``limit``."""
    seen: dict[str, None] = {}
    for text in texts:
        for match in _TERM.finditer(text):
            term = match.group(0).lower().strip("./-")
            if len(term) >= 3 and term not in _STOPWORDS:
                seen.setdefault(term, None)
                if len(seen) >= limit:
                    return tuple(seen)
    return tuple(seen)
