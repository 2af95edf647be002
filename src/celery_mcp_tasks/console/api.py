"""The console's JSON API, under the console's root (the CLI and scripts use it; the pages share `Console`).

    GET  /api/overview
    GET  /api/tasks?status=&tool=&owner=&min_age=&max_age=&q=&sort=&cursor=&limit=
    GET  /api/tasks/{key}
    POST /api/tasks/{key}/cancel   (JSON or form body: {"terminate": true} optional)
    POST /api/tasks/{key}/resend | /delete | /reveal
    GET  /api/events               (Server-Sent Events: `event: task`, data a row as JSON)

Errors are `{"error": {"code", "message", "field"?}}`: 400 for a bad filter,
sort, cursor or limit (naming the query parameter), 401 without an operator,
403 for a missing, forged or expired CSRF token (a cookie-authenticated POST;
a bearer token needs none), 404, 409 when the task changed meanwhile or the
action does not apply, 503 when the store is unavailable. Nothing changes on
any error.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from celery_mcp_tasks.console import auth
from celery_mcp_tasks.console.context import ActionResult, Console, ConsoleError
from celery_mcp_tasks.store.base import StoreUnavailable
from celery_mcp_tasks.store.rows import BadFilter, Filter, Overview, parse_limit, parse_sort

__all__ = ["overview_json", "routes"]

KEEPALIVE_S = 15.0


def _error(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, **extra}}, status_code=status)


def overview_json(overview: Overview) -> dict[str, Any]:
    sweep = overview.last_sweep
    return {
        "now": overview.now_ms,
        "final_since": overview.final_since_ms,
        "by_status": overview.by_status,
        "by_tool": overview.by_tool,
        "per_minute": [m._asdict() for m in overview.per_minute],
        "oldest_working": None if overview.oldest_working is None else overview.oldest_working.as_json(),
        "oldest_input_required": (
            None if overview.oldest_input_required is None else overview.oldest_input_required.as_json()
        ),
        "last_sweep": None
        if sweep is None
        else {
            "swept_at": sweep.swept_at,
            "duration_ms": sweep.duration_ms,
            "sweeps": sweep.sweeps,
            "report": sweep.report,
            "read_at": sweep.read_at,
        },
        "lost_resent": overview.lost_resent,
        "lost_failed": overview.lost_failed,
    }


def _guarded(
    handler: Callable[[Request, Console], Awaitable[Response]], console: Console
) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request, console)
        except BadFilter as exc:
            return _error(400, "bad_filter", exc.message, field=exc.field)
        except ConsoleError as exc:
            return _error(exc.status, exc.outcome, exc.message)
        except StoreUnavailable:
            return _error(503, "store_unavailable", StoreUnavailable.MESSAGE)

    return endpoint


async def _overview(request: Request, console: Console) -> Response:
    return JSONResponse(overview_json(await console.overview()))


async def _tasks(request: Request, console: Console) -> Response:
    query = request.query_params
    filter = Filter.parse(query)
    sort = parse_sort(query.get("sort"))
    limit = parse_limit(query.get("limit"))
    cursor = (query.get("cursor") or "").strip() or None
    page = await console.page(filter, sort, cursor, limit)
    return JSONResponse(
        {
            "rows": [row.as_json() for row in page.rows],
            "next_cursor": page.next_cursor,
            "sort": sort,
            "filter": filter.query(),
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
        except ValueError:
            raise BadFilter("body", "the body is not JSON") from None
        if not isinstance(data, dict):
            raise BadFilter("body", "the body must be a JSON object")
        return data
    if kind in ("application/x-www-form-urlencoded", "multipart/form-data"):
        form = await request.form()
        return {name: value for name, value in form.items() if isinstance(value, str)}
    return {}


def _truthy(value: object) -> bool:
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("1", "true", "on", "yes")


def _action(name: str) -> Callable[[Request, Console], Awaitable[Response]]:
    async def handler(request: Request, console: Console) -> Response:
        fields = await _body(request)
        if getattr(request.state, "auth_via", None) != "bearer":  # a cookie (or host) session: CSRF
            token = request.headers.get(auth.CSRF_HEADER) or str(fields.get("csrf", ""))
            refusal = auth.csrf_refusal(request, token)
            if refusal is not None:
                return _error(403, "csrf", refusal)
        key = request.path_params["key"]
        operator = auth.operator_of(request)
        if name == "reveal":
            return JSONResponse((await console.reveal(key, operator)).as_json())
        result: ActionResult
        if name == "cancel":
            result = await console.cancel(key, operator, _truthy(fields.get("terminate", False)))
        elif name == "resend":
            result = await console.resend(key, operator)
        else:
            result = await console.delete(key, operator)
        return JSONResponse(
            {
                "action": result.action,
                "key": result.key,
                "outcome": result.outcome,
                "message": result.message,
                "row": None if result.row is None else result.row.as_json(),
            }
        )

    return handler


async def _events(request: Request, console: Console) -> Response:
    async def stream() -> AsyncIterator[str]:
        yield f"retry: 2000\n: {console.subscriber_count + 1} open\n\n"
        async for change in console.events(idle_s=KEEPALIVE_S):
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
        *(
            Route(f"/api/tasks/{{key}}/{name}", _guarded(_action(name), console), methods=["POST"])
            for name in ("cancel", "resend", "delete", "reveal")
        ),
        Route("/api/events", _guarded(_events, console), methods=["GET"]),
    ]
