"""The inspector's routes under ``/ui`` (see ``workers.ui``).

Every page is rendered by Jinja2 with autoescaping on, so message contents, tool outputs,
summaries and metadata are text, never markup; every response carries a
Content-Security-Policy that allows no script at all (the pages have none) and no framing.
A page of a conversation the signed-in tenant does not own answers like an unknown one.
Forms that change something (rollback, sign-out) carry the session's CSRF token: without
it the answer is 403 and nothing changes.
"""

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Cookie, Form, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from ctxcore.errors import CtxcoreError, InvalidKeyError, NotFoundError
from ctxcore.recall.archive import RecallAnswer
from ctxcore.state import ConversationKey
from ctxcore.state.filesystem import validate_handle
from workers.api_common.auth import rate_limit, tenant_for_token
from workers.api_common.errors import ApiError
from workers.api_common.state import ApiState
from workers.ratelimit import RateLimiter
from workers.rollback import rollback_conversation
from workers.ui.pages import conversation_page, conversation_rows, diff_page, message_rows
from workers.ui.sessions import COOKIE, UiSession, UiSessions

__all__ = ["EXPIRED", "LOGIN_ATTEMPTS_PER_SECOND", "LOGIN_BURST", "SECURITY_HEADERS", "ui_router"]

_HERE = Path(__file__).parent
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
EXPIRED = "your session has expired or was ended: sign in again"
# A person mistyping a token gets 5 tries at once, then one every 12 s; a guesser gets the same.
LOGIN_BURST = 5
LOGIN_ATTEMPTS_PER_SECOND = 1 / 12
_ENV = Environment(loader=FileSystemLoader(_HERE / "templates"), autoescape=select_autoescape(default=True))


def _page(
    template: str,
    status: int = 200,
    session: UiSession | None = None,
    headers: dict[str, str] | None = None,
    **context: Any,
) -> HTMLResponse:
    if session is not None:
        context.setdefault("tenant", session.tenant)
        context.setdefault("csrf", session.csrf)
    html = _ENV.get_template(template).render(**context)
    return HTMLResponse(html, status_code=status, headers={**SECURITY_HEADERS, **(headers or {})})


def _redirect(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303, headers=SECURITY_HEADERS)


class _Answer(Exception):
    """What a page's route answers instead (sign in, 429, the 404 page), raised by the
    checks it shares with the other routes."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status_code)
        self.response = response


def _answering(route: Callable[..., Response]) -> Callable[..., Response]:
    """``route`` answering an ``_Answer`` raised in it with its response (FastAPI reads the
    route's own parameters through ``functools.wraps``)."""

    @functools.wraps(route)
    def answered(*args: Any, **kwargs: Any) -> Response:
        try:
            return route(*args, **kwargs)
        except _Answer as answer:
            return answer.response

    return answered


def ui_router(api: ApiState) -> APIRouter:
    """The inspector's pages over ``api`` (not in the OpenAPI document: they are HTML)."""
    router = APIRouter(prefix="/ui", include_in_schema=False)
    sessions = UiSessions(api.runtime.redis, api.settings.redis.key_prefix)
    # Sign-in attempts per client address: their own buckets, apart from the tenants'.
    attempts = RateLimiter(api.runtime.redis, f"{api.settings.redis.key_prefix}:ui-login")
    Session = Annotated[str | None, Cookie(alias=COOKIE)]

    def signed_in(cookie: str | None) -> UiSession:
        """The cookie's session, charged to its tenant's request rate like the API's
        requests; else ``_Answer``: sign in (again, saying why, when a cookie came), or 429."""
        session = sessions.get(cookie)
        if session is None:
            response = _redirect("/ui/login?expired=1" if cookie else "/ui/login")
            response.delete_cookie(COOKIE, path="/ui")
            raise _Answer(response)
        try:
            rate_limit(api, session.tenant)
        except ApiError as exc:
            raise _Answer(
                _page("limited.html", 429, session, error=exc.detail, headers=exc.headers)
            ) from None
        return session

    def conversation(session: UiSession, cid: str) -> ConversationKey:
        try:
            key = ConversationKey(session.tenant, cid)
        except InvalidKeyError:
            raise NotFoundError("conversation not found") from None
        if not api.exists(key):
            raise NotFoundError("conversation not found")
        return key

    def open_conversation(cookie: str | None, cid: str) -> tuple[UiSession, ConversationKey]:
        """The signed-in session and the conversation ``cid`` of its tenant; else ``_Answer``
        (sign in, 429, or the same 404 for an unknown or another tenant's conversation)."""
        session = signed_in(cookie)
        try:
            return session, conversation(session, cid)
        except NotFoundError:
            raise _Answer(not_found(session)) from None

    def not_found(session: UiSession) -> HTMLResponse:
        return _page(
            "range.html",
            404,
            session,
            cid="",
            first="",
            last="",
            messages=[],
            notice="conversation not found",
        )

    @router.get("/static/ui.css")
    def stylesheet() -> FileResponse:
        return FileResponse(_HERE / "static" / "ui.css", media_type="text/css", headers=SECURITY_HEADERS)

    @router.get("/login")
    def login_form(expired: Annotated[int, Query(ge=0, le=1)] = 0) -> HTMLResponse:
        return _page("login.html", error=EXPIRED if expired else None)

    @router.post("/login")
    def login(request: Request, token: Annotated[str, Form(max_length=500)]) -> Response:
        # Every attempt takes a token from its address's small bucket before the token is
        # compared: guessing is slowed whatever the guesses are.
        address = request.client.host if request.client else "unknown"
        attempt = attempts.take(address, LOGIN_ATTEMPTS_PER_SECOND, LOGIN_BURST)
        if not attempt.allowed:
            return _page(
                "login.html",
                429,
                error=f"too many sign-in attempts from this address; retry in {attempt.retry_after} s",
                headers={"Retry-After": str(attempt.retry_after)},
            )
        tenant = tenant_for_token(api.settings, token.strip())
        if tenant is None:
            return _page("login.html", 401, error="unknown token")
        cookie, _ = sessions.create(tenant)
        response = _redirect("/ui/")
        response.set_cookie(
            COOKIE,
            cookie,
            max_age=sessions.seconds,
            path="/ui",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    @router.post("/logout")
    def logout(ctxcore_ui: Session = None, csrf: Annotated[str | None, Form()] = None) -> Response:
        session = sessions.get(ctxcore_ui)
        if session is not None and not session.csrf_matches(csrf):
            return _page("login.html", 403, error="sign-out refused: the form's CSRF token is missing")
        sessions.delete(ctxcore_ui)
        response = _redirect("/ui/login")
        response.delete_cookie(COOKIE, path="/ui")
        return response

    @router.get("/")
    @_answering
    def conversations(
        ctxcore_ui: Session = None,
        after: Annotated[str | None, Query(max_length=128)] = None,
        prefix: Annotated[str, Query(max_length=128)] = "",
    ) -> Response:
        session = signed_in(ctxcore_ui)
        rows, following = conversation_rows(api, session.tenant, after or None, prefix)
        return _page("conversations.html", session=session, rows=rows, next=following, prefix=prefix)

    @router.get("/c/{cid}")
    @_answering
    def conversation_view(
        cid: str, ctxcore_ui: Session = None, budget: Annotated[int | None, Query(ge=1, le=10_000_000)] = None
    ) -> Response:
        session, key = open_conversation(ctxcore_ui, cid)
        return _page("conversation.html", session=session, **conversation_page(api, key, budget))

    @router.get("/c/{cid}/range")
    @_answering
    def sources(
        cid: str,
        first: Annotated[str, Query(max_length=12)],
        last: Annotated[str, Query(max_length=12)],
        ctxcore_ui: Session = None,
    ) -> Response:
        session = signed_in(ctxcore_ui)
        try:
            key = conversation(session, cid)
            messages = api.runtime.log.read_range(key, first, last)
        except (NotFoundError, InvalidKeyError):
            return not_found(session)
        return _page(
            "range.html", session=session, cid=cid, first=first, last=last, messages=message_rows(messages)
        )

    @router.get("/c/{cid}/offload/{handle}")
    @_answering
    def offload(cid: str, handle: str, ctxcore_ui: Session = None) -> Response:
        session = signed_in(ctxcore_ui)
        try:
            key = conversation(session, cid)
            validate_handle(handle)
            messages = api.runtime.offloads.get(key, handle)
        except (NotFoundError, InvalidKeyError):
            messages = None
        if messages is None:
            return not_found(session)
        return _page(
            "range.html",
            session=session,
            cid=cid,
            first=f"offload {handle}",
            last="",
            messages=message_rows(messages),
        )

    @router.get("/c/{cid}/history")
    @_answering
    def history(
        cid: str, ctxcore_ui: Session = None, notice: Annotated[str, Query(max_length=200)] = ""
    ) -> Response:
        session, key = open_conversation(ctxcore_ui, cid)
        versions = api.runtime.state_store.history(key)
        journal = [
            {**e.as_dict(), "at": e.at.strftime("%Y-%m-%d %H:%M:%S")}
            for e in api.runtime.journal.entries(key)
        ]
        return _page(
            "history.html", session=session, cid=cid, versions=versions, journal=journal, notice=notice
        )

    @router.get("/c/{cid}/diff")
    @_answering
    def diff(
        cid: str, a: Annotated[int, Query(ge=1)], b: Annotated[int, Query(ge=1)], ctxcore_ui: Session = None
    ) -> Response:
        session, key = open_conversation(ctxcore_ui, cid)
        kept = {s.version: s for s in api.runtime.state_store.history(key)}
        if a not in kept or b not in kept:
            return _page(
                "range.html",
                404,
                session,
                cid=cid,
                first="",
                last="",
                messages=[],
                notice="that version is not kept",
            )
        return _page("diff.html", session=session, **diff_page(key, kept[a], kept[b]))

    @router.get("/c/{cid}/rollback")
    @_answering
    def confirm_rollback(
        cid: str, version: Annotated[int, Query(ge=1)], ctxcore_ui: Session = None
    ) -> Response:
        session, _ = open_conversation(ctxcore_ui, cid)
        return _page("confirm.html", session=session, cid=cid, version=version)

    @router.post("/c/{cid}/rollback")
    def rollback(
        cid: str,
        version: Annotated[int, Form(ge=1)],
        csrf: Annotated[str | None, Form()] = None,
        ctxcore_ui: Session = None,
    ) -> Response:
        try:
            session = signed_in(ctxcore_ui)
        except _Answer:
            return _page(
                "login.html", 401, error=f"{EXPIRED if ctxcore_ui else 'sign in first'}; nothing changed"
            )
        if not session.csrf_matches(csrf):
            return _page(
                "login.html",
                403,
                session,
                error="rollback refused: the form's CSRF token is missing or wrong; nothing changed",
            )
        try:
            key = conversation(session, cid)
        except NotFoundError:
            return not_found(session)
        try:
            done = rollback_conversation(api.runtime, key, version)
        except CtxcoreError as exc:  # not kept, busy, a concurrent save: said on the page
            return _page(
                "confirm.html", 409, session, cid=cid, version=version, notice=f"nothing changed: {exc}"
            )
        return _redirect(
            f"/ui/c/{cid}/history?notice=version+{done.restored}+restored+as+version+{done.version}"
        )

    @router.get("/c/{cid}/recall")
    @_answering
    def recall(
        cid: str, ctxcore_ui: Session = None, q: Annotated[str, Query(max_length=2000)] = ""
    ) -> Response:
        session, key = open_conversation(ctxcore_ui, cid)
        answer: RecallAnswer | None = None
        error = None
        if q.strip():
            try:
                answer = api.service.recall(key, q)
            except CtxcoreError as exc:  # recall off for the tenant: the page says which setting
                error = str(exc)
        return _page("recall.html", session=session, cid=cid, query=q, answer=answer, error=error)

    return router
