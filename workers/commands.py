"""The commands of ``ctxcore`` other than ``eval`` (``workers/cli.py`` holds the parser).

Each takes the parsed arguments and the output stream and returns the exit code; errors it
expects are ``CtxcoreError`` naming their input, which ``main`` prints as one line.
"""

from __future__ import annotations

import argparse
import json
import logging
import secrets
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, cast

from ctxcore.config import FlowerSettings, Settings, hash_token
from ctxcore.errors import ConfigError
from ctxcore.messages import from_openai
from ctxcore.state.keys import ConversationKey, validate_id
from ctxcore.tokens import TiktokenCounter
from ctxcore.window import check_window
from workers.table_cells import cell

if TYPE_CHECKING:
    from workers.broker import NodeKind

__all__ = [
    "bundled_sample",
    "cmd_compact",
    "cmd_count",
    "cmd_demo",
    "cmd_flower",
    "cmd_inspect",
    "cmd_rollback",
    "cmd_serve",
    "cmd_token_create",
    "cmd_worker",
    "counter_for",
    "settings_for",
]

log = logging.getLogger("ctxcore.cli")

# The widest id column of ``count``'s table; longer ids end with an ellipsis (--json: whole).
ID_COLUMN_MAX = 40


def bundled_sample() -> Path:
    """Path of the bundled sample conversations."""
    return Path(str(resources.files("ctxcore").joinpath("samples", "agent_runs.jsonl")))


def settings_for(args: argparse.Namespace) -> Settings:
    # The CLI is one of the two places that read the environment (DESIGN: config).
    return Settings.from_env(config_file=args.config)


def counter_for(args: argparse.Namespace, settings: Settings) -> TiktokenCounter:
    return TiktokenCounter(args.model or settings.engine.tokenizer_model)


def cmd_count(args: argparse.Namespace, out: TextIO) -> int:
    """Print token counts per conversation of a JSONL file."""
    from workers.batch import read_batch

    path = Path(args.file) if args.file else bundled_sample()
    counter = counter_for(args, settings_for(args))
    rows: list[dict[str, Any]] = [
        {
            "id": record.id,
            "messages": len(messages),
            "tokens": counter.count_messages(messages),
            "violations": len(check_window(messages)),
        }
        for record in read_batch(path)
        for messages in [from_openai(record.messages)]
    ]
    if args.json:
        out.write(json.dumps(rows, indent=2) + "\n")
        return 0
    width = min(max([len(r["id"]) for r in rows] + [12]), ID_COLUMN_MAX)
    out.write(f"{'conversation':<{width}}  {'messages':>8}  {'tokens':>8}  {'violations':>10}\n")
    for r in rows:
        out.write(f"{cell(r['id'], width)}  {r['messages']:>8}  {r['tokens']:>8}  {r['violations']:>10}\n")
    out.write(
        f"{'total':<{width}}  {sum(r['messages'] for r in rows):>8}  {sum(r['tokens'] for r in rows):>8}\n"
        f"encoding: {counter.encoding_name} ({path})\n"
    )
    return 0


def cmd_demo(args: argparse.Namespace, out: TextIO) -> int:
    """Replay the bundled runs through the distributed service on an embedded default."""
    from workers.demo import run_demo

    return run_demo(
        settings_for(args), str(bundled_sample()), out, interactive=out.isatty(), timeout=args.timeout
    )


def cmd_worker(args: argparse.Namespace, out: TextIO) -> int:
    """Start a Celery worker consuming continuation stages first, then new jobs.

    On RabbitMQ (no priority across queues) ``--node all`` runs a stages node and a drain
    node (``workers.nodes``); ``--node stages`` / ``--node drain`` runs one of them.
    """
    from workers.app import app, configure
    from workers.broker import node_queues, uses_amqp
    from workers.runtime import check_startup

    settings = settings_for(args)
    check_startup(settings)
    # argparse's ``choices`` (default "all") keeps ``--node`` to a ``NodeKind``.
    node = cast("NodeKind", args.node)
    if node == "all" and uses_amqp(settings):
        from workers.logs import apply_log_format
        from workers.nodes import run_nodes

        apply_log_format(settings, [logging.getLogger()])  # the supervisor's own lines
        return run_nodes(args)
    configure(settings)
    from workers.logs import before_celery_logging
    from workers.prom_worker import start_node_metrics

    # Before the pool forks: the children inherit the multiprocess directory. Its port (or
    # that it serves none) is logged before Celery's logging exists.
    with before_celery_logging(settings, args.loglevel, "workers.prom_worker"):
        start_node_metrics(settings, node)
    # A drain node only pops jobs and sends their first stage: one process is enough.
    concurrency = 1 if node == "drain" else (args.concurrency or settings.worker.concurrency)
    queues = ",".join(node_queues(settings, node))
    argv = ["worker", "-Q", queues, "--loglevel", args.loglevel, "-E", "--concurrency", str(concurrency)]
    if args.hostname:
        argv += ["--hostname", args.hostname]
    app.worker_main(argv)
    return 0


def cmd_flower(args: argparse.Namespace, out: TextIO) -> int:
    """Start Flower on this deployment's broker (``worker.broker_url``, else ``redis.url``),
    queues and event exchange (its options after ``--``)."""
    from workers.app import app, configure
    from workers.broker import check_broker

    settings = settings_for(args)
    flower_args = [a for a in args.flower_args if a != "--"]
    check_flower_args(settings.flower, flower_args)
    check_broker(settings)
    configure(settings)
    return int(app.start(["flower", *flower_options(settings.flower), *flower_args]) or 0)


# Where Flower listens and who may read it come from the settings (checked), not from
# options passed through to Flower (unchecked).
_FLOWER_OWN = ("address", "port", "basic_auth", "basic-auth", "unix_socket", "unix-socket")


def check_flower_args(flower: FlowerSettings, passed: list[str]) -> None:
    """``ConfigError`` when Flower would listen beyond this machine without basic auth, or
    when the options after ``--`` try to set what ``flower.*`` settings decide."""
    for arg in passed:
        name = arg.lstrip("-").split("=", 1)[0]
        if name in _FLOWER_OWN:
            raise ConfigError(
                f"ctxcore flower: --{name} is set by flower.host, flower.port and flower.basic_auth "
                "(CTXCORE_FLOWER__HOST, ...), not after --"
            )
    if not flower.loopback and not flower.basic_auth:
        raise ConfigError(
            f"ctxcore flower: flower.host is {flower.host!r}, beyond this machine, and flower.basic_auth is "
            "empty: Flower shows every task's arguments and failures; set flower.basic_auth "
            "(user:password entries, CTXCORE_FLOWER__BASIC_AUTH) or keep flower.host at 127.0.0.1"
        )


def flower_options(flower: FlowerSettings) -> list[str]:
    """Flower's command-line options for ``flower.*``."""
    options = [f"--address={flower.host}", f"--port={flower.port}"]
    if flower.basic_auth:
        options.append(f"--basic-auth={','.join(flower.basic_auth)}")
    return options


def cmd_serve(args: argparse.Namespace, out: TextIO) -> int:
    """Serve the HTTP API with uvicorn (``--host``/``--port``/``--workers`` override
    ``http.host``/``http.port``/``http.workers``)."""
    from workers.http import serve
    from workers.logs import apply_log_format
    from workers.runtime import check_startup

    settings = settings_for(args)
    check_startup(settings)
    given = (("host", args.host), ("port", args.port), ("workers", args.workers))
    overrides = {k: v for k, v in given if v is not None}
    if overrides:
        settings = settings.model_copy(update={"http": settings.http.model_copy(update=overrides)})
    if not settings.http.tokens:
        logging.basicConfig(format="%(levelname)s: %(message)s")
        apply_log_format(settings, [logging.getLogger()])
        log.warning(
            "http.tokens is empty: every call will be answered 401. "
            "Create a token with `ctxcore token create TENANT`."
        )
    serve(settings)
    return 0


def cmd_token_create(args: argparse.Namespace, out: TextIO) -> int:
    """Print a new bearer token once, then both config forms of its sha256."""
    tenant = validate_id(args.tenant, "tenant_id")
    token = secrets.token_urlsafe(32)
    digest = hash_token(token)
    # The variable replaces the whole map: carry the configured entries over into it.
    tokens = {**settings_for(args).http.tokens, digest: tenant}
    kept = len(tokens) - 1
    note = f"; the {kept} token(s) configured now are included" if kept else ""
    out.write(
        f"bearer token for tenant {tenant} (shown once, store it now):\n\n  {token}\n\n"
        f"its sha256, to configure in one of two ways:\n\n  {digest}\n\n"
        "1. environment: this variable replaces the whole token map, so every token the\n"
        f"   server should accept must be in it{note}:\n\n"
        f"  CTXCORE_HTTP__TOKENS='{json.dumps(tokens, separators=(',', ':'))}'\n\n"
        f'2. TOML settings file, a line under [http.tokens]:\n\n  "{digest}" = "{tenant}"\n'
    )
    return 0


def cmd_compact(args: argparse.Namespace, out: TextIO) -> int:
    """Offline batch: compact each conversation of a JSONL file to a window within the budget."""
    from workers.batch import compact_file

    settings = settings_for(args)
    return compact_file(
        Path(args.file),
        Path(args.out),
        args.budget,
        settings,
        counter_for(args, settings),
        out,
        continue_on_error=args.continue_on_error,
    )


def cmd_inspect(args: argparse.Namespace, out: TextIO) -> int:
    """Print a conversation's overview for people (``--json``: its compaction state, and
    with ``--history`` the kept versions, as JSON)."""
    from workers.holds import status_of
    from workers.inspect_view import InspectView, render_overview
    from workers.runtime import Runtime
    from workers.spend import summariser_cap

    rt = Runtime(settings_for(args))
    key = ConversationKey(args.tenant, args.conversation)
    state = rt.state_store.load(key)
    record = rt.failures.get(key)
    status = status_of(
        record,
        backoff_seconds=rt.settings.worker.no_progress_backoff_seconds,
        cap_tokens=summariser_cap(rt.settings, key.tenant_id),
    )
    history = rt.state_store.history(key, 20) if args.history or not args.json else []
    if not args.json:
        view = InspectView(
            key=key,
            status=status,
            detail=record.detail,
            state=state,
            kept_versions=[s.version for s in history],
            journal=rt.journal.entries(key),
            last_log_id=rt.log.last_id(key),
            budget=rt.state_store.get_budget(key),
        )
        lines = render_overview(view)
        if args.history:
            lines += [
                "",
                "kept versions: " + ", ".join(f"v{s.version} ({len(s.blocks)} blocks)" for s in history),
            ]
        out.write("\n".join(lines) + "\n")
        return 0
    doc: dict[str, Any] = {
        "conversation": str(key),
        "last_log_id": rt.log.last_id(key),
        "budget": rt.state_store.get_budget(key),
        "compaction": status,
        "compaction_detail": record.detail.as_dict(),
        "state": state.model_dump(mode="json") if state else None,
    }
    if args.history:
        doc["history"] = [s.model_dump(mode="json") for s in history]
    out.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    return 0


def cmd_rollback(args: argparse.Namespace, out: TextIO) -> int:
    """Make an earlier kept version of the state current again (as a new version)."""
    from workers.rollback import rollback_conversation
    from workers.runtime import Runtime

    rt = Runtime(settings_for(args))
    key = ConversationKey(args.tenant, args.conversation)
    done = rollback_conversation(rt, key, args.version)
    out.write(f"{key}: version {done.restored} restored as version {done.version}\n")
    return 0
