"""The console's JSON API over raw HTTP against a real deployment: a web process, a Celery worker and the
`console` process (embedded, and PostgreSQL + Redis when configured). Forged requests included."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from celery_mcp_tasks.console.auth import COOKIE, AuthConfig
from celery_mcp_tasks.model import task_key
from tests.support import Backend, Deployment, McpHttp, free_port, process_env, wait_until

pytestmark = pytest.mark.integration

APP = "examples.conformance.app"
TOKEN = "console-test-token-0123456789"


@pytest.fixture(scope="module")
def deployment(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Deployment, str]]:
    with Deployment(APP, backend, tmp_path_factory.mktemp(f"console-{backend.name}")) as deployment:
        deployment.web()
        deployment.worker()
        yield deployment, deployment.console(TOKEN)


@pytest.fixture
def api(deployment: tuple[Deployment, str]) -> Iterator[httpx.Client]:
    _, root = deployment
    with httpx.Client(base_url=root, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10) as client:
        yield client


@pytest.fixture
def mcp(deployment: tuple[Deployment, str]) -> Iterator[McpHttp]:
    http = McpHttp(deployment[0].url)
    yield http
    http.close()


def _status(api: httpx.Client, key: str) -> str:
    return str(api.get(f"/api/tasks/{key}").json()["status"])


def test_the_console_refuses_to_start_without_a_token_naming_the_setting(backend: Backend) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "celery_mcp_tasks.cli", "console", APP, "--port", str(free_port())],
        env=process_env(backend),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "MCP_TASKS_CONSOLE_TOKEN" in done.stderr


def test_no_token_or_a_wrong_one_is_refused(deployment: tuple[Deployment, str]) -> None:
    _, root = deployment
    for headers in [{}, {"Authorization": "Bearer wrong-token-wrong-token"}, {"Authorization": "Basic eDp5"}]:
        reply = httpx.get(f"{root}/api/tasks", headers=headers, timeout=10)
        assert reply.status_code == 401 and reply.json()["error"]["code"] == "unauthorized"
    cookie = {COOKIE: "eyJvcCI6ImV2ZSJ9.0000"}  # a forged session cookie
    assert httpx.get(f"{root}/api/tasks", cookies=cookie, timeout=10).status_code == 401


def test_a_bad_filter_cursor_or_limit_is_a_400_naming_the_field(api: httpx.Client) -> None:
    for query, field in [
        ("status=running", "status"),
        ("min_age=soon", "min_age"),
        ("cursor=not-a-cursor", "cursor"),
        ("sort=name", "sort"),
        ("limit=100000", "limit"),
    ]:
        reply = api.get(f"/api/tasks?{query}")
        assert reply.status_code == 400, query
        assert reply.json()["error"]["field"] == field and reply.json()["error"]["message"]
    assert api.get("/api/tasks/" + "0" * 64).status_code == 404


def _cursor(value: object, sort: str = "-created") -> str:
    raw = json.dumps([sort, value, "a" * 64]).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def test_a_query_no_store_can_take_is_a_400_naming_the_field_not_a_500_or_503(api: httpx.Client) -> None:
    """A cursor past 64 bits (SQLite overflowed, PostgreSQL answered "bigint out of range"), a NUL in a text
    filter (PostgreSQL refuses it in any text) and a parameter given twice (only the last used to count)."""
    for params, field in [
        ([("cursor", _cursor(2**63))], "cursor"),
        ([("cursor", _cursor(-(2**70)))], "cursor"),
        ([("tool", "a\x00b")], "tool"),
        ([("q", "a\x00b")], "q"),
        ([("owner", "anonymous\x00")], "owner"),
        ([("tool", "slow_compute"), ("tool", "other")], "tool"),
        ([("limit", "5"), ("limit", "500")], "limit"),
    ]:
        reply = api.get("/api/tasks", params=params)
        assert reply.status_code == 400, params
        assert reply.json()["error"]["field"] == field and reply.json()["error"]["message"], params
    assert api.get("/api/tasks", params={"cursor": _cursor(2**63 - 1)}).status_code == 200  # the largest is fine


def test_repeated_statuses_are_all_kept_as_the_pages_checkboxes_send_them(api: httpx.Client) -> None:
    reply = api.get("/api/tasks", params=[("status", "working"), ("status", "failed")])
    assert reply.status_code == 200
    assert set(reply.json()["filter"]["status"].split(",")) == {"working", "failed"}


def test_a_body_nested_too_deep_or_a_cookie_expiring_at_infinity_is_refused_not_a_500(
    deployment: tuple[Deployment, str], api: httpx.Client
) -> None:
    _, root = deployment
    deep = api.post(
        f"/api/tasks/{'0' * 64}/cancel", content=b"[" * 100_000, headers={"Content-Type": "application/json"}
    )
    assert deep.status_code == 400 and deep.json()["error"]["field"] == "body"
    config = AuthConfig(token=TOKEN)
    body = base64.urlsafe_b64encode(b'{"op": "eve", "sid": "s1", "exp": Infinity}').rstrip(b"=").decode()
    forever = {COOKIE: f"{body}.{config.sign('session', body)}"}
    assert httpx.get(f"{root}/api/tasks", cookies=forever, timeout=10).status_code == 401


def test_a_cancel_whose_terminate_is_not_a_yes_or_no_is_a_400_and_nothing_changes(
    api: httpx.Client, mcp: McpHttp
) -> None:
    task_id = mcp.create("slow_compute", {"seconds": 60})
    key = task_key(task_id)
    for body in ({"terminate": "yes please"}, {"terminate": "false-ish"}, {"terminate": 1}, {"terminate": None}):
        reply = api.post(f"/api/tasks/{key}/cancel", json=body)
        assert reply.status_code == 400, body
        assert reply.json()["error"] == {
            "code": "bad_filter",
            "field": "terminate",
            "message": "terminate must be true or false",
        }
    assert mcp.get(task_id)["status"] == "working"
    cancelled = api.post(f"/api/tasks/{key}/cancel", data={"terminate": "off"})  # a form's "off": no
    assert cancelled.status_code == 200 and cancelled.json()["outcome"] == "cancelled"


def test_a_task_appears_live_is_listed_shown_and_cancelled_without_its_id_anywhere(
    api: httpx.Client, mcp: McpHttp
) -> None:
    seen: list[dict[str, object]] = []
    opened = threading.Event()

    def listen() -> None:
        with api.stream("GET", "/api/events", timeout=httpx.Timeout(10, read=30)) as stream:
            opened.set()
            event = None
            for line in stream.iter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event == "task":
                    seen.append(json.loads(line[6:]))
                    if seen[-1]["tool"] == "slow_compute" and seen[-1]["status"] == "cancelled":
                        return

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert opened.wait(10)
    task_id = mcp.create("slow_compute", {"seconds": 60})
    key = task_key(task_id)
    wait_until(lambda: any(e["key"] == key for e in seen), 20, "the new task on the event stream")
    listed = api.get("/api/tasks", params={"tool": "slow_compute", "status": "working"}).json()
    assert key in [row["key"] for row in listed["rows"]]
    detail = api.get(f"/api/tasks/{key}").json()
    assert detail["celery_message_id"] and detail["queue"].startswith("mcp-test-")
    assert "arguments" not in detail and detail["row"] == key[:12]
    cancelled = api.post(f"/api/tasks/{key}/cancel", json={}, headers={"X-Console-Operator": "pat"})
    assert cancelled.status_code == 200 and cancelled.json()["row"]["status"] == "cancelled"
    assert mcp.get(task_id)["status"] == "cancelled"
    listener.join(20)
    assert any(e["key"] == key and e["status"] == "cancelled" for e in seen)
    everything = json.dumps([listed, detail, cancelled.json(), seen])
    assert task_id not in everything


def test_a_cancel_that_loses_the_race_to_completed_is_a_409_and_nothing_changes(
    api: httpx.Client, mcp: McpHttp
) -> None:
    task_id = mcp.create("slow_compute", {"seconds": 0})
    mcp.wait_for(task_id, "completed")
    key = task_key(task_id)
    before = api.get(f"/api/tasks/{key}").json()
    reply = api.post(f"/api/tasks/{key}/cancel", json={"terminate": False})
    assert reply.status_code == 409 and "completed" in reply.json()["error"]["message"]
    assert api.get(f"/api/tasks/{key}").json() == before


def _session_cookie(name: str = "eve") -> str:
    """A session cookie as the login form sets it (the test knows the token, as the operator does)."""
    import base64

    config = AuthConfig(token=TOKEN)
    body = (
        base64.urlsafe_b64encode(json.dumps({"op": name, "sid": "s1", "exp": int(time.time()) + 600}).encode())
        .rstrip(b"=")
        .decode()
    )
    return f"{body}.{config.sign('session', body)}"


def _csrf(expires: int, subject: str = "session:s1") -> str:
    return f"{expires}.{AuthConfig(token=TOKEN).sign('csrf', f'{subject}:{expires}')}"


def test_a_cookie_post_without_a_valid_csrf_token_is_403_and_changes_nothing(
    deployment: tuple[Deployment, str], api: httpx.Client, mcp: McpHttp
) -> None:
    _, root = deployment
    task_id = mcp.create("slow_compute", {"seconds": 60})
    key = task_key(task_id)
    wait_until(lambda: api.get(f"/api/tasks/{key}").status_code == 200, 10, "the task to be stored")
    now = int(time.time())
    with httpx.Client(base_url=root, cookies={COOKIE: _session_cookie()}, timeout=10) as browser:
        assert browser.get("/api/tasks").status_code == 200  # reading needs no CSRF token
        for headers in [
            {},
            {"X-CSRF-Token": "123.forged"},
            {"X-CSRF-Token": _csrf(now - 5)},  # expired
            {"X-CSRF-Token": _csrf(now + 600, subject="session:another")},  # another session's
        ]:
            reply = browser.post(f"/api/tasks/{key}/cancel", headers=headers, json={})
            assert reply.status_code == 403 and reply.json()["error"]["code"] == "csrf", headers
            assert (
                "Nothing was changed" in reply.json()["error"]["message"]
                or "sign in" in reply.json()["error"]["message"].lower()
            )
        assert _status(api, key) == "working"
        done = browser.post(f"/api/tasks/{key}/cancel", headers={"X-CSRF-Token": _csrf(now + 600)}, json={})
        assert done.status_code == 200 and _status(api, key) == "cancelled"


def test_the_cli_lists_shows_and_cancels(deployment: tuple[Deployment, str], mcp: McpHttp, tmp_path: Path) -> None:
    dep, root = deployment
    task_id = mcp.create("slow_compute", {"seconds": 60})
    key = task_key(task_id)
    env = process_env(dep.backend, MCP_TASKS_CONSOLE_TOKEN=TOKEN)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "celery_mcp_tasks.cli", "tasks", *args, "--url", root]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)

    wait_until(lambda: key[:12] in cli("ls", "--tool", "slow_compute").stdout, 10, "the task in `tasks ls`")
    listed = json.loads(cli("ls", "--status", "working", "--json").stdout)
    assert key in [row["key"] for row in listed["rows"]]
    shown = cli("show", key)
    assert shown.returncode == 0 and "slow_compute" in shown.stdout and task_id not in shown.stdout
    by_id = cli("show", task_id)  # what a user's ticket quotes: hashed in the command, never sent
    assert by_id.returncode == 0 and key in by_id.stdout and task_id not in by_id.stdout + by_id.stderr
    assert task_id not in dep.logs()
    mistyped = cli("show", task_id[:-1])  # neither a row key nor an id: refused before anything is sent
    assert mistyped.returncode == 2 and "neither a row key" in mistyped.stderr and task_id[:-1] not in mistyped.stderr
    bad = cli("ls", "--status", "running")
    assert bad.returncode == 2 and "status:" in bad.stderr
    assert cli("cancel", key).returncode == 0
    again = cli("cancel", key)
    assert again.returncode == 1 and "409" in again.stderr


def test_a_signed_out_session_cookie_is_refused_by_every_console_on_the_store(
    deployment: tuple[Deployment, str],
) -> None:
    """Signing out in one console process: a copy of the cookie is refused there and by another one."""
    import re

    running, root = deployment
    other = running.console(TOKEN, name="console-b")
    with httpx.Client(base_url=root, timeout=10, follow_redirects=False) as browser:
        assert browser.post("/login", data={"name": "ada", "token": TOKEN, "next": "/"}).status_code == 303
        cookie = browser.cookies[COOKIE]
        page = browser.get("/", headers={"Accept": "text/html"})
        found = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert page.status_code == 200 and found is not None
        for console in (root, other):
            assert httpx.get(f"{console}/api/overview", cookies={COOKIE: cookie}, timeout=10).status_code == 200
        assert browser.post("/logout", data={"csrf": found.group(1)}).status_code == 303
    for console in (root, other):
        refused = httpx.get(f"{console}/api/overview", cookies={COOKIE: cookie}, timeout=10)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
