"""A slow summariser for ``bench/turn_latency.py``: a local OpenAI-compatible server in its own
process (no GIL shared with the agent) whose every call takes ``--delay`` seconds and answers
the contract the prompt carries (the compaction stages' JSON blocks) with an extractive
summary (``ExtractiveModel`` over the serialized messages).

    .venv/bin/python bench/slow_summariser.py PORT_FILE --delay 0.5   # what SummariserProcess runs
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from ctxcore.markers import ROUND_LEVEL_MEMORY_BLOCK
from ctxcore.messages import AnyMessage, AssistantMessage, UserMessage
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.summarize.model import ContractBlock, OutputContract
from ctxcore.tokens import TiktokenCounter

_BLOCK = re.compile(r"^\[Block: (.+)\]$")
_TARGET = re.compile(r"^target_summary_tokens: (\d+)$")
_MESSAGE = re.compile(r"^\[([^\]\n]+)\] role=(user|assistant|tool|system)\b.*? \| content=(.*)$")
_XML_MESSAGE = re.compile(r'<message type="(\w+)">(.*?)</message>', re.DOTALL)


def _as_message(role: str, text: str) -> AnyMessage:
    return UserMessage(content=text) if role in ("user", "human") else AssistantMessage(content=text)


def blocks_reply(prompt: str, model: ExtractiveModel) -> str:
    """The JSON blocks answer to a compaction stage's prompt, summarised extractively."""
    blocks: list[tuple[str, int, list[tuple[str, str]]]] = []
    current: tuple[str, int, list[tuple[str, str]]] | None = None
    for line in prompt.splitlines():
        block = _BLOCK.match(line)
        if block:
            current = (block.group(1), 0, [])
            blocks.append(current)
            continue
        if current is None:
            continue
        if line.startswith("[Protected Recent Context]") or line.startswith("[Output Contract]"):
            current = None
            continue
        target = _TARGET.match(line)
        if target and not current[2]:
            current = (current[0], int(target.group(1)), current[2])
            blocks[-1] = current
            continue
        found = _MESSAGE.match(line)
        if found:
            current[2].append((found.group(2), found.group(3)))
        elif current[2]:
            role, text = current[2][-1]
            current[2][-1] = (role, f"{text}\n{line}")
    contract = OutputContract(
        kind="blocks",
        blocks=[
            ContractBlock(
                block_id=bid, target_tokens=max(target, 1), source=[_as_message(r, t) for r, t in msgs]
            )
            for bid, target, msgs in blocks
        ],
    )
    total = sum(max(t, 1) for _, t, _ in blocks) * 2 + 64 * len(blocks) + 64
    return model.complete([UserMessage(content="summarise")], max_tokens=total, contract=contract).text


def transcript_summary(prompt: str, target: int, model: ExtractiveModel) -> str:
    """An extractive summary of the ``<message>`` elements of a LangChain summary prompt."""
    source: list[AnyMessage] = []
    for kind, body in _XML_MESSAGE.findall(prompt):
        text = html.unescape(body)
        if text.startswith("Here is a summary of the conversation to date:"):
            # An earlier summary: mined as one, the way ctxcore's blocks are.
            source.append(UserMessage(content=f"{ROUND_LEVEL_MEMORY_BLOCK}\n{text}"))
        else:
            source.append(_as_message(kind, text))
    contract = OutputContract(
        kind="blocks", blocks=[ContractBlock(block_id="s", target_tokens=target, source=source)]
    )
    reply = model.complete([UserMessage(content="summarise")], max_tokens=target * 2, contract=contract).text
    return str(json.loads(reply)["blocks"][0]["summary"])


def serve_summariser(port_file: str, delay: float) -> None:
    """Subprocess entry: an ``OpenAIServer`` answering compaction prompts extractively."""
    from ctxcore.testing.openai_server import OpenAIServer

    model = ExtractiveModel(TiktokenCounter())

    def responder(request: dict[str, Any]) -> str:
        messages = request.get("messages") or []
        prompt = next(
            (m.get("content") for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "user"),
            "",
        )
        if isinstance(prompt, str) and "[Block: " in prompt:
            return blocks_reply(prompt, model)
        return json.dumps({"blocks": []})

    server = OpenAIServer(delay=delay, responder=responder).start()
    Path(port_file).write_text(str(server.port))
    try:
        while True:
            time.sleep(3600)
    finally:
        server.stop()


class SummariserProcess:
    """The local OpenAI-compatible summariser in its own process (no GIL shared with the agent)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.process: subprocess.Popen[bytes] | None = None
        self.base_url = ""

    def __enter__(self) -> SummariserProcess:
        port_file = f"/tmp/ctxcore-bench-summariser-{uuid.uuid4().hex[:8]}"
        self.process = subprocess.Popen(
            [sys.executable, __file__, port_file, "--delay", str(self.delay)],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if os.path.exists(port_file) and Path(port_file).read_text().strip():
                self.base_url = f"http://127.0.0.1:{Path(port_file).read_text().strip()}/v1"
                os.unlink(port_file)
                return self
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError("the summariser server did not start")

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("port_file", help="where to write the port once serving")
    parser.add_argument("--delay", type=float, default=0.5, help="seconds per call")
    args = parser.parse_args()
    serve_summariser(args.port_file, args.delay)


if __name__ == "__main__":
    main()
