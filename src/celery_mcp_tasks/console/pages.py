"""The console's web pages: server-rendered (Jinja2, autoescaped), readable without JavaScript (live.js keeps
them live). Rows are named by store key; payloads appear only after a confirmed, audited reveal.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import urlencode

import jinja2
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from celery_mcp_tasks.console import auth
from celery_mcp_tasks.console.context import (
    ACTIONS,
    DONE,
    KEY,
    Console,
    ConsoleError,
    ListQuery,
    NotFound,
    flat_query,
    form_of,
    parse_list_query,
)
from celery_mcp_tasks.model import now_ms
from celery_mcp_tasks.store.base import StoreUnavailable
from celery_mcp_tasks.store.rows import DEFAULT_LIMIT, DEFAULT_SORT, STATUS_NAMES, BadFilter, Overview, TaskDetail

_NAME: Final = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
SORT_LABELS: Final = (
    ("-created", "Newest first"),
    ("created", "Oldest first"),
    ("-updated", "Recently updated first"),
    ("updated", "Least recently updated first"),
)
_DONE: Final = {action: f"{words}." for action, words in DONE.items()}  # ?done=<action>: never text from the query
_CONFIRM: Final = {
    "cancel": ("Cancel", "The task becomes cancelled; its client sees that, and its running job is told to stop."),
    "resend": ("Re-send", "The job's message is sent to its queue again, as the janitor does for a lost job."),
    "delete": ("Delete", "The finished task's row is removed; its client then finds no such task."),
    "reveal": ("Reveal", "The task's arguments, answers and result are shown to you; an audit line names you."),
}
_EXPIRED: Final = "Refused: the form has expired or was not made here"
_CSP: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


# -- the template environment ------------------------------------------------------------------


def _iso(ms: int | None) -> str:
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _ago(ms: int | None) -> str:
    """How long ago (or how soon) `ms` is, as live.js writes it too."""
    if ms is None:
        return "never"
    seconds = round((now_ms() - ms) / 1000)
    future, seconds = seconds < 0, abs(seconds)
    if seconds < 5:
        return "just now"
    units = ((" d", 86400), (" h", 3600), (" min", 60), ("s", 1))
    text = next(f"{seconds // size}{unit}" for unit, size in units if seconds >= size)
    return f"in {text}" if future else f"{text} ago"


def _span(ms: int | None) -> str:
    """A duration: 1500 -> "1.5s", 90000 -> "90s", 1800000 -> "30 min", 86400000 -> "24 h"."""
    if ms is None:
        return ""
    seconds = ms / 1000
    for unit, size in ((" d", 86400), (" h", 3600), (" min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _number(value: float | None) -> str:
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}".rstrip("0")


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


_ENV: Final = jinja2.Environment(
    loader=jinja2.PackageLoader("celery_mcp_tasks.console", "templates"),
    autoescape=True,  # every template, whatever its name: a status message is the job's text
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_ENV.filters.update(iso=_iso, ago=_ago, span=_span, number=_number, pretty=_pretty)
TEMPLATES: Final = Jinja2Templates(env=_ENV)


# -- the chart --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Chart:
    """The per-minute chart's geometry, drawn by _chart.html (numbers only: nothing to escape)."""

    width: int
    height: int
    left: int
    top: int
    bottom: int
    peak: int
    series: dict[str, str]  # name -> polyline points
    ticks: list[tuple[float, str]]  # y, label
    marks: list[tuple[float, str]]  # x, label
    totals: dict[str, int]  # name -> the hour's sum
    summary: str


def chart_of(overview: Overview) -> Chart:
    width, height, left, right, top, bottom = 640, 180, 40, 8, 10, 22
    minutes = overview.per_minute
    peak = max([1, *(max(m.created, m.completed, m.failed) for m in minutes)])
    plot_w, plot_h = width - left - right, height - top - bottom
    step = plot_w / max(1, len(minutes) - 1)

    def y(value: int) -> float:
        return round(top + plot_h - plot_h * value / peak, 1)

    series = {
        name: " ".join(f"{round(left + i * step, 1)},{y(getattr(m, name))}" for i, m in enumerate(minutes))
        for name in ("created", "completed", "failed")
    }
    ticks = [(y(v), str(v)) for v in sorted({0, (peak + 1) // 2, peak})]
    marks = [(round(left + i * step, 1), label) for i, label in ((0, "60 min ago"), (30, "30 min ago"), (59, "now"))]
    totals = {name: sum(getattr(m, name) for m in minutes) for name in ("created", "completed", "failed")}
    summary = (
        f"In the last hour: {totals['created']} created, {totals['completed']} completed, "
        f"{totals['failed']} failed; at most {peak} in one minute."
    )
    return Chart(width, height, left, top, bottom, peak, series, ticks, marks, totals, summary)


# -- the list's query ---------------------------------------------------------------------------


def _list_href(root: str, query: ListQuery, cursor: str | None) -> str:
    params = dict(query.filter.query())
    if query.sort != DEFAULT_SORT:
        params["sort"] = query.sort
    if query.limit != DEFAULT_LIMIT:
        params["limit"] = str(query.limit)
    if cursor is not None:
        params["cursor"] = cursor
    return f"{root}/tasks" + (f"?{urlencode(params)}" if params else "")


# -- the pages ---------------------------------------------------------------------------------


class Pages:
    def __init__(self, console: Console) -> None:
        self.console = console

    # -- rendering

    def render(
        self, request: Request, template: str, page_name: str, status_code: int = 200, **context: Any
    ) -> Response:
        operator = auth.operator_of(request)
        response = TEMPLATES.TemplateResponse(
            request,
            template,
            {
                "root": auth.mount_root(request),
                "page_name": page_name,
                "operator": operator,
                "can_logout": operator is not None and auth.has_session(request),
                "csrf": auth.csrf_token(request) if operator is not None else "",
                "statuses": STATUS_NAMES,
                "payloads_allowed": self.console.payloads_allowed,
                "notice": None,
                "error": None,
                **context,
            },
            status_code=status_code,
        )
        return _guarded(response)

    def problem(
        self, request: Request, status_code: int, heading: str, message: str, back: str | None = "/tasks"
    ) -> Response:
        """An error page; `back`: a link to this page of the console."""
        back = None if back is None else auth.mount_root(request) + back
        return self.render(request, "error.html", "error", status_code, heading=heading, error=message, back=back)

    # -- GET pages

    async def overview(self, request: Request) -> Response:
        overview = await self.console.overview()
        return self.render(
            request, "overview.html", "overview", ov=overview, chart=chart_of(overview), quota=self.console.quota_active
        )

    async def tasks(self, request: Request) -> Response:
        root = auth.mount_root(request)
        try:
            flat, repeated = flat_query(request.query_params.multi_items()), None
        except BadFilter as exc:  # the form shows the last value of each
            flat, repeated = dict(request.query_params), exc
        context: dict[str, Any] = {
            "tools": self.console.tools,
            "sorts": SORT_LABELS,
            "notice": _DONE.get(request.query_params.get("done", "")),
            "rendered_at": now_ms(),
            "form": form_of(flat),
            "rows": [],
            "bad_field": None,
            "next_href": None,
            "first_href": None,
            "can_insert": False,
        }
        try:
            if repeated is not None:
                raise repeated
            query = parse_list_query(flat)
            page = await self.console.page(query)
        except BadFilter as exc:
            context.update(bad_field=exc.field, error=f"{exc.field}: {exc.message}")
            return self.render(request, "tasks.html", "tasks", 400, **context)
        context.update(
            form=query.form,
            rows=page.rows,
            next_href=_list_href(root, query, page.next_cursor) if page.next_cursor else None,
            first_href=_list_href(root, query, None) if query.cursor else None,
            can_insert=query.cursor is None and query.sort == "-created",
        )
        return self.render(request, "tasks.html", "tasks", **context)

    async def task(self, request: Request) -> Response:
        key = request.path_params["key"]
        notice = _DONE.get(request.query_params.get("done", ""))
        try:
            detail = await self.console.detail(key)
        except ConsoleError as exc:  # not found, or a prefix of several rows' keys
            title = "No such task" if isinstance(exc, NotFound) else "Which task?"
            return self.problem(request, exc.status, title, exc.message)
        return self.render(request, "task.html", "task", d=detail, notice=notice)

    async def row(self, request: Request) -> Response:
        """One list row for live.js: the <tr>, or 204 when the row is gone or the list's filter leaves it out."""
        key = request.path_params["key"]
        try:
            query = parse_list_query(flat_query(request.query_params.multi_items()))
        except BadFilter:
            return Response(status_code=204)
        row = await self.console.matching_row(key, query.filter)
        if row is None:
            return Response(status_code=204)
        return _guarded(TEMPLATES.TemplateResponse(request, "_row.html", {"r": row, "root": auth.mount_root(request)}))

    # -- POST: actions with a confirmation step

    async def act(self, request: Request) -> Response:
        key, action = request.path_params["key"], request.path_params["action"]
        root = auth.mount_root(request)
        form = await request.form()
        refusal = auth.csrf_refusal(request, str(form.get("csrf", "")))
        if refusal is not None:
            return self.problem(request, 403, _EXPIRED, refusal, back=f"/tasks/{key}")
        terminate = form.get("terminate") == "on"
        if form.get("confirm") != "yes":
            try:
                await self.console.detail(key)
            except NotFound as exc:
                return self.problem(request, 404, "No such task", exc.message)
            verb, explain = _CONFIRM[action]
            if terminate:
                explain += " Its running job is also terminated (killed where it runs)."
            return self.render(
                request,
                "confirm.html",
                "confirm",
                key=key,
                action=action,
                verb=verb,
                explain=explain,
                terminate=terminate,
            )
        try:
            result = await self.console.act(action, key, auth.operator_of(request), terminate)
        except ConsoleError as exc:
            return await self._refused(request, key, exc)
        if isinstance(result, TaskDetail):  # a reveal
            return self.render(request, "task.html", "task", d=result)
        target = f"{root}/tasks?done=delete" if result.row is None else f"{root}/tasks/{key}?done={action}"
        return RedirectResponse(target, status_code=303)

    async def _refused(self, request: Request, key: str, exc: ConsoleError) -> Response:
        """The task page again, saying why nothing changed (or a plain page when the task is gone)."""
        try:
            detail = await self.console.detail(key)
        except NotFound:
            return self.problem(request, exc.status, "Nothing changed", _nothing_changed(exc.message))
        return self.render(request, "task.html", "task", exc.status, d=detail, error=_nothing_changed(exc.message))

    # -- login / logout

    async def login(self, request: Request) -> Response:
        root = auth.mount_root(request)
        if request.method == "GET":
            if auth.operator_of(request) is not None:
                return RedirectResponse(_next(request.query_params.get("next"), root), status_code=303)
            wanted = request.query_params.get("next", "")
            return self.render(
                request, "login.html", "login", next_path=wanted if _next(wanted, "") == wanted else "/", name=""
            )
        form = await request.form()
        name, token = str(form.get("name", "")).strip(), str(form.get("token", ""))
        target = _next(str(form.get("next", "")), root)
        if not _NAME.fullmatch(name):
            status, name, error = 400, "", "Your name: 1 to 64 letters, digits or . _ @ - (it goes into the audit log)."
        elif not auth.token_ok(request, token, name):
            status, error = 401, "Wrong operator token."
        else:
            response = RedirectResponse(target, status_code=303)
            auth.start_session(request, response, name)
            return response
        return self.render(request, "login.html", "login", status, next_path=target, name=name, error=error)

    async def logout(self, request: Request) -> Response:
        form = await request.form()
        refusal = auth.csrf_refusal(request, str(form.get("csrf", "")))
        if refusal is not None:
            return self.problem(request, 403, _EXPIRED, refusal, back=None)
        session = auth.session_of(request)
        if session is not None:  # every console process refuses a copy of the cookie from now on
            try:
                await self.console.sign_out(session.sid, session.expires)
            except StoreUnavailable:
                return self.problem(request, 503, "Not signed out", _NOT_SIGNED_OUT, back="/")
        response = RedirectResponse(f"{auth.mount_root(request)}/login", status_code=303)
        auth.end_session(request, response)
        return response


_NOT_SIGNED_OUT = (
    "The task store is unreachable, so the sign-out could not be recorded: you are still signed in. Try again "
    "once the store is back."
)


def _nothing_changed(message: str) -> str:
    """A refusal as the page says it: the reason, and that nothing changed (said once)."""
    text = message[:1].upper() + message[1:]
    return text if "nothing changed" in text.lower() else f"{text}; nothing changed."


def _next(value: str | None, root: str) -> str:
    """Where to go after signing in: `value` is a path inside the console (the middleware's `next`, without
    the mount root); anything else (another site, `//host`) goes to the overview."""
    if value and value.startswith("/") and not value.startswith("//") and "\\" not in value:
        return f"{root}{value}"
    return f"{root}/"


def routes(console: Console) -> list[BaseRoute]:
    """The pages and the static files, for the console's Starlette app (console/app.py)."""
    pages = Pages(console)

    def guarded(endpoint: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        """A page whose store is unreachable: a 503 page saying so, as the API answers it (not a 500)."""

        async def page(request: Request) -> Response:
            try:
                return await endpoint(request)
            except StoreUnavailable:
                return pages.problem(
                    request, 503, "Store unavailable", f"{StoreUnavailable.MESSAGE}; try again in a moment."
                )

        return page

    def valid_key(endpoint: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        """404 for a path key that is not 64 hex digits (or an unknown action), before anything reads the store."""

        async def checked(request: Request) -> Response:
            action = request.path_params.get("action", ACTIONS[0])
            if not KEY.fullmatch(request.path_params["key"]) or action not in ACTIONS:
                return pages.problem(request, 404, "No such task", "A row key is 64 hex digits.")
            return await endpoint(request)

        return guarded(checked)

    return [
        Route("/", guarded(pages.overview), name="console:overview"),
        Route("/tasks", guarded(pages.tasks), name="console:tasks"),
        Route("/tasks/{key}", valid_key(pages.task), name="console:task"),
        Route("/tasks/{key}/row", valid_key(pages.row), name="console:row"),
        Route("/tasks/{key}/{action}", valid_key(pages.act), methods=["POST"], name="console:act"),
        Route("/login", guarded(pages.login), methods=["GET", "POST"], name="console:login"),
        Route("/logout", guarded(pages.logout), methods=["POST"], name="console:logout"),
        Mount("/static", StaticFiles(packages=[("celery_mcp_tasks.console", "static")]), name="console:static"),
    ]


def _guarded(response: Response) -> Response:
    """Every HTML answer's headers: the content policy (no frames, no foreign scripts), no sniffing, no caching."""
    response.headers["Content-Security-Policy"] = _CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["Cache-Control"] = "no-store"
    return response
