"""Secrets (API keys, bearer tokens, passwords, private keys, JWTs) pasted into a
conversation never leave it by a side door:

- not in the text sent to the summarisation endpoint, by default (workers' pipeline stages,
  the incremental ``Coordinator.compress``, the embedded round-level, current-round and
  dialogue compressors); ``redact_secrets=False`` is the explicit opt-out;
- not in compression dumps or debug records (files mode 0600 in 0700 directories, only
  under the configured directory, never through a planted symlink);
- not in error messages or logs, even when the provider echoes a key back.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ctxcore.config import Settings
from ctxcore.coordinator import Coordinator
from ctxcore.engine import ContextEngine
from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.pipeline import PipelineConfig, run_stage
from ctxcore.state import ConversationKey, MemoryMessageLog, MemoryStateStore
from ctxcore.summarize.dump import CompressionDump, DebugLog
from ctxcore.summarize.errors import ModelCallError
from ctxcore.summarize.executor import CompressionExecutor
from ctxcore.summarize.openai_chat import OpenAIChatModel
from ctxcore.testing import OpenAIServer
from ctxcore.tokens import TiktokenCounter
from tests.chaos.helpers import block_responder
from workers.runtime import Runtime

pytestmark = [pytest.mark.security]

PEM_BODY = "MIIEowIBAAKCAQEA7bq9mWxR0cH3mV1o6Yq5o0Ykq3bq1o9sSg0mF8tQ2Yb3c4u"
SECRETS = {
    "openai": "sk-proj-A1b2C3d4E5f6G7h8I9j0K1l2M3n4",
    "aws": "AKIAIOSFODNN7EXAMPLE",
    "github": "ghp_" + "a1B2c3D4e5" * 4,
    "bearer": "abcDEF123456ghiJKL789mnoPQR",
    "password": "hunter2-very-secret",
    "pem": PEM_BODY,
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV",
}
PEM = f"-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}\n{PEM_BODY[:40]}=\n-----END RSA PRIVATE KEY-----"
COUNTER = TiktokenCounter()
FILLER = "the build log shows the deploy step retried the cache warmup and the index rebuild " * 12


def leaked(text: str) -> list[str]:
    """Names of the secrets found in ``text``."""
    return [name for name, value in SECRETS.items() if value in text]


def secret_conversation() -> list[AnyMessage]:
    """A tool-using conversation with every kind of secret in user text, tool-call
    arguments, tool output and assistant text (and enough filler to need compaction)."""
    out: list[AnyMessage] = [UserMessage(content="Deploy the service to staging and check the logs.")]
    for n in range(6):
        call = ToolCall(
            id="call_0",
            name="bash",
            arguments=json.dumps(
                {"cmd": f"curl -H 'Authorization: Bearer {SECRETS['bearer']}' https://api/{n}"}
            ),
        )
        out += [
            AssistantMessage(
                content=f"Step {n}: using key {SECRETS['openai']} now. {FILLER}", tool_calls=[call]
            ),
            ToolMessage(
                tool_call_id="call_0",
                content=(
                    f"env: AWS_ACCESS_KEY_ID={SECRETS['aws']}\nGITHUB_TOKEN={SECRETS['github']}\n"
                    f"db_password={SECRETS['password']}\njwt {SECRETS['jwt']}\n{PEM}\n{FILLER}"
                ),
            ),
        ]
        out.append(UserMessage(content=f"also my password: {SECRETS['password']} -- {FILLER}"))
        out.append(AssistantMessage(content=f"noted {n}. {FILLER}"))
    out.append(UserMessage(content="Now summarise what happened."))
    return out


@pytest.fixture()
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer(responder=block_responder) as s:
        yield s


def _sent(server: OpenAIServer) -> str:
    return json.dumps(server.requests, ensure_ascii=False)


@pytest.mark.redis
def test_worker_stages_send_no_secret_to_the_summariser(redis_url: str, server: OpenAIServer) -> None:
    url = f"{redis_url.rsplit('/', 1)[0]}/9"
    prefix = f"secret{uuid.uuid4().hex[:6]}"
    rt = Runtime(
        Settings.load({"redis": {"url": url, "key_prefix": prefix}, "model": {"base_url": server.base_url}})
    )
    key = ConversationKey("tenant-s", "leaky")
    try:
        rt.log.append(key, secret_conversation())
        rt.state_store.set_budget(key, 2500)
        exhausted: list[str] = []
        for _ in range(6):
            stage = rt.coordinator.plan(key, exhausted=exhausted)
            if stage is None:
                break
            result = rt.coordinator.run_stage(key, stage)
            if result.outcome != "compressed":
                exhausted.append(stage.kind)
        assert server.request_count >= 1
        assert leaked(_sent(server)) == []
        # The opt-out really sends them (so the check above can fail).
        other = ConversationKey("tenant-s", "opted-out")
        rt.log.append(other, secret_conversation())
        rt.state_store.set_budget(other, 2500)
        stage = rt.coordinator.plan(other)
        assert stage is not None
        plain = PipelineConfig(
            target_tokens=stage.target_tokens, keep_recent_messages=4, redact_secrets=False
        )
        server.reset()
        run_stage(stage, rt.coordinator.view(other), rt.model_for(other), COUNTER, config=plain)
        assert leaked(_sent(server))
    finally:
        keys = list(rt.redis.scan_iter(match=f"*{prefix}*"))
        if keys:
            rt.redis.delete(*keys)


def test_incremental_compress_sends_no_secret(server: OpenAIServer) -> None:
    key = ConversationKey("t", "c")
    log, store = MemoryMessageLog(), MemoryStateStore()
    log.append(key, secret_conversation())
    model = OpenAIChatModel(server.base_url)
    coordinator = Coordinator(
        store, log, COUNTER, lambda _k: model, default_budget=2000, keep_recent_messages=2
    )
    result = coordinator.compress(key)
    assert result.outcome == "compressed", result.detail
    assert server.request_count >= 1 and leaked(_sent(server)) == []


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("RoundLevelCompressor", {"trigger_total_tokens": 3000, "target_total_tokens": 1500}),
        ("CurrentRoundCompressor", {"trigger_context_ratio": 0.1, "min_target_context_ratio": 0.01}),
        ("DialogueCompressor", {"trigger_context_ratio": 0.1, "min_target_context_ratio": 0.01}),
    ],
)
def test_embedded_compressors_send_no_secret(name: str, config: dict[str, object], tmp_path: Path) -> None:
    with OpenAIServer(
        responder=lambda r: "<state_snapshot>## Task\nDeploy to staging.</state_snapshot>"
    ) as snap:
        responder_server = snap if name != "RoundLevelCompressor" else None
        with OpenAIServer(responder=block_responder) as blocks:
            server = responder_server or blocks
            engine = ContextEngine({"context_window_tokens": 16_000, "strict_processors": True})
            messages = secret_conversation()
            if name == "CurrentRoundCompressor":
                # It summarises the current round: the work after the last real user message.
                messages = [
                    UserMessage(content="Deploy now."),
                    *(m for m in messages if not isinstance(m, UserMessage)),
                ]
            ctx = engine.create_context(
                f"ctx-{name}",
                processors=[(name, {**config, "model_client": OpenAIChatModel(server.base_url)})],
                token_counter=COUNTER,
            )
            ctx.add_messages(messages)
            assert ctx.compress_context() == "compressed"
            assert server.request_count >= 1
            assert leaked(_sent(server)) == [], leaked(_sent(server))


def test_dumps_and_debug_records_are_redacted_private_and_stay_in_their_directory(tmp_path: Path) -> None:
    with OpenAIServer(
        responder=lambda r: f"<state_snapshot>## Task\nkey {SECRETS['openai']}</state_snapshot>"
    ) as server:
        root = tmp_path / "dumps"
        engine = ContextEngine({"context_window_tokens": 16_000, "strict_processors": True})
        ctx = engine.create_context(
            "dumped",
            processors=[
                (
                    "DialogueCompressor",
                    {
                        "trigger_context_ratio": 0.1,
                        "min_target_context_ratio": 0.01,
                        "model_client": OpenAIChatModel(server.base_url),
                        "enable_compression_dump": True,
                        "compression_dump_dir": str(root / "{session_id}"),
                    },
                )
            ],
            session_id="sess-1",
            token_counter=COUNTER,
        )
        ctx.add_messages(secret_conversation())
        assert ctx.compress_context() == "compressed"
    # A crafted session id cannot move the dump directory.
    assert CompressionDump(root / "{session_id}", session_id="../../escape").write("p", {"k": SECRETS["aws"]})
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert files and all(root in p.parents for p in files), files
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        text = path.read_text()
        assert leaked(text) == [], (path, leaked(text))
        # A dump holds the conversation (secrets cut); the debug records (.jsonl) hold sizes.
        assert "[REDACTED]" in text or path.suffix == ".jsonl"
    assert {p.suffix for p in files} == {".json", ".jsonl"}  # the compressor wrote both

    # Debug records: redacted, 0600.
    debug = DebugLog(tmp_path / "debug", processor="compressor")
    assert debug.event(
        "compression_retry",
        error_message=f"401 for key {SECRETS['openai']}",
        headers={"authorization": f"Bearer {SECRETS['bearer']}"},
    )
    assert leaked(debug.path.read_text()) == [] and stat.S_IMODE(debug.path.stat().st_mode) == 0o600

    # A symlink planted where the next dump would go is not followed.
    outside = tmp_path / "outside.txt"
    outside.write_text("untouched")
    dump = CompressionDump(tmp_path / "planted", clock=lambda: 1.0)
    (tmp_path / "planted").mkdir()
    (tmp_path / "planted" / "1000_p_session.json").symlink_to(outside)
    written = dump.write("p", {"x": SECRETS["aws"]})
    assert outside.read_text() == "untouched"
    # Refused (and logged), or written beside it as a new regular file: never through it.
    assert written is None or (not written.is_symlink() and written.parent == tmp_path / "planted")


def test_provider_errors_echoing_a_key_are_redacted_everywhere(
    server: OpenAIServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    echo = f"Incorrect API key provided: {SECRETS['openai']}. Authorization: Bearer {SECRETS['bearer']}"
    model = OpenAIChatModel(server.base_url)
    debug = DebugLog(tmp_path / "debug")
    executor = CompressionExecutor(model, COUNTER, debug=debug, backoff=(0.0,), transient_retries=1)
    for fault in ("auth", "server_error", "bad_request"):
        server.push_fault(fault, message=echo)
        server.push_fault(fault, message=echo)
        with pytest.raises(ModelCallError) as info:
            executor.execute([UserMessage(content="hi")], max_tokens=10)
        assert leaked(str(info.value)) == [] and leaked(info.value.message) == []
    # Through the coordinator: the failed result's error text.
    key = ConversationKey("t", "c")
    log, store = MemoryMessageLog(), MemoryStateStore()
    log.append(key, secret_conversation())
    store.set_budget(key, 2500)
    coordinator = Coordinator(store, log, COUNTER, lambda _k: model, keep_recent_messages=2)
    stage = coordinator.plan(key)
    assert stage is not None
    server.push_fault("auth", message=echo)
    result = coordinator.run_stage(key, stage)
    assert result.outcome == "failed" and result.error and leaked(result.error) == []
    assert leaked(caplog.text) == [], leaked(caplog.text)
    if debug.path.exists():
        assert leaked(debug.path.read_text()) == []
    assert os.listdir(tmp_path) in ([], ["debug"])
