"""The task console in a real browser: Debian's headless Chromium, driven by Playwright (Python).

A real deployment (the web process, a Celery worker, and the `celery-mcp-tasks console` process on
a port of its own), on the embedded backend and on PostgreSQL + Redis. An operator signs in; a client (the official SDK client
with the Tasks extension) starts a slow tool that reports progress; the row appears in the open list
without a reload; its page shows the progress bar moving; the operator cancels it there (through the
confirmation page); the list shows it `cancelled`, the client sees `cancelled` too, and the console's
log has the audit line. No page ever holds the task id.

Playwright comes from PyPI (the test extra) and launches /usr/bin/chromium (no browser download);
without Chromium the test skips (fails under MCP_TASKS_TEST_REQUIRE_TOOLS=1). With
MCP_TASKS_TEST_SCREENSHOTS=1 it writes the documentation's screenshots (docs/img/console-*.png).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import pytest

from celery_mcp_tasks.model import task_key
from tests.support import ROOT, Backend, Deployment, Proc, free_port, port_open, process_env, spawn, tool, wait_until

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"  # Debian's `chromium` package
TOKEN = "console-test-token-5f0c"  # the operator token of this test's console (a test value, not a secret)
OPERATOR = "ada"
SHOTS = ROOT / "docs" / "img"
WRITE_SHOTS = os.environ.get("MCP_TASKS_TEST_SCREENSHOTS", "") not in ("", "0")
APP = "tests.apps.interop_app"  # count_up(steps, pause) reports "step i of n" with numeric progress


def start_console(deployment: Deployment, **extra: str) -> tuple[Proc, str]:
    """`celery-mcp-tasks console APP --port P` beside the deployment (same store, broker and queue)."""
    port = free_port()
    proc = spawn(
        "console",
        [sys.executable, "-m", "celery_mcp_tasks.cli", "console", deployment.app, "--port", str(port)],
        process_env(deployment.backend, **deployment.env(MCP_TASKS_CONSOLE_TOKEN=TOKEN, **extra)),
        deployment.log_dir,
    )
    deployment.procs.append(proc)
    wait_until(lambda: port_open(port) or proc.popen.poll() is not None, 60, "the console to listen")
    if proc.popen.poll() is not None:
        raise RuntimeError(f"the console exited:\n{proc.text()}")
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def deployment(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Deployment, Proc, str]]:
    """Embedded (SQLite, the filesystem broker: hints by polling) and PostgreSQL + Redis (LISTEN/NOTIFY)."""
    with Deployment(APP, backend, tmp_path_factory.mktemp(f"console-logs-{backend.name}")) as running:
        running.web()
        running.worker()
        console, url = start_console(running)
        yield running, console, url


def sign_in(page: Any, console_url: str) -> None:
    """Sign in with the token form and wait for the overview (a click returns before the page it leads to loads)."""
    page.goto(f"{console_url}/login")
    page.fill("input[name=name]", OPERATOR)
    page.fill("input[name=token]", TOKEN)
    page.click("form.login button[type=submit]")
    page.wait_for_url(re.compile(r".*/$"))


def start_task(url: str, tool_name: str, arguments: dict[str, Any]) -> str:
    """Start a task with the official SDK client and the Tasks extension; return its id (the client's secret)."""
    from mcp import Client

    from celery_mcp_tasks.client import TasksClient

    async def scenario() -> str:
        tasks = TasksClient()
        async with Client(url, extensions=[tasks]) as client:
            with anyio.fail_after(60):
                handle = await tasks.start(client, tool_name, arguments)
                assert handle.id is not None, "the tool answered at once: no task"
                handle.close()  # the server keeps the task; this client stops following it
                return handle.id

    with ThreadPoolExecutor(1) as pool:  # its own thread: Playwright's sync API owns this one's event loop
        return pool.submit(anyio.run, scenario).result(timeout=90)


def task_status(url: str, task_id: str) -> str:
    """The task's status as its client sees it (SDK client, `attach`)."""
    from mcp import Client

    from celery_mcp_tasks.client import TasksClient

    async def scenario() -> str:
        tasks = TasksClient()
        async with Client(url, extensions=[tasks]) as client:
            with anyio.fail_after(30):
                handle = await tasks.attach(client, task_id)
                status = handle.status
                handle.close()
                return status

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(anyio.run, scenario).result(timeout=60)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    executable = tool("chromium", "Debian: apt-get install chromium", path=CHROMIUM)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:  # pragma: no cover - the test extra installs it
        pytest.fail("the `playwright` package is missing: pip install -e '.[test]'")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True)
        try:
            yield browser
        finally:
            browser.close()


class Shots:
    """Screenshots: into docs/img/console-NAME.png with MCP_TASKS_TEST_SCREENSHOTS=1, else beside the test's logs."""

    def __init__(self, fallback: Path, backend: Backend) -> None:
        self.folder = SHOTS if WRITE_SHOTS and backend.name == "embedded" else fallback
        self.folder.mkdir(parents=True, exist_ok=True)

    def take(self, page: Any, name: str, *, full_page: bool = False) -> None:
        page.screenshot(path=str(self.folder / f"console-{name}.png"), full_page=full_page)


def test_an_operator_follows_a_task_live_and_cancels_it_from_its_page(
    deployment: tuple[Deployment, Proc, str], chromium: Any, tmp_path: Path
) -> None:
    running, console, console_url = deployment
    shots = Shots(tmp_path / "shots", running.backend)
    seen_html: list[str] = []
    context = chromium.new_context(viewport={"width": 1280, "height": 860}, color_scheme="light")
    page = context.new_page()
    page.set_default_timeout(30_000)
    console_errors: list[str] = []
    page.on("console", lambda message: message.type == "error" and console_errors.append(message.text))
    failed: list[str] = []  # a request the pages made that the console refused (the sign-in's own 401 aside)
    page.on(
        "response", lambda r: r.status >= 400 and r.request.method == "GET" and failed.append(f"{r.status} {r.url}")
    )
    for steps in (2, 3):  # finished tasks beside the one this test follows
        start_task(running.url, "count_up", {"steps": steps, "pause": 0.05})
    try:
        # Not signed in: the list sends the browser to the sign-in form, which brings it back.
        page.goto(f"{console_url}/tasks")
        assert "/login" in page.url, page.url
        page.fill("input[name=name]", OPERATOR)
        page.fill("input[name=token]", "not-the-token")
        page.click("form.login button[type=submit]")  # answered on the same URL: wait for the answer's text
        page.wait_for_selector("main >> text=Wrong operator token")
        page.fill("input[name=name]", OPERATOR)
        page.fill("input[name=token]", TOKEN)
        shots.take(page, "login")
        page.click("form.login button[type=submit]")
        page.wait_for_url(re.compile(r".*/tasks$"))
        assert page.inner_text(".operator") == OPERATOR
        page.wait_for_selector("#live-state[data-state=on]")
        page.evaluate("window.__noReload = true")

        # A second tab keeps the list open throughout: it must follow the task to `cancelled` by itself.
        watcher = context.new_page()
        watcher.goto(f"{console_url}/tasks")
        watcher.wait_for_selector("#live-state[data-state=on]")
        watcher.evaluate("window.__noReload = true")

        # A client starts a slow task: its row appears in the open list, without a reload.
        task_id = start_task(running.url, "count_up", {"steps": 120, "pause": 0.25})
        key = task_key(task_id)
        row = page.wait_for_selector(f"#row-{key}")
        assert page.evaluate("window.__noReload === true"), "the list was reloaded"
        assert row.inner_text().startswith(key[:12])
        page.wait_for_function(
            "key => document.querySelector('#row-' + key + ' .cell-progress progress') !== null", arg=key
        )
        seen_html.append(page.content())
        shots.take(page, "list")

        # Its page: the progress bar moves while we look.
        page.click(f"#row-{key} a.key")
        page.wait_for_url(re.compile(rf".*/tasks/{key}$"))
        assert page.inner_text("h1").startswith(f"Task {key[:12]}")
        first = float(page.get_attribute("p.cell-progress progress", "value") or 0)
        page.wait_for_function(
            "before => Number(document.querySelector('p.cell-progress progress').value) > before", arg=first
        )
        assert page.evaluate("window.__noReload === undefined")  # a new page (the click), then no reload
        page.evaluate("window.__noReload = true")
        page.wait_for_function(
            "before => Number(document.querySelector('p.cell-progress progress').value) > before + 1", arg=first
        )
        assert page.evaluate("window.__noReload === true"), "the task page was reloaded"
        assert "count_up" in page.inner_text("main")
        assert "working" in page.inner_text("h1")
        seen_html.append(page.content())
        shots.take(page, "task", full_page=True)

        # Cancel it from its page: a confirmation step, then the task is cancelled.
        page.click("form.action-cancel button[type=submit]")
        page.wait_for_selector("div.confirm")
        assert f"task {key[:12]}" in page.inner_text("h1")
        seen_html.append(page.content())
        shots.take(page, "confirm")
        page.click("div.confirm button[type=submit]")
        page.wait_for_url(re.compile(rf".*/tasks/{key}\?done=cancel$"))
        assert "The task is cancelled." in page.inner_text("main")
        assert page.inner_text("h1 .status") == "cancelled"
        seen_html.append(page.content())

        # The list open since before the task existed shows it cancelled, never reloaded; so does a fresh
        # list, and so does the task's client.
        watcher.wait_for_function(
            "key => document.querySelector('#row-' + key + ' .cell-status').innerText === 'cancelled'", arg=key
        )
        assert watcher.evaluate("window.__noReload === true"), "the open list was reloaded"
        page.goto(f"{console_url}/tasks")
        assert page.inner_text(f"#row-{key} .cell-status") == "cancelled"
        seen_html.append(page.content())
        assert task_status(running.url, task_id) == "cancelled"

        page.goto(f"{console_url}/")
        page.wait_for_selector("figure.chart svg polyline")
        seen_html.append(page.content())
        shots.take(page, "overview", full_page=True)

        # Live updates kept working across the pages, and no script error on any of them.
        assert not failed, failed
        assert not [e for e in console_errors if "status of 401" not in e], console_errors
    finally:
        context.close()

    # The audit line names the operator and the row key; the task id is nowhere.
    audit = f"operator={OPERATOR} action=cancel row={key[:12]} outcome=cancelled"
    wait_until(lambda: audit in console.text(), 10, "the audit line")
    for html in seen_html:
        assert task_id not in html
    assert task_id not in console.text()


def test_the_dark_theme_and_the_keyboard(
    deployment: tuple[Deployment, Proc, str], chromium: Any, tmp_path: Path
) -> None:
    """The system's dark preference gives the dark theme; the toggle overrides it; j/k walk the rows."""
    running, _console, console_url = deployment
    shots = Shots(tmp_path / "shots", running.backend)
    start_task(running.url, "count_up", {"steps": 3, "pause": 0.1})
    context = chromium.new_context(viewport={"width": 1280, "height": 760}, color_scheme="dark")
    page = context.new_page()
    try:
        sign_in(page, console_url)
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(21, 23, 27)", background  # the dark palette
        page.goto(f"{console_url}/tasks")
        page.wait_for_selector("#rows tr")
        shots.take(page, "list-dark")
        page.keyboard.press("j")
        focused = page.evaluate("document.activeElement.className")
        assert focused == "key", focused
        assert page.evaluate("document.activeElement.closest('tr').classList.contains('focused')")
        page.click(".theme-toggle")  # system -> light
        assert page.get_attribute("html", "data-theme") == "light"
        assert page.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(255, 255, 255)"
        page.click(".theme-toggle")  # light -> dark, which holds under a light system too
        page.emulate_media(color_scheme="light")
        assert page.get_attribute("html", "data-theme") == "dark"
        assert page.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(21, 23, 27)"
    finally:
        context.close()


def test_pages_read_without_javascript(deployment: tuple[Deployment, Proc, str], chromium: Any) -> None:
    """With scripts off, signing in, the list, its filter and a task page still work (server-rendered)."""
    running, _console, console_url = deployment
    task_id = start_task(running.url, "count_up", {"steps": 1, "pause": 0})
    wait_until(lambda: task_status(running.url, task_id) == "completed", 30, "the task to complete")
    context = chromium.new_context(java_script_enabled=False)
    page = context.new_page()
    try:
        sign_in(page, console_url)
        page.goto(f"{console_url}/tasks?max_age=2h")  # an age as the docs write it stays in its field
        assert page.input_value("input[name=max_age]") == "2h"
        page.check("input[name=status][value=completed]")
        page.click("form.filters button[type=submit]")
        page.wait_for_url(re.compile(r".*status=completed.*"))
        assert "max_age=2h" in page.url
        statuses = page.eval_on_selector_all("#rows tr", "rows => rows.map(r => r.dataset.status)")
        assert statuses and set(statuses) == {"completed"}, statuses
        page.click(f"#row-{task_key(task_id)} a.key")
        page.wait_for_url(re.compile(rf".*/tasks/{task_key(task_id)}$"))
        assert page.inner_text("h1").startswith(f"Task {task_key(task_id)[:12]}")
        assert "counted to 1" not in page.content()  # the result stays hidden (payloads off)
        assert page.is_hidden(".theme-toggle")  # the toggle needs the script; the system's theme applies
        # A bad filter value: the list says which field, as a 400, and shows the form again.
        response = page.goto(f"{console_url}/tasks?status=sleeping")
        assert response is not None and response.status == 400
        assert "status: unknown status (one of" in page.inner_text("main")
        assert "sleeping" not in page.inner_text("main")  # a refusal never repeats what was typed
    finally:
        context.close()


def test_the_overview_counts_active_tasks_by_owner_and_links_to_them(
    deployment: tuple[Deployment, Proc, str], chromium: Any
) -> None:
    """The operator sees which owner has active tasks (here every caller is anonymous: no authentication) and
    follows the owner's link to the list of them."""
    import httpx

    running, _console, console_url = deployment
    task_id = start_task(running.url, "count_up", {"steps": 60, "pause": 1})
    context = chromium.new_context()
    page = context.new_page()
    try:
        sign_in(page, console_url)
        row = page.locator("table.by-owner tbody tr", has_text="anonymous")
        assert int(row.locator("td").nth(0).inner_text()) >= 1  # working
        row.locator("a").click()
        page.wait_for_url(re.compile(r".*/tasks\?owner=anonymous&status=active$"))
        page.wait_for_selector(f"#row-{task_key(task_id)}[data-status=working]")  # its own (others may end meanwhile)
    finally:
        context.close()
        httpx.post(
            f"{console_url}/api/tasks/{task_key(task_id)}/cancel",
            headers={"Authorization": f"Bearer {TOKEN}"},
            json={},
            timeout=10,
        )


def test_a_row_changing_further_down_the_list_stays_there(
    deployment: tuple[Deployment, Proc, str], chromium: Any
) -> None:
    """The first page of one row: a newer task appears at its top live; an older one that keeps
    changing (it belongs on a later page) is never inserted there."""
    running, _console, console_url = deployment
    older = task_key(start_task(running.url, "count_up", {"steps": 40, "pause": 0.2}))
    context = chromium.new_context()
    try:
        everything = context.new_page()
        everything.goto(f"{console_url}/login?next=/tasks")
        everything.fill("input[name=name]", OPERATOR)
        everything.fill("input[name=token]", TOKEN)
        everything.click("form.login button[type=submit]")
        everything.wait_for_selector(f"#row-{older}")
        first_page = context.new_page()
        first_page.goto(f"{console_url}/tasks?limit=1")
        first_page.wait_for_selector("#live-state[data-state=on]")
        assert first_page.query_selector(f"#row-{older}") is not None  # the newest task: the one row shown
        newer = task_key(start_task(running.url, "count_up", {"steps": 30, "pause": 0.2}))
        first_page.wait_for_selector(f"#row-{newer}")
        first_page.reload()  # now the page of one row shows `newer`; `older` is on the next page
        first_page.wait_for_selector("#live-state[data-state=on]")
        assert first_page.query_selector(f"#row-{older}") is None
        step = "key => Number(document.querySelector('#row-' + key + ' .cell-progress progress').value)"
        seen = everything.evaluate(step, older)
        everything.wait_for_function(f"key => ({step})(key) >= {seen + 3}", arg=older)  # three changes later
        assert first_page.query_selector(f"#row-{older}") is None, "an older row was inserted at the top"
        assert first_page.query_selector(f"#row-{newer}") is not None
    finally:
        context.close()


def test_a_long_unbroken_message_neither_widens_the_pages_nor_makes_its_row_tall(
    deployment: tuple[Deployment, Proc, str], chromium: Any
) -> None:
    """A job's text is not the page's to lay out: a word longer than the screen wraps in the list, on the
    task's page (its error too) and on the overview, and a long message shows its first lines in the list."""
    running, _console, console_url = deployment
    words = "w" * 300 + " " + " ".join(["many words on many lines"] * 12)
    key = task_key(start_task(running.url, "fail_saying", {"words": words}))
    context = chromium.new_context(viewport={"width": 1024, "height": 760})
    page = context.new_page()
    fits = "document.documentElement.scrollWidth <= window.innerWidth"
    try:
        page.goto(f"{console_url}/login?next=/tasks")
        page.fill("input[name=name]", OPERATOR)
        page.fill("input[name=token]", TOKEN)
        page.click("form.login button[type=submit]")
        page.wait_for_selector(f"#row-{key}[data-status=failed]")
        assert page.evaluate(fits), page.evaluate("document.documentElement.scrollWidth")
        line = page.evaluate("parseFloat(getComputedStyle(document.querySelector('#rows td')).lineHeight) || 20")
        height = page.evaluate(f"document.querySelector('#row-{key} .cell-message').getBoundingClientRect().height")
        assert height <= 3.5 * line, (height, line)  # its first three lines
        assert "w" * 300 in page.text_content(f"#row-{key} .cell-message")  # clipped on screen, whole in the page
        page.goto(f"{console_url}/tasks/{key}")
        page.wait_for_selector("p.error")
        assert page.evaluate(fits), page.evaluate("document.documentElement.scrollWidth")
        page.goto(f"{console_url}/")
        assert page.evaluate(fits), page.evaluate("document.documentElement.scrollWidth")
    finally:
        context.close()
