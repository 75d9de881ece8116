"""Issue 38's bad inputs, on the path the workers take (``Coordinator.run_stage`` with
``OpenAIChatModel``) without the real model: the model server not running, an empty reply, a
reply in another language, a reply repeating the prompt. Each is a visible stage outcome with
its kind, or a summary that keeps the pipeline's contract; nothing invalid is saved.
(The real model itself: tests/integration/test_real_model.py; start it by hand with
``ctxcore model serve``.)"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from ctxcore import check_window, from_openai
from ctxcore.coordinator import Coordinator, CoordinatorResult
from ctxcore.markers import ROUND_LEVEL_MEMORY_BLOCK
from ctxcore.messages import SystemMessage, message_text
from ctxcore.pipeline.fitting import CallLimits
from ctxcore.state import ConversationKey, MemoryMessageLog, MemoryStateStore
from ctxcore.summarize.model import ModelClient
from ctxcore.summarize.openai_chat import OpenAIChatModel
from ctxcore.testing import OpenAIServer
from ctxcore.tokens import TiktokenCounter
from tests.datasets import conversations

COUNTER = TiktokenCounter()
KEY = ConversationKey("acme", "bad-replies")
BUDGET = 6000


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as srv:
        yield srv


def _stage(client: ModelClient) -> tuple[CoordinatorResult, MemoryStateStore]:
    """The first planned stage of a development-like run over its budget, on ``client``."""
    store, log = MemoryStateStore(), MemoryMessageLog()
    coord = Coordinator(
        store,
        log,
        COUNTER,
        model_for=lambda key: client,
        default_budget=BUDGET,
        keep_recent_messages=2,
        call_limits_for=lambda key: CallLimits(8192, 512),
    )
    msgs = from_openai(next(conversations("minisweagent.jsonl"))["messages"])
    log.append(KEY, [m for m in msgs if not isinstance(m, SystemMessage)])
    stage = coord.plan(KEY)
    assert stage is not None and stage.kind == "l0_to_l1"
    return coord.run_stage(KEY, stage), store


def test_the_model_server_not_running_fails_the_stage_as_server_unstable() -> None:
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    with OpenAIChatModel(url, model="gemma-3-270m", timeout=5) as client:
        result, store = _stage(client)
    assert result.outcome == "failed", (
        "a model server that is not running must fail the stage visibly; "
        "start the bundled one with `ctxcore model serve`"
    )
    assert result.error_kind == "server_unstable", result.error
    assert store.load(KEY) is None, "nothing may be saved"


def test_an_empty_reply_fails_the_stage_visibly(server: OpenAIServer) -> None:
    server.push_text("")
    with OpenAIChatModel(server.base_url, model="m", timeout=5) as client:
        result, store = _stage(client)
    assert result.outcome == "failed" and result.error_kind, result
    assert "no text" in (result.error or "")
    assert store.load(KEY) is None


def test_a_blank_summary_is_never_saved(server: OpenAIServer) -> None:
    server.responder = lambda request: json.dumps({"blocks": [{"block_id": "block_1", "summary": "  "}]})
    with OpenAIChatModel(server.base_url, model="m", timeout=5) as client:
        result, store = _stage(client)
    assert result.outcome == "skipped" and "no summary was usable" in result.detail, result
    assert store.load(KEY) is None


def test_a_reply_repeating_the_prompt_is_never_saved(server: OpenAIServer) -> None:
    server.responder = lambda request: str(request["messages"][-1]["content"])[:2000]
    with OpenAIChatModel(server.base_url, model="m", timeout=5) as client:
        result, store = _stage(client)
    assert result.outcome == "skipped" and "no summary was usable" in result.detail, result
    assert store.load(KEY) is None


def test_free_text_in_another_language_is_not_saved(server: OpenAIServer) -> None:
    server.responder = lambda request: (
        "Der Agent hat die Datei card.py untersucht und einen Fehler gefunden. 代理检查了文件并运行了测试。"
    )
    with OpenAIChatModel(server.base_url, model="m", timeout=5) as client:
        result, store = _stage(client)
    # Not the requested blocks, and the stage spans more than one segment: nothing usable.
    assert result.outcome == "skipped" and "no summary was usable" in result.detail, result
    assert store.load(KEY) is None


def test_the_requested_format_in_another_language_keeps_the_contract(server: OpenAIServer) -> None:
    summary = "L'agent a lu card.py et lancé les tests."
    server.responder = lambda request: json.dumps({"blocks": [{"block_id": "block_1", "summary": summary}]})
    with OpenAIChatModel(server.base_url, model="m", timeout=5) as client:
        result, store = _stage(client)
    # A summary like any other: checked (sections, working set), then saved.
    assert result.outcome == "compressed", result
    saved = store.load(KEY)
    assert saved is not None
    served = result.view.context_messages()
    assert check_window(served) == []
    fresh = [b for b in saved.blocks if b.block_id.startswith("L")]
    assert fresh
    for block in fresh:
        text = message_text(block.messages[0])
        assert ROUND_LEVEL_MEMORY_BLOCK in text
        assert block.tokens_after < block.tokens_before
