"""The API's memory when the proxy's upstream answers with a huge reply.

Starts ``ctxcore serve`` (a subprocess) in front of a hand-written upstream that answers a
chat completion with a ``--mb`` MB body, chunked (no Content-Length to refuse it by), and
prints the API process's resident memory (``VmRSS``) and peak (``VmHWM``, from
``/proc/<pid>/status``) before and after a non-streamed and a streamed request, and how
much of the reply the upstream got to send before the proxy hung up. The reply buffer is
bounded by ``4 * service.max_message_chars + 64 KiB`` (8 MiB at the default 2,000,000
characters): the peak should grow by about that, not by the reply's size.

Redis: 127.0.0.1:6379 db 14 (``--redis-url``), a unique key prefix, its keys deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid

import httpx
import redis

from ctxcore.config import hash_token

TOKEN = "bench-memory-token"
MODEL = "bench-model"


def status_kb(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of ``pid`` in kB."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                out[name] = int(value.split()[0])
    return out


class HugeUpstream:
    """Answers every request with a ``size``-byte completion (JSON or SSE), chunked."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.sent = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._run, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1"

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.sent += len(data)

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            while len(body) < length:
                body += conn.recv(65536)
            stream = json.loads(body).get("stream") is True
            kind = b"text/event-stream" if stream else b"application/json"
            conn.sendall(
                b"HTTP/1.1 200 OK\r\ncontent-type: " + kind + b"\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            self.sent = 0
            try:
                if stream:
                    event = {
                        "choices": [{"index": 0, "delta": {"content": "x" * 65000}, "finish_reason": None}]
                    }
                    piece = f"data: {json.dumps(event)}\n\n".encode()
                else:
                    self._send(conn, b'{"choices":[{"index":0,"message":{"role":"assistant","content":"')
                    piece = b"x" * 65536
                while self.sent < self.size:
                    self._send(conn, piece)
                conn.sendall(b"0\r\n\r\n")
            except OSError:
                pass  # the proxy hung up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=300, help="size of the upstream's reply (MB, default 300)")
    parser.add_argument("--long", action="store_true", help="a 1,000 MB reply")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    args = parser.parse_args()
    size = (1000 if args.long else args.mb) * 1024 * 1024
    upstream = HugeUpstream(size)
    prefix = f"benchmem{uuid.uuid4().hex[:8]}"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        **os.environ,
        "CTXCORE_REDIS_URL": args.redis_url,
        "CTXCORE_REDIS__KEY_PREFIX": prefix,
        "CTXCORE_HTTP__TOKENS": json.dumps({hash_token(TOKEN): "bench"}),
        "CTXCORE_PROXY__UPSTREAM_BASE_URL": upstream.base_url,
        "CTXCORE_PROXY__CONTEXT_WINDOW_TOKENS": json.dumps({MODEL: 8000}),
        "CTXCORE_HTTP__ACCESS_LOG": "false",
    }
    serve = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "serve", "--port", str(port)],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or serve.poll() is not None:
                raise SystemExit("ctxcore serve did not start")
            time.sleep(0.2)
        print(f"upstream reply: {size / 2**20:.0f} MB, chunked; API pid {serve.pid}")
        print(
            f"{'after':<28} {'VmRSS MB':>9} {'VmHWM MB':>9} {'status':>7} {'upstream sent MB':>17} {'s':>6}"
        )
        before = status_kb(serve.pid)
        print(f"{'start-up':<28} {before['VmRSS'] / 1024:>9.1f} {before['VmHWM'] / 1024:>9.1f}")
        headers = {
            "Authorization": f"Bearer {TOKEN}",
            "X-Ctxcore-Conversation": f"mem-{uuid.uuid4().hex[:6]}",
        }
        for stream in (False, True):
            started = time.monotonic()
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
            response = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=600)
            took = time.monotonic() - started
            time.sleep(0.5)
            now = status_kb(serve.pid)
            label = "streamed request" if stream else "non-streamed request"
            print(
                f"{label:<28} {now['VmRSS'] / 1024:>9.1f} {now['VmHWM'] / 1024:>9.1f} "
                f"{response.status_code:>7} {upstream.sent / 2**20:>17.1f} {took:>6.2f}"
            )
            headers["X-Ctxcore-Conversation"] = f"mem-{uuid.uuid4().hex[:6]}"
        peak = status_kb(serve.pid)["VmHWM"] - before["VmHWM"]
        print(
            f"peak growth: {peak / 1024:.1f} MB for a {size / 2**20:.0f} MB reply ({peak * 1024 / size:.3f} of it)"
        )
    finally:
        serve.terminate()
        serve.wait(timeout=10)
        upstream.listener.close()
        client = redis.Redis.from_url(args.redis_url)
        keys = [
            *client.scan_iter(match=f"{prefix}:*", count=1000),
            *client.scan_iter(match=f"{{{prefix}:*", count=1000),
        ]
        if keys:
            client.delete(*keys)
        client.close()


if __name__ == "__main__":
    main()
