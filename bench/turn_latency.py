"""Benchmark: per-turn time to obtain the window when the summariser is slow.

A simulated agent replays LoCoMo conversations (concatenated in file order until it has
``--turns`` real user turns; each conversation's first session date line is prefixed to its
first message, as the data does for the other sessions) against a token budget. Per turn it
appends the user message, obtains the window (timed), "calls its own model" (sleeps
``--agent-delay``, default half the summariser's delay: an agent's own call per turn is of
the same kind as a summary call) and appends the reply. A faster agent leaves the
background workers behind: see ``--agent-delay 0.1`` in bench/README.md. The summariser is a local OpenAI-compatible server
in a subprocess whose every call takes ``--delay`` seconds (``OpenAIServer``); it answers the
contract the prompt carries (the compaction stages' JSON blocks) with an extractive summary
(``ExtractiveModel`` over the serialized messages), so the three systems summarise alike and
their answer recall can be compared.

* ``ctxcore-bg``: ctxcore with background workers: a real Celery worker (in-process, thread
  pool, concurrency 2; ``--worker process`` runs a ``celery -A workers.app worker`` subprocess
  instead, named ``ctxcore-bg-proc``) on the local Redis (db 12 by default, a unique key prefix, removed
  afterwards; an embedded redis-server is started when none answers); windows from
  ``ContextService.get_window``, which never calls the model (over the trigger it enqueues
  a compaction; when the workers are behind, the fast-path fallback shapes the window);
* ``ctxcore-inline``: the same compressors inline: when the view is over the trigger the
  stages run synchronously through a ``Coordinator`` before the window is served (the
  ``full`` policy of ``ctxcore eval``, summariser behind the same server);
* ``langchain``: LangChain's ``SummarizationMiddleware.before_model`` with a fake chat model
  of the same delay and the same extractive summary, trigger 0.9 and keep 0.4 of the budget
  (its summary gets 0.35): skipped with the reason when ``langchain`` is not installed
  (a bench-only dependency: ``pip install langchain``).

Prints p50/p95/p99/max per system, the ratios to ctxcore-bg, how often ctxcore's fallback
fired, the summariser calls, and answer recall / substring hit rate of the last window
(LoCoMo questions whose evidence was replayed), so no system wins latency by dropping
everything. ``--plot`` writes the latency distributions (needs matplotlib). Asserts nothing.

    .venv/bin/python bench/turn_latency.py                # quick: 200 turns, 0.5 s per summary
    .venv/bin/python bench/turn_latency.py --long         # 1,000 turns, 2 s per summary
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.locomo_agent import Result, Script, build_script, percentile, replay  # noqa: E402
from bench.slow_summariser import SummariserProcess, transcript_summary  # noqa: E402
from ctxcore.eval.policies import CountingModel, PolicySetup, make_policy  # noqa: E402
from ctxcore.messages import AnyMessage, AssistantMessage, SystemMessage, UserMessage, message_text  # noqa: E402
from ctxcore.summarize.extractive import ExtractiveModel  # noqa: E402
from ctxcore.summarize.openai_chat import OpenAIChatModel  # noqa: E402
from ctxcore.tokens import TiktokenCounter  # noqa: E402
from ctxcore.turns import DEFAULT_DETECTOR  # noqa: E402

DEFAULT_DATA = Path(
    os.environ.get("CTXCORE_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data")
)
SYSTEM = SystemMessage(content="You are chatting with a friend. Reply in their conversation's style.")


def run_background(
    script: Script, args: argparse.Namespace, base_url: str, counter: TiktokenCounter
) -> Result:
    """ctxcore with a real in-process Celery worker on Redis; windows from the fast path."""
    import redis
    from celery.contrib.testing.worker import start_worker

    from ctxcore.config import Settings
    from ctxcore.state import ConversationKey
    from workers.app import app, configure, queue_names, runtime
    from workers.embedded import ensure_redis
    from workers.keyspace import delete_prefixed_keys
    from workers.runtime import build_service
    from workers.tasks import CeleryQueue

    server = ensure_redis(args.redis_url)
    url = server.url if server.started else args.redis_url
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    settings = Settings.load(
        {
            "redis": {"url": url, "key_prefix": prefix},
            "model": {"base_url": base_url, "name": "bench-summariser", "timeout": 60},
            "worker": {"retry_delays": [0.2, 0.5]},
        }
    )
    configure(settings)
    result = Result("ctxcore-bg" if args.worker == "thread" else "ctxcore-bg-proc")
    key = ConversationKey("bench", "turn-latency")
    try:
        with _worker(
            args.worker, app, url, prefix, base_url, queue_names(settings).consume_order(), start_worker
        ):
            rt = runtime()
            service = build_service(rt, CeleryQueue())

            def window() -> tuple[list[AnyMessage], bool]:
                served = service.get_window(key, args.budget, [SYSTEM])
                return served.messages, served.fallback_applied

            replay(
                script,
                args.agent_delay,
                lambda msgs: service.append(key, msgs),
                window,
                result,
                counter,
                args.budget,
            )
            result.summariser_calls = int(rt.usage.of(key.tenant_id).get("calls", 0))
            deadline = time.monotonic() + 120
            while rt.scheduler.status(key) != "idle" and time.monotonic() < deadline:
                time.sleep(0.1)
            state = rt.state_store.load(key)
            result.note = f"state v{state.version if state else 0} at the end"
    finally:
        # Every key of the run, Celery's included (global_keyprefix), carries its prefix:
        # exactly those are deleted.
        client = redis.Redis.from_url(url)
        delete_prefixed_keys(client, prefix)
        client.close()
        server.stop()
    return result


@contextlib.contextmanager
def _worker(
    kind: str, app: Any, url: str, prefix: str, base_url: str, queues: list[str], start_worker: Any
) -> Iterator[None]:
    """The Celery worker: threads in this process, or a ``celery -A workers.app worker``
    subprocess (as deployed: the agent's process does not share its interpreter lock)."""
    if kind == "thread":
        with start_worker(
            app, pool="threads", concurrency=2, perform_ping_check=False, queues=queues, shutdown_timeout=60
        ):
            yield
        return
    env = {
        **os.environ,
        "CTXCORE_REDIS__URL": url,
        "CTXCORE_REDIS__KEY_PREFIX": prefix,
        "CTXCORE_MODEL__BASE_URL": base_url,
        "CTXCORE_MODEL__NAME": "bench-summariser",
        "CTXCORE_WORKER__RETRY_DELAYS": "[0.2, 0.5]",
    }
    name = f"tl-{prefix}"
    command = [sys.executable, "-m", "celery", "-A", "workers.app", "worker", "--pool", "threads", "-c", "2"]
    command += ["-Q", ",".join(queues), "-n", f"{name}@%h", "--loglevel", "WARNING"]
    command += ["--without-gossip", "--without-mingle"]
    proc = subprocess.Popen(
        command,
        cwd=Path(__file__).resolve().parents[1],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            replies = app.control.ping(timeout=0.5) or []
            if any(n.startswith(name) for reply in replies for n in reply):
                break
        else:
            raise RuntimeError("the worker process did not answer a ping within 60 s")
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_inline(script: Script, args: argparse.Namespace, base_url: str, counter: TiktokenCounter) -> Result:
    """The same stages run synchronously when over the trigger (``ctxcore eval``'s ``full``)."""
    model = CountingModel(OpenAIChatModel(base_url, model="bench-summariser", timeout=60), counter)
    setup = PolicySetup("turn-latency", args.budget, [SYSTEM], [], counter, model, DEFAULT_DETECTOR)
    policy = make_policy("full", setup)
    result = Result("ctxcore-inline")

    def window() -> tuple[list[AnyMessage], bool]:
        served = policy.window()
        return served.messages, served.fallback

    replay(script, args.agent_delay, policy.append, window, result, counter, args.budget)
    result.summariser_calls = model.calls
    return result


def run_langchain(script: Script, args: argparse.Namespace, counter: TiktokenCounter) -> Result:
    """LangChain's SummarizationMiddleware with a fake chat model of the same delay."""
    try:
        from langchain.agents.middleware import SummarizationMiddleware
        from langchain_core.language_models.chat_models import BaseChatModel
        from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
        from langchain_core.outputs import ChatGeneration, ChatResult
    except ImportError as exc:
        return Result(
            "langchain", note=f"skipped: langchain is not installed ({exc.name}); pip install langchain"
        )

    extractive = ExtractiveModel(counter)
    summary_tokens = int(args.budget * 0.35)
    calls = [0]

    class DelayedExtractiveChat(BaseChatModel):
        """Sleeps like the summariser, then answers with the same extractive summary."""

        delay: float = 0.0
        target: int = 1

        @property
        def _llm_type(self) -> str:
            return "fake-delayed-extractive"

        def _generate(
            self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
        ) -> ChatResult:
            calls[0] += 1
            time.sleep(self.delay)
            prompt = "\n".join(str(m.content) for m in messages)
            text = transcript_summary(prompt, self.target, extractive)
            return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text or "(nothing)"))])

    system_tokens = counter.count_messages([SYSTEM])

    def count(messages: Any) -> int:
        return sum(counter.count_text(str(getattr(m, "content", m))) + 4 for m in messages) + 3

    middleware = SummarizationMiddleware(
        model=DelayedExtractiveChat(delay=args.delay, target=summary_tokens),
        trigger=("tokens", int(args.budget * 0.9) - system_tokens),
        keep=("tokens", int(args.budget * 0.4)),
        token_counter=count,
    )
    state: dict[str, list[Any]] = {"messages": []}

    def to_lc(messages: list[AnyMessage]) -> list[Any]:
        return [
            HumanMessage(content=message_text(m)) if m.role == "user" else AIMessage(content=message_text(m))
            for m in messages
        ]

    def append(messages: list[AnyMessage]) -> None:
        state["messages"].extend(to_lc(messages))

    def window() -> tuple[list[AnyMessage], bool]:
        update = middleware.before_model(state, None)  # type: ignore[arg-type]
        if update is not None:
            state["messages"] = list(update["messages"][1:])  # after RemoveMessage(REMOVE_ALL)
        served: list[AnyMessage] = [SYSTEM]
        for m in state["messages"]:
            served.append(
                UserMessage(content=str(m.content))
                if m.type == "human"
                else AssistantMessage(content=str(m.content))
            )
        return served, False

    result = Result("langchain")
    replay(script, args.agent_delay, append, window, result, counter, args.budget)
    result.summariser_calls = calls[0]
    return result


# --- output -------------------------------------------------------------------------------------


def report(results: list[Result], args: argparse.Namespace, script: Script) -> str:
    lines = [
        f"{len(script.turns)} turns of {', '.join(script.conversations)}; budget {args.budget} tokens; "
        f"summariser {args.delay:g} s per call; agent {args.agent_delay:g} s per turn",
        "",
        "| system | p50 ms | p95 ms | p99 ms | max ms | p99 / ctxcore-bg | summariser calls | fallback turns "
        "| over budget | final tokens | answer recall | substring hit | compacted recall | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = next((r for r in results if r.name.startswith("ctxcore-bg") and r.latencies_ms), None)
    base_p99 = percentile(base.latencies_ms, 0.99) if base else 0.0
    for r in results:
        if not r.latencies_ms:
            lines.append(f"| {r.name} | {r.note} |" + " |" * 12)
            continue
        rates = r.qa.rates()
        p99 = percentile(r.latencies_ms, 0.99)
        ratio = f"{p99 / base_p99:.1f}x" if base_p99 else "-"
        lines.append(
            f"| {r.name} | {statistics.median(r.latencies_ms):.2f} | {percentile(r.latencies_ms, 0.95):.2f} "
            f"| {p99:.2f} | {max(r.latencies_ms):.1f} | {ratio} | {r.summariser_calls} "
            f"| {r.fallbacks}/{len(r.latencies_ms)} | {r.over_budget} | {r.final_tokens} "
            f"| {rates['answer_recall']} | {rates['substring_hit_rate']} | {rates['compacted_answer_recall']} "
            f"| {r.seconds:.1f} |"
        )
    lines.append("")
    lines.append(
        f"questions scored: {results[0].qa.questions if results else 0} (evidence within the replayed turns)"
    )
    for r in results:
        if r.note and r.latencies_ms:
            lines.append(f"{r.name}: {r.note}")
    return "\n".join(lines)


def plot(results: list[Result], path: str) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "plot skipped: matplotlib is not installed (pip install matplotlib)"
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in results:
        if not r.latencies_ms:
            continue
        ordered = sorted(r.latencies_ms)
        ys = [(i + 1) / len(ordered) for i in range(len(ordered))]
        ax.plot(ordered, ys, label=r.name)
    ax.set_xscale("log")
    ax.set_xlabel("time to obtain the window (ms, log scale)")
    ax.set_ylabel("share of turns")
    ax.set_title("per-turn window latency (CDF)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"wrote {path}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--long", action="store_true", help="1,000 turns with a 2 s summariser")
    parser.add_argument("--turns", type=int, help="real user turns (default 200, 1000 with --long)")
    parser.add_argument(
        "--delay", type=float, help="seconds per summariser call (default 0.5, 2 with --long)"
    )
    parser.add_argument(
        "--agent-delay", type=float, help="seconds the agent's own model takes per turn (default delay/2)"
    )
    parser.add_argument("--budget", type=int, default=4000, help="window budget in tokens")
    parser.add_argument(
        "--worker",
        choices=["thread", "process"],
        default="thread",
        help="ctxcore-bg's Celery worker: threads in this process (default) or a worker subprocess",
    )
    parser.add_argument("--systems", default="ctxcore-bg,ctxcore-inline,langchain")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/12")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA / "locomo.jsonl")
    parser.add_argument("--plot", help="write the latency CDF here (PNG, needs matplotlib)")
    args = parser.parse_args()
    args.turns = args.turns or (1000 if args.long else 200)
    args.delay = args.delay if args.delay is not None else (2.0 if args.long else 0.5)
    args.agent_delay = args.agent_delay if args.agent_delay is not None else args.delay / 2
    if not args.data.exists():
        raise SystemExit(f"no data at {args.data} (set CTXCORE_DATA_DIR)")
    counter = TiktokenCounter()
    script = build_script(args.data, args.turns)
    wanted = [s.strip() for s in args.systems.split(",") if s.strip()]
    results: list[Result] = []
    with SummariserProcess(args.delay) as summariser:
        for name in wanted:
            print(f"running {name} ...", file=sys.stderr, flush=True)
            if name == "ctxcore-bg":
                results.append(run_background(script, args, summariser.base_url, counter))
            elif name == "ctxcore-inline":
                results.append(run_inline(script, args, summariser.base_url, counter))
            elif name == "langchain":
                results.append(run_langchain(script, args, counter))
            else:
                raise SystemExit(f"unknown system {name!r}")
    print(report(results, args, script))
    if args.plot:
        print(plot(results, args.plot))


if __name__ == "__main__":
    main()
