"""The eval's baselines: a correct truncation (``steps``), observation masking, lossless."""

from __future__ import annotations

import json

import pytest

from ctxcore.errors import BudgetExceeded
from ctxcore.eval.baselines import MASK_KEEP_ASSISTANTS
from ctxcore.eval.policies import CountingModel, PolicySetup, make_policy
from ctxcore.messages import AnyMessage, AssistantMessage, SystemMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.tokens import TiktokenCounter
from ctxcore.turns import DEFAULT_DETECTOR
from ctxcore.window import check_window

COUNTER = TiktokenCounter()
SYSTEM = [SystemMessage(content="You are a coding agent.")]


def setup(budget: int) -> PolicySetup:
    model = CountingModel(ExtractiveModel(COUNTER), COUNTER)
    return PolicySetup("run", budget, SYSTEM, [], COUNTER, model, DEFAULT_DETECTOR)


def step(i: int, size: int = 40) -> list[AnyMessage]:
    call = ToolCall(id=f"c{i}", name="bash", arguments=json.dumps({"command": f"cat f{i}.py"}))
    return [
        AssistantMessage(content=f"step {i}", tool_calls=[call]),
        ToolMessage(tool_call_id=f"c{i}", content=f"output {i} " + "word " * size),
    ]


def replay(name: str, budget: int, units: list[list[AnyMessage]]) -> list[AnyMessage]:
    policy = make_policy(name, setup(budget))
    for unit in units:
        policy.append(unit)
    window = policy.window()
    assert COUNTER.count_messages(window.messages) <= budget or name == "lossless"
    return window.messages


def test_steps_keeps_anchors_and_the_newest_whole_steps_in_log_order() -> None:
    task, intent = UserMessage(content="Fix the bug."), UserMessage(content="Also add a test.")
    units = [[task], *[step(i) for i in range(10)], [intent], *[step(i) for i in range(10, 20)]]
    window = replay("steps", 600, units)
    assert window[0] == SYSTEM[0] and window[1] == task and intent in window
    assert check_window(window) == []
    kept = [m for m in window if isinstance(m, AssistantMessage)]
    numbers = [int(str(m.content).split()[1]) for m in kept]
    # A contiguous run of the newest steps, each with its output, nothing cut.
    assert numbers == list(range(numbers[0], 20)) and len(numbers) >= 3
    assert sum(isinstance(m, ToolMessage) for m in window) == len(numbers)
    assert not any("characters cut" in str(m.content) for m in window)
    assert window.index(intent) < window.index(kept[0]) or numbers[0] < 10


def test_steps_cuts_the_newest_step_to_head_and_tail_when_it_alone_is_too_big() -> None:
    task = UserMessage(content="Fix the bug.")
    big = step(1, size=3000)
    window = replay("steps", 800, [[task], step(0), big])
    assert check_window(window) == []
    output = window[-1]
    assert isinstance(output, ToolMessage) and "characters cut ...]" in str(output.content)
    head, tail = str(output.content).split("[... ")
    assert head.startswith("output 1 word") and tail.endswith("word ")
    kept = len(str(output.content)) - len(tail.split("...]", 1)[0]) - len("[... ...]")
    assert kept > 1000  # it fills the room, not a token preview
    assert window[-2] == big[0]  # the call itself is whole


def test_steps_leaves_out_an_older_step_no_window_could_hold_and_goes_on() -> None:
    task = UserMessage(content="Fix the bug.")
    huge = step(2, size=3000)
    window = replay("steps", 800, [[task], step(0), step(1), huge, step(3), step(4)])
    assert check_window(window) == []
    kept = [int(str(m.content).split()[1]) for m in window if isinstance(m, AssistantMessage)]
    # Before, the walk stopped at the huge output and served the two steps after it only.
    assert kept == [0, 1, 3, 4] and not any("characters cut" in str(m.content) for m in window)


def test_steps_raises_when_the_anchors_alone_do_not_fit() -> None:
    policy = make_policy("steps", setup(50))
    policy.append([UserMessage(content="a long task " * 40)])
    with pytest.raises(BudgetExceeded):
        policy.window()


def test_mask_replaces_old_outputs_with_their_line_count() -> None:
    task = UserMessage(content="Fix the bug.")
    units = [[task], *[step(i, size=5) for i in range(MASK_KEEP_ASSISTANTS + 3)]]
    units[1][1] = ToolMessage(tool_call_id="c0", content="a\nb\nc")
    window = replay("mask", 100_000, units)
    outputs = [m for m in window if isinstance(m, ToolMessage)]
    assert str(outputs[0].content) == "[old tool output omitted: 3 lines]"
    assert [str(m.content).startswith("[old tool output omitted") for m in outputs] == [True] * 3 + [
        False
    ] * MASK_KEEP_ASSISTANTS
    assert check_window(window) == []


def test_lossless_serves_everything() -> None:
    units = [[UserMessage(content="task")], *[step(i, size=500) for i in range(5)]]
    window = replay("lossless", 100, units)
    assert len(window) == 1 + 1 + 10
