"""The console's JSON API under `/api/` (the CLI and scripts use it): the overview, the task list and one task,
the actions (POST), and `/api/events` (Server-Sent Events). Errors are `{"error": {"code", "message", "field"?}}`,
and nothing changes on any error.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from celery_mcp_tasks.config import yes_no
from celery_mcp_tasks.console import auth
from celery_mcp_tasks.console.context import ACTIONS, Console, ConsoleError, flat_query, parse_list_query
from celery_mcp_tasks.store.base import StoreUnavailable
from celery_mcp_tasks.store.rows import BadFilter

KEEPALIVE_S = 15.0


def _guarded(
    handler: Callable[[Request, Console], Awaitable[Response]], console: Console
) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            response = await handler(request, console)
        except BadFilter as exc:
            response = auth.json_error(400, "bad_filter", exc.message, field=exc.field)
        except ConsoleError as exc:
            response = auth.json_error(exc.status, exc.outcome, exc.message)
        except StoreUnavailable:
            response = auth.json_error(503, "store_unavailable", StoreUnavailable.MESSAGE)
        response.headers.setdefault("Cache-Control", "no-store")  # an operator's answer: no cache keeps it
        return response

    return endpoint


async def _overview(request: Request, console: Console) -> Response:
    overview = await console.overview()
    sweep = overview.last_sweep
    return JSONResponse(
        {
            "now": overview.now_ms,
            "final_since": overview.final_since_ms,
            "by_status": overview.by_status,
            "by_tool": overview.by_tool,
            "per_minute": [m._asdict() for m in overview.per_minute],
            "oldest_working": overview.oldest_working and overview.oldest_working.as_json(),
            "oldest_input_required": overview.oldest_input_required and overview.oldest_input_required.as_json(),
            "last_sweep": sweep
            and {k: getattr(sweep, k) for k in ("swept_at", "duration_ms", "sweeps", "report", "read_at")},
            "lost_resent": overview.lost_resent,
            "lost_failed": overview.lost_failed,
            "by_owner": [counted._asdict() for counted in overview.by_owner],
            "owners_active": overview.owners_active,
            "quota_active": console.quota_active,
        }
    )


async def _tasks(request: Request, console: Console) -> Response:
    query = parse_list_query(flat_query(request.query_params.multi_items()))
    page = await console.page(query)
    return JSONResponse(
        {
            "rows": [row.as_json() for row in page.rows],
            "next_cursor": page.next_cursor,
            "sort": query.sort,
            "filter": query.filter.query(),
        }
    )


async def _task(request: Request, console: Console) -> Response:
    return JSONResponse((await console.detail(request.path_params["key"])).as_json())


async def _body(request: Request) -> dict[str, Any]:
    """A POST's fields: a JSON object or a form; an empty body is no fields."""
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind == "application/json":
        raw = await request.body()
        if not raw.strip():
            return {}
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            raise BadFilter("body", "the body is not JSON") from None
        if not isinstance(data, dict):
            raise BadFilter("body", "the body must be a JSON object")
        return data
    if kind in ("application/x-www-form-urlencoded", "multipart/form-data"):
        form = await request.form()
        return {name: value for name, value in form.items() if isinstance(value, str)}
    return {}


def _flag(fields: dict[str, Any], name: str) -> bool:
    """A yes/no field: JSON true/false, or a form's on/off, true/false, 1/0, yes/no (absent or empty: no)."""
    value = fields.get(name, False)
    if isinstance(value, str):
        value = yes_no(value) if value.strip() else False
    if isinstance(value, bool):
        return value
    raise BadFilter(name, f"{name} must be true or false")


def _action(name: str) -> Callable[[Request, Console], Awaitable[Response]]:
    async def handler(request: Request, console: Console) -> Response:
        fields = await _body(request)
        if getattr(request.state, "auth_via", None) != "bearer":  # a cookie (or host) session: CSRF
            token = request.headers.get(auth.CSRF_HEADER) or str(fields.get("csrf", ""))
            refusal = auth.csrf_refusal(request, token)
            if refusal is not None:
                return auth.json_error(403, "csrf", refusal)
        terminate = _flag(fields, "terminate")
        result = await console.act(name, request.path_params["key"], auth.operator_of(request), terminate)
        return JSONResponse(result.as_json())

    return handler


async def _events(request: Request, console: Console) -> Response:
    session = auth.session_of(request) if auth.has_session(request) else None

    async def signed_out() -> bool:
        """Whether the stream's session ended meanwhile: it expired, or was signed out (here or in another
        console process). A request under it would be refused now, so the stream ends too."""
        if session is None:
            return False
        if auth.session_of(request) is None:  # expired
            return True
        try:
            return await console.signed_out(session.sid)
        except StoreUnavailable:
            return False  # asked again at the next keep-alive

    async def stream() -> AsyncIterator[str]:
        yield f"retry: 2000\n: {console.subscriber_count + 1} open\n\n"
        asked = time.monotonic()
        async for change in console.events(idle_s=KEEPALIVE_S):
            if session is not None and console.signed_out_here(session.sid):
                return  # signed out through this process: not one change more
            if time.monotonic() - asked >= KEEPALIVE_S:  # through another process, or expired
                if await signed_out():
                    return  # the browser's reconnect is then refused
                asked = time.monotonic()
            if change is None:
                yield ": keep-alive\n\n"
                continue
            yield f"event: task\ndata: {change.data}\n\n"

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


def routes(console: Console) -> list[BaseRoute]:
    return [
        Route("/api/overview", _guarded(_overview, console), methods=["GET"]),
        Route("/api/tasks", _guarded(_tasks, console), methods=["GET"]),
        Route("/api/tasks/{key}", _guarded(_task, console), methods=["GET"]),
        *(Route(f"/api/tasks/{{key}}/{name}", _guarded(_action(name), console), methods=["POST"]) for name in ACTIONS),
        Route("/api/events", _guarded(_events, console), methods=["GET"]),
    ]
