"""A light HTTP/1.1 load-generator client for the benches (asyncio streams, keep-alive).

The benches' agents share the machine's cores with the API they measure. httpx spends
about 1 ms of CPU per request in its own Python (URL and header models, the connection
pool, the response object): at 32 closed-loop agents that is a core's worth the API no
longer has. This client writes each request as one prebuilt buffer and reads the answer by
its ``Content-Length`` (or its chunks), nothing else: measured in ``bench/http_load.py
--api-processes`` (load generator CPU per step, httpx against this, in bench/README.md).
Only what the benches send: JSON bodies, bearer headers, answers read whole.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

__all__ = ["RawClient", "RawResponse"]


class RawResponse:
    """A status code and a body, read whole."""

    def __init__(self, status_code: int, headers: dict[str, str], content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content

    def json(self) -> Any:
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.requests = 0

    async def exchange(self, request: bytes) -> tuple[RawResponse, bool]:
        """Send ``request``; the response and whether the connection can be used again."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            body = await self.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                parts.append(await self.reader.readexactly(size + 2))
                if size == 0:
                    break
            body = b"".join(part[:-2] for part in parts)
        else:
            body = b""
        reusable = headers.get("connection", "").lower() != "close"
        return RawResponse(status, headers, body), reusable

    def close(self) -> None:
        self.writer.close()


class RawClient:
    """``request(method, path, json=..., params=..., headers=...)`` as httpx's, over a pool of
    keep-alive connections to one ``host:port`` (one per request in flight).

    ``reconnect``: a connection closes after that many requests (``Connection: close`` on
    the last), so that N server processes sharing one listening socket see the agents'
    connections again: a keep-alive connection stays with whichever process accepted it, and
    on a busy machine that split is lopsided (32 agents over 2 processes: 24 and 9, seen with
    ``ss``), which sets the busier process's queue as everyone's tail."""

    def __init__(self, host: str, port: int, reconnect: int | None = None) -> None:
        self.host, self.port, self.reconnect = host, port, reconnect
        self._idle: list[_Connection] = []

    async def request(
        self,
        method: str,
        path: str,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        content: bytes | None = None,
    ) -> RawResponse:
        body = content if content is not None else (b"" if json is None else _dumps(json))
        query = {k: v for k, v in (params or {}).items() if v is not None}
        target = f"{path}?{urlencode(query)}" if query else path
        lines = [
            f"{method} {target} HTTP/1.1",
            f"Host: {self.host}:{self.port}",
            f"Content-Length: {len(body)}",
        ]
        if json is not None:
            lines.append("Content-Type: application/json")
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        while True:
            reused = bool(self._idle)
            connection = (
                self._idle.pop()
                if reused
                else _Connection(*await asyncio.open_connection(self.host, self.port))
            )
            connection.requests += 1
            close = self.reconnect is not None and connection.requests >= self.reconnect
            request = ("\r\n".join([*lines, *(["Connection: close"] if close else [])]) + "\r\n\r\n").encode(
                "latin-1"
            ) + body
            try:
                response, reusable = await connection.exchange(request)
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                connection.close()
                # A kept connection the server closed while it sat idle (uvicorn's keep-alive
                # timeout, 5 s): the request never reached it; send it on a new one, as httpx does.
                answered = isinstance(exc, asyncio.IncompleteReadError) and exc.partial
                if reused and not answered:
                    continue
                raise
            except BaseException:
                connection.close()
                raise
            if reusable:
                self._idle.append(connection)
            else:
                connection.close()
            return response

    async def post(self, path: str, **kwargs: Any) -> RawResponse:
        return await self.request("POST", path, **kwargs)

    async def get(self, path: str, **kwargs: Any) -> RawResponse:
        return await self.request("GET", path, **kwargs)

    async def aclose(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
