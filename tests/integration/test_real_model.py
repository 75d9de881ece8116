"""A real language model in the loop: the bundled Gemma 3 270M (the ``local-model`` extra)
served by llama-cpp-python on a free loopback port, and a development run compacted through
a real Celery worker with ``OpenAIChatModel`` against it.

Whatever the model writes (free text, the wrong format, a reply cut at ``max_tokens``, the
prompt repeated), the pipeline's contract must hold: every window valid and within budget,
no invalid block ever saved, every failure a visible stage outcome with its kind. Without the
extra the test skips saying how to install it (``pip install -e '.[local-model]'``; then
``ctxcore model serve`` serves the same model by hand); under ``CI=true`` it fails instead.
Kept short on 2 cores: a slice of one run, a small budget and small outputs (measured 1 to 5
minutes on 2 cores shared with other builds and test runs: the model's latency varies; one run
saw a first call time out, a second stage's replies cut at max_tokens and unusable, and a third
save a 248-token summary of 4,627 tokens).
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from ctxcore.config import Settings
from ctxcore.errors import MODEL_CALL_KINDS, CtxcoreError
from ctxcore.markers import ROUND_LEVEL_MEMORY_BLOCK
from ctxcore.messages import AnyMessage, SystemMessage, from_openai, message_text
from ctxcore.state import ConversationKey
from ctxcore.tokens import TiktokenCounter
from ctxcore.turns import anchors
from ctxcore.window import check_window
from tests.chaos.processes import free_port
from tests.conftest import server_unavailable
from tests.datasets import swe_runs
from tests.workers_fixture import in_process_worker
from workers.keyspace import delete_prefixed_keys
from workers.local_model import MODEL_ALIAS, require_extra, serving
from workers.runtime import Runtime, build_service

pytestmark = [pytest.mark.real_model, pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(600)]

# model.context_window_tokens; the server gets twice that: ctxcore counts with its own
# tokenizer (cl100k_base), and Gemma's counts more (1.2x on a log of paths and numbers:
# 3,899 against 3,214); twice leaves room for text that splits worse.
# Small, as every prompt token costs ~15 ms on 2 busy cores.
CONTEXT = 2048
BUDGET = 3000
# Raw tokens of the run's slice: twice the budget, so L0->L1 must run (and a further pass
# may follow), in a few model calls. Its first tool result alone is 3,442 tokens: trimmed.
SLICE_TOKENS = 6000
COUNTER = TiktokenCounter()


@pytest.fixture(scope="module")
def model_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    try:
        require_extra()
    except CtxcoreError as exc:
        server_unavailable(f"{exc}; then `ctxcore model serve` serves the model this test uses")
    log = tmp_path_factory.mktemp("local-model") / "server.log"
    with serving(free_port(), 2 * CONTEXT, log) as url:
        yield url


@pytest.fixture()
def settings(redis_url: str, model_url: str) -> Iterator[Settings]:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    yield Settings.load(
        {
            "redis": {"url": redis_url, "key_prefix": prefix},
            "model": {
                "base_url": model_url,
                "name": MODEL_ALIAS,
                "context_window_tokens": CONTEXT,
                "max_tokens": 256,
                "timeout": 60,
                "timeout_per_output_token": 0.25,
            },
            "worker": {"retry_delays": [0.5], "lock_timeout": 120, "hard_time_limit": 300},
            "engine": {"keep_recent_messages": 2},
        }
    )
    client = redis.Redis.from_url(redis_url)
    try:
        delete_prefixed_keys(client, prefix)
    finally:
        client.close()


def _steps(messages: list[AnyMessage]) -> Iterator[list[AnyMessage]]:
    """The run's messages a step at a time: an assistant message with its tool results."""
    i = 0
    while i < len(messages):
        j = i + 1
        while j < len(messages) and messages[j].role == "tool":
            j += 1
        yield messages[i:j]
        i = j


def _wait_idle(rt: Runtime, key: ConversationKey, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if rt.scheduler.status(key) == "idle":
            return
        time.sleep(0.5)
    raise AssertionError(f"compaction of {key} on the real model did not finish in {seconds:.0f} s")


def _check_served(messages: list[AnyMessage], logged: list[AnyMessage]) -> None:
    assert COUNTER.count_messages(messages) <= BUDGET
    assert check_window(messages) == []
    served = {m.context_message_id for m in messages}
    for a in anchors(logged).indices():
        assert logged[a].context_message_id in served


def test_a_development_run_compacted_by_the_real_model_keeps_the_contract(
    settings: Settings, tmp_path: Path
) -> None:
    from workers.tasks import CeleryQueue

    run = next(swe_runs())
    msgs = from_openai(run["messages"])
    system = [m for m in msgs if isinstance(m, SystemMessage)]
    rest: list[AnyMessage] = [m for m in msgs if not isinstance(m, SystemMessage)]
    key = ConversationKey("acme", f"real-{uuid.uuid4().hex[:6]}")
    with in_process_worker(settings) as rt:
        service = build_service(rt, CeleryQueue())
        appended: list[AnyMessage] = []
        for step in _steps(rest):
            service.append(key, step)
            appended.extend(step)
            _check_served(service.get_window(key, BUDGET, system).messages, rt.log.read_after(key, None))
            if COUNTER.count_messages(appended) > SLICE_TOKENS:
                break
        _wait_idle(rt, key, 480)
        final = service.get_window(key, BUDGET, system).messages
        entries = rt.journal.entries(key)
        history = rt.state_store.history(key, 50)
    _check_served(final, rt.log.read_after(key, None))
    assert entries, "no stage ran: the slice never went over its compaction target"

    # The model was reached: a call was made, or it failed visibly with a model-call kind.
    kinds = {str(k) for k in MODEL_CALL_KINDS}
    assert any(e.model_calls > 0 or (e.error_kind in kinds) for e in entries), [e.as_dict() for e in entries]
    # Every failure is a visible outcome with its kind (a rejected summary included).
    for entry in entries:
        if entry.outcome in ("failed", "rejected"):
            assert entry.error_kind, entry.as_dict()
    # Only what a stage saved is a version; nothing a rejected stage produced is kept.
    saved_versions = {e.version for e in entries if e.outcome == "compressed"}
    rejected_versions = {e.version for e in entries if e.outcome == "rejected" and e.version is not None}
    assert not rejected_versions & {s.version for s in history}
    for state in history:
        if state.version == 0:
            continue
        assert state.version in saved_versions, (state.version, saved_versions)
        ranges = sorted((b.first_id, b.last_id) for b in state.blocks)
        assert all(a <= b for a, b in ranges)
        assert all(b1 < a2 for (_, b1), (a2, _) in itertools.pairwise(ranges)), ranges
        for block in state.blocks:
            texts = [message_text(m) for m in block.messages]
            assert block.messages and all(t.strip() for t in texts), block.block_id
            if block.block_id.startswith("L"):
                # A summary block: the pipeline's marker, and no larger than what it replaced.
                assert ROUND_LEVEL_MEMORY_BLOCK in texts[0]
                assert block.tokens_after < block.tokens_before, block.block_id
