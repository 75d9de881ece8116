"""llama-cpp-python's OpenAI-compatible server with Gemma 3's own handling of the system
prompt (``python -m workers.local_model_server``, what ``ctxcore model serve`` runs).

llama-cpp-python's ``gemma`` chat format drops system messages (Gemma has no system role),
so the summariser's system prompt (its priorities and "Answer with JSON only") never reached
the model. Gemma 3's own chat template puts it at the head of the first user turn; the
``ctxcore-gemma3`` format registered here does the same, then the server runs as usual.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["GEMMA3_FORMAT", "gemma3_prompt", "main"]

GEMMA3_FORMAT = "ctxcore-gemma3"
_END = "<end_of_turn>"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def gemma3_prompt(messages: Sequence[Mapping[str, Any]]) -> str:
    """The Gemma 3 prompt of an OpenAI chat: system text at the head of the first user turn,
    assistant turns as ``model``, ending with an open ``model`` turn."""
    system = "\n\n".join(_text(m.get("content")) for m in messages if m.get("role") == "system")
    turns: list[str] = []
    for message in messages:
        role = message.get("role")
        if role == "system":
            continue
        text = _text(message.get("content"))
        if system and not turns:
            text = f"{system}\n\n{text}"
        turns.append(f"<start_of_turn>{'model' if role == 'assistant' else 'user'}\n{text}{_END}\n")
    if system and not turns:
        turns.append(f"<start_of_turn>user\n{system}{_END}\n")
    return "".join(turns) + "<start_of_turn>model\n"


def main() -> None:
    """Register the format, then run llama-cpp-python's server with this process's arguments."""
    formats = importlib.import_module("llama_cpp.llama_chat_format")

    def gemma3(messages: list[dict[str, Any]], **_: Any) -> Any:
        return formats.ChatFormatterResponse(prompt=gemma3_prompt(messages), stop=_END)

    formats.register_chat_format(GEMMA3_FORMAT)(gemma3)
    importlib.import_module("llama_cpp.server.__main__").main()


if __name__ == "__main__":
    main()
