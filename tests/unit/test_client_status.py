"""Clients read a compaction status they do not know as "unknown", never as an error, and the
adapters' ``StatusWatch`` logs when a conversation turns paused or failing."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest

from ctxcore.client import CtxcoreClient, WindowResponse
from ctxcore.client.status import StatusWatch

STATS = dict.fromkeys(
    [
        "total_messages",
        "total_tokens",
        "total_dialogues",
        "system_messages",
        "user_messages",
        "assistant_messages",
        "tool_messages",
        "tools",
        "system_message_tokens",
        "user_message_tokens",
        "assistant_message_tokens",
        "tool_message_tokens",
        "tool_tokens",
    ],
    0,
)


def body(status: str, **detail: Any) -> dict[str, Any]:
    return {
        "messages": [],
        "stats": STATS,
        "state_version": 0,
        "compaction": status,
        "compaction_detail": {"last_error": None, "last_success_at": None, **detail},
        "fallback_applied": False,
    }


@pytest.mark.parametrize("status", ["idle", "queued", "running", "failing", "paused"])
def test_every_published_status_parses(status: str) -> None:
    assert WindowResponse.model_validate(body(status)).compaction == status


def test_an_unknown_status_from_a_newer_server_is_unknown_not_an_error() -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=body("hibernating", extra=1)))
    with CtxcoreClient("http://ctxcore.test", "token", transport=transport) as client:
        window = client.window("c1", 1000)
    assert window.compaction == "unknown"
    assert window.compaction_detail.reason is None and window.compaction_detail.hold is None


def test_the_status_watch_warns_once_per_change_with_the_reason(caplog: pytest.LogCaptureFixture) -> None:
    hold = {
        "reason": "no_progress",
        "at": "2026-12-02T10:00:00+00:00",
        "why": "stages l0_to_l1 ran and saved nothing",
    }
    paused = WindowResponse.model_validate(body("paused", reason="no_progress", hold=hold))
    watch = StatusWatch()
    with caplog.at_level(logging.INFO, logger="ctxcore.client"):
        watch.seen("c1", WindowResponse.model_validate(body("idle")))
        watch.seen("c1", paused)
        watch.seen("c1", paused)
        watch.seen("c1", WindowResponse.model_validate(body("queued")))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "paused (no_progress): stages l0_to_l1 ran and saved nothing" in warnings[0].getMessage()
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.INFO] == [
        "ctxcore compaction of c1 is queued again"
    ]
