"""Who may look at the console (`ConsoleAuth`, an ASGI middleware), and the CSRF tokens of its forms.

Three ways in, tried in this order: `Authorization: Bearer <MCP_TASKS_CONSOLE_TOKEN>` (the CLI, scripts:
no cookie, so no CSRF token); the host application's `operator(request)` when mounted; a browser session
(a signed, HttpOnly, SameSite=Strict, expiring cookie from the login form). Cookies and CSRF tokens are
signed with HMAC-SHA256 under a key derived from the token, so every console process with that token
accepts them and changing it signs everyone out. Signing out records the session's random id in the store
until its cookie would expire, so every console process refuses a copy of it (`ConsoleAuth`'s `signed_out`,
one primary-key read per request that carries a session cookie). A CSRF token is bound to the session (or
host operator) and expires. The middleware leaves `operator` and `auth_via` ("bearer", "host", "session") in `request.state`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from celery_mcp_tasks.config import ConfigError
from celery_mcp_tasks.console.context import audit_refused
from celery_mcp_tasks.store.base import StoreUnavailable

COOKIE: Final = "mcp_tasks_console"
CSRF_HEADER: Final = "x-csrf-token"
OPERATOR_HEADER: Final = "x-console-operator"
SESSION_TTL_S: Final = 8 * 3600
CSRF_TTL_S: Final = 2 * 3600
MAX_NAME: Final = 64


@dataclass
class AuthConfig:
    """How the console checks who is there. `token`: MCP_TASKS_CONSOLE_TOKEN (None: host authentication only)."""

    token: str | None
    operator: Callable[[Request], Any] | None = None
    session_ttl_s: int = SESSION_TTL_S
    csrf_ttl_s: int = CSRF_TTL_S
    clock: Callable[[], float] = time.time
    _key: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.token is None and self.operator is None:
            raise ConfigError("MCP_TASKS_CONSOLE_TOKEN: the console needs an operator token (or, mounted, operator=)")
        # Without a token (host authentication only) the key is this process's own: CSRF tokens then
        # hold within one process; set MCP_TASKS_CONSOLE_TOKEN to share them between processes.
        seed = self.token.encode() if self.token is not None else secrets.token_bytes(32)
        self._key = hmac.new(seed, b"celery-mcp-tasks console signing key", hashlib.sha256).digest()

    def token_matches(self, given: str) -> bool:
        if self.token is None or not given:
            return False
        return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), self.token.encode())

    def sign(self, purpose: str, payload: str) -> str:
        return hmac.new(self._key, f"{purpose}\n{payload}".encode(), hashlib.sha256).hexdigest()

    def signed(self, purpose: str, payload: str, signature: str) -> bool:
        """`signature` is this payload's; compared as bytes (`compare_digest` raises on non-ASCII text)."""
        given = signature.encode("utf-8", "surrogatepass")
        return hmac.compare_digest(given, self.sign(purpose, payload).encode())


def clean_name(name: str | None) -> str:
    """An operator's name as audit lines show it: printable, one word per space, bounded."""
    text = "".join(ch if ch.isprintable() else " " for ch in (name or "")).strip()
    return " ".join(text.split())[:MAX_NAME]


@dataclass(frozen=True)
class Session:
    operator: str
    sid: str
    expires: int


def _config(request: Request) -> AuthConfig:
    config: AuthConfig = request.app.state.console_auth  # set by `create_app`
    return config


def _session_of(config: AuthConfig, cookie: str | None) -> Session | None:
    if not cookie or "." not in cookie:
        return None
    body, signature = cookie.rsplit(".", 1)
    if not config.signed("session", body, signature):
        return None
    try:
        values = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        session = Session(str(values["op"]), str(values["sid"]), int(values["exp"]))
    except (ValueError, KeyError, TypeError, OverflowError):  # OverflowError: an expiry of Infinity
        return None
    return session if session.expires > config.clock() else None


def mount_root(request: Request) -> str:
    """Where the console is mounted ("" when it is the whole app): every link is under it."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def json_error(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, **extra}}, status_code=status)


# -- what pages and the API call ------------------------------------------------------------


def operator_of(request: Request) -> str | None:
    """The signed-in operator's name (None: nobody), as the middleware found it."""
    return getattr(request.state, "operator", None)


def has_session(request: Request) -> bool:
    """Signed in with the login form's cookie (so "Sign out" means something)."""
    return getattr(request.state, "auth_via", None) == "session"


def token_ok(request: Request, token: str, name: str) -> bool:
    """The login form's token is the operator token (constant-time); a wrong one is an audit WARNING."""
    if _config(request).token_matches(token):
        return True
    _refused(request, name, "sign-in")
    return False


def _refused(request: Request, operator: str, action: str) -> None:
    """One audit WARNING per wrong operator token given (never the token), for whoever watches for guessing."""
    audit_refused(operator, action, request.client.host if request.client else "unknown")


def start_session(request: Request, response: Response, name: str) -> None:
    """Sign `name` in: the signed session cookie on `response` (HttpOnly, SameSite=Strict, expiring)."""
    config = _config(request)
    expires = int(config.clock()) + config.session_ttl_s
    values = {"op": clean_name(name) or "operator", "sid": secrets.token_urlsafe(16), "exp": expires}
    body = base64.urlsafe_b64encode(json.dumps(values, separators=(",", ":")).encode()).rstrip(b"=").decode()
    response.set_cookie(
        COOKIE,
        f"{body}.{config.sign('session', body)}",
        max_age=config.session_ttl_s,
        path=mount_root(request) or "/",
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )


def session_of(request: Request) -> Session | None:
    """The request's signed, unexpired session cookie (None: none, or expired by now: an open stream asks again);
    whether it was signed out is not asked."""
    return _session_of(_config(request), request.cookies.get(COOKIE))


def end_session(request: Request, response: Response) -> None:
    response.delete_cookie(COOKIE, path=mount_root(request) or "/", httponly=True, samesite="strict")


def _csrf_subject(request: Request) -> str | None:
    """What a CSRF token is bound to: the session (its random id), or the host-authenticated operator."""
    session = session_of(request)
    if session is not None:
        return f"session:{session.sid}"
    operator = operator_of(request)
    if operator is not None and getattr(request.state, "auth_via", None) == "host":
        return f"host:{operator}"
    return None


def csrf_token(request: Request) -> str:
    """A CSRF token for a form on this page: bound to the session and expiring (`CSRF_TTL_S`)."""
    config = _config(request)
    subject = _csrf_subject(request) or "nobody"
    expires = int(config.clock()) + config.csrf_ttl_s
    return f"{expires}.{config.sign('csrf', f'{subject}:{expires}')}"


def csrf_refusal(request: Request, token: str | None) -> str | None:
    """None when `token` is a valid CSRF token for this request's session; else why not (for a 403)."""
    config = _config(request)
    subject = _csrf_subject(request)
    if subject is None:
        return "Not signed in: sign in again, then repeat the action."
    if not token or "." not in token:
        return "The form's security token is missing: reload the page and try again. Nothing was changed."
    expires, signature = token.split(".", 1)
    if not expires.isdigit() or not config.signed("csrf", f"{subject}:{expires}", signature):
        return "The form's security token is not valid: reload the page and try again. Nothing was changed."
    if int(expires) <= config.clock():
        return "The form's security token has expired: reload the page and try again. Nothing was changed."
    return None


# -- the middleware ---------------------------------------------------------------------------


class ConsoleAuth:
    """Let a request through only with an operator; `/static/*` and `/login` are open. Without one, a
    browser page request is sent to the login page, anything else gets 401 with a JSON error."""

    def __init__(self, app: ASGIApp, config: AuthConfig, signed_out: Callable[[str], Awaitable[bool]]) -> None:
        self.app = app
        self.config = config
        self.signed_out = signed_out  # whether a session was signed out (`Console.signed_out`: the store)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        root = mount_root(request)
        path = scope["path"][len(root) :] if scope["path"].startswith(root) else scope["path"]
        if path.startswith("/static/"):  # open, and nobody needs to be known for it
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        try:
            state["operator"], state["auth_via"] = await self._identify(request)
        except StoreUnavailable:  # a session cookie is checked against the store's sign-outs
            await self._unavailable(request, path)(scope, receive, send)
            return
        if state["operator"] is None and path != "/login":
            await self._refuse(request, path)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _identify(self, request: Request) -> tuple[str | None, str | None]:
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() == "bearer":
            operator = clean_name(request.headers.get(OPERATOR_HEADER)) or "api"
            if self.config.token_matches(given.strip()):
                return operator, "bearer"
            if self.config.token is not None and given.strip():  # a guess at the token (not another app's Bearer)
                _refused(request, operator, "api")
            return None, None  # a wrong token is never helped by a cookie
        if self.config.operator is not None:
            found = self.config.operator(request)
            if isinstance(found, Awaitable):
                found = await found
            if found:
                return clean_name(str(found)) or "operator", "host"
        session = _session_of(self.config, request.cookies.get(COOKIE))
        if session is not None and not await self.signed_out(session.sid):
            return session.operator, "session"
        return None, None

    @staticmethod
    def _wants_a_page(request: Request, path: str) -> bool:
        return (
            request.method in ("GET", "HEAD")
            and "text/html" in request.headers.get("accept", "")
            and not path.startswith("/api/")
        )

    def _unavailable(self, request: Request, path: str) -> Response:
        if self._wants_a_page(request, path):
            return PlainTextResponse(StoreUnavailable.MESSAGE, status_code=503)
        return json_error(503, "store_unavailable", StoreUnavailable.MESSAGE)

    def _refuse(self, request: Request, path: str) -> Response:
        if self._wants_a_page(request, path):
            target = path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"{mount_root(request)}/login?next={quote(target, safe='')}", status_code=303)
        bearer = request.headers.get("authorization", "").lower().startswith("bearer ")
        message = (
            "the operator token is wrong (MCP_TASKS_CONSOLE_TOKEN)"
            if bearer
            else "sign in: send Authorization: Bearer <MCP_TASKS_CONSOLE_TOKEN>, or log in at /login"
        )
        response = json_error(401, "unauthorized", message)
        response.headers["WWW-Authenticate"] = 'Bearer realm="celery-mcp-tasks console"'
        return response
