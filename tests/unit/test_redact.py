"""Secret redaction: every secret kind goes, ordinary text stays, large inputs stay fast."""

from __future__ import annotations

import json
import time

import pytest

from ctxcore.summarize import redact
from ctxcore.summarize.redact import REDACTED, redact_value

PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\n"
    "MIIEowIBAAKCAQEA7bq9mWxR0cH3mV1o6Yq5o0Ykq3bq1o9sSg0mF8tQ2Yb3c4u\n"
    "q1o9sSg0mF8tQ2Yb3c4uMIIEowIBAAKCAQEA7bq9mWxR0cH3mV1o6Yq5o0Ykq3b=\n"
    "-----END RSA PRIVATE KEY-----"
)
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9."
    "eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIn0."
    "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("key: sk-proj-abcdefghijklmnopqrstuvwx1234", "sk-proj-abcdefghijklmnopqrstuvwx1234"),
        ("export OPENAI_API_KEY=sk-abcdefghijklmnop12345678", "sk-abcdefghijklmnop12345678"),
        ("anthropic sk-ant-api03-AbCdEfGhIjKlMnOpQrSt_uvwxyz", "sk-ant-api03-AbCdEfGhIjKlMnOpQrSt_uvwxyz"),
        ("aws id AKIAIOSFODNN7EXAMPLE in config", "AKIAIOSFODNN7EXAMPLE"),
        ("token ghp_" + "a1B2c3D4e5" * 4 + " used", "ghp_" + "a1B2c3D4e5" * 4),
        ("pat github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", "github_pat_11ABCDEFG0123456789"),
        ("slack xoxb-123456789012-abcdefABCDEF here", "xoxb-123456789012-abcdefABCDEF"),
        ("Authorization: Bearer abc.DEF-123_456~789", "abc.DEF-123_456~789"),
        ('headers {"authorization": "bearer zzzzyyyyxxxx1234"}', "zzzzyyyyxxxx1234"),
        ("login with password=hunter2!x and go", "hunter2!x"),
        ('config {"password": "correct horse battery"}', "correct horse battery"),
        ("db_password: 's3cr3t-value'", "s3cr3t-value"),
        ("client_secret=abcDEF123&scope=x", "abcDEF123"),
        (f"pem:\n{PEM}\nafter", "MIIEowIBAAKCAQEA7bq9mWxR0cH3mV1o6Yq5o0Ykq3bq1o9sSg0mF8tQ2Yb3c4u"),
        (f"jwt {JWT} end", JWT),
    ],
)
def test_each_secret_kind_is_redacted(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out
    assert REDACTED in out


def test_context_around_secrets_is_kept() -> None:
    assert redact("Authorization: Bearer abcdefgh12345") == "Authorization: Bearer [REDACTED]"
    assert redact('{"password": "x1"}') == '{"password": "[REDACTED]"}'
    assert redact(f"before\n{PEM}\nafter") == f"before\n{REDACTED}\nafter"


def test_cut_off_private_key_is_still_redacted() -> None:
    truncated = PEM.split("-----END")[0]
    out = redact("log: " + truncated)
    assert "MIIEowIBAAKCAQEA" not in out and out.startswith("log: ")


@pytest.mark.parametrize(
    "text",
    [
        "Fixed the bug in ctxcore/tokens.py; 42 tests pass on 2024-05-01.",
        "The bearer bonds were sold by Alice in May.",
        "Set max_tokens=100 and use the key to success: patience.",
        "skip-list sk-short and ask a task-oriented question",
        "Our pass rate is 97%, the secretary said.",
        "An API key should be rotated every 90 days.",
        "eyJ alone is not a token, nor is AKIA123.",
        "",
    ],
)
def test_ordinary_text_is_untouched(text: str) -> None:
    assert redact(text) == text


def test_redact_value_keeps_json_valid_and_blanks_secret_keys() -> None:
    record = {
        "api_key": "plain-looking-value",
        "messages": [{"content": "use sk-abcdefghijklmnopqrstu please"}],
        "count": 3,
        "nested": {"Authorization": "Bearer abcdefghijk12345"},
    }
    out = redact_value(record)
    json.dumps(out)
    assert out["api_key"] == REDACTED
    assert out["messages"][0]["content"] == f"use {REDACTED} please"
    assert out["count"] == 3
    assert out["nested"]["Authorization"] == REDACTED


def test_large_adversarial_input_is_fast() -> None:
    # Near-misses for every pattern, repeated: a backtracking regex would take seconds.
    chunk = (
        "sk-" + "a" * 10 + " password= " + "-----BEGIN PRIVATE KEY-----" + " bearer " + "eyJ" * 5 + " x" * 10
    )
    text = (chunk * (100_000 // len(chunk) + 1))[:100_000]
    start = time.perf_counter()
    redact(text)
    redact("a" * 100_000)
    redact("password=" + "x" * 100_000)
    assert time.perf_counter() - start < 1.0
