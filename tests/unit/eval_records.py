"""Records the evaluation tests replay: a chat with facts and questions, a coding run with
tool calls, and the setup and replay helpers around them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ctxcore.eval.data import conversation
from ctxcore.eval.harness import evaluate_conversation
from ctxcore.eval.policies import CountingModel, PolicySetup
from ctxcore.messages import (
    AnyMessage,
)
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.tokens import TiktokenCounter
from ctxcore.turns import DEFAULT_DETECTOR

COUNTER = TiktokenCounter()
FACTS = [
    "my sister Lena moved to Lisbon in March 2021",
    "the dog is called Biscuit and he is a beagle",
    "I started learning the cello last autumn",
    "our wedding anniversary is on 14 June",
    "I work night shifts at the Riverside hospital",
    "the kids love building volcano models with baking soda",
    "my favourite book is The Left Hand of Darkness",
    "we drove the old blue Volvo to the coast",
    "Grandpa Theo grew tomatoes on the balcony",
    "I ran the Porto half marathon in 2 hours 5 minutes",
]


def chat_record(turns: int = 40) -> dict[str, Any]:
    """A two-person chat: one fact per user turn for ten turns, small talk after, and questions
    about the facts."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "[Session 1: 8 May 2023]"}]
    for i in range(turns):
        said = f"by the way, {FACTS[i]}" if i < len(FACTS) else "what a long day at work it was"
        messages.append({"role": "user", "content": f"Ana: {said}. Turn {i}.", "msg_id": f"D1:{2 * i + 1}"})
        messages.append(
            {
                "role": "assistant",
                "content": f"Ben: oh nice, tell me more about that, turn {i}!",
                "msg_id": f"D1:{2 * i + 2}",
            }
        )
    qa = [
        {
            "question": "Where did Lena move?",
            "answer": "Lisbon",
            "evidence": ["D1:1"],
            "category": "single-hop",
        },
        {"question": "Dog's name?", "answer": "Biscuit", "evidence": ["D1:3"], "category": "single-hop"},
        {
            "question": "Marathon time?",
            "answer": "2 hours 5 minutes",
            "evidence": ["D1:19"],
            "category": "single-hop",
        },
        {
            "question": "Ana's cat?",
            "answer": "Not mentioned in the conversation",
            "evidence": [],
            "category": "adversarial",
        },
    ]
    return {"id": "chat-1", "messages": messages, "qa": qa, "meta": {"answers": "secret"}}


def call(cid: str, command: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": f"THOUGHT: run {command}",
        "tool_calls": [{"id": cid, "name": "bash", "arguments": json.dumps({"command": command})}],
    }


def tool_record(steps: int = 30) -> dict[str, Any]:
    """A coding run: a task, many reads, an error, a diff and a final message."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {
            "role": "user",
            "content": "Fix the crash in src/app/core.py when the config file is empty.\nKeep the API.",
        },
    ]
    for i in range(steps):
        messages.append(call(f"c{i}", f"sed -n {i},{i + 40}p src/app/module_{i}.py"))
        messages.append(
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"line {i}: " + "x = compute(y) " * 60}
        )
    messages.append(call("e", "python -m pytest tests/test_core.py"))
    messages.append(
        {
            "role": "tool",
            "tool_call_id": "e",
            "content": "Traceback (most recent call last):\n  File core.py\nValueError: empty config",
        }
    )
    messages.append(call("w", "sed -i 's/return text/return text or {}/' src/app/core.py"))
    messages.append({"role": "tool", "tool_call_id": "w", "content": ""})
    messages.append(call("d", "git diff"))
    messages.append(
        {
            "role": "tool",
            "tool_call_id": "d",
            "content": "diff --git a/src/app/core.py b/src/app/core.py\n+    if not text: return {}\n"
            "diff --git a/src/app/config.py b/src/app/config.py\n+DEFAULT = {}",
        }
    )
    messages.append({"role": "assistant", "content": "Done: empty configs now load as {}."})
    return {"id": "run-1", "messages": messages, "meta": {"resolved": True}}


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def setup_for(record: dict[str, Any], budget: int) -> tuple[PolicySetup, list[AnyMessage]]:
    conv = conversation(record)
    model = CountingModel(ExtractiveModel(COUNTER), COUNTER)
    return PolicySetup(conv.id, budget, list(conv.system), [], COUNTER, model, DEFAULT_DETECTOR), list(
        conv.messages
    )


def replay(record: dict[str, Any], policies: list[str], budget: int) -> dict[str, Any]:
    return evaluate_conversation(
        conversation(record), policies, budget, model=ExtractiveModel(COUNTER), counter=COUNTER
    )
