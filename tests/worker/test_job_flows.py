"""A job's life on real worker processes: input rounds, cancellation, retries (a killed pool process:
test_lost_pool_process.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from celery_mcp_tasks.model import task_key
from celery_mcp_tasks.protocol import PROGRESS_META_KEY
from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.store.sql import SqlStore
from celery_mcp_tasks.worker.context import TaskContext
from tests.support import (
    Backend,
    McpHttp,
    Proc,
    celery_id_of,
    run_ended,
    wait_until,
    without_meta,
    worker_caught_up,
)
from tests.worker.conftest import accept, alive, follow, job_pid, text_of

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("worker")]


# -- input without parking a worker ---------------------------------------------------------


def test_two_input_rounds_each_end_the_run_and_resume_with_all_answers(client: McpHttp) -> None:
    task_id = client.create("two_rounds")
    first = client.wait_for(task_id, "input_required")
    assert list(first["inputRequests"]) == ["name"]

    ack = client.task("tasks/update", task_id, inputResponses={"name": accept(name="Ada")})["result"]
    assert ack["resultType"] == "complete" and "status" not in ack
    second = client.wait_for(task_id, "input_required", "completed", "failed")
    assert second["status"] == "input_required" and list(second["inputRequests"]) == ["colour"]

    client.task("tasks/update", task_id, inputResponses={"colour": accept(colour="teal")})
    done = client.wait_for(task_id)
    assert done["status"] == "completed"
    assert text_of(done).startswith("Ada likes teal")


def test_an_input_key_is_never_asked_twice(client: McpHttp) -> None:
    task_id = client.create("ask_again")
    client.wait_for(task_id, "input_required")
    client.task("tasks/update", task_id, inputResponses={"same": accept(v="x")})
    failed = client.wait_for(task_id)
    assert failed["status"] == "failed"
    assert "DuplicateInputKeys" in failed["error"]["message"] and "same" in failed["error"]["message"]


def test_a_parked_job_gets_its_answer_in_the_same_run(client: McpHttp) -> None:
    task_id = client.create("wait_here", {"timeout": 20})
    asked = client.wait_for(task_id, "input_required")
    assert asked["statusMessage"].endswith("waiting")
    client.task("tasks/update", task_id, inputResponses={"ok": accept(ok=True)})
    done = client.wait_for(task_id)
    assert done["status"] == "completed"
    # One run answered: no second job was enqueued for the answer.
    assert text_of(done).startswith("answered True") and text_of(done).endswith("same run=True")


def test_a_parked_job_that_times_out_decides_itself(client: McpHttp) -> None:
    task_id = client.create("wait_or_give_up", {"timeout": 0.5})
    done = client.wait_for(task_id)
    assert done["status"] == "completed" and text_of(done) == "nobody answered"


def test_a_parked_job_that_times_out_fails_the_task_by_default(client: McpHttp) -> None:
    task_id = client.create("wait_here", {"timeout": 0.5})
    failed = client.wait_for(task_id)
    assert failed["status"] == "failed"
    assert failed["error"]["message"] == "Job failed: InputTimeout: no answer to the input request within 0.5s"


# -- what a running job shows ----------------------------------------------------------------


def test_a_job_that_never_reports_shows_it_started_while_it_runs(client: McpHttp, tmp_path: Path) -> None:
    marker = tmp_path / "quiet"
    created = client.call_tool("gated", {"marker": str(marker)})["result"]
    assert created["statusMessage"] == "Queued"
    task_id = created["taskId"]
    wait_until(marker.exists, 20, "the job to start")
    running = client.get(task_id)  # the start was written before the body ran
    assert (running["status"], running["statusMessage"]) == ("working", "Started"), running
    assert running["lastUpdatedAt"] > created["lastUpdatedAt"]  # ISO timestamps in UTC sort as text
    assert PROGRESS_META_KEY not in running.get("_meta", {})  # it never reported a number
    Path(f"{marker}.go").touch()
    assert client.wait_for(task_id)["status"] == "completed"


def test_numeric_progress_is_on_the_wire_of_tasks_get_and_kept_at_the_end(client: McpHttp, tmp_path: Path) -> None:
    marker = tmp_path / "counted"
    task_id = client.create("gated", {"marker": str(marker), "steps": 3})
    wait_until(marker.exists, 20, "the job to count")
    running = client.get(task_id)
    assert running["statusMessage"] == "Step 3 of 3"
    assert running["_meta"][PROGRESS_META_KEY] == {"progress": 3, "total": 3}
    assert "io.modelcontextprotocol/serverInfo" in running["_meta"]  # merged, not replaced
    Path(f"{marker}.go").touch()
    done = client.wait_for(task_id)
    assert done["status"] == "completed" and done["_meta"][PROGRESS_META_KEY] == {"progress": 3, "total": 3}


# -- cancellation ---------------------------------------------------------------------------


def test_cancel_while_running_stops_a_cooperative_job(client: McpHttp, worker: Proc, tmp_path: Path) -> None:
    marker = tmp_path / "work"
    task_id = client.create("work", {"seconds": 30, "marker": str(marker)})
    job_pid(client, task_id)
    client.task("tasks/cancel", task_id)
    cancelled = client.get(task_id)
    assert cancelled["status"] == "cancelled"  # synchronous in tasks/cancel
    # The job notices within its check interval and returns; its outcome is ignored.
    wait_until(lambda: Path(f"{marker}.stopped").exists(), 5, "the job to stop")
    assert "succeeded in" in run_ended(worker, client, task_id)  # the bridge was handed "stopped early" ...
    assert without_meta(client.get(task_id)) == without_meta(cancelled)  # ... and refused it


def test_cancel_terminates_a_stubborn_job_when_the_tool_asks_for_it(
    client: McpHttp, backend: Backend, worker: Proc
) -> None:
    task_id = client.create("stubborn", {"seconds": 60})
    pid = job_pid(client, task_id)
    client.task("tasks/cancel", task_id)
    cancelled = client.get(task_id)
    assert cancelled["status"] == "cancelled" and cancelled["statusMessage"] == "Cancelled by the client"
    wait_until(lambda: not alive(pid), 15, "the pool process to be terminated")
    worker_caught_up(backend, worker)  # the revoke, and the bridge's task_revoked, are handled
    assert f"Terminating {celery_id_of(client, task_id)}" in worker.text()
    assert without_meta(client.get(task_id)) == without_meta(cancelled)  # not "revoked in Celery": still ours


def test_cancel_after_completion_changes_nothing(client: McpHttp) -> None:
    task_id = client.create("work", {"seconds": 0.1})
    done = client.wait_for(task_id)
    assert done["status"] == "completed"
    ack = client.task("tasks/cancel", task_id)["result"]
    assert ack["resultType"] == "complete" and "status" not in ack
    assert client.get(task_id) == done


# -- retries --------------------------------------------------------------------------------


def test_self_retry_twice_keeps_the_task_working_then_completes(client: McpHttp, worker: Proc) -> None:
    task_id = client.create("flaky", {"failures": 2})
    done, seen = follow(client, task_id, worker=worker)
    assert done["status"] == "completed" and text_of(done) == "succeeded on attempt 3"
    statuses = [status for status, _ in seen]
    assert set(statuses[:-1]) == {"working"}, seen  # never failed on the way
    # "Retrying (attempt n)" once the retry is scheduled, "Started (attempt n)" once it runs (only the latter
    # when the retry signal lands late).
    assert _first_about(seen, "(attempt 2)") < _first_about(seen, "(attempt 3)"), seen


def test_autoretry_that_runs_out_fails_only_at_the_end(client: McpHttp, worker: Proc) -> None:
    task_id = client.create("hopeless")
    failed, seen = follow(client, task_id, worker=worker)
    assert failed["status"] == "failed"
    assert failed["error"] == {"code": -32603, "message": "Job failed: RuntimeError: broken on attempt 3"}
    assert seen[_first_about(seen, "(attempt 3)")][0] == "working" and [s for s, _ in seen].count("failed") == 1, seen


def test_a_soft_time_limit_reached_in_the_middle_of_a_write_fails_the_task_saying_so(client: McpHttp) -> None:
    """The limit's exception lands while a progress write runs (the job writes without pause): the task fails
    saying the limit was reached, never "the task store is unavailable" from a connection left mid-query,
    and the next jobs on that pool process write as usual."""
    task_ids = [client.create("overtime") for _ in range(4)]
    for task_id in task_ids:
        failed = client.wait_for(task_id, timeout=60)
        assert failed["status"] == "failed", failed
        assert failed["error"]["message"] == (
            "Job failed: SoftTimeLimitExceeded: the job ran longer than its soft time limit (soft_time_limit, "
            "task_soft_time_limit or the worker's --soft-time-limit) and did not catch SoftTimeLimitExceeded"
        ), failed
    assert client.wait_for(client.create("flaky", {"failures": 0}))["status"] == "completed"


def test_a_hard_time_limit_fails_the_task_naming_the_option_and_its_seconds(client: McpHttp) -> None:
    failed = client.wait_for(client.create("stuck", {"seconds": 30}), timeout=60)
    assert failed["status"] == "failed", failed
    assert failed["error"]["message"] == (
        "Job failed: TimeLimitExceeded: the job ran longer than its time limit (1 s, time_limit, task_time_limit or "
        "the worker's --time-limit) and was stopped"
    )


def _first_about(seen: list[tuple[str, str | None]], attempt: str) -> int:
    """Where the first statusMessage about `attempt` ("(attempt 2)") is among the states seen."""
    return next(n for n, (_, message) in enumerate(seen) if message and attempt in message)


# -- work that ends elsewhere ------------------------------------------------------------------


def test_a_handed_off_task_is_completed_from_outside_by_its_row_key(client: McpHttp, backend: Backend) -> None:
    task_id = client.create("elsewhere")
    waiting = wait_until(
        lambda: (t := client.get(task_id)).get("statusMessage") == "Waiting for the webhook" and t, 20, "the hand-off"
    )
    assert waiting["status"] == "working"
    store = SqlStore.from_url(backend.store_url)
    try:
        handle = TaskContext(TaskService(store), task_key(task_id))  # what McpTasks.task_handle(key) builds
        handle.complete("built elsewhere")
        done = client.get(task_id)
        assert done["status"] == "completed" and text_of(done) == "built elsewhere"
        with pytest.raises(Exception, match="terminal"):
            handle.progress("too late")
    finally:
        store.dispose()
