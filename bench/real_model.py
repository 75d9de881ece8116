"""Benchmark: a real language model as the summariser, beside the extractive one.

The bundled Gemma 3 270M (the ``local-model`` extra) is served by llama-cpp-python on a free
loopback port (``workers.local_model.serving``, as ``ctxcore model serve`` does), and a few
development runs (``bench/dev_split.json``, half A, from the start; each cut to its first
``--slice`` tokens at a step boundary) are replayed through ``full`` as ``ctxcore eval``
does, once with ``ExtractiveModel`` and once with ``OpenAIChatModel`` on that server behind
the executor's retry policy (transient kinds retried once), on the same slices. Per
summariser it prints the calls and their attempts, failures and retries by kind, the replies
that did not parse into the requested blocks (and those repeating the prompt), output tokens
against the ``max_tokens`` sent, latency per call, and the windows' next-step references
held, with windows over budget, invalid windows, and summaries saved that repeat the prompt.
It asserts nothing: a 270M model is expected to summarise worse; the point is that the path
holds. The server runs on one thread (``--threads``) so the machine keeps a core.

    .venv/bin/python bench/real_model.py                     # 2 runs, 6k budget, 8k slices
    .venv/bin/python bench/real_model.py --runs 3 --slice 12000 --json out.json

Data: ``CTXCORE_DATA_DIR`` (default ``../shared/data``). Slow: ~2 minutes per model call on
one busy core.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ctxcore.config import Settings
from ctxcore.eval import EvalConfig, evaluate_file
from ctxcore.messages import AnyMessage, from_openai
from ctxcore.processors.llm_support import ExecutorClient
from ctxcore.summarize import ExtractiveModel, ModelCallError
from ctxcore.summarize.blocks import parse_blocks
from ctxcore.summarize.executor import CompressionExecutor
from ctxcore.summarize.model import Completion, ModelClient, OutputContract, Usage
from ctxcore.summarize.openai_chat import OpenAIChatModel
from ctxcore.tokens import TiktokenCounter

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from workers.local_model import MODEL_ALIAS, serving  # noqa: E402

HERE = Path(__file__).resolve().parent
DEFAULT_DATA = Path(os.environ.get("CTXCORE_DATA_DIR", HERE.parents[1] / "shared" / "data"))


class Recording:
    """A ``ModelClient`` recording each attempt: latency, ``max_tokens`` asked, output tokens,
    the error kind of a failed one, and whether a reply parsed into the requested blocks."""

    def __init__(self, inner: ModelClient, cap: int | None = None) -> None:
        self.inner = inner
        # model.max_tokens: the client sends the smaller of it and what the pipeline asks.
        self.cap = cap
        self.attempts: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.inner.name

    def complete(
        self, messages: Sequence[AnyMessage], *, max_tokens: int, contract: OutputContract | None = None
    ) -> Completion:
        started = time.perf_counter()
        sent = max_tokens if self.cap is None else min(max_tokens, self.cap)
        record: dict[str, Any] = {"max_tokens": sent, "requested": max_tokens}
        try:
            completion = self.inner.complete(messages, max_tokens=max_tokens, contract=contract)
        except ModelCallError as exc:
            record.update(seconds=time.perf_counter() - started, error=str(exc.kind))
            with self._lock:
                self.attempts.append(record)
            print(json.dumps({"attempt": record}), file=sys.stderr, flush=True)
            raise
        record.update(
            seconds=time.perf_counter() - started,
            input_tokens=completion.usage.input_tokens,
            output_tokens=completion.usage.output_tokens,
            finish_reason=completion.finish_reason,
        )
        if contract is not None and contract.kind == "blocks":
            parsed = parse_blocks(completion.text)
            wanted = set(contract.block_ids)
            record["parse"] = "ok" if wanted <= set(parsed) else ("partial" if parsed else "none")
            if record["parse"] == "none" and any(m in completion.text for m in _PROMPT_LINES):
                record["parse"] = "prompt_repeated"
        with self._lock:
            self.attempts.append(record)
        # Each attempt as it lands: a replay that is stopped early still leaves its figures.
        print(json.dumps({"attempt": record}), file=sys.stderr, flush=True)
        return completion


# Lines of the pipeline's task prompt: a reply holding one repeats the prompt.
_PROMPT_LINES = ("[Compression Task]", "[Selected Targets]", "[Output Contract]")


class Counted:
    """A ``ModelClient`` counting the calls the pipeline made (each may be several attempts)."""

    def __init__(self, inner: ModelClient) -> None:
        self.inner = inner
        self.calls = 0

    @property
    def name(self) -> str:
        return self.inner.name

    def complete(
        self, messages: Sequence[AnyMessage], *, max_tokens: int, contract: OutputContract | None = None
    ) -> Completion:
        self.calls += 1
        return self.inner.complete(messages, max_tokens=max_tokens, contract=contract)


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)] if ordered else 0.0


def call_figures(attempts: Sequence[dict[str, Any]], calls: int) -> dict[str, Any]:
    """Attempts, errors by kind, parse outcomes, output against ``max_tokens``, latency."""
    ok = [a for a in attempts if "error" not in a]
    ratios = [a["output_tokens"] / a["max_tokens"] for a in ok if a["max_tokens"]]
    per_token = [a["seconds"] / a["output_tokens"] for a in ok if a.get("output_tokens")]
    return {
        "calls": calls,
        "attempts": len(attempts),
        "retries": len(attempts) - calls,
        "errors_by_kind": dict(Counter(a["error"] for a in attempts if "error" in a)),
        "parse": dict(Counter(a.get("parse", "-") for a in ok)),
        "finish_length": sum(1 for a in ok if a.get("finish_reason") == "length"),
        "cut_at_max_tokens": sum(1 for a in ok if a["output_tokens"] >= a["max_tokens"]),
        "output_over_requested_median": round(statistics.median(ratios), 3) if ratios else None,
        "requested_median": statistics.median([a["requested"] for a in attempts]) if attempts else None,
        "max_tokens_median": statistics.median([a["max_tokens"] for a in attempts]) if attempts else None,
        "output_tokens_median": statistics.median([a["output_tokens"] for a in ok]) if ok else None,
        "seconds_median": round(statistics.median([a["seconds"] for a in ok]), 2) if ok else None,
        "seconds_p90": round(_pct([a["seconds"] for a in ok], 0.9), 2) if ok else None,
        "seconds_max": round(max((a["seconds"] for a in attempts), default=0.0), 2),
        "seconds_per_output_token_median": round(statistics.median(per_token), 3) if per_token else None,
    }


def window_figures(report: dict[str, Any]) -> dict[str, Any]:
    """``full``'s next-step references and validity from an eval report."""
    rep = next(r for r in report.get("reports", [report]) if r["policy"] == "full")
    overall = rep["overall"]
    refs = overall.get("references") or {}
    return {
        "refs": refs.get("overall"),
        "recent": refs.get("recent"),
        "stale": refs.get("stale"),
        "windows": overall.get("windows"),
        "over_budget_windows": overall.get("over_budget_windows"),
        "violations": overall.get("violations"),
        "stage_failures": overall.get("stage_failures"),
        "failure_kinds": overall.get("failure_kinds"),
        "stages": overall.get("stages"),
    }


def sliced(path: Path, ids: list[str], tokens: int, out: Path) -> Path:
    """``ids``' records of ``path`` cut to their first ``tokens`` tokens, at a step boundary
    (before an assistant message), written to ``out``."""
    counter = TiktokenCounter()
    wanted = set(ids)
    with path.open() as src, out.open("w") as dst:
        for line in src:
            record = json.loads(line)
            if record["id"] not in wanted:
                continue
            kept: list[dict[str, Any]] = []
            used = 0
            for raw in record["messages"]:
                if raw.get("role") == "assistant" and used > tokens:
                    break
                used += counter.count_messages(from_openai([raw]))
                kept.append(raw)
            dst.write(json.dumps({**record, "messages": kept}) + "\n")
    return out


def prompt_echoes_served(windows: Path) -> int:
    """Served summary messages that hold a line of the task prompt (a repeated prompt saved)."""
    found = 0
    for line in windows.read_text().splitlines():
        for message in json.loads(line).get("messages", []):
            text = json.dumps(message.get("content"))
            found += int("memory_block" in text and any(m in text for m in _PROMPT_LINES))
    return found


def replay(path: Path, ids: list[str], budget: int, settings: Settings, model: ModelClient) -> dict[str, Any]:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        windows = Path(tmp) / "windows.jsonl"
        config = EvalConfig(
            policies=["full"],
            budget=budget,
            ids=ids,
            baseline=None,
            settings=settings,
            model=model,
            windows_out=windows,
        )
        report = evaluate_file(path, config)
        echoes = prompt_echoes_served(windows) if windows.exists() else None
    return {
        "seconds": round(time.perf_counter() - started, 1),
        **window_figures(report),
        "served_summaries_repeating_the_prompt": echoes,
    }


class PromptRepeater:
    """A stand-in for what the 270M model wrote: the task prompt back, cut at ``max_tokens``
    (~4 characters a token). Offline and instant, so whole runs can be replayed to see what
    the windows hold when every summary is unusable."""

    name = "prompt-repeater"

    def complete(
        self, messages: Sequence[AnyMessage], *, max_tokens: int, contract: OutputContract | None = None
    ) -> Completion:
        text = str(messages[-1].content)[: max_tokens * 4]
        return Completion(text, Usage(0, max_tokens, max_tokens, model=self.name), "length")


def endpoint_settings(url: str, args: argparse.Namespace) -> Settings:
    """The summariser settings of the local model's replay (at ``url``)."""
    return Settings.load(
        {
            "model": {
                "base_url": url,
                "name": MODEL_ALIAS,
                "context_window_tokens": args.context,
                "max_tokens": args.max_tokens,
                "timeout": args.timeout,
                "timeout_per_output_token": args.per_token,
            }
        }
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2, help="development runs of half A, from the start")
    parser.add_argument("--slice", type=int, default=8000, help="tokens of each run replayed (0: whole)")
    parser.add_argument(
        "--offline-only",
        action="store_true",
        help="the extractive model and the prompt-repeating stand-in only",
    )
    parser.add_argument("--budget", type=int, default=6000)
    parser.add_argument(
        "--context", type=int, default=2048, help="model.context_window_tokens (the server gets twice it)"
    )
    parser.add_argument("--max-tokens", type=int, default=256, help="model.max_tokens")
    parser.add_argument("--timeout", type=float, default=90, help="model.timeout (the prompt's evaluation)")
    parser.add_argument("--per-token", type=float, default=0.2, help="model.timeout_per_output_token")
    parser.add_argument("--threads", type=int, default=1, help="the server's CPU threads")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    swe = args.data / "minisweagent_dev.jsonl"
    if not swe.exists():
        raise SystemExit(f"no data in {args.data} (set CTXCORE_DATA_DIR)")
    ids = json.loads((HERE / "dev_split.json").read_text())["A"][: args.runs]
    counter = TiktokenCounter()
    results: dict[str, Any] = {
        "runs": ids,
        "slice": args.slice,
        "budget": args.budget,
        "context": args.context,
        "max_tokens": args.max_tokens,
    }
    with tempfile.TemporaryDirectory() as tmp:
        data = sliced(swe, ids, args.slice or 10**12, Path(tmp) / "slices.jsonl")
        extractive = Recording(ExtractiveModel(counter))
        calls = Counted(ExecutorClient(CompressionExecutor(extractive, counter, transient_retries=1)))
        # The offline summariser as ctxcore eval runs it: no context limit, no output cap.
        results["extractive"] = replay(data, ids, args.budget, Settings.load({}), calls)
        results["extractive"].update(call_figures(extractive.attempts, calls.calls))
        print(json.dumps({"extractive": results["extractive"]}), flush=True)
        # Not contacted: the stand-in answers; the URL only makes the settings an endpoint's.
        offline_endpoint = endpoint_settings("http://127.0.0.1:9/v1", args)
        repeater = Recording(PromptRepeater(), args.max_tokens)
        calls = Counted(ExecutorClient(CompressionExecutor(repeater, counter, transient_retries=1)))
        results["prompt-repeater"] = replay(data, ids, args.budget, offline_endpoint, calls)
        results["prompt-repeater"].update(call_figures(repeater.attempts, calls.calls))
        print(json.dumps({"prompt-repeater": results["prompt-repeater"]}), flush=True)
        if args.offline_only:
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=1))
            return

        with serving(_free_port(), 2 * args.context, Path(tmp) / "server.log", threads=args.threads) as url:
            settings = endpoint_settings(url, args)
            cfg = settings.model
            client = OpenAIChatModel(
                url,
                model=MODEL_ALIAS,
                timeout=cfg.timeout,
                timeout_per_output_token=cfg.timeout_per_output_token,
                max_tokens=cfg.max_tokens,
            )
            real = Recording(client, cfg.max_tokens)
            calls = Counted(
                ExecutorClient(CompressionExecutor(real, counter, transient_retries=1, backoff=(0.5,)))
            )
            results["gemma-3-270m"] = replay(data, ids, args.budget, settings, calls)
            results["gemma-3-270m"].update(call_figures(real.attempts, calls.calls))
    print(json.dumps({"gemma-3-270m": results["gemma-3-270m"]}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
