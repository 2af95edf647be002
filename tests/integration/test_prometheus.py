"""A real Prometheus scrapes a real web process and a real prefork worker while tasks run.

PostgreSQL + Redis, `celery-mcp-tasks serve`, `celery worker --pool=prefork -c 2 -B` with
its metrics on a port of its own, and `prometheus` (Debian's package) scraping both every
second with the shipped alert rules loaded. What Prometheus then holds must match what
happened: created = finished + in flight, finished by status, the histograms' counts, the
janitor's sweeps, and no label value that looks like a task id or a row key.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.mcp.listen_client import ListenStream
from tests.support import (
    POSTGRES_URL,
    REDIS_URL,
    Backend,
    Deployment,
    McpHttp,
    Proc,
    free_port,
    fresh_postgres_database,
    spawn,
    tool,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.postgres, pytest.mark.redis]

APP = "examples.conformance.app"
ROOT = Path(__file__).resolve().parents[2]
TASK_ID = re.compile(r"^[A-Za-z0-9_-]{43}$")
ROW_KEY = re.compile(r"^[0-9a-f]{64}$")
PROMETHEUS_LABELS = {"__name__", "job", "instance", "le"}


@dataclass
class Scraped:
    deployment: Deployment
    worker: Proc
    prometheus: str

    def query(self, promql: str) -> list[dict[str, Any]]:
        reply = httpx.get(f"{self.prometheus}/api/v1/query", params={"query": promql}, timeout=10).json()
        assert reply["status"] == "success", reply
        return reply["data"]["result"]

    def scalar(self, promql: str) -> float | None:
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else None

    def by(self, promql: str, label: str) -> dict[str, float]:
        return {item["metric"].get(label, ""): float(item["value"][1]) for item in self.query(promql)}

    def settles(self, promql: str, expected: float, what: str, timeout: float = 30) -> None:
        wait_until(lambda: self.scalar(promql) == expected, timeout, f"{what}: {promql} == {expected}", interval=0.5)


def prometheus_config(web: str, worker: str, rules: Path) -> str:
    return f"""
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: ["{rules}"]
scrape_configs:
  - job_name: celery-mcp-tasks-web
    static_configs: [{{targets: ["{web}"]}}]
  - job_name: celery-mcp-tasks-worker
    static_configs: [{{targets: ["{worker}"]}}]
"""


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    if not (POSTGRES_URL and REDIS_URL):
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL and MCP_TASKS_TEST_REDIS_URL to run")
    binary = tool("prometheus", "Debian: apt-get install prometheus")
    log_dir = tmp_path_factory.mktemp("prometheus")
    with fresh_postgres_database(POSTGRES_URL) as url:
        backend = Backend("pg_redis", {"MCP_TASKS_DATABASE_URL": url, "CELERY_BROKER_URL": REDIS_URL})
        with Deployment(APP, backend, log_dir) as deployment:
            every_second = {"MCP_TASKS_JANITOR_INTERVAL_S": "1", "MCP_TASKS_METRICS": "on"}
            ops_port = free_port()
            deployment.web(**every_second, MCP_TASKS_OPS_PORT=str(ops_port))
            worker_port = free_port()
            worker = deployment.worker(
                pool="prefork",
                concurrency=2,
                beat=True,
                env={**every_second, "MCP_TASKS_WORKER_METRICS_PORT": str(worker_port)},
            )
            port = free_port()
            config = log_dir / "prometheus.yml"
            config.write_text(
                prometheus_config(
                    f"127.0.0.1:{ops_port}", f"127.0.0.1:{worker_port}", ROOT / "deploy/prometheus/alerts.yml"
                )
            )
            argv = [binary, f"--config.file={config}", f"--storage.tsdb.path={log_dir / 'tsdb'}"]
            argv += [f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
            prometheus = spawn("prometheus", argv, {"PATH": "/usr/bin:/bin", "HOME": str(log_dir)}, log_dir)
            deployment.procs.append(prometheus)  # stopped with the rest
            scraped = Scraped(deployment, worker, f"http://127.0.0.1:{port}")
            wait_until(lambda: _ready(scraped) or prometheus.popen.poll() is not None, 60, "prometheus to be ready")
            assert prometheus.popen.poll() is None, prometheus.text()
            yield scraped


def _ready(scraped: Scraped) -> bool:
    try:
        return httpx.get(f"{scraped.prometheus}/-/ready", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class Ran:
    """What the run did (the counts Prometheus must show) and the listen stream still open."""

    counts: dict[str, int]
    stream: ListenStream

    def __getitem__(self, name: str) -> int:
        return self.counts[name]


@pytest.fixture(scope="module")
def ran(scraped: Scraped) -> Iterator[Ran]:
    """A handful of tasks, some failing, one cancelled, one answered, one left waiting for input;
    a listen stream follows the cancelled one (and stays open until the module ends)."""
    scraped.settles('sum(up{job=~"celery-mcp-tasks-.*"})', 2, "both targets up", timeout=60)
    client = McpHttp(scraped.deployment.url)
    stream: ListenStream | None = None
    try:
        done = [client.create("slow_compute", {"seconds": 0}) for _ in range(3)]
        done.append(client.create("failing_job"))  # a tool error: the task completes, with isError
        failed = [client.create("protocol_error_job") for _ in range(2)]
        answered = client.create("confirm_delete", {"filename": "a.txt"})
        waiting = client.create("confirm_delete", {"filename": "b.txt"})
        cancelled = client.create("slow_compute", {"seconds": 30})
        stream = ListenStream(scraped.deployment.url, {"taskIds": [cancelled]})
        assert stream.ack()["notifications"]["taskIds"] == [cancelled]
        client.wait_for(answered, "input_required")
        answer = {"confirm": {"action": "accept", "content": {"confirm": True}}}
        assert "result" in client.task("tasks/update", answered, inputResponses=answer)
        wait_until(lambda: client.get(cancelled)["statusMessage"] == "Started", 30, "the long job to start")
        assert "result" in client.task("tasks/cancel", cancelled)
        while stream.task()["status"] != "cancelled":  # pushed: the start, then the cancel
            pass
        for task_id in [*done, answered]:
            assert client.wait_for(task_id)["status"] == "completed"
        for task_id in failed:
            assert client.wait_for(task_id)["status"] == "failed"
        client.wait_for(waiting, "input_required")
    except BaseException:
        if stream is not None:
            stream.close()
        raise
    finally:
        client.close()
    yield Ran({"created": 9, "completed": 5, "failed": 2, "cancelled": 1, "in_flight": 1}, stream)
    stream.close()


def test_created_equals_finished_plus_in_flight(scraped: Scraped, ran: Ran) -> None:
    scraped.settles("sum(mcp_tasks_created_total)", ran["created"], "every creation scraped")
    scraped.settles("sum(mcp_tasks_finished_total)", ran["created"] - ran["in_flight"], "every finish scraped")
    in_flight = 'sum(mcp_tasks_in_status{status=~"working|input_required"})'
    scraped.settles(in_flight, ran["in_flight"], "a sweep that counted the task still waiting")

    created = scraped.scalar("sum(mcp_tasks_created_total)")
    finished = scraped.scalar("sum(mcp_tasks_finished_total)")
    assert created == (finished or 0) + (scraped.scalar(in_flight) or 0)
    assert scraped.by("sum by (status) (mcp_tasks_in_status)", "status")["input_required"] == 1


def test_finished_by_status_matches_what_happened(scraped: Scraped, ran: Ran) -> None:
    scraped.settles("sum(mcp_tasks_finished_total)", ran["created"] - ran["in_flight"], "every finish scraped")

    assert scraped.by("sum by (status) (mcp_tasks_finished_total)", "status") == {
        status: ran[status] for status in ("completed", "failed", "cancelled")
    }
    by_tool = scraped.by('sum by (tool) (mcp_tasks_finished_total{status="failed"})', "tool")
    assert by_tool == {"protocol_error_job": 2}
    # the prefork children's counts reach the worker's endpoint; the web process counted the cancel
    by_job = scraped.by('sum by (job) (mcp_tasks_finished_total{status="completed"})', "job")
    assert by_job == {"celery-mcp-tasks-worker": ran["completed"]}
    assert scraped.scalar('sum(mcp_tasks_finished_total{job="celery-mcp-tasks-web", status="cancelled"})') == 1
    assert scraped.scalar('sum(mcp_tasks_created_total{job="celery-mcp-tasks-web"})') == ran["created"]


def test_the_histograms_counted_every_run(scraped: Scraped, ran: Ran) -> None:
    finished = ran["created"] - ran["in_flight"]
    scraped.settles("sum(mcp_tasks_duration_seconds_count)", finished, "created -> final for every finished task")

    runs_started = scraped.scalar("sum(mcp_tasks_queue_wait_seconds_count)") or 0
    assert runs_started >= ran["created"] + 1  # every task started once, the answered one twice
    # A run ends where its job ended it: 5 completions (the answered task's second run among them), 2 failures,
    # 2 questions; the cancelled run is not one (a cancel ends the task, and its job's end is refused).
    scraped.settles("sum(mcp_tasks_run_seconds_count)", finished - ran["cancelled"] + 2, "every run's end")
    assert scraped.scalar("sum(mcp_tasks_input_wait_seconds_count)") == 1
    assert (scraped.scalar("sum(mcp_tasks_run_seconds_sum)") or 0) > 0
    assert scraped.scalar('sum(mcp_tasks_duration_seconds_bucket{le="+Inf"})') == finished


def test_the_janitor_and_the_ledger_are_scraped(scraped: Scraped, ran: Ran) -> None:
    wait_until(lambda: (scraped.scalar("sum(mcp_tasks_janitor_sweeps_total)") or 0) >= 2, 30, "sweeps counted")

    assert scraped.scalar("max(mcp_tasks_ledger_up)") == 1
    assert scraped.scalar("max(mcp_tasks_janitor_interval_seconds)") == 1
    age = scraped.scalar("time() - max(mcp_tasks_janitor_last_sweep_timestamp_seconds)")
    assert age is not None and age < 30
    assert scraped.scalar("sum(mcp_tasks_enqueue_failures_total)") in (None, 0)


def test_no_label_value_looks_like_an_id(scraped: Scraped, ran: Ran) -> None:
    scraped.settles("sum(mcp_tasks_created_total)", ran["created"], "every creation scraped")
    reply = httpx.get(f"{scraped.prometheus}/api/v1/series", params={"match[]": '{__name__=~"mcp_tasks_.+"}'}).json()
    series = reply["data"]
    assert len(series) > 50

    values = {(name, value) for labels in series for name, value in labels.items() if name not in PROMETHEUS_LABELS}
    assert [pair for pair in values if TASK_ID.match(pair[1]) or ROW_KEY.match(pair[1])] == []
    assert {name for name, _ in values} <= {"tool", "status", "action", "operation", "source"}
    tools = {value for name, value in values if name == "tool"}
    assert tools <= {"slow_compute", "failing_job", "protocol_error_job", "confirm_delete", "other"}


def test_the_shipped_alert_rules_evaluate_against_real_series(scraped: Scraped, ran: Ran) -> None:
    scraped.settles("sum(mcp_tasks_created_total)", ran["created"], "every creation scraped")

    def evaluated() -> list[dict[str, Any]] | None:
        groups = httpx.get(f"{scraped.prometheus}/api/v1/rules", timeout=10).json()["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        return rules if rules and all(rule.get("lastEvaluation", "").startswith("2") for rule in rules) else None

    rules = wait_until(evaluated, 30, "every rule evaluated once", interval=0.5)
    assert {rule["health"] for rule in rules} == {"ok"}, [rule for rule in rules if rule["health"] != "ok"]
    firing = {rule["name"] for rule in rules if rule["state"] == "firing"}
    assert "McpTasksWorkerMetricsDown" not in firing and "McpTasksJanitorStale" not in firing


def test_the_worker_served_its_metrics_without_a_warning(scraped: Scraped, ran: Ran) -> None:
    log = scraped.worker.text()
    assert "worker metrics on http://" in log
    assert "is not free" not in log


def test_push_streams_and_their_latency_are_scraped(scraped: Scraped, ran: Ran) -> None:
    scraped.settles('sum(mcp_tasks_listen_streams{job="celery-mcp-tasks-web"})', 1, "the open stream")
    # The start and the cancel were pushed (one may coalesce into the other); waited for, as the stream
    # gauge above may have been scraped before the pushes were counted.
    count = "sum(mcp_tasks_push_notify_latency_seconds_count)"
    pushed = wait_until(lambda: scraped.scalar(count), 30, "a push's latency scraped", interval=0.5)
    assert pushed >= 1
    assert (scraped.scalar("sum(mcp_tasks_push_notify_latency_seconds_sum)") or 0) < pushed  # well under 1 s each

    ran.stream.close()
    scraped.settles('sum(mcp_tasks_listen_streams{job="celery-mcp-tasks-web"})', 0, "the stream closed")
