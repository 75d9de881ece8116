"""The window's budget: checked once where windows start, one error naming the field, and
the modules it passes through from the route to the served window.

``walk`` runs the window route with a budget no other figure of the request equals and
records, for every ctxcore function called, the parameters holding that value: the
modules the budget passes through and the names it goes by.
"""

from __future__ import annotations

import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ctxcore.config import Settings, hash_token
from ctxcore.errors import InvalidRequestError
from ctxcore.messages import AssistantMessage, SystemMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.state import ConversationKey, MemoryMessageLog, MemoryStateStore
from workers.http import create_app
from workers.keyspace import delete_prefixed_keys
from workers.runtime import Runtime, build_service
from workers.service import ContextService, InlineQueue

ROOT = Path(__file__).resolve().parents[2]
BUDGET = 54_321
TOKEN = "budget-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
KEY = ConversationKey("acme", "budgeted")
SYSTEM = [{"role": "system", "content": "You are terse."}]
SYSTEM_MESSAGES = [SystemMessage(content="You are terse.")]
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


@pytest.fixture(params=[pytest.param("redis", marks=pytest.mark.redis), "sqlite"])
def runtime(request: pytest.FixtureRequest, redis_url: str, tmp_path: Path) -> Iterator[Runtime]:
    data: dict[str, Any] = {
        "redis": {"url": redis_url, "key_prefix": f"budget{uuid.uuid4().hex[:6]}"},
        "http": {"tokens": {hash_token(TOKEN): "acme"}},
    }
    if request.param == "sqlite":
        data["database"] = {"url": f"sqlite:///{tmp_path / 'b.db'}"}
    rt = Runtime(Settings.load(data))
    if request.param == "sqlite":
        rt.state_store.setup()  # type: ignore[attr-defined]
    yield rt
    delete_prefixed_keys(rt.redis, rt.settings.redis.key_prefix)
    rt.redis.close()


def history(steps: int) -> list[Any]:
    out: list[Any] = [UserMessage(content="the task: " + "fix the parser " * 20)]
    for i in range(steps):
        call = ToolCall(id=f"c{i}", name="bash", arguments='{"command": "pytest"}')
        out += [
            AssistantMessage(content="", tool_calls=[call]),
            ToolMessage(tool_call_id=call.id, content="ok " * 300),
        ]
    return out


def _held(found: object, value: int) -> bool:
    return isinstance(found, int) and not isinstance(found, bool) and found == value


class Walk:
    """Records, while installed, ``module -> {function(parameter)}`` for every ctxcore call
    that received ``budget_tokens``, and how often each such function was called."""

    def __init__(self) -> None:
        self.budget_tokens = 0
        self.seen: dict[str, set[str]] = {}
        self.calls: Counter[str] = Counter()

    def profile(self, frame: FrameType, event: str, _: Any) -> None:
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith((str(ROOT / "ctxcore"), str(ROOT / "workers"))):
            return
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        value = self.budget_tokens
        # ``BudgetTokens`` (the checked budget) is an int too; a bool is not a budget.
        held = [n for n in names if _held(frame.f_locals.get(n), value)]
        if held:
            module = Path(code.co_filename).relative_to(ROOT).as_posix()
            self.seen.setdefault(module, set()).update(f"{code.co_name}({n})" for n in held)
            self.calls[f"{module}:{code.co_name}"] += 1

    def window(self, client: TestClient, budget_tokens: int) -> dict[str, set[str]]:
        self.budget_tokens, self.seen = budget_tokens, {}
        answer = client.post(
            f"/v1/conversations/{KEY.conversation_id}/window",
            json={"budget_tokens": budget_tokens, "system_messages": SYSTEM, "tools": TOOLS},
            headers=AUTH,
        )
        self.budget_tokens = 0
        assert answer.status_code == 200, answer.text
        return self.seen


def test_the_budget_passes_through_these_modules_as_budget_tokens(runtime: Runtime) -> None:
    build_service(runtime, InlineQueue()).append(KEY, history(30))
    walk = Walk()
    # The route runs in the client's worker threads: profiling starts before they do.
    threading.setprofile(walk.profile)
    sys.setprofile(walk.profile)
    try:
        with TestClient(create_app(runtime, InlineQueue())) as client:
            fits, over = walk.window(client, BUDGET), walk.window(client, 2_500)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    expected = {
        # The route's span; the service checks the budget once (``BudgetTokens``), hands the
        # room it leaves the messages to the reader (``conversation_budget``: what the reader
        # records for the workers, below) and the budget to the chain and to assemble.
        "workers/telemetry/spans.py": {"window_span(budget_tokens)"},
        "workers/service/context_service.py": {"get_window(budget_tokens)", "_rules(budget_tokens)"},
        # Checked once: making the ``BudgetTokens`` (its ``__new__``) is the check.
        "ctxcore/state/budget.py": {
            "check_budget(budget_tokens)",
            "__new__(budget_tokens)",
            "conversation_budget(budget_tokens)",
            "trigger_tokens(budget_tokens)",
        },
        "ctxcore/assemble.py": {"assemble_window(budget_tokens)"},
        # The chain gets it once (``WindowRules``); it builds its rules only when the tail
        # is over its room.
        "ctxcore/processors/chain.py": {"__init__(budget_tokens)"},
    }
    assert len(expected) <= 6
    assert fits == expected
    # What the workers compact to: the budget less the system messages and tools.
    fixed = runtime.counter.count_messages(SYSTEM_MESSAGES) + runtime.counter.count_tools(TOOLS)
    assert runtime.state_store.get_budget(KEY) == 2_500 - fixed
    # Over the budget the rules run with it as their window and the fallback shapes the
    # window: the same modules, the same name.
    assert set(over) == set(expected)
    assert over["ctxcore/processors/chain.py"] == {
        "__init__(budget_tokens)",
        "default_rule_chain(budget_tokens)",
        "apply_rules_result(budget_tokens)",
    }
    assert {name.split("(")[1] for names in over.values() for name in names} == {"budget_tokens)"}
    assert "fit_to_budget(budget_tokens)" in over["ctxcore/assemble.py"]
    # Checked once per window: the stores take the checked value and do not check it again.
    assert walk.calls["ctxcore/state/budget.py:__new__"] == 2


def test_a_bad_budget_is_one_error_naming_the_field(runtime: Runtime) -> None:
    runtime.log.append(KEY, history(1))
    with TestClient(create_app(runtime, InlineQueue()), raise_server_exceptions=False) as client:
        for bad in (0, -5, 10**30, 1_000_000_001):
            answer = client.post(
                f"/v1/conversations/{KEY.conversation_id}/window", json={"budget_tokens": bad}, headers=AUTH
            )
            assert answer.status_code == 422, answer.text
            body = answer.json()
            assert body["error"] == "invalid_request" and body["field"] == "budget_tokens", body
            assert body["detail"].startswith("budget_tokens must be a positive number of tokens")
        # Not a number at all: the request's schema answers, naming the field too.
        answer = client.post(
            f"/v1/conversations/{KEY.conversation_id}/window", json={"budget_tokens": "lots"}, headers=AUTH
        )
        assert answer.status_code == 422 and answer.json()["detail"][0]["loc"] == ["body", "budget_tokens"]


@pytest.mark.parametrize("bad", [0, -1, True, 10**10])
def test_the_service_refuses_a_bad_budget_before_reading(bad: int) -> None:
    state, log = MemoryStateStore(), MemoryMessageLog()
    service = ContextService(Settings(), state, log, None, InlineQueue())
    service.append(KEY, [UserMessage(content="hi")])
    with pytest.raises(InvalidRequestError) as raised:
        service.get_window(KEY, bad)
    assert raised.value.field == "budget_tokens"
    assert state.get_budget(KEY) is None
