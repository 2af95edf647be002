"""The console's pages over a real SQLite store (Starlette's TestClient, the console's own app).

What a page must never do: show a task id (the store has none, and the tests check every page
for the ids the service handed out), show a payload before a confirmed reveal, or change
anything on a POST without a valid CSRF token. What it must do: render every page, escape what
jobs wrote, carry a CSRF field in every form that changes something, say which filter field is
wrong, and answer a lost race with a clear 409 and nothing changed.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from starlette.testclient import TestClient

from celery_mcp_tasks.console.app import NO_LIFESPAN, create_app, serving
from celery_mcp_tasks.console.auth import COOKIE, AuthConfig
from celery_mcp_tasks.console.context import AUDIT_LOGGER, Console
from celery_mcp_tasks.console.pages import chart_of
from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.model import TaskRecord, now_ms
from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.store.base import ANY
from celery_mcp_tasks.store.rows import owner_label
from celery_mcp_tasks.store.sql import SqlStore
from tests.builders import SendOnly

TOKEN = "pages-test-token"
OWNER = "sub:https%3A%2F%2Fissuer.example:alice-subject-7731"
SECRET_ARGUMENT = "argument-only-the-client-knows"
HOSTILE = '<script>alert("x")</script> & "quotes"'


class Deployment:
    """A store with a few tasks, the console over it, and the task ids the service handed out."""

    def __init__(self, tmp: Path, *, payloads: bool = False) -> None:
        url = f"sqlite:///{tmp / 'tasks.db'}"
        upgrade(url)
        self.store = SqlStore.from_url(url)
        self.service = TaskService(self.store, dispatcher=SendOnly(lambda record: None))
        self.ids: dict[str, str] = {}
        self.console = Console(
            self.service,
            hub=None,
            queue_of=lambda record: "celery",
            terminable=lambda tool: tool == "slow",
            stale_timeout_s=60,
            payloads_allowed=payloads,
            tools=lambda: ["slow", "quick"],
        )

    def add(self, name: str, *, tool: str = "slow", owner: str | None = OWNER, message: str | None = None) -> str:
        task_id, record = self.service.create(
            owner=owner, tool=tool, arguments={"secret": SECRET_ARGUMENT, "n": 1}, status_message=message
        )
        self.ids[name] = task_id
        return record.key

    def get(self, key: str) -> TaskRecord:
        record = self.store.get(key)
        assert record is not None
        return record


def console_app(deployment: Deployment) -> Any:
    return create_app(deployment.console, AuthConfig(token=TOKEN))


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    running = Deployment(tmp_path)
    yield running
    running.store.dispose()


def signed_in(deployment: Deployment, name: str = "ada") -> TestClient:
    client = TestClient(console_app(deployment), base_url="http://console.test", follow_redirects=False)
    response = client.post("/login", data={"name": name, "token": TOKEN, "next": "/tasks"})
    assert response.status_code == 303, response.text
    return client


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "no CSRF field in the page"
    return found.group(1)


def assert_no_task_id(deployment: Deployment, *pages: str) -> None:
    for page in pages:
        for name, task_id in deployment.ids.items():
            assert task_id not in page, f"the task id of {name!r} is in a page"
        assert SECRET_ARGUMENT not in page, "a payload is in a page before any reveal"
        assert "alice-subject-7731" not in page, "a raw owner subject is in a page"


# -- signing in ------------------------------------------------------------------------------------


def test_nothing_is_served_before_signing_in_but_the_form_and_the_static_files(deployment: Deployment) -> None:
    client = TestClient(console_app(deployment), follow_redirects=False)
    for path in ("/", "/tasks", f"/tasks/{'0' * 64}"):
        response = client.get(path, headers={"Accept": "text/html"})
        assert response.status_code == 303, (path, response.status_code)
        assert "/login?next=" in response.headers["location"], response.headers["location"]
    assert client.get("/login").status_code == 200
    css = client.get("/static/console.css")
    assert css.status_code == 200 and "light-dark(" in css.text
    assert client.get("/static/live.js").status_code == 200


def test_a_wrong_token_is_refused_and_the_right_one_sets_a_strict_httponly_cookie(
    deployment: Deployment, caplog: pytest.LogCaptureFixture
) -> None:
    client = TestClient(console_app(deployment), follow_redirects=False)
    with caplog.at_level(logging.WARNING, logger="celery_mcp_tasks.console.audit"):
        wrong = client.post("/login", data={"name": "ada", "token": "guess-one", "next": "/"})
        forged = {"Authorization": "Bearer guess-two", "X-Console-Operator": "bot outcome=ok"}
        api = client.get("/api/overview", headers=forged)
        empty = client.get("/api/overview", headers={"Authorization": "Bearer "})  # no guess: not a line
    assert wrong.status_code == 401 and api.status_code == 401 and empty.status_code == 401
    assert "Wrong operator token." in wrong.text
    refused = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert refused == [  # for whoever watches for a guess at the token; never the token itself
        "operator=ada action=sign-in outcome=refused (wrong operator token) client=testclient",
        "operator=bot_outcome_ok action=api outcome=refused (wrong operator token) client=testclient",
    ]
    assert "set-cookie" not in wrong.headers
    bad_name = client.post("/login", data={"name": "ada\nforged=1", "token": TOKEN, "next": "/"})
    assert bad_name.status_code == 400
    right = client.post("/login", data={"name": "ada", "token": TOKEN, "next": "https://elsewhere.example/"})
    assert right.status_code == 303
    assert right.headers["location"] == "/", "a sign-in never sends the browser to another site"
    cookie = right.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    assert TOKEN not in right.headers["set-cookie"]
    page = client.get("/")
    assert page.status_code == 200
    assert '<strong class="operator">ada</strong>' in page.text


# -- the pages --------------------------------------------------------------------------------------


def test_every_page_renders_escaped_with_csrf_fields_and_no_task_id(deployment: Deployment) -> None:
    hostile = deployment.add("hostile", message=HOSTILE)
    quick = deployment.add("quick", tool="quick", owner=None)
    client = signed_in(deployment)

    overview = client.get("/")
    assert overview.status_code == 200
    assert overview.text.count("<polyline") == 3
    assert 'data-status-count="working">2<' in overview.text
    assert overview.headers["content-security-policy"].startswith("default-src 'self'")
    # each owner's active tasks, by its label, linked to its list
    (link,) = re.findall(rf'<a href="([^"]+)"><bdi>{re.escape(owner_label(OWNER))}</bdi></a>', overview.text)
    owned = client.get(link.replace("&amp;", "&"))
    assert f'href="/tasks/{hostile}"' in owned.text and f'href="/tasks/{quick}"' not in owned.text

    listing = client.get("/tasks")
    assert listing.status_code == 200
    assert f'href="/tasks/{hostile}">{hostile[:12]}</a>' in listing.text
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; &#34;quotes&#34;" in listing.text
    assert "<script>alert" not in listing.text
    assert "anonymous" in listing.text and "sub:https%3A%2F%2Fissuer.example" in listing.text

    task = client.get(f"/tasks/{hostile}")
    assert task.status_code == 200
    assert "&lt;script&gt;alert" in task.text and "<script>alert" not in task.text
    for form in re.findall(r"<form[^>]*method=\"post\".*?</form>", task.text, flags=re.S):
        assert 'name="csrf" value="' in form, form
    assert "action-cancel" in task.text and "action-delete" not in task.text
    assert "MCP_TASKS_CONSOLE_PAYLOADS=on" in task.text  # payloads off: said, not offered

    confirm = client.post(f"/tasks/{hostile}/cancel", data={"csrf": csrf_of(task.text)})
    assert confirm.status_code == 200 and "Yes, cancel" in confirm.text
    row = client.get(f"/tasks/{hostile}/row")
    assert row.status_code == 200 and row.text.lstrip().startswith("<tr")

    assert_no_task_id(deployment, overview.text, listing.text, task.text, confirm.text, row.text)


def test_the_chart_scales_to_the_busiest_minute(deployment: Deployment) -> None:
    for index in range(3):
        deployment.add(f"t{index}")
    overview = deployment.store.overview(now_ms())
    chart = chart_of(overview)
    assert chart.peak == 3
    created = [tuple(map(float, point.split(","))) for point in chart.series["created"].split()]
    assert len(created) == 60
    assert min(y for _, y in created) == chart.top  # the busiest minute reaches the top
    assert "3 created" in chart.summary


def test_filters_page_by_keyset_and_bad_values_name_their_field(deployment: Deployment) -> None:
    keys = [deployment.add(f"t{index}", tool="quick" if index % 2 else "slow") for index in range(5)]
    client = signed_in(deployment)

    slow = client.get("/tasks", params={"tool": "slow"})
    assert sorted(re.findall(r'data-key="([0-9a-f]{64})"', slow.text)) == sorted(keys[0::2])

    seen: list[str] = []
    url: str | None = "/tasks?limit=2"
    while url is not None:
        page = client.get(url)
        assert page.status_code == 200
        seen += re.findall(r'data-key="([0-9a-f]{64})"', page.text)
        found = re.search(r'<a href="([^"]+)" rel="next">', page.text)
        url = found.group(1).replace("&amp;", "&") if found else None
    assert sorted(seen) == sorted(keys) and len(seen) == len(set(seen))

    both = client.get("/tasks", params=[("status", "working"), ("status", "failed")])
    assert both.status_code == 200 and 'value="failed" checked' in both.text

    for params, field in (
        ({"status": "sleeping"}, "status"),
        ({"min_age": "soon"}, "min_age"),
        ({"sort": "sideways"}, "sort"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"owner": "alice"}, "owner"),
    ):
        refused = client.get("/tasks", params=params)
        assert refused.status_code == 400, params
        assert f'<p class="error" role="alert">{field}: ' in refused.text, refused.text

    assert client.get("/tasks/not-a-key").status_code == 404
    assert client.get(f"/tasks/{'a' * 64}").status_code == 404


def test_the_row_fragment_follows_the_lists_filter(deployment: Deployment) -> None:
    key = deployment.add("t", tool="slow")
    client = signed_in(deployment)
    row = client.get(f"/tasks/{key}/row", params={"tool": "slow", "status": "working"})
    assert row.status_code == 200
    assert "frame-ancestors 'none'" in row.headers["content-security-policy"]  # as every page: defence in depth
    assert row.headers["x-content-type-options"] == "nosniff"
    assert client.get(f"/tasks/{key}/row", params={"tool": "quick"}).status_code == 204
    assert client.get(f"/tasks/{key}/row", params={"status": "completed"}).status_code == 204
    assert client.get(f"/tasks/{key}/row", params={"q": "no such words"}).status_code == 204


# -- actions ---------------------------------------------------------------------------------------


def test_cancel_confirms_first_then_cancels_and_audits(
    deployment: Deployment, caplog: pytest.LogCaptureFixture
) -> None:
    key = deployment.add("t")
    client = signed_in(deployment, "grace")
    token = csrf_of(client.get(f"/tasks/{key}").text)

    asked = client.post(f"/tasks/{key}/cancel", data={"csrf": token, "terminate": "on"})
    assert asked.status_code == 200 and "also terminated" in asked.text
    assert 'name="terminate" value="on"' in asked.text
    assert deployment.get(key).status.value == "working", "asking to confirm changes nothing"

    with caplog.at_level(logging.INFO, logger=AUDIT_LOGGER):
        done = client.post(f"/tasks/{key}/cancel", data={"csrf": csrf_of(asked.text), "confirm": "yes"})
    assert done.status_code == 303 and done.headers["location"] == f"/tasks/{key}?done=cancel"
    assert deployment.get(key).status.value == "cancelled"
    assert f"operator=grace action=cancel row={key[:12]} outcome=cancelled" in caplog.text
    after = client.get(done.headers["location"])
    assert "The task is cancelled." in after.text and "action-delete" in after.text
    assert_no_task_id(deployment, caplog.text, after.text)


def test_a_forged_or_missing_csrf_token_is_refused_and_nothing_changes(deployment: Deployment) -> None:
    key = deployment.add("t")
    client = signed_in(deployment)
    other = signed_in(deployment, "mallory")
    foreign = csrf_of(other.get(f"/tasks/{key}").text)
    for data in ({"confirm": "yes"}, {"csrf": "forged", "confirm": "yes"}, {"csrf": foreign, "confirm": "yes"}):
        refused = client.post(f"/tasks/{key}/cancel", data=data)
        assert refused.status_code == 403, data
        assert "Refused" in refused.text
        assert deployment.get(key).status.value == "working"
    assert client.post("/logout", data={"csrf": "forged"}).status_code == 403


def test_a_forged_token_or_cookie_with_non_ascii_characters_is_refused_not_a_server_error(
    deployment: Deployment,
) -> None:
    key = deployment.add("t")
    client = signed_in(deployment)
    refused = client.post(f"/tasks/{key}/cancel", data={"csrf": "1.signé", "confirm": "yes"})
    assert refused.status_code == 403 and "Refused" in refused.text
    assert deployment.get(key).status.value == "working"
    forged = TestClient(console_app(deployment), base_url="http://console.test", follow_redirects=False)
    cookie = {"cookie": f"{COOKIE}=e30.signé".encode("latin-1")}  # a header's bytes, as a browser may send them
    assert forged.get("/api/overview", headers=cookie).status_code == 401
    page = forged.get("/tasks", headers=cookie)
    assert page.status_code == forged.get("/tasks").status_code == 401 and "sign in" in page.text


def test_a_cancel_that_lost_the_race_says_so_and_changes_nothing(deployment: Deployment) -> None:
    key = deployment.add("t")
    client = signed_in(deployment)
    token = csrf_of(client.get(f"/tasks/{key}").text)
    deployment.store.update(key, ANY, lambda r: r.completed({"content": []}, now_ms()))
    lost = client.post(f"/tasks/{key}/cancel", data={"csrf": token, "confirm": "yes"})
    assert lost.status_code == 409
    assert "The task is already completed; nothing changed" in lost.text
    assert deployment.get(key).status.value == "completed"


def test_delete_only_a_finished_task(deployment: Deployment) -> None:
    key = deployment.add("t")
    client = signed_in(deployment)
    token = csrf_of(client.get(f"/tasks/{key}").text)
    refused = client.post(f"/tasks/{key}/delete", data={"csrf": token, "confirm": "yes"})
    assert refused.status_code == 409 and deployment.store.get(key) is not None
    deployment.store.update(key, ANY, lambda r: r.failed({"message": "boom"}, now_ms()))
    page = client.get(f"/tasks/{key}")
    assert "boom" in page.text and "action-delete" in page.text
    done = client.post(f"/tasks/{key}/delete", data={"csrf": csrf_of(page.text), "confirm": "yes"})
    assert done.status_code == 303 and done.headers["location"] == "/tasks?done=delete"
    assert deployment.store.get(key) is None
    assert "The task is deleted." in client.get("/tasks?done=delete").text
    assert client.get(f"/tasks/{key}").status_code == 404


def test_payloads_show_only_after_a_confirmed_audited_reveal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    deployment = Deployment(tmp_path, payloads=True)
    try:
        key = deployment.add("t")
        client = signed_in(deployment, "ada")
        page = client.get(f"/tasks/{key}")
        assert SECRET_ARGUMENT not in page.text and "Reveal the payloads" in page.text
        asked = client.post(f"/tasks/{key}/reveal", data={"csrf": csrf_of(page.text)})
        assert SECRET_ARGUMENT not in asked.text and "Yes, reveal" in asked.text
        with caplog.at_level(logging.INFO, logger=AUDIT_LOGGER):
            shown = client.post(f"/tasks/{key}/reveal", data={"csrf": csrf_of(asked.text), "confirm": "yes"})
        assert shown.status_code == 200 and SECRET_ARGUMENT in shown.text
        assert f"operator=ada action=reveal row={key[:12]} outcome=revealed" in caplog.text
        assert SECRET_ARGUMENT not in client.get(f"/tasks/{key}").text, "a reveal is for that one answer only"
        assert deployment.ids["t"] not in shown.text
    finally:
        deployment.store.dispose()


def test_a_reveal_is_refused_while_payloads_are_off(deployment: Deployment) -> None:
    key = deployment.add("t")
    client = signed_in(deployment)
    token = csrf_of(client.get(f"/tasks/{key}").text)
    refused = client.post(f"/tasks/{key}/reveal", data={"csrf": token, "confirm": "yes"})
    assert refused.status_code == 403 and SECRET_ARGUMENT not in refused.text


def test_mounted_under_a_path_every_link_and_the_cookie_stay_under_it(deployment: Deployment) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    key = deployment.add("t")
    console = create_app(deployment.console, AuthConfig(token=TOKEN), mount_path="/ops/console")
    host = Starlette(routes=[Mount("/ops/console", app=console)], lifespan=lambda _: serving(deployment.console))
    with TestClient(host, base_url="http://host.test", follow_redirects=False) as client:
        sent = client.get(f"/ops/console/tasks/{key}", headers={"Accept": "text/html"})
        assert sent.status_code == 303 and sent.headers["location"].startswith("/ops/console/login?next=")
        form = client.get(sent.headers["location"])
        assert form.status_code == 200 and 'action="/ops/console/login"' in form.text
        assert 'href="/ops/console/static/console.css"' in form.text
        assert client.get("/ops/console/static/live.js").status_code == 200
        next_path = re.search(r'name="next" value="([^"]+)"', form.text)
        assert next_path is not None and next_path.group(1) == f"/tasks/{key}"

        signed = client.post("/ops/console/login", data={"name": "ada", "token": TOKEN, "next": next_path.group(1)})
        assert signed.status_code == 303 and signed.headers["location"] == f"/ops/console/tasks/{key}"
        assert "path=/ops/console" in signed.headers["set-cookie"].lower()
        page = client.get(signed.headers["location"])
        assert page.status_code == 200
        assert f'action="/ops/console/tasks/{key}/cancel"' in page.text
        assert 'data-root="/ops/console"' in page.text
        links = re.findall(r'(?:href|action)="(/[^"]*)"', page.text)
        assert links and all(link.startswith("/ops/console/") for link in links), links


def test_behind_a_proxy_that_strips_a_prefix_the_console_answers_where_the_app_mounts_it(
    deployment: Deployment,
) -> None:
    """`uvicorn --root-path /api/agents` behind a proxy that strips the prefix: the server's root path is outside
    the application, so `console_app(path="/console")` mounted at /console answers (its links under the whole
    prefix), and one mounted elsewhere is still refused (found in an audit behind haproxy: every page was 404)."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    console = create_app(deployment.console, AuthConfig(token=TOKEN), mount_path="/console")
    bearer = {"Authorization": f"Bearer {TOKEN}", "Accept": "text/html"}
    host = Starlette(
        routes=[Mount("/console", app=console), Mount("/elsewhere", app=console)],
        lifespan=lambda _: serving(deployment.console),
    )
    with TestClient(host, root_path="/api/agents", follow_redirects=False) as client:
        page = client.get("/api/agents/console/", headers=bearer)  # an ASGI path includes the root path

        assert page.status_code == 200, page.text
        assert 'data-root="/api/agents/console"' in page.text
        links = re.findall(r'(?:href|action)="(/[^"]*)"', page.text)
        assert links and all(link.startswith("/api/agents/console/") for link in links), links
        elsewhere = client.get("/api/agents/elsewhere/", headers=bearer)
        assert elsewhere.status_code == 404 and elsewhere.json()["error"]["code"] == "misplaced"


def test_a_root_path_given_with_its_slash_is_outside_the_mount_too() -> None:
    """`uvicorn --root-path /api/agents/`: Starlette then makes the mount's root path `/api/agents//console`."""
    from types import SimpleNamespace

    from celery_mcp_tasks.console.app import _MountGuard

    reached: list[str] = []

    async def console(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["root_path"])

    guard = _MountGuard(console, path="/console", console=SimpleNamespace(serving=True))  # type: ignore[arg-type]
    scope = {"type": "http", "root_path": "/api/agents//console", "app_root_path": "/api/agents/"}
    anyio.run(guard, scope, None, None)
    assert reached == ["/api/agents//console"]


def test_an_expired_form_is_refused_and_nothing_changes(deployment: Deployment) -> None:
    now = [1_000_000.0]
    config = AuthConfig(token=TOKEN, clock=lambda: now[0], csrf_ttl_s=600, session_ttl_s=3600)
    client = TestClient(create_app(deployment.console, config), follow_redirects=False)
    assert client.post("/login", data={"name": "ada", "token": TOKEN, "next": "/"}).status_code == 303
    key = deployment.add("t")
    token = csrf_of(client.get(f"/tasks/{key}").text)
    now[0] += 601  # the form is older than its token; the session still holds
    refused = client.post(f"/tasks/{key}/cancel", data={"csrf": token, "confirm": "yes"})
    assert refused.status_code == 403 and "expired" in refused.text
    assert deployment.get(key).status.value == "working"
    fresh = csrf_of(client.get(f"/tasks/{key}").text)  # a reload gives a form that works
    assert client.post(f"/tasks/{key}/cancel", data={"csrf": fresh, "confirm": "yes"}).status_code == 303
    assert deployment.get(key).status.value == "cancelled"


def test_the_docs_mounting_example_lets_in_only_whom_the_host_app_names(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from examples.guide import console_mounted

    user = SimpleNamespace(is_authenticated=True, display_name="grace")

    async def signed_in_host(scope: Any, receive: Any, send: Any) -> None:  # the host app's auth, in short
        await console_mounted.app({**scope, "user": user}, receive, send)

    # The example's own store (the default data dir) is not what this is about: its start-up checks pass as
    # `celery-mcp-tasks serve` would have run them (they are tests/test_start_refusals.py's).
    monkeypatch.setattr(console_mounted.tasks, "_checked_pid", os.getpid())
    with TestClient(console_mounted.app, follow_redirects=False) as nobody:  # runs tasks.lifespan
        assert nobody.get("/console/api/overview").status_code == 401
        assert nobody.get("/console/login").status_code == 200  # no operator: the token form (no token is set)
        host = TestClient(signed_in_host, follow_redirects=False)
        again = host.get("/console/login")
        assert again.status_code == 303 and again.headers["location"] == "/console/"


def test_mounted_in_an_app_without_its_lifespan_it_refuses_in_one_line_saying_what_to_pass(
    deployment: Deployment, caplog: pytest.LogCaptureFixture
) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    console = create_app(deployment.console, AuthConfig(token=TOKEN), mount_path="/console")
    forgotten = Starlette(routes=[Mount("/console", app=console)])  # no lifespan=tasks.lifespan
    with TestClient(forgotten, follow_redirects=False) as client:
        for path in ("/console/", "/console/api/overview", "/console/api/events"):
            refused = client.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
            assert refused.status_code == 503, path
            assert "lifespan=tasks.lifespan" in refused.json()["error"]["message"]
    assert [r.getMessage() for r in caplog.records if "lifespan=tasks.lifespan" in r.getMessage()] == [
        f"celery-mcp-tasks console: {NO_LIFESPAN}"
    ]  # logged once, not once per request

    remembered = Starlette(routes=[Mount("/console", app=console)], lifespan=lambda _: serving(deployment.console))
    with TestClient(remembered, follow_redirects=False) as client:
        assert client.get("/console/api/overview", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_signing_out_ends_the_session(deployment: Deployment) -> None:
    client = signed_in(deployment)
    cookie = client.cookies["mcp_tasks_console"]
    page = client.get("/")
    assert "Sign out" in page.text
    out = client.post("/logout", data={"csrf": csrf_of(page.text)})
    assert out.status_code == 303 and out.headers["location"] == "/login"
    assert 'mcp_tasks_console=""' in out.headers["set-cookie"] or "max-age=0" in out.headers["set-cookie"].lower()
    assert client.get("/", headers={"Accept": "text/html"}).status_code == 303
    # A copy of the cookie taken before is refused too (another console process: tests/console/test_api.py).
    replay = TestClient(console_app(deployment), base_url="http://console.test", follow_redirects=False)
    replay.cookies.set("mcp_tasks_console", cookie)
    assert replay.get("/", headers={"Accept": "text/html"}).status_code == 303
    assert replay.get("/api/overview").status_code == 401
    assert signed_in(deployment).get("/").status_code == 200  # signing in again is a new session


@pytest.mark.parametrize("ended_by", ["signing out", "expiry"])
def test_an_open_event_stream_ends_once_its_session_ends(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch, ended_by: str
) -> None:
    """The live list's stream looks again at each keep-alive (15 s; here 0.2 s) and ends once its session was
    signed out or ran out (the console's clock is driven), so a page left open stops following the store."""
    import time

    from celery_mcp_tasks.console import api

    monkeypatch.setattr(api, "KEEPALIVE_S", 0.2)
    now = [time.time()]
    with _served(deployment, AuthConfig(token=TOKEN, clock=lambda: now[0], session_ttl_s=3600)) as browser:
        root, cookie = str(browser.base_url).rstrip("/"), browser.cookies[COOKIE]
        with httpx.stream("GET", f"{root}/api/events", cookies={COOKIE: cookie}, timeout=10) as events:
            lines = events.iter_lines()
            assert next(lines).startswith("retry:")
            assert ": keep-alive" in [next(lines) for _ in range(4)]  # alive while signed in
            if ended_by == "expiry":
                now[0] += 3601
            else:
                page = browser.get("/", headers={"Accept": "text/html"})
                assert browser.post("/logout", data={"csrf": csrf_of(page.text)}).status_code == 303
            ended = time.monotonic()
            for _line in lines:  # ends by itself, at the next keep-alive or the one after (0.2-0.4 s)
                assert time.monotonic() - ended < 5, f"the stream went on after {ended_by}"
        assert httpx.get(f"{root}/api/events", cookies={COOKIE: cookie}, timeout=10).status_code == 401


def test_a_stream_signed_out_through_its_own_console_process_sends_no_change_after(deployment: Deployment) -> None:
    """Signed out through the console process that serves the stream, it ends at the next change, not at the
    next keep-alive (15 s): no task changed after the sign-out reaches it."""
    with _served(deployment, AuthConfig(token=TOKEN)) as browser:
        root, cookie = str(browser.base_url).rstrip("/"), browser.cookies[COOKIE]
        with httpx.stream("GET", f"{root}/api/events", cookies={COOKIE: cookie}, timeout=10) as events:
            lines = events.iter_lines()
            assert next(lines).startswith("retry:")
            deployment.add("before")
            assert next(line for line in lines if line.startswith("event:")) == "event: task"
            page = browser.get("/", headers={"Accept": "text/html"})
            assert browser.post("/logout", data={"csrf": csrf_of(page.text)}).status_code == 303
            deployment.add("after")
            assert [line for line in lines if line.startswith("event:")] == []  # ended, the change unsent


@contextmanager
def _served(deployment: Deployment, config: AuthConfig) -> Iterator[httpx.Client]:
    """The console app on uvicorn (its lifespan runs the live-update loop), in a thread: a client signed in."""
    import threading

    import uvicorn

    from tests.support import free_port, wait_until

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(deployment.console, config), port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 10, "the console to listen")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10, follow_redirects=False) as browser:
            assert browser.post("/login", data={"name": "ada", "token": TOKEN}).status_code == 303
            yield browser
    finally:
        server.should_exit = True
        thread.join(10)


def test_the_apis_answers_are_never_cached_and_its_audit_lines_name_only_row_keys(
    deployment: Deployment, caplog: pytest.LogCaptureFixture
) -> None:
    """Every JSON answer (a refusal too) says `no-store`; an action on text that is no row key (a task id pasted
    in its place, a line break) is a 404 whose audit line says `row=invalid`, never the text."""
    caplog.set_level(logging.INFO, AUDIT_LOGGER)
    key = deployment.add("t")
    client = signed_in(deployment)
    csrf = {"X-CSRF-Token": csrf_of(client.get(f"/tasks/{key}").text)}
    answers = [
        client.get("/api/overview"),
        client.get("/api/tasks"),
        client.get(f"/api/tasks/{key}"),
        client.get("/api/tasks?limit=oops"),
        client.post(f"/api/tasks/{key}/reveal", headers=csrf, json={}),
    ]
    assert [a.status_code for a in answers] == [200, 200, 200, 400, 403]
    assert {a.headers["cache-control"] for a in answers} == {"no-store"}
    task_id = deployment.ids["t"]
    for text in (task_id, "%0Aoperator%3Droot%20action%3Ddelete"):
        refused = client.post(f"/api/tasks/{text}/cancel", headers=csrf, json={})
        assert refused.status_code == 404 and refused.headers["cache-control"] == "no-store"
    lines = [r.getMessage() for r in caplog.records if r.name == AUDIT_LOGGER]
    assert lines[-2:] == ["operator=ada action=cancel row=invalid outcome=not_found"] * 2
    assert not any(task_id[:8] in line or "root" in line for line in lines)
    assert deployment.get(key).status.value == "working"


def test_with_the_store_unreachable_a_session_gets_a_readable_503_and_a_sign_out_says_it_failed(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery_mcp_tasks.store.base import StoreUnavailable

    client = signed_in(deployment)
    page = client.get("/")
    assert page.status_code == 200

    def unreachable(*_args: object, **_kwargs: object) -> bool:
        raise StoreUnavailable()

    monkeypatch.setattr(deployment.store, "signed_out", unreachable)
    monkeypatch.setattr(deployment.store, "sign_out", unreachable)
    shown = client.get("/tasks", headers={"Accept": "text/html"})
    assert shown.status_code == 503 and shown.text == StoreUnavailable.MESSAGE  # a page request: plain text
    assert client.get("/api/overview").json()["error"]["code"] == "store_unavailable"
    assert client.get("/static/console.css").status_code == 200  # static files never ask the store
    monkeypatch.setattr(deployment.store, "signed_out", lambda session: False)
    out = client.post("/logout", data={"csrf": csrf_of(page.text)})
    assert out.status_code == 503 and "you are still signed in" in out.text
    assert "mcp_tasks_console" in client.cookies  # the cookie is kept: the session was not ended


def test_while_the_store_is_unreachable_every_page_says_so_in_a_503_not_a_500(tmp_path: Path) -> None:
    """A real store whose server refuses connections (a PostgreSQL URL on a port nothing listens on): the
    pages answer as the API does, a 503 page naming the store, never an unhandled error."""
    from tests.support import free_port

    down = SqlStore.from_url(f"postgresql://postgres@127.0.0.1:{free_port()}/tasks")
    console = Console(
        TaskService(down, dispatcher=SendOnly(lambda record: None)),
        hub=None,
        queue_of=lambda record: "celery",
        terminable=lambda tool: False,
        stale_timeout_s=60,
        payloads_allowed=False,
        tools=lambda: ["slow"],
    )
    client = TestClient(create_app(console, AuthConfig(token=TOKEN)), base_url="http://console.test")
    try:
        for path in ("/", "/tasks", "/tasks?status=working", f"/tasks/{'a' * 64}", f"/tasks/{'a' * 64}/row"):
            page = client.get(path, headers={"Authorization": f"Bearer {TOKEN}", "Accept": "text/html"})
            assert page.status_code == 503, (path, page.status_code)
            assert "The task store is unavailable; try again in a moment." in page.text, path
    finally:
        down.dispose()
