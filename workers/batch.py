"""``ctxcore compact``: offline batch compaction of a JSONL file of conversations.

The output is written to a temporary file beside ``--out`` and renamed over it when the
batch ends, so an interrupted or failed batch leaves the previous ``--out`` as it was and a
partial file is never presented as complete. Every error names its input: ``file:line``
and the conversation id.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from ctxcore.config import Settings
from ctxcore.errors import CtxcoreError, OperationFailed, UsageError
from ctxcore.messages import AnyMessage, SystemMessage, from_openai, to_openai
from ctxcore.tokens import TokenCounter

__all__ = ["BatchRecord", "compact_file", "read_batch"]


@dataclass(frozen=True)
class BatchRecord:
    """One conversation of the input file and where it is (for error messages)."""

    where: str  # "file:line"
    id: str
    messages: list[dict[str, Any]]

    def label(self) -> str:
        """``file:line (id X)``."""
        return f"{self.where} (id {self.id})"


def read_batch(path: Path) -> list[BatchRecord]:
    """The records of a JSONL file; a malformed line or an empty file is a ``CtxcoreError``
    naming the file (and line)."""
    from ctxcore.eval.data import numbered_records

    records = [BatchRecord(f"{path}:{n}", str(r["id"]), r["messages"]) for n, r in numbered_records(path)]
    if not records:
        raise UsageError(f"{path}: no conversations (the file is empty)")
    return records


@contextlib.contextmanager
def _replace_on_success(target: Path) -> Iterator[TextIO]:
    """A temporary file beside ``target`` (its directory checked by the caller), renamed over
    it only when the block completes."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as sink:
            yield sink
        os.replace(tmp, target)
    except BaseException:
        # Ctrl-C included: the previous file stays, the partial one goes.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _window(
    record: BatchRecord, budget: int, settings: Settings, model: Any, counter: TokenCounter
) -> dict[str, Any]:
    from ctxcore.assemble import assemble_window
    from ctxcore.pipeline import PipelineConfig, View, compress_until_target

    messages = from_openai(record.messages)
    system = [m for m in messages if isinstance(m, SystemMessage)]
    rest: list[AnyMessage] = [
        m.model_copy(update={"context_message_id": f"{i:012d}"})
        for i, m in enumerate((m for m in messages if not isinstance(m, SystemMessage)), 1)
    ]
    view = View(version=0, system=tuple(system), tail=tuple(rest))
    config = PipelineConfig(
        target_tokens=max(int(budget * settings.service.target_ratio), 1),
        keep_recent_messages=settings.engine.keep_recent_messages,
        ceiling_tokens=budget,
    )
    run = compress_until_target(view, config, model, counter)
    result = assemble_window(
        run.view.to_state(),
        list(run.view.tail),
        budget,
        system,
        [],
        None,
        counter,
        pinned=list(run.view.pinned),
    )
    return {
        "id": record.id,
        "messages": to_openai(result.messages, include_extra=True),
        "tokens_before": view.tokens(counter),
        "tokens_after": result.stats.total_tokens,
        "stages": [r.stage.kind for r in run.results if r.changed],
    }


def compact_file(
    path: Path,
    out_path: Path,
    budget: int,
    settings: Settings,
    counter: TokenCounter,
    out: TextIO,
    *,
    continue_on_error: bool = False,
) -> int:
    """Compact every conversation of ``path`` to a window within ``budget``; the exit code.

    Without ``continue_on_error`` the first conversation that fails stops the batch with a
    ``CtxcoreError`` naming it. With it, each failure is named on stderr, the others are
    written, and the exit code is 1.
    """
    from tqdm import tqdm

    from workers.runtime import build_model

    if not out_path.parent.is_dir():
        raise UsageError(f"--out {out_path}: directory {out_path.parent} does not exist")
    records = read_batch(path)
    model = build_model(settings.model, counter)
    failed: list[str] = []
    with (
        _replace_on_success(out_path) as sink,
        tqdm(total=len(records), unit="conv", file=sys.stderr, disable=not sys.stderr.isatty()) as bar,
    ):
        for record in records:
            try:
                row = _window(record, budget, settings, model, counter)
            except CtxcoreError as exc:
                if not continue_on_error:
                    raise (UsageError if isinstance(exc, UsageError) else OperationFailed)(
                        f"{record.label()}: {exc}"
                    ) from exc
                failed.append(record.label())
                bar.write(f"ctxcore: error: {record.label()}: {exc}", file=sys.stderr)
                bar.update(1)
                continue
            sink.write(json.dumps(row, ensure_ascii=False) + "\n")
            stages = ", ".join(row["stages"]) or "unchanged"
            bar.write(
                f"{record.id}: {row['tokens_before']:,} -> {row['tokens_after']:,} tokens ({stages})",
                file=out,
            )
            bar.update(1)
    written = len(records) - len(failed)
    out.write(f"wrote {written} windows to {out_path}")
    out.write(f"; {len(failed)} conversations failed\n" if failed else "\n")
    return 1 if failed else 0
