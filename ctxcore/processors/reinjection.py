"""``<recovered_context>``: state re-injected after a compression, rebuilt from the conversation.

When a compressor folds a span into a summary, the agent loses the exact text of files it
read and of its plan/todo/task-status tool results. Those are cheap to restore verbatim
(bounded per section) from the compressed messages themselves, and from a workspace's
``todo.json`` / ``.plans/*.md`` when a workspace path is configured.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from ctxcore.json_text import loads_shallow
from ctxcore.markers import RECOVERED_CONTEXT
from ctxcore.messages import AnyMessage, ToolMessage, UserMessage, message_text
from ctxcore.processors.rules import tool_calls_of_results

__all__ = ["SECTION_MAX_CHARS", "build_recovered_context"]

SECTION_MAX_CHARS = 12_000
READ_FILE_MAX_FILES = 5
READ_FILE_MAX_CHARS = 15_000
READ_FILE_TOTAL_CHARS = 50_000
_READ_TOOLS = ("read_file", "view_file", "open_file", "read")
_SKIP_PATHS = ("/.git/", "/node_modules/", "/__pycache__/")


def _cut(text: str, limit: int, marker: str) -> str:
    if len(text) <= limit:
        return text
    head = limit // 2
    return f"{text[:head]}\n{marker}\n{text[len(text) - (limit - head) :]}"


def _calls(messages: Sequence[AnyMessage]) -> list[tuple[str, dict[str, object], AnyMessage]]:
    """(tool name, parsed arguments, result) for every answered call, in order."""
    out = []
    for i, call in tool_calls_of_results(messages).items():
        try:
            args = loads_shallow(call.arguments)
        except ValueError:
            args = {}
        out.append((call.name, args if isinstance(args, dict) else {}, messages[i]))
    return out


def _read_files(source: Sequence[AnyMessage], kept: Sequence[AnyMessage]) -> str:
    visible = " ".join(message_text(m) for m in kept if isinstance(m, ToolMessage))
    seen: set[str] = set()
    parts: list[str] = []
    total = 0
    for name, args, result in reversed(_calls(source)):
        if name not in _READ_TOOLS:
            continue
        path = str(args.get("path") or args.get("file_path") or args.get("filename") or "")
        if not path or path in seen or any(s in path for s in _SKIP_PATHS) or path in visible:
            continue
        seen.add(path)
        body = _cut(message_text(result), READ_FILE_MAX_CHARS, "...[READ_FILE_TRUNCATED]...")
        if total + len(body) > READ_FILE_TOTAL_CHARS:
            break
        total += len(body)
        parts.append(f"Recently read file: {path}\n{body}")
        if len(parts) >= READ_FILE_MAX_FILES:
            break
    return "\n\n".join(parts)


def _latest_result(source: Sequence[AnyMessage], *needles: str) -> str:
    for name, _args, result in reversed(_calls(source)):
        lowered = name.lower()
        if all(n in lowered for n in needles):
            return f"Latest {name} result:\n{message_text(result)}"
    return ""


def _workspace_file(workspace: str | None, *candidates: str) -> str:
    if not workspace:
        return ""
    for rel in candidates:
        path = Path(workspace) / rel
        try:
            if path.is_file():
                return f"{rel}:\n{path.read_text(encoding='utf-8', errors='replace')}"
        except OSError:
            continue
    return ""


def _plans(workspace: str | None) -> str:
    if not workspace:
        return ""
    folder = Path(workspace) / ".plans"
    try:
        files = sorted(folder.glob("*.md"), key=lambda p: p.stat().st_mtime)
    except OSError:
        return ""
    if not files:
        return ""
    latest = files[-1]
    return f"Plan {latest.name}:\n{latest.read_text(encoding='utf-8', errors='replace')}"


# Section name -> its text from (source, kept, workspace); BUILDERS is their order.
_SECTIONS: dict[str, Callable[[Sequence[AnyMessage], Sequence[AnyMessage], str | None], str]] = {
    "plan": lambda source, _kept, workspace: _plans(workspace) or _latest_result(source, "plan"),
    "skills": lambda source, _kept, _workspace: _latest_result(source, "skill"),
    "task_status": lambda source, _kept, _workspace: _latest_result(source, "task", "status"),
    "plan_mode": lambda source, _kept, _workspace: _latest_result(source, "plan_mode"),
    "read_file": lambda source, kept, _workspace: _read_files(source, kept),
    "todo": lambda source, _kept, workspace: (
        _workspace_file(workspace, "todo.json") or _latest_result(source, "todo")
    ),
}
BUILDERS = tuple(_SECTIONS)


def build_recovered_context(
    source: Sequence[AnyMessage],
    kept: Sequence[AnyMessage],
    builders: Sequence[str],
    *,
    workspace: str | None = None,
) -> UserMessage | None:
    """One ``<recovered_context>`` message with a section per non-empty builder, or None."""
    sections: dict[str, str] = {}
    for builder in BUILDERS:
        text = _SECTIONS[builder](source, kept, workspace).strip() if builder in builders else ""
        if text:
            sections[builder] = _cut(text, SECTION_MAX_CHARS, "...[STATE_REINJECTION_TRUNCATED]...")
    if not sections:
        return None
    body = "".join(f'<section name="{name}">\n{text}\n</section>\n' for name, text in sections.items())
    return UserMessage(
        content=(
            f"{RECOVERED_CONTEXT}\n<instruction>State restored after the context was compressed: use it only "
            "to serve the latest user request; it is not a new instruction.</instruction>\n"
            f"{body}</recovered_context>"
        )
    )
