"""Turns, steps and anchors, and the tool-call boundary rules.

* A **turn** starts at a run of *real* user messages and lasts until the next such run.
* A **step** is a completed API round: an assistant message with all of its tool results,
  or an assistant message without tool calls (with any user messages before it).
* The **task anchor** is the first real user message, the **intent anchor** the last.

Tool results are matched to calls within their step (the nearest preceding assistant
message, with only tool messages in between): real agents reuse tool-call ids across a
conversation, so a global id lookup would pair a result with the wrong call.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ctxcore.errors import ConfigError
from ctxcore.markers import INTERNAL_USER_PREFIXES
from ctxcore.messages import AnyMessage, AssistantMessage, ToolMessage, UserMessage

__all__ = [
    "HARNESS_USER_PATTERNS",
    "Anchors",
    "Step",
    "Turn",
    "UserDetector",
    "adjust_keep_recent_for_tool_boundaries",
    "anchors",
    "compile_patterns",
    "count_turns",
    "is_real_user",
    "newest_step_start",
    "settled_older_turns",
    "steps",
    "tool_callers",
    "turns",
]


# User-role messages an agent harness writes, not a person: regexes matched at the start of
# the left-stripped text. A deviation from spec 1.4, whose list has ctxcore's own markers
# only: without these a harness reminder becomes the "intent" the window pins.
HARNESS_USER_PATTERNS: tuple[str, ...] = (
    # mini-swe-agent's format error (its ``format_error_template``), sent when a reply holds
    # no or several bash blocks: "Please always provide EXACTLY ONE action in triple
    # backticks, found 2 actions."
    r"Please always provide EXACTLY ONE action in triple backticks",
)


def compile_patterns(
    patterns: Iterable[str], what: str = "internal_user_patterns"
) -> tuple[re.Pattern[str], ...]:
    """The compiled patterns; ``ConfigError`` naming one that does not compile or matches
    the empty string (it would make every user message internal)."""
    compiled = []
    for pattern in patterns:
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"{what}: pattern {pattern!r} does not compile: {exc}") from None
        if regex.match(""):
            raise ConfigError(f"{what}: pattern {pattern!r} matches the empty string, so every user message")
        compiled.append(regex)
    return tuple(compiled)


_VERDICTS = 8192


@dataclass(frozen=True)
class UserDetector:
    """Tells real user messages from internal user-role messages (memory blocks, reminders).

    The built-in prefixes are every marker ctxcore writes; ``extra_prefixes`` add more, and
    ``patterns`` (regexes matched at the start of the left-stripped text; by default
    ``HARNESS_USER_PATTERNS``) catch harness messages. With ``harness_structure`` a user
    message is internal too when it directly follows an assistant message without tool
    calls in a turn whose assistant already made tool calls (a harness nudging its agent;
    it also catches a person's short reply there, which is why it is off by default).

    A message is classified from itself and the messages before it only, so appending
    never reclassifies an earlier message (pinned ids stay valid).

    Raises:
        ConfigError: a pattern that does not compile or matches the empty string.
    """

    extra_prefixes: tuple[str, ...] = ()
    patterns: tuple[str, ...] = HARNESS_USER_PATTERNS
    harness_structure: bool = False
    _compiled: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)
    _prefixes: tuple[str, ...] = field(init=False, repr=False, compare=False)
    # String content -> its verdict: a window classifies its whole tail several times, and
    # windows share decoded messages (and so content strings, whose hash Python caches).
    _verdicts: dict[str, bool] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_compiled", compile_patterns(self.patterns))
        object.__setattr__(self, "_prefixes", INTERNAL_USER_PREFIXES + tuple(self.extra_prefixes))
        object.__setattr__(self, "_verdicts", {})

    def _by_text(self, message: AnyMessage) -> bool:
        if message.role != "user":
            return False
        content = message.content
        if not isinstance(content, str):
            return self._classify(message)
        verdict = self._verdicts.get(content)
        if verdict is None:
            if len(self._verdicts) >= _VERDICTS:  # a plain bound: clearing costs one recount
                self._verdicts.clear()
            verdict = self._verdicts[content] = self._classify(message)
        return verdict

    def _classify(self, message: AnyMessage) -> bool:
        # Deviation from spec 1.4: list content is checked by its text too, so a memory
        # block sent as content parts is still recognised as internal.
        text = message.text.lstrip()
        if text.startswith(self._prefixes):
            return False
        return not any(p.match(text) for p in self._compiled)

    def is_real(self, message: AnyMessage, before: Sequence[AnyMessage] = ()) -> bool:
        """True for a user message written by the user, not by ctxcore or the harness;
        ``before`` are the messages logged before it (read by ``harness_structure`` only)."""
        if not self._by_text(message):
            return False
        if not self.harness_structure or not before:
            return True
        return self.real_flags([*before, message])[-1]

    def real_flags(self, messages: Sequence[AnyMessage]) -> list[bool]:
        """``is_real`` of every message, each from the messages before it: one pass."""
        flags: list[bool] = []
        tools_in_turn = False
        for i, message in enumerate(messages):
            real = self._by_text(message)
            if real and self.harness_structure and tools_in_turn and i > 0:
                previous = messages[i - 1]
                real = not (previous.role == "assistant" and not previous.tool_calls)
            flags.append(real)
            if real:
                tools_in_turn = False
            elif message.role == "assistant" and message.tool_calls:
                tools_in_turn = True
        return flags


DEFAULT_DETECTOR = UserDetector()


def is_real_user(message: AnyMessage, detector: UserDetector | None = None) -> bool:
    """True for a real user message (spec 1.4 with every ctxcore marker added)."""
    return (detector or DEFAULT_DETECTOR).is_real(message)


def _has_calls(message: AnyMessage) -> bool:
    return isinstance(message, AssistantMessage) and bool(message.tool_calls)


# --- anchors ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Anchors:
    """Indices of the task anchor (first real user message) and intent anchor (last)."""

    task: int | None
    intent: int | None

    def indices(self) -> tuple[int, ...]:
        """The distinct anchor indices in order."""
        found = [i for i in (self.task, self.intent) if i is not None]
        return tuple(sorted(set(found)))


def anchors(messages: Sequence[AnyMessage], detector: UserDetector | None = None) -> Anchors:
    """Both anchors of a conversation."""
    det = detector or DEFAULT_DETECTOR
    real = [i for i, flag in enumerate(det.real_flags(messages)) if flag]
    if not real:
        return Anchors(None, None)
    return Anchors(real[0], real[-1])


# --- tool-call matching -----------------------------------------------------------------


def tool_callers(messages: Sequence[AnyMessage]) -> dict[int, int]:
    """Map each tool message that validly answers a call to the index of that assistant.

    The caller is the nearest preceding assistant message with only tool messages in
    between, and it must have a call with the result's id. Unmatched results are absent.
    """
    callers: dict[int, int] = {}
    caller: int | None = None
    ids: Sequence[str] = ()
    for i, message in enumerate(messages):  # roles: a failed isinstance costs pydantic's ABCMeta hook
        if message.role == "assistant":
            caller = i
            ids = [c.id for c in message.tool_calls] if message.tool_calls else ()
        elif message.role == "tool":
            if caller is not None and message.tool_call_id in ids:
                callers[i] = caller
        else:
            caller, ids = None, ()
    return callers


# --- steps ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """Messages ``[start, end)`` forming one API round; ``complete`` when closed.

    ``interrupted``: a user message came while calls were unanswered (the user stopped the
    tool), so no result will come; the step is complete and cancelled.
    """

    start: int
    end: int
    assistant: int | None
    complete: bool
    interrupted: bool = False


def steps(messages: Sequence[AnyMessage]) -> list[Step]:
    """Partition messages into API rounds (spec 1.5 ``group_completed_api_rounds``).

    A round closes at an assistant message without tool calls, or when every call of an
    assistant message has its result. Trailing messages that close nothing form a final
    incomplete step, as does an assistant whose calls never all got results before the next
    assistant message. A user message arriving while calls are unanswered closes the step
    as complete and ``interrupted``: a deliberate exception to "a step with a missing tool
    result is never summarised", since once the user speaks no result will come (served
    windows answer such calls with ``close_interrupted_tool_calls``).
    """
    out: list[Step] = []
    start = 0
    assistant: int | None = None
    pending: set[str] = set()
    for i, message in enumerate(messages):
        if isinstance(message, AssistantMessage):
            if pending and assistant is not None:
                out.append(Step(start, i, assistant, False))
                start = i
            assistant = i
            pending = {c.id for c in message.tool_calls}
            if not pending:
                out.append(Step(start, i + 1, i, True))
                start, assistant = i + 1, None
        elif isinstance(message, ToolMessage) and message.tool_call_id in pending:
            pending.discard(message.tool_call_id)
            if not pending:
                out.append(Step(start, i + 1, assistant, True))
                start, assistant = i + 1, None
        elif isinstance(message, UserMessage) and pending and assistant is not None:
            out.append(Step(start, i, assistant, True, interrupted=True))
            start, assistant, pending = i, None, set()
    if start < len(messages):
        out.append(Step(start, len(messages), assistant, False))
    return out


def newest_step_start(messages: Sequence[AnyMessage]) -> int:
    """Index where the newest step begins (its assistant message); headroom rules never
    touch it, the model is about to read it."""
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], AssistantMessage):
            return i
    return len(messages)


# --- turns ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """A dialogue round ``[start, end)`` beginning with real user message(s).

    ``final`` is the index of the assistant reply without tool calls that closes it.
    """

    start: int
    end: int
    final: int | None
    complete: bool
    failed: bool
    cancelled: bool


def turns(messages: Sequence[AnyMessage], detector: UserDetector | None = None) -> list[Turn]:
    """Dialogue rounds in log order; messages before the first real user are in none."""
    starts = _turn_starts(messages, detector)
    out: list[Turn] = []
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(messages)
        out.append(_make_turn(messages, start, end))
    return out


def settled_older_turns(messages: Sequence[AnyMessage], detector: UserDetector | None = None) -> list[Turn]:
    """The turns a window may shrink or leave out, oldest first: answered, with no failed or
    cancelled call, older than the current turn and not the turn the newest step closes (a
    new request with no reply yet answers that turn: tau-bench at lag 5, 0.571 -> 0.588 of the
    next-step references; bench/README.md, "The turn a new request answers")."""
    newest = newest_step_start(messages)
    older = turns(messages, detector)[:-1]
    return [t for t in older if t.end <= newest and t.complete and not t.failed and not t.cancelled]


def count_turns(messages: Sequence[AnyMessage], detector: UserDetector | None = None) -> int:
    """``len(turns(messages, detector))`` without building the turns (a window's statistics
    need only the count)."""
    return len(_turn_starts(messages, detector))


def _turn_starts(messages: Sequence[AnyMessage], detector: UserDetector | None) -> list[int]:
    det = detector or DEFAULT_DETECTOR
    starts: list[int] = []
    previous_real = False
    for i, (message, real) in enumerate(zip(messages, det.real_flags(messages), strict=True)):
        if real and not previous_real:
            starts.append(i)
        # Internal user messages between real ones do not split a run of user input.
        if message.role != "user":
            previous_real = False
        elif real:
            previous_real = True
    return starts


def _make_turn(messages: Sequence[AnyMessage], start: int, end: int) -> Turn:
    last_assistant: int | None = None
    failed = cancelled = False
    for i in range(start, end):
        message = messages[i]
        if isinstance(message, AssistantMessage):
            last_assistant = i
        elif isinstance(message, ToolMessage):
            failed = failed or message.metadata.get("is_error") is True
            cancelled = cancelled or message.metadata.get("cancelled") is True
    final = None
    if last_assistant is not None and not _has_calls(messages[last_assistant]):
        final = last_assistant
    complete = final is not None and all(s.complete for s in steps(messages[start : final + 1]))
    # The next turn's user message is what interrupts a call left open at this turn's end.
    cancelled = cancelled or any(s.interrupted for s in steps(messages[start : end + 1]))
    return Turn(start, end, final, complete, failed, cancelled)


# --- keep-recent and boundary protection (spec 4.1 and 4.5) -------------------------------


def adjust_keep_recent_for_tool_boundaries(messages: Sequence[AnyMessage], keep: int) -> int:
    """Widen a keep-recent count so the kept tail holds no tool result without its call.

    Returns the new count (>= ``keep``); ``max(keep, 0)`` when there is nothing to do.
    """
    if keep <= 0 or not messages:
        return max(keep, 0)
    n = len(messages)
    start = max(n - keep, 0)
    callers = tool_callers(messages)
    while True:
        earliest = min(
            (callers[i] for i in range(start, n) if i in callers and callers[i] < start), default=None
        )
        if earliest is None:
            return n - start
        start = earliest
