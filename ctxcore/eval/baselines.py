"""Simple baselines every ctxcore policy is measured against, in the same run.

* ``truncate``: the newest messages that fit (naive: it cuts tool pairs and drops the task;
  excluded from every validity goal).
* ``steps``: a correct truncation: system, task anchor, intent anchor, then the newest whole
  steps that fit, in log order. A step is an assistant message plus its tool results; any
  other message is a step by itself. When not even the newest step fits, its outputs are
  cut to an equal head and tail around ``[... N characters cut ...]``; an older step larger
  than the whole room (no window could hold it) is left out and older steps still go in.
* ``mask``: observation masking: tool results older than the 10 newest assistant messages
  become ``[old tool output omitted: N lines]``, then ``steps``.
* ``lossless``: system plus every raw message, no budget (a reference row).

Written from these definitions only: no ctxcore compressor, rule or fallback code runs here.
"""

from __future__ import annotations

from collections.abc import Sequence

from ctxcore.errors import BudgetExceeded
from ctxcore.eval.policy_base import Policy, PolicySetup, PolicyWindow, message_cost, priming_tokens
from ctxcore.messages import AnyMessage, AssistantMessage, ToolMessage, message_text, replace_content
from ctxcore.turns import anchors

__all__ = ["LosslessPolicy", "MaskPolicy", "StepsPolicy", "TruncatePolicy", "truncate_window"]

MASK_KEEP_ASSISTANTS = 10


class _Recorder(Policy):
    """A policy that keeps the raw messages and builds each window from all of them."""

    def __init__(self, setup: PolicySetup) -> None:
        super().__init__(setup)
        self.messages: list[AnyMessage] = []

    def append(self, messages: Sequence[AnyMessage]) -> None:
        """Remember the messages."""
        self.messages.extend(messages)


class TruncatePolicy(_Recorder):
    """Keep the longest suffix of the conversation that fits the budget (naive baseline)."""

    name = "truncate"

    def window(self) -> PolicyWindow:
        """System messages plus the newest messages that fit."""
        return PolicyWindow(truncate_window(self.setup, self.messages), list(self.setup.tools))


def truncate_window(setup: PolicySetup, messages: Sequence[AnyMessage]) -> list[AnyMessage]:
    """The keep-newest window of ``messages`` within ``setup.budget``."""
    counter = setup.counter
    priming = priming_tokens(counter)
    system = list(setup.system)
    used = counter.count_messages(system) + counter.count_tools(list(setup.tools))
    if not system:
        used += priming
    start = len(messages)
    for i in range(len(messages) - 1, -1, -1):
        cost = message_cost(counter, messages[i], priming)
        if used + cost > setup.budget:
            break
        used += cost
        start = i
    return [*system, *messages[start:]]


class LosslessPolicy(_Recorder):
    """Every raw message, whatever the budget: what a window could at best hold."""

    name = "lossless"
    reference = True

    def window(self) -> PolicyWindow:
        """System messages plus the whole conversation."""
        return PolicyWindow([*self.setup.system, *self.messages], list(self.setup.tools))


def _steps(messages: Sequence[AnyMessage]) -> list[list[int]]:
    """Indices grouped into steps; a tool result answering no call of its step is dropped
    (it could only be an orphan in any window)."""
    out: list[list[int]] = []
    calls: set[str] = set()
    for i, message in enumerate(messages):
        if isinstance(message, ToolMessage):
            if out and message.tool_call_id in calls:
                out[-1].append(i)
            continue
        out.append([i])
        calls = {c.id for c in message.tool_calls} if isinstance(message, AssistantMessage) else set()
    return out


def _cut(text: str, keep: int) -> str:
    if len(text) <= keep:
        return text
    head = keep // 2
    tail = keep - head
    cut = len(text) - keep
    return f"{text[:head]}[... {cut} characters cut ...]{text[len(text) - tail :] if tail else ''}"


class StepsPolicy(_Recorder):
    """Anchors, then the newest whole steps that fit (a correct truncation).

    With ``fill`` (the matched-fill control, never the ``steps`` baseline) the room the whole
    steps leave goes to the next older step that fits with its outputs cut (older ones when
    even its call does not), so the window's fill matches its budget to within a few tokens.
    """

    name = "steps"
    fill = False

    def source(self) -> list[AnyMessage]:
        """The messages windows are built from."""
        return self.messages

    def window(self) -> PolicyWindow:
        """See the module docstring."""
        s = self.setup
        counter = s.counter
        messages = self.source()
        system = list(s.system)
        tools = list(s.tools)
        found = anchors(messages, s.detector).indices()
        anchor_msgs = [messages[i] for i in found]
        fixed = counter.count_messages([*system, *anchor_msgs]) + counter.count_tools(tools)
        if fixed > s.budget:
            raise BudgetExceeded(
                s.budget,
                counter.count_messages(system),
                counter.count_tools(tools),
                counter.count_messages(anchor_msgs),
            )
        priming = priming_tokens(counter)
        room = whole_room = s.budget - fixed
        chosen: dict[int, AnyMessage] = {i: messages[i] for i in found}
        first = True
        for step in reversed(_steps(messages)):
            members = [i for i in step if i not in chosen]
            if not members:
                continue
            cost = sum(message_cost(counter, messages[i], priming) for i in members)
            if cost <= room:
                chosen.update((i, messages[i]) for i in members)
                room -= cost
            elif first:
                chosen.update(self._fit(messages, members, room, priming))
                break
            elif cost > whole_room:
                # No window could hold it: one such output must not push every older step out.
                continue
            elif self.fill:
                # The room left goes to the next older step that fits, cut if need be.
                part = self._fit(messages, members, room, priming)
                if part:
                    chosen.update(part)
                    break
            else:
                break
            first = False
        window = [*system, *(chosen[i] for i in sorted(chosen))]
        return PolicyWindow(window, tools)

    def _fit(
        self, messages: Sequence[AnyMessage], members: list[int], room: int, priming: int
    ) -> dict[int, AnyMessage]:
        """The newest step with its outputs cut to fit ``room``, or nothing when even that fails."""
        counter = self.setup.counter
        outputs = [i for i in members if isinstance(messages[i], ToolMessage)] or members[-1:]
        texts = {i: message_text(messages[i]) for i in outputs}

        def build(keep: int) -> dict[int, AnyMessage]:
            return {
                i: replace_content(messages[i], _cut(texts[i], keep)) if i in texts else messages[i]
                for i in members
            }

        def fits(candidate: dict[int, AnyMessage]) -> bool:
            return sum(message_cost(counter, m, priming) for m in candidate.values()) <= room

        low, high = 0, max(len(t) for t in texts.values())
        if not fits(build(low)):
            return {}
        while low < high:  # the largest share of each output that still fits
            mid = (low + high + 1) // 2
            if fits(build(mid)):
                low = mid
            else:
                high = mid - 1
        return build(low)


class MaskPolicy(StepsPolicy):
    """Observation masking: old tool outputs replaced by a one-line note, then ``steps``."""

    name = "mask"

    def __init__(self, setup: PolicySetup) -> None:
        super().__init__(setup)
        self._masked: dict[int, AnyMessage] = {}

    def source(self) -> list[AnyMessage]:
        """The raw messages with tool results older than the newest assistant messages masked."""
        assistants = [i for i, m in enumerate(self.messages) if isinstance(m, AssistantMessage)]
        if len(assistants) <= MASK_KEEP_ASSISTANTS:
            return self.messages
        cutoff = assistants[-MASK_KEEP_ASSISTANTS]
        out = list(self.messages)
        for i in range(cutoff):
            message = out[i]
            if isinstance(message, ToolMessage):
                if i not in self._masked:
                    lines = len(message_text(message).splitlines())
                    self._masked[i] = replace_content(message, f"[old tool output omitted: {lines} lines]")
                out[i] = self._masked[i]
        return out
