"""The proxy's pure parts: alignment of a request with the log, ids, and stream assembly."""

from __future__ import annotations

import json

from ctxcore.messages import from_openai
from workers.proxy.match import (
    Divergence,
    Match,
    canonical_hash,
    match_request,
    new_message_id,
    reply_message_id,
)
from workers.proxy.stream import ReplyAssembler, replay_chunks

IDS = [f"{i:012d}" for i in range(1, 7)]


def test_alignment_prefix_trimming_new_messages_and_divergence() -> None:
    log = list("abcdef")
    assert match_request([], [], list("xy")) == Match(offset=0, new_from=0)
    assert match_request(IDS, log, list("abcdefgh")) == Match(offset=0, new_from=6)  # two new
    assert match_request(IDS, log, list("abcdef")) == Match(offset=0, new_from=6)  # nothing new
    assert match_request(IDS, log, list("defg")) == Match(offset=3, new_from=3)  # trimmed prefix
    assert match_request(IDS, log, list("abc")) == Match(offset=0, new_from=3)  # ends inside
    # The smallest offset wins when several agree.
    assert match_request(IDS[:4], list("abab"), list("ab")) == Match(offset=0, new_from=2)
    # A differing message: the first differing index of the longest agreement and the log id there.
    assert match_request(IDS, log, list("abXdefg")) == Divergence(index=2, log_id=IDS[2])
    assert match_request(IDS, log, list("cdX")) == Divergence(index=2, log_id=IDS[4])
    assert match_request(IDS, log, list("zz")) == Divergence(index=0, log_id=IDS[0])


def test_canonical_form_ignores_extension_keys_and_tool_call_shape() -> None:
    nested = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}],
        "refusal": None,
        "annotations": [],
    }
    flat = {
        "role": "assistant",
        "tool_calls": [{"id": "c1", "name": "bash", "arguments": "{}"}],
        "message_id": "m-1",
        "metadata": {"k": 1},
    }
    a, b = from_openai([nested, flat])
    assert canonical_hash(a) == canonical_hash(b)
    other = from_openai([{"role": "assistant", "content": "x"}])[0]
    assert canonical_hash(other) != canonical_hash(a)


def test_ids_depend_on_conversation_position_and_content() -> None:
    ids = {new_message_id(c, p, h) for c in ("c1", "c2") for p in (0, 1) for h in ("h1", "h2")}
    assert len(ids) == 8 and new_message_id("c1", 0, "h1") == new_message_id("c1", 0, "h1")
    assert reply_message_id("c1", 2, ["h1", "h2"]) != reply_message_id("c1", 2, ["h1", "h3"])


def test_assembler_joins_split_events_and_tool_call_deltas() -> None:
    message = {
        "role": "assistant",
        "content": "Looking.",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
        ],
    }
    stream = b"".join(replay_chunks(message, "m", "r1", include_usage=True))
    assembler = ReplyAssembler()
    done = [assembler.feed(stream[i : i + 7]) for i in range(0, len(stream), 7)]  # events straddle chunks
    assert any(done) and assembler.complete and assembler.finish_reason == "tool_calls"
    assert assembler.message() == message
    cut = ReplyAssembler()
    cut.feed(stream[: len(stream) // 2])
    assert not cut.complete
    failed = ReplyAssembler()
    failed.feed(b'data: {"error": {"message": "boom"}}\n\ndata: [DONE]\n\n')
    assert failed.done and not failed.complete
    assert json.loads(stream.split(b"\n\n")[0][6:])["choices"][0]["delta"]["role"] == "assistant"
