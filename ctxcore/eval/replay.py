"""A conversation cut for replay: its append groups, window points, probes and checkpoints."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ctxcore.eval.data import Conversation, groups, window_points
from ctxcore.eval.policy_base import message_cost, priming_tokens
from ctxcore.eval.probes import Probes, ProbeTracker
from ctxcore.eval.references import Checkpoint, checkpoints, held, window_text
from ctxcore.eval.results import CheckpointScore
from ctxcore.messages import AnyMessage
from ctxcore.tokens import TokenCounter
from ctxcore.turns import UserDetector

__all__ = ["Replay", "conversation_tokens", "score_checkpoint"]


def conversation_tokens(conv: Conversation, counter: TokenCounter) -> int:
    """Tokens of the whole conversation as one request (system, messages, tools)."""
    return counter.count_messages([*conv.system, *conv.messages]) + counter.count_tools(list(conv.tools))


@dataclass
class Replay:
    """A conversation cut into the groups and window points every policy replays."""

    conv: Conversation
    units: list[list[AnyMessage]]
    points: list[int]
    # Probes of the raw run up to each window point (empty for a run without tools).
    probes: dict[int, Probes]
    # The checkpoints, by the group after which their window is taken.
    checkpoints: dict[int, Checkpoint]
    # The raw run's tokens up to each group (system and tools included) and each group's own.
    raw_tokens: list[int]
    unit_tokens: list[int]

    @classmethod
    def of(
        cls, conv: Conversation, step_stride: int, detector: UserDetector, counter: TokenCounter
    ) -> Replay:
        units = groups(conv.messages)
        points = window_points(units, step_stride=step_stride, detector=detector)
        priming = priming_tokens(counter)
        unit_tokens = [sum(message_cost(counter, m, priming) for m in unit) for unit in units]
        total = counter.count_messages(list(conv.system)) + counter.count_tools(list(conv.tools))
        total += 0 if conv.system else priming
        raw_tokens: list[int] = []
        starts: dict[int, int] = {}
        at = 0
        for i, unit in enumerate(units):
            starts[at] = i
            at += len(unit)
            total += unit_tokens[i]
            raw_tokens.append(total)
        found: dict[int, Checkpoint] = {}
        for checkpoint in checkpoints(conv.messages, conv.system):
            at_unit = starts[checkpoint.index]
            if at_unit > 0:  # with nothing before it no window is asked for
                found[at_unit - 1] = checkpoint
        # The agent asks for a window before every model call: a checkpoint's is taken
        # whatever the stride.
        points = sorted({*points, *found})
        probes: dict[int, Probes] = {}
        if conv.has_tools:
            tracker = ProbeTracker()
            wanted = set(points)
            for i, unit in enumerate(units):
                for message in unit:
                    tracker.add(message)
                if i in wanted:
                    probes[i] = tracker.snapshot()
        return cls(conv, units, points, probes, found, raw_tokens, unit_tokens)

    def pressed(self, unit: int, budget: int) -> bool:
        """The run up to ``unit`` exceeds ``budget`` by at least its newest group: a window
        there must leave something out."""
        return self.raw_tokens[unit] >= budget + self.unit_tokens[unit]


def score_checkpoint(
    checkpoint: Checkpoint, window: Sequence[AnyMessage], tokens: int, budget: int, pressed: bool
) -> CheckpointScore:
    """Which of the checkpoint's references ``window`` holds."""
    text = window_text(window)
    hits = tuple(held(r, text) for r in checkpoint.references)
    return CheckpointScore(checkpoint, hits, tokens, budget, pressed)
