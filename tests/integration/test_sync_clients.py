"""Clients that did not declare the tasks extension, through the official SDK client (issue 9 item 3, issue 12 item 3).

An earlier-era client (`mode="legacy"`: the 2025 `initialize` handshake over
Streamable HTTP) and a 2026-07-28 client without the extension both get the
synchronous path: the job runs as a hidden task and the call answers with its
outcome. What they see of it: the job's reports as `notifications/progress`,
its questions asked through their own callbacks (mid-call on the request's
stream, or as MRTR rounds on 2026-07-28), an idle bound that a reporting job
never hits, and a hidden task that ends `cancelled` (its job stopped) whenever
the caller stops waiting.
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import anyio
import httpx
import pytest
import sqlalchemy as sa
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CallToolResult,
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequestParams,
    ElicitResult,
    ErrorData,
    TextContent,
)

from celery_mcp_tasks.mcp.serving import STOPPED
from celery_mcp_tasks.mcp.sync import CallProgress
from celery_mcp_tasks.model import TaskRecord, TaskStatus
from celery_mcp_tasks.protocol import IDEMPOTENCY_META_KEY
from celery_mcp_tasks.store.engine import normalize_url
from tests.integration.test_protocol_eras import LegacySession
from tests.support import Backend, Deployment, McpHttp, wait_until

pytestmark = pytest.mark.integration

APP = "tests.apps.runtime_app"


@pytest.fixture(scope="module")
def runtime(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with Deployment(APP, backend, tmp_path_factory.mktemp(f"sync-{backend.name}")) as deployment:
        deployment.web()
        deployment.worker(concurrency=4)
        yield deployment


def rows_of(deployment: Deployment, tool: str) -> list[dict[str, Any]]:
    """Every row of `tool` in the store (the backend's store is shared with other modules)."""
    engine = sa.create_engine(normalize_url(deployment.backend.store_url))
    try:
        with engine.connect() as conn:
            found = conn.execute(
                sa.text("SELECT key, status, status_message, arguments FROM mcp_tasks_task WHERE tool = :tool"),
                {"tool": tool},
            )
            rows = [dict(row) for row in found.mappings()]
    finally:
        engine.dispose()
    for row in rows:
        if isinstance(row["arguments"], str):  # JSON is text on SQLite
            row["arguments"] = json.loads(row["arguments"])
    return rows


def hidden_row(deployment: Deployment, tool: str, **arguments: Any) -> dict[str, Any]:
    """The one row of `tool` whose arguments include `arguments`: a synchronous call's hidden task."""
    (row,) = [row for row in rows_of(deployment, tool) if arguments.items() <= row["arguments"].items()]
    return row


def ended_row(deployment: Deployment, tool: str, **arguments: Any) -> dict[str, Any]:
    row: dict[str, Any] = wait_until(
        lambda: (row := hidden_row(deployment, tool, **arguments))["status"] != "working" and row,
        15,
        f"the hidden {tool} task to end",
    )
    return row


def text(result: CallToolResult) -> str:
    return "".join(item.text for item in result.content if isinstance(item, TextContent))


def run(scenario: Any) -> Any:
    return anyio.run(scenario)


class Progress:
    """A progress callback that records what arrives."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, float | None, str | None]] = []

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self.seen.append((progress, total, message))

    def values(self) -> list[float]:
        return [value for value, _, _ in self.seen]


class Answers:
    """An elicitation callback answering each question from a script, by a word of its message."""

    def __init__(self, **by_word: dict[str, Any]) -> None:
        self.by_word = by_word
        self.asked: list[str] = []

    async def __call__(self, context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult | ErrorData:
        self.asked.append(params.message)
        for word, content in self.by_word.items():
            if word in params.message.lower():
                return ElicitResult(action="accept", content=content)
        return ElicitResult(action="decline")


# -- progress -------------------------------------------------------------------------------------


def assert_counted(progress: Progress, steps: int) -> None:
    values = progress.values()
    assert values, "no notifications/progress arrived"
    assert values == sorted(set(values)), f"progress must strictly increase: {values}"
    numbered = [(value, total, message) for value, total, message in progress.seen if total is not None]
    assert numbered, progress.seen
    for value, total, message in numbered:  # the job's own numbers and its statusMessage
        assert (total, message) == (steps, f"step {value:g} of {steps}")
    # The runtime's word for the start ("Started") carries no number of the job's: it is not sent.
    assert all(total is not None for _, total, _ in progress.seen), progress.seen


class Session:
    """What `CallProgress` reports through: the request's session, recording every notification."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, float | None, str | None]] = []

    async def report_progress(self, progress: float, total: float | None, message: str | None) -> None:
        self.sent.append((progress, total, message))


def test_a_job_counting_from_0_keeps_its_0_after_the_runtimes_started() -> None:
    """The quickstart's shape: "Started", then the job's own 0, 1, 2 of 3 (a unit check, no process)."""
    session = Session()
    queued = TaskRecord("k", None, "write_report", TaskStatus.WORKING, 1, 1, None, status_message="Queued")
    started = replace(queued, started_at=2, status_message="Started")
    steps = [replace(started, progress=n, progress_total=3, status_message=f"section {n}") for n in range(3)]
    retried = replace(steps[-1], started_at=None, progress=None, progress_total=None, status_message="Retrying")
    alone = replace(retried, status_message="a message alone")

    async def scenario() -> None:
        progress = CallProgress(cast("ServerRequestContext[Any, Any]", SimpleNamespace(session=session)), queued)
        for record in [started, *steps, retried, alone]:
            await progress.report(record)

    run(scenario)
    assert session.sent == [(0, 3, "section 0"), (1, 3, "section 1"), (2, 3, "section 2"), (3, None, "a message alone")]


def test_a_legacy_caller_receives_the_jobs_progress_with_its_numbers(runtime: Deployment) -> None:
    progress = Progress()

    async def scenario() -> CallToolResult:
        async with Client(runtime.url, mode="legacy") as client:
            return await client.call_tool("count_up", {"steps": 4, "interval": 0.3}, progress_callback=progress)

    assert text(run(scenario)) == "counted to 4"
    assert_counted(progress, 4)


def test_a_2026_caller_without_the_extension_receives_progress_too(runtime: Deployment) -> None:
    progress = Progress()

    async def scenario() -> tuple[str, CallToolResult]:
        async with Client(runtime.url) as client:
            result = await client.call_tool("count_up", {"steps": 3, "interval": 0.3}, progress_callback=progress)
            return client.protocol_version, result

    version, result = run(scenario)
    assert version == "2026-07-28" and text(result) == "counted to 3"
    assert_counted(progress, 3)


# -- the idle bound -------------------------------------------------------------------------------


def test_a_job_that_keeps_reporting_outlives_its_idle_bound(runtime: Deployment) -> None:
    """count_up's bound is 3 s of silence; it reports every second for 6 s and completes."""
    progress = Progress()

    async def scenario() -> CallToolResult:
        async with Client(runtime.url, mode="legacy") as client:
            return await client.call_tool("count_up", {"steps": 6, "interval": 1.0}, progress_callback=progress)

    assert text(run(scenario)) == "counted to 6"
    assert len(progress.seen) >= 3
    assert hidden_row(runtime, "count_up", steps=6, interval=1.0)["status"] == "completed"


def test_a_job_that_goes_silent_is_cut_at_its_idle_bound_and_cancelled(runtime: Deployment, tmp_path: Path) -> None:
    marker = str(tmp_path / "silent")

    async def scenario() -> MCPError:
        async with Client(runtime.url, mode="legacy") as client:
            with pytest.raises(MCPError) as cut:
                await client.call_tool("goes_silent", {"seconds": 60, "marker": marker})
            return cut.value

    cut = run(scenario)
    assert cut.code == -32603
    assert cut.message.startswith("Tool goes_silent did not finish in time, and its job was cancelled: its job ")
    assert cut.message.endswith("; call it with the tasks extension to wait as long as it runs")
    row = hidden_row(runtime, "goes_silent", marker=marker)
    assert (row["status"], row["status_message"]) == ("cancelled", "Timed out waiting synchronously")
    wait_until(lambda: Path(f"{marker}.stopped").exists(), 15, "the job to see the cancel and stop")


# -- questions --------------------------------------------------------------------------------------


def test_a_legacy_caller_answers_the_jobs_question_mid_call_and_gets_its_result(runtime: Deployment) -> None:
    answers = Answers(name={"name": "Ada"})

    async def scenario() -> CallToolResult:
        async with Client(runtime.url, mode="legacy", elicitation_callback=answers) as client:
            return await client.call_tool("ask_name_then_wait", {"seconds": 0.5})

    assert text(run(scenario)) == "Hello, Ada"
    assert answers.asked == ["Your name?"]
    assert hidden_row(runtime, "ask_name_then_wait", seconds=0.5)["status"] == "completed"


@pytest.mark.parametrize(("mode", "seconds"), [("legacy", 0.25), ("2026", 0.3)])
def test_a_callers_answer_of_the_wrong_shape_is_invalid_params_and_cancels_the_task(
    runtime: Deployment, mode: str, seconds: float
) -> None:
    """The question asks for a string; an answer with a number cannot resume the job: the call gets -32602
    saying which answer, and the hidden task ends readable instead of waiting for the janitor (on 2026-07-28,
    an MRTR round's answer: the SDK's client does not retry a refused round, so the task would wait a day)."""
    answers = Answers(name={"name": 7})

    async def scenario() -> MCPError:
        options: dict[str, Any] = {"mode": "legacy"} if mode == "legacy" else {}
        async with Client(runtime.url, elicitation_callback=answers, **options) as client:
            with pytest.raises(MCPError) as refused:
                await client.call_tool("ask_name_then_wait", {"seconds": seconds})
            return refused.value

    refused = run(scenario)
    assert refused.code == -32602
    assert refused.message.startswith("the input response 'name' is not an answer to its elicitation/create request")
    row = hidden_row(runtime, "ask_name_then_wait", seconds=seconds)
    assert (row["status"], row["status_message"]) == ("cancelled", "The client's answer did not fit the job's question")


def test_a_legacy_caller_answers_every_round_of_a_job_that_asks_twice(runtime: Deployment) -> None:
    answers = Answers(name={"name": "Ada"}, colour={"colour": "blue"})

    async def scenario() -> CallToolResult:
        async with Client(runtime.url, mode="legacy", elicitation_callback=answers) as client:
            return await client.call_tool("two_rounds", {})

    assert text(run(scenario)).startswith("Ada likes blue")
    assert answers.asked == ["Your name?", "Favourite colour?"]


def test_a_legacy_caller_answers_a_sampling_question_with_its_model(runtime: Deployment) -> None:
    async def model(context: ClientRequestContext, params: CreateMessageRequestParams) -> CreateMessageResult:
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text="All good"), model="m-1")

    async def scenario() -> CallToolResult:
        async with Client(runtime.url, mode="legacy", sampling_callback=model) as client:
            return await client.call_tool("asks_undeclared", {})

    assert text(run(scenario)) == "All good"


def test_a_legacy_caller_that_cannot_answer_gets_an_error_and_the_task_is_cancelled(runtime: Deployment) -> None:
    before = {row["key"] for row in rows_of(runtime, "asks_undeclared")}

    async def scenario() -> MCPError:
        async with Client(runtime.url, mode="legacy") as client:  # no sampling callback: no sampling capability
            with pytest.raises(MCPError) as refused:
                await client.call_tool("asks_undeclared", {})
            return refused.value

    refused = run(scenario)
    assert (refused.code, refused.message) == (
        -32603,
        (
            "Tool asks_undeclared needs input from the user, and this client did not declare sampling: call it "
            "from a client that does, or with the tasks extension"
        ),
    )
    (row,) = [row for row in rows_of(runtime, "asks_undeclared") if row["key"] not in before]
    assert (row["status"], row["status_message"]) == ("cancelled", "The job needs input; call it as a task")


def test_a_2026_caller_without_the_extension_answers_by_mrtr_rounds(runtime: Deployment) -> None:
    """The SDK client drives each `InputRequiredResult` through its callback and retries with the sealed state."""
    answers = Answers(name={"name": "Grace"}, colour={"colour": "green"})

    async def scenario() -> CallToolResult:
        async with Client(runtime.url, elicitation_callback=answers) as client:
            return await client.call_tool("two_rounds", {})

    assert text(run(scenario)).startswith("Grace likes green")
    assert answers.asked == ["Your name?", "Favourite colour?"]


# -- the caller stops waiting -----------------------------------------------------------------------


def test_a_legacy_caller_cancelling_its_call_cancels_the_task_and_the_job_stops(
    runtime: Deployment, tmp_path: Path
) -> None:
    marker = tmp_path / "cancelled"

    async def scenario() -> None:
        async with Client(runtime.url, mode="legacy") as client, anyio.create_task_group() as tg:
            tg.start_soon(client.call_tool, "work", {"seconds": 60, "marker": str(marker)})
            with anyio.fail_after(30):
                while not marker.exists():  # the job's body started
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()

    run(scenario)
    row = ended_row(runtime, "work", marker=str(marker))
    assert row["status"] == "cancelled", row
    wait_until(lambda: Path(f"{marker}.stopped").exists(), 15, "the job to see the cancel and stop")


def test_a_legacy_caller_that_hangs_up_cancels_the_task_and_the_job_stops(runtime: Deployment, tmp_path: Path) -> None:
    """No `notifications/cancelled`: the HTTP connection closes while the SSE response streams."""
    marker = tmp_path / "hung-up"
    session = LegacySession(runtime.url, "2025-11-25", {}).open()
    try:
        with httpx.Client(timeout=3) as http, pytest.raises(httpx.ReadTimeout):
            session.call_tool("work", {"seconds": 60, "marker": str(marker)}, http=http)
    finally:
        session.close()
    row = ended_row(runtime, "work", marker=str(marker))
    assert (row["status"], row["status_message"]) == ("cancelled", "The synchronous caller went away")
    wait_until(lambda: Path(f"{marker}.stopped").exists(), 15, "the job to see the cancel and stop")


def test_closing_a_2026_client_mid_call_cancels_the_task_and_the_job_stops(runtime: Deployment, tmp_path: Path) -> None:
    marker = tmp_path / "closed"

    async def scenario() -> None:
        with anyio.CancelScope() as scope:
            async with Client(runtime.url) as client, anyio.create_task_group() as tg:
                tg.start_soon(client.call_tool, "work", {"seconds": 60, "marker": str(marker)})
                with anyio.fail_after(30):
                    while not marker.exists():
                        await anyio.sleep(0.05)
                scope.cancel()  # leaves the client's context: its HTTP connection closes

    run(scenario)
    assert ended_row(runtime, "work", marker=str(marker))["status"] == "cancelled"
    wait_until(lambda: Path(f"{marker}.stopped").exists(), 15, "the job to see the cancel and stop")


def test_a_web_process_told_to_stop_cancels_its_synchronous_calls_and_answers_them(
    backend: Backend, tmp_path: Path
) -> None:
    """SIGTERM while 2026-07-28 callers without the extension wait: a call that ends within the drain is answered
    as usual; one still running then has its hidden task cancelled (the job stops, not running on for nobody)
    and its caller gets an error, not a connection cut off when the server's graceful timeout ran out. An
    idempotent call's task runs on: a retry with its key meets it."""
    marker, kept, done = tmp_path / "stopping", tmp_path / "kept", tmp_path / "done"
    secret = {"MCP_TASKS_IDEMPOTENCY_SECRET": "stop-" + "s" * 40}
    with Deployment(APP, backend, tmp_path) as deployment:
        deployment.web(**secret)
        web = deployment.procs[-1]
        deployment.worker(env=secret)
        errors: list[BaseException] = []
        finishing = threading.Thread(  # a call that ends within the drain after the signal: answered as usual
            target=lambda: McpHttp(deployment.url).call_tool(
                "work", {"seconds": 1, "marker": str(done)}, capabilities={}
            ),
            daemon=True,
        )
        idempotent = threading.Thread(
            target=lambda: McpHttp(deployment.url).call_tool(
                "work", {"seconds": 4, "marker": str(kept)}, capabilities={}, meta={IDEMPOTENCY_META_KEY: "kept-1"}
            ),
            daemon=True,
        )

        async def scenario() -> None:
            async with Client(deployment.url) as client, anyio.create_task_group() as tg:

                async def call() -> None:
                    try:
                        await client.call_tool("work", {"seconds": 60, "marker": str(marker)})
                    except Exception as exc:  # noqa: BLE001 - what the caller got is the point
                        errors.append(exc)

                tg.start_soon(call)
                idempotent.start()
                with anyio.fail_after(30):
                    while not (marker.exists() and kept.exists()):
                        await anyio.sleep(0.05)
                finishing.start()
                with anyio.fail_after(30):
                    while not done.exists():
                        await anyio.sleep(0.02)
                web.popen.send_signal(signal.SIGTERM)
                with anyio.fail_after(20):
                    while not errors:
                        await anyio.sleep(0.05)

        run(scenario)
        assert isinstance(errors[0], MCPError), errors
        assert str(errors[0]).endswith(STOPPED), errors
        row = ended_row(deployment, "work", marker=str(marker))
        assert (row["status"], row["status_message"]) == ("cancelled", "The server stopped before the job finished")
        wait_until(lambda: Path(f"{marker}.stopped").exists(), 15, "the job to see the cancel and stop")
        assert ended_row(deployment, "work", marker=str(kept))["status"] == "completed"  # never cancelled
        assert ended_row(deployment, "work", marker=str(done))["status"] == "completed"  # finished in the drain


def test_an_earlier_eras_synchronous_call_loses_its_stream_at_sigterm_and_its_job_stops(
    backend: Backend, tmp_path: Path
) -> None:
    """What docs/operations.md says of a 2025-era caller: the SDK answers its session's calls over
    sse-starlette, which ends every such stream as soon as uvicorn is told to exit, before the drain could
    answer; the call's hidden task is cancelled (its caller went away, or the server stopped: whichever the
    server sees first), and the job stops. If this starts
    failing because the caller is answered, the docs can promise it the 2026-07-28 answer."""
    from tests.integration.test_protocol_eras import LegacySession

    marker = tmp_path / "legacy"
    with Deployment(APP, backend, tmp_path) as deployment:
        deployment.web()
        web = deployment.procs[-1]
        deployment.worker()
        session = LegacySession(deployment.url, "2025-11-25", {}).open()
        outcome: list[object] = []

        def call() -> None:
            try:
                outcome.append(session.call_tool("work", {"seconds": 60, "marker": str(marker)}))
            except Exception as exc:  # noqa: BLE001 - what the caller got is the point
                outcome.append(exc)

        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        wait_until(marker.exists, 30, "the job to start")
        web.popen.send_signal(signal.SIGTERM)
        caller.join(20)
        session.close()
        (got,) = outcome  # a stream that ended without an answer (or, cut mid-chunk, a transport error)
        assert isinstance(got, httpx.TransportError) or "without a final message" in str(got), got
        row = ended_row(deployment, "work", marker=str(marker))
        # Whichever comes first cancels it: the call seeing its caller gone, or the exiting server's own cancel.
        assert row["status"] == "cancelled", row
        assert row["status_message"] in ("The synchronous caller went away", STOPPED), row
        wait_until(lambda: Path(f"{marker}.stopped").exists(), 15, "the job to see the cancel and stop")
