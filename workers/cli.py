"""The ``ctxcore`` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

from ctxcore.config import Settings
from ctxcore.errors import CtxcoreError
from ctxcore.messages import from_openai
from ctxcore.tokens import TiktokenCounter
from ctxcore.window import check_window


def bundled_sample() -> Path:
    """Path of the bundled sample conversations."""
    return Path(str(resources.files("ctxcore").joinpath("samples", "agent_runs.jsonl")))


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    records = []
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CtxcoreError(f"{path}:{n}: not valid JSON ({exc.msg})") from exc
            if isinstance(record, list):
                record = {"id": f"line-{n}", "messages": record}
            if not isinstance(record, dict) or "messages" not in record:
                raise CtxcoreError(f"{path}:{n}: expected an object with 'messages' or a list of messages")
            records.append(record)
    return records


def cmd_count(args: argparse.Namespace, out: TextIO) -> int:
    """Print token counts per conversation of a JSONL file."""
    path = Path(args.file) if args.file else bundled_sample()
    counter = TiktokenCounter(args.model)
    rows = []
    for record in _read_jsonl(path):
        messages = from_openai(record["messages"])
        rows.append(
            {
                "id": str(record.get("id", "?")),
                "messages": len(messages),
                "tokens": counter.count_messages(messages),
                "violations": len(check_window(messages)),
            }
        )
    if args.json:
        json.dump(rows, out, indent=2)
        out.write("\n")
        return 0
    width = max([len(r["id"]) for r in rows] + [12])
    out.write(f"{'conversation':<{width}}  {'messages':>8}  {'tokens':>8}  {'violations':>10}\n")
    for r in rows:
        out.write(f"{r['id']:<{width}}  {r['messages']:>8}  {r['tokens']:>8}  {r['violations']:>10}\n")
    total = sum(r["tokens"] for r in rows)
    out.write(f"{'total':<{width}}  {sum(r['messages'] for r in rows):>8}  {total:>8}\n")
    out.write(f"encoding: {counter.encoding_name} ({path})\n")
    return 0


def _settings(args: argparse.Namespace) -> Settings:
    # The CLI is one of the two places that read the environment (DESIGN: config).
    return Settings.from_env(config_file=getattr(args, "config", None))


def cmd_demo(args: argparse.Namespace, out: TextIO) -> int:
    """Replay the bundled runs through the distributed service on an embedded default."""
    from workers.demo import run_demo

    return run_demo(
        _settings(args), str(bundled_sample()), out, interactive=out.isatty(), timeout=args.timeout
    )


def cmd_worker(args: argparse.Namespace, out: TextIO) -> int:
    """Start a Celery worker consuming continuation stages first, then new jobs."""
    from workers.app import app, configure, queue_names

    settings = _settings(args)
    configure(settings)
    queues = ",".join(queue_names(settings).consume_order())
    argv = ["worker", "-Q", queues, "--loglevel", args.loglevel, "-E"]
    argv += ["--concurrency", str(args.concurrency or settings.worker.concurrency)]
    if args.hostname:
        argv += ["--hostname", args.hostname]
    app.worker_main(argv)
    return 0


def cmd_flower(args: argparse.Namespace, out: TextIO) -> int:
    """Start Flower on this deployment's broker, queues and event exchange (its options after ``--``)."""
    from workers.app import app, configure

    configure(_settings(args))
    flower_args = [a for a in args.flower_args if a != "--"]
    return int(app.start(["flower", *flower_args]) or 0)


def cmd_serve(args: argparse.Namespace, out: TextIO) -> int:
    """Serve the HTTP API with uvicorn (``--host``/``--port`` override ``http.host``/``http.port``)."""
    from workers.http import serve

    settings = _settings(args)
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if overrides:
        settings = settings.model_copy(update={"http": settings.http.model_copy(update=overrides)})
    serve(settings)
    return 0


def cmd_compact(args: argparse.Namespace, out: TextIO) -> int:
    """Offline batch: compact each conversation of a JSONL file to a window within the budget."""
    from ctxcore.assemble import assemble_window
    from ctxcore.messages import SystemMessage, to_openai
    from ctxcore.pipeline import PipelineConfig, View, compress_until_target
    from workers.runtime import build_model

    settings = _settings(args)
    counter = TiktokenCounter(args.model)
    model = build_model(settings.model, counter)
    records = _read_jsonl(Path(args.file))
    show_bar = out.isatty()
    written = 0
    with open(args.out, "w", encoding="utf-8") as sink:
        for n, record in enumerate(records, 1):
            messages = from_openai(record["messages"])
            system = [m for m in messages if isinstance(m, SystemMessage)]
            rest = [
                m.model_copy(update={"context_message_id": f"{i:012d}"})
                for i, m in enumerate((m for m in messages if not isinstance(m, SystemMessage)), 1)
            ]
            view = View(version=0, system=tuple(system), tail=tuple(rest))
            target = max(int(args.budget * settings.service.target_ratio), 1)
            config = PipelineConfig(
                target_tokens=target, keep_recent_messages=settings.engine.keep_recent_messages
            )
            run = compress_until_target(view, config, model, counter)
            state = run.view.to_state()
            result = assemble_window(
                state,
                list(run.view.tail),
                args.budget,
                system,
                [],
                None,
                counter,
                pinned=list(run.view.pinned),
            )
            row = {
                "id": record.get("id", n),
                "messages": to_openai(result.messages, include_extra=True),
                "tokens_before": view.tokens(counter),
                "tokens_after": result.stats.total_tokens,
                "stages": [r.stage.kind for r in run.results if r.changed],
            }
            sink.write(json.dumps(row, ensure_ascii=False) + "\n")
            written += 1
            line = f"{row['id']}: {row['tokens_before']:,} -> {row['tokens_after']:,} tokens ({', '.join(row['stages']) or 'unchanged'})"
            out.write((f"\r[{n}/{len(records)}] " if show_bar else "") + line + "\n")
    out.write(f"wrote {written} windows to {args.out}\n")
    return 0


# ``ctxcore.eval.POLICIES`` by name: importing the harness for every command would cost ~0.7 s.
EVAL_POLICIES = ("truncate", "rules", "current_round", "dialogue", "round_level", "full")


def cmd_eval(args: argparse.Namespace, out: TextIO) -> int:
    """Replay conversations through a context policy and score every window (``ctxcore.eval``)."""
    from ctxcore.eval import EvalConfig, evaluate_file
    from ctxcore.eval.report import format_report, plot_report

    config = EvalConfig(
        policy=args.policy,
        budget=args.budget,
        budget_ratio=args.budget_ratio,
        limit=args.limit,
        ids=args.ids.split(",") if args.ids else None,
        step_stride=args.step_stride,
        counter=TiktokenCounter(args.model),
    )

    def progress(result: Any) -> None:
        print(f"{result.id}: {result.elapsed_seconds:.1f}s", file=sys.stderr, flush=True)

    report = evaluate_file(args.file, config, progress=progress if args.progress else None)
    out.write(format_report(report, per_conversation=not args.quiet))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=1, ensure_ascii=False)
            fh.write("\n")
        out.write(f"wrote {args.json}\n")
    if args.plot:
        plot_report(report, args.plot)
        out.write(f"wrote {args.plot}\n")
    return 0


def cmd_inspect(args: argparse.Namespace, out: TextIO) -> int:
    """Print a conversation's compaction state (and history)."""
    from ctxcore.state import ConversationKey
    from workers.runtime import Runtime

    rt = Runtime(_settings(args))
    key = ConversationKey(args.tenant, args.conversation)
    state = rt.state_store.load(key)
    doc: dict[str, Any] = {
        "conversation": str(key),
        "last_log_id": rt.log.last_id(key),
        "budget": rt.state_store.get_budget(key),
        "compaction_detail": rt.failures.detail(key).as_dict(),
        "state": state.model_dump(mode="json") if state else None,
    }
    if args.history:
        doc["history"] = [s.model_dump(mode="json") for s in rt.state_store.history(key, 20)]
    json.dump(doc, out, indent=2, ensure_ascii=False)
    out.write("\n")
    return 0


def cmd_rollback(args: argparse.Namespace, out: TextIO) -> int:
    """Make an earlier kept version of the state current again (as a new version)."""
    from ctxcore.state import ConversationKey
    from workers.runtime import Runtime

    rt = Runtime(_settings(args))
    key = ConversationKey(args.tenant, args.conversation)
    state = rt.state_store.load(key)
    if state is None:
        out.write(f"{key}: no saved state\n")
        return 2
    if not rt.state_store.rollback(key, args.version, expected_version=state.version):
        out.write(
            f"{key}: rollback to version {args.version} failed (unknown version or a concurrent save)\n"
        )
        return 1
    out.write(f"{key}: version {args.version} restored as version {state.version + 1}\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="ctxcore", description="A context engine for LLM agents.")
    sub = parser.add_subparsers(dest="command", required=True)
    count = sub.add_parser("count", help="token counts of conversations in a JSONL file")
    count.add_argument("file", nargs="?", help="JSONL of {'messages': [...]} (default: the bundled sample)")
    count.add_argument("--model", default=None, help="model name picking the tokenizer (default cl100k_base)")
    count.add_argument("--json", action="store_true", help="print JSON instead of a table")
    count.set_defaults(func=cmd_count)

    def with_config(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--config", help="TOML settings file (default: $CTXCORE_CONFIG_FILE)")
        return p

    demo = with_config(sub.add_parser("demo", help="run the distributed service on the bundled samples"))
    demo.add_argument("--timeout", type=float, default=100.0, help="seconds before the demo wraps up")
    demo.set_defaults(func=cmd_demo)

    worker = with_config(sub.add_parser("worker", help="start a Celery compaction worker"))
    worker.add_argument("--concurrency", type=int, default=None)
    worker.add_argument("--loglevel", default="INFO")
    worker.add_argument(
        "--hostname",
        default=None,
        help="node name shown in Flower, e.g. worker1@%%h (default: Celery's celery@<host>)",
    )
    worker.set_defaults(func=cmd_worker)

    flower = with_config(
        sub.add_parser(
            "flower",
            help="monitor the workers with Flower (options after --, e.g. -- --port=5555)",
            description="Flower on the configured Redis and key prefix; Flower's own options "
            "follow '--' (default port 5555).",
        )
    )
    flower.add_argument("flower_args", nargs=argparse.REMAINDER, help="Flower options (default: none)")
    flower.set_defaults(func=cmd_flower)

    serve = with_config(sub.add_parser("serve", help="serve the HTTP API"))
    serve.add_argument("--host", default=None)
    serve.add_argument("--port", type=int, default=None)
    serve.set_defaults(func=cmd_serve)

    compact = with_config(sub.add_parser("compact", help="offline batch compaction of a JSONL file"))
    compact.add_argument("file", help="JSONL of {'id', 'messages': [...]}")
    compact.add_argument("--out", required=True, help="where to write the compacted windows (JSONL)")
    compact.add_argument("--budget", type=int, required=True, help="token budget of each window")
    compact.add_argument("--model", default=None, help="model name picking the tokenizer")
    compact.set_defaults(func=cmd_compact)

    ev = sub.add_parser("eval", help="replay conversations through a policy and score its windows")
    ev.add_argument("file", help="JSONL of {'id', 'messages': [...], 'qa'?: [...]}")
    ev.add_argument("--policy", required=True, choices=EVAL_POLICIES)
    size = ev.add_mutually_exclusive_group(required=True)
    size.add_argument("--budget", type=int, help="token budget of every window")
    size.add_argument("--budget-ratio", type=float, help="budget as a share of each conversation's tokens")
    ev.add_argument("--json", help="write the full JSON report here")
    ev.add_argument("--plot", help="write a PNG plot here (needs matplotlib)")
    ev.add_argument("--limit", type=int, default=None, help="only the first K conversations")
    ev.add_argument("--ids", default=None, help="only these conversation ids (comma-separated)")
    ev.add_argument(
        "--step-stride", type=int, default=1, help="a window every N steps without a user message (default 1)"
    )
    ev.add_argument("--model", default=None, help="model name picking the tokenizer")
    ev.add_argument("--quiet", action="store_true", help="print the overall row only")
    ev.add_argument("--progress", action="store_true", help="print each conversation's time to stderr")
    ev.set_defaults(func=cmd_eval)

    inspect = with_config(sub.add_parser("inspect", help="show a conversation's compaction state"))
    inspect.add_argument("tenant")
    inspect.add_argument("conversation")
    inspect.add_argument("--history", action="store_true")
    inspect.set_defaults(func=cmd_inspect)

    rollback = with_config(sub.add_parser("rollback", help="restore an earlier state version"))
    rollback.add_argument("tenant")
    rollback.add_argument("conversation")
    rollback.add_argument("version", type=int)
    rollback.set_defaults(func=cmd_rollback)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ctxcore`` console script."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args, sys.stdout))
    except (CtxcoreError, OSError) as exc:
        print(f"ctxcore: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
