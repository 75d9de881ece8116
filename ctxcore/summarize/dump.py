"""Optional compression dumps (spec 5.3) and JSONL debug records (spec 5.4).

Both are diagnostics: they must never break a compaction, so every I/O error is logged
and swallowed. They may hold conversation text, so every string is redacted, files are
created with mode 0600 (directories 0700), names are sanitised, and nothing is written
outside the configured directory (no ``..``, no following a planted symlink).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ctxcore.messages import AnyMessage, to_openai
from ctxcore.summarize.redact import redact_value

__all__ = ["CompressionDump", "DebugLog", "benefit", "debug_outputs", "dump_record", "safe_name"]

logger = logging.getLogger(__name__)

# Runs of dots go too: ".." is harmless inside a name but alarming in an audit.
_UNSAFE = re.compile(r"(?:[^A-Za-z0-9._-]|\.{2,})+")
_MAX_NAME = 80
# os.O_NOFOLLOW is POSIX only; a platform check (not a probe) lets mypy see both branches.
if sys.platform == "win32":
    _NOFOLLOW = 0
else:
    _NOFOLLOW = os.O_NOFOLLOW


def safe_name(text: str, limit: int = _MAX_NAME) -> str:
    """``text`` as a file-name fragment: unsafe runs become ``-``, no leading dots, <= limit chars."""
    cleaned = _UNSAFE.sub("-", text).strip(".-") or "x"
    return cleaned[:limit]


def _expand(directory: str | os.PathLike[str], session_id: str, context_id: str) -> Path:
    # Ids are sanitised before substitution so a session id like "../../etc" cannot
    # move the directory.
    text = os.fspath(directory)
    text = text.replace("{session_id}", safe_name(session_id or "session"))
    text = text.replace("{context_id}", safe_name(context_id or "context"))
    return Path(text).expanduser().absolute()


def _iso_now(clock: Callable[[], float]) -> str:
    return datetime.fromtimestamp(clock(), UTC).isoformat(timespec="milliseconds")


def _inside(directory: Path, name: str) -> Path | None:
    path = directory / name
    if path.resolve().parent != directory.resolve():
        return None
    return path


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _append(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | _NOFOLLOW, 0o600)
    with os.fdopen(fd, "ab") as handle:
        handle.write(data)


def benefit(tokens_before: int, tokens_after: int) -> dict[str, float | int]:
    """The dump's ``benefit`` section: reduction (never negative) and its ratio (4 dp)."""
    reduction = max(tokens_before - tokens_after, 0)
    ratio = round(reduction / tokens_before, 4) if tokens_before > 0 else 0.0
    return {
        "tokens_before": tokens_before,
        "tokens_after": tokens_after,
        "reduction": reduction,
        "reduction_ratio": ratio,
    }


def dump_record(
    *,
    processor_type: str,
    session_id: str = "",
    context_id: str = "",
    trigger: Mapping[str, Any] | None = None,
    span: Mapping[str, Any] | None = None,
    messages_sent: Sequence[AnyMessage] = (),
    exclude_recent_messages: int = 0,
    system_messages_count: int = 0,
    tools: Sequence[Mapping[str, Any]] = (),
    raw_content: str = "",
    extracted_summary: str = "",
    usage: Mapping[str, Any] | None = None,
    context_after: Sequence[AnyMessage] = (),
    tokens_before: int = 0,
    tokens_after: int = 0,
    clock: Callable[[], float] = time.time,
) -> dict[str, Any]:
    """A spec 5.3 dump record; the prompt is the last message sent to the model."""
    sent = to_openai(messages_sent)
    prompt = sent[-1].get("content", "") if sent else ""
    return {
        "processor_type": processor_type,
        "session_id": session_id,
        "context_id": context_id,
        "trigger": dict(trigger or {}),
        "span": dict(span or {}),
        "compression_request": {
            "prompt": prompt,
            "exclude_recent_messages": exclude_recent_messages,
            "system_messages_count": system_messages_count,
            "tools_count": len(tools),
            "tools": list(tools),
            "messages_sent_to_model": sent,
        },
        "compression_response": {
            "raw_content": raw_content,
            "extracted_summary": extracted_summary,
            "usage": dict(usage or {}),
        },
        "context_after": {"messages": to_openai(context_after), "total_tokens_after": tokens_after},
        "benefit": benefit(tokens_before, tokens_after),
        "timestamp": _iso_now(clock),
    }


class CompressionDump:
    """Writes one redacted JSON file per successful compression under ``directory``.

    ``directory`` may contain ``{session_id}`` and ``{context_id}``. Files are named
    ``{epoch_ms}_{processor_type}_{session}.json`` (sanitised, at most 80 characters).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        session_id: str = "",
        context_id: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = _expand(directory, session_id, context_id)
        self.session_id = session_id
        self.context_id = context_id
        self._clock = clock

    def write(self, processor_type: str, record: Mapping[str, Any]) -> Path | None:
        """Write ``record`` (redacted); the path written, or None when writing failed."""
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            stem = safe_name(f"{int(self._clock() * 1000)}_{processor_type}_{self.session_id or 'session'}")
            stem = stem[: _MAX_NAME - len(".json") - 3]
            data = json.dumps(redact_value(record), ensure_ascii=False, indent=2, default=str).encode()
            for attempt in range(100):
                name = f"{stem}.json" if attempt == 0 else f"{stem}-{attempt}.json"
                path = _inside(self.directory, name)
                if path is None:
                    logger.warning("compression dump: refusing to write outside %s", self.directory)
                    return None
                try:
                    _write_new(path, data)
                except FileExistsError:
                    continue
                return path
            logger.warning("compression dump: no free file name for %s in %s", stem, self.directory)
        except (OSError, TypeError, ValueError) as exc:
            logger.warning("compression dump to %s failed (compression unaffected): %s", self.directory, exc)
        return None


class DebugLog:
    """Appends redacted JSONL debug records to ``{directory}/{processor}.jsonl`` (spec 5.4).

    Each record carries ``timestamp, event, processor, session_id, context_id`` and the
    event's own fields (e.g. ``compression_retry{attempt, error_type, retried, reason}``).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        processor: str = "compressor",
        session_id: str = "",
        context_id: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = _expand(directory, session_id, context_id)
        self.processor = processor
        self.session_id = session_id
        self.context_id = context_id
        self._clock = clock

    @property
    def path(self) -> Path:
        """The JSONL file this log appends to."""
        return self.directory / f"{safe_name(self.processor)}.jsonl"

    def event(self, event: str, **fields: Any) -> bool:
        """Append one record; True when it was written (failures are logged, not raised)."""
        record = {
            "timestamp": _iso_now(self._clock),
            "event": event,
            "processor": self.processor,
            "session_id": self.session_id,
            "context_id": self.context_id,
            **fields,
        }
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            path = _inside(self.directory, self.path.name)
            if path is None:
                logger.warning("debug log: refusing to write outside %s", self.directory)
                return False
            line = json.dumps(redact_value(record), ensure_ascii=False, default=str) + "\n"
            _append(path, line.encode())
        except (OSError, TypeError, ValueError) as exc:
            logger.warning("debug record to %s failed: %s", self.directory, exc)
            return False
        return True


def debug_outputs(
    directory: str | None, processor: str, session_id: str, context_id: str
) -> tuple[CompressionDump | None, DebugLog | None]:
    """What a compressor writes to ``directory`` (None: nothing): a dump per compression
    (spec 5.3) and its JSONL debug records (spec 5.4), both under the one directory, as the
    reference's compressors do with ``enable_compression_dump``."""
    if directory is None:
        return None, None
    return (
        CompressionDump(directory, session_id=session_id, context_id=context_id),
        DebugLog(directory, processor=processor, session_id=session_id, context_id=context_id),
    )
