"""A pure ASGI middleware that rejects request bodies over a size limit with 413.

It runs before routing, authentication and JSON parsing, so an oversized body is never
buffered whole nor parsed. A declared ``Content-Length`` over the limit is refused before
the application is called at all; a body without one (chunked transfer encoding) is
counted as it streams, and the moment it passes the limit the 413 is sent and the
application sees a client disconnect (whatever response it then tries to send is dropped).

Recent Starlette/FastAPI releases have a ``max_body_size`` of their own; our dependency
floor predates it and we want the API's JSON error shape, hence this small middleware.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["BodyLimitMiddleware", "CutOff"]


# The proxy's routes answer in OpenAI's error shape (an SDK shows its message), the rest in ours.
_OPENAI_PATHS = frozenset({"/v1/chat/completions", "/v1/responses"})


def _response(status: int, error: str, detail: str, openai: bool = False) -> tuple[Message, Message]:
    shaped = (
        {"error": {"message": detail, "type": "invalid_request_error", "param": None, "code": error}}
        if openai
        else {"error": error, "detail": detail}
    )
    body = json.dumps(shaped).encode()
    start: Message = {
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            # The rest of the body is not read: the connection cannot be reused.
            (b"connection", b"close"),
        ],
    }
    return start, {"type": "http.response.body", "body": body}


def _content_length(scope: Scope) -> int | str | None:
    """The declared length, None when absent, "invalid" when it is not a number."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() else "invalid"
    return None


class BodyLimitMiddleware:
    """Reject HTTP request bodies larger than ``max_bytes`` with 413 (see module docstring)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        # Validated once, by the settings (http.max_body_bytes: above 0).
        self.app = app
        self.max_bytes = max_bytes

    async def _reject(self, send: Send, status: int, error: str, detail: str, scope: Scope) -> None:
        start, body = _response(status, error, detail, scope.get("path") in _OPENAI_PATHS)
        await send(start)
        await send(body)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request through, or answer 413 without involving the application."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared == "invalid":
            await self._reject(send, 400, "invalid_request", "Content-Length is not a number", scope)
            return
        too_large = f"request body larger than {self.max_bytes} bytes (http.max_body_bytes)"
        if isinstance(declared, int) and declared > self.max_bytes:
            await self._reject(send, 413, "body_too_large", too_large, scope)
            return

        received = 0
        run = CutOff(send)

        async def limited_receive() -> Message:
            nonlocal received
            if run.refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    run.refused = True
                    if not run.started:
                        await self._reject(send, 413, "body_too_large", too_large, scope)
                        run.answered = True
                    # The application stops reading as if the client went away.
                    return {"type": "http.disconnect"}
            return message

        await run.run(self.app, scope, limited_receive)


class CutOff:
    """One run of an application whose request body may be cut off mid-stream: once
    ``refused``, the receive it is given reports a client disconnect; once ``answered`` (our
    own error was sent before the application started its response) whatever the application
    then sends is dropped, and an exception it lets the disconnect escape as is swallowed."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.refused = False  # the body was cut off
        self.answered = False  # ... and our answer sent (the application had not responded yet)
        self.started = False  # the application started its response

    async def guarded_send(self, message: Message) -> None:
        """``send``, but nothing once our own answer went out."""
        if self.answered:
            return
        if message["type"] == "http.response.start":
            self.started = True
        await self.send(message)

    async def run(self, app: ASGIApp, scope: Scope, receive: Receive) -> None:
        """Run ``app`` on ``receive`` and the guarded send."""
        try:
            await app(scope, receive, self.guarded_send)
        except Exception:
            if not self.refused:
                raise
