"""Benchmark: JSON in and out of the window and append routes, in process.

What a request body costs to become the route's pydantic model, three ways: the standard
library's ``json.loads`` then ``model_validate`` (what FastAPI does with a body parameter),
``orjson.loads`` then ``model_validate``, and pydantic-core's ``model_validate_json`` on the
raw bytes; and what a window response costs to become bytes: ``model_dump_json`` (what the
window route sends) against ``orjson.dumps(model_dump())``. Bodies: an append of one agent
step (a tool call and its result) and a window request with a system message and the 14
tau-bench tool definitions; the response is a 61-message window served by the fast path's
models. p50 of 2,000 calls each, microseconds. Asserts nothing.

    .venv/bin/python bench/serialization.py
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import orjson
from fast_path_flat import DEFAULT_DATA, conversation, tau_tools

from ctxcore.client.models import AppendRequest, WindowRequest, WindowResponse, WindowStats
from ctxcore.messages import to_openai

N = 2_000


def p50_us(call: Callable[[], Any]) -> float:
    call()
    samples = []
    for _ in range(N):
        started = time.perf_counter_ns()
        call()
        samples.append(time.perf_counter_ns() - started)
    return sorted(samples)[N // 2] / 1e3


def main() -> None:
    system, body = conversation(DEFAULT_DATA / "tau_bench.jsonl", 200)
    step = to_openai(body[-3:-1])
    append_raw = json.dumps({"messages": step}).encode()
    window_raw = json.dumps(
        {"budget_tokens": 32_000, "system_messages": to_openai(system), "tools": tau_tools()}
    ).encode()
    print(f"bodies: append {len(append_raw):,} bytes, window request {len(window_raw):,} bytes\n")
    print("| body | json.loads + model_validate | orjson.loads + model_validate | model_validate_json |")
    print("|---|---|---|---|")
    for name, model, raw in (("append", AppendRequest, append_raw), ("window", WindowRequest, window_raw)):
        a = p50_us(lambda m=model, r=raw: m.model_validate(json.loads(r)))
        b = p50_us(lambda m=model, r=raw: m.model_validate(orjson.loads(r)))
        c = p50_us(lambda m=model, r=raw: m.model_validate_json(r))
        print(f"| {name} | {a:.1f} | {b:.1f} | {c:.1f} |")
    response = WindowResponse(
        messages=to_openai(body[-61:]),
        tools=tau_tools(),
        stats=WindowStats(
            total_messages=61,
            total_tokens=9_000,
            total_dialogues=1,
            system_messages=0,
            user_messages=1,
            assistant_messages=30,
            tool_messages=30,
            tools=14,
            system_message_tokens=0,
            user_message_tokens=100,
            assistant_message_tokens=3_000,
            tool_message_tokens=5_000,
            tool_tokens=900,
        ),
        state_version=3,
        compaction="idle",
        compaction_detail={"last_error": None, "last_success_at": None},
        fallback_applied=False,
        elided_ranges=[],
    )
    out = response.model_dump_json().encode()
    print(f"\nwindow response: {len(out):,} bytes\n")
    print("| response | model_dump_json | orjson.dumps(model_dump()) |\n|---|---|---|")
    a = p50_us(response.model_dump_json)
    b = p50_us(lambda: orjson.dumps(response.model_dump()))
    print(f"| window | {a:.1f} | {b:.1f} |")


if __name__ == "__main__":
    main()
