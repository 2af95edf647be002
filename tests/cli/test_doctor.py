"""`doctor` in process: each check's row on a real store, broker and transport, the table, and the redaction.

The command against real deployments (a worker, a broker and a schema each broken
in turn), and a broken install: tests/integration/test_doctor.py.
"""

from __future__ import annotations

import io
import json
import re
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_mcp_tasks import McpTasks
from celery_mcp_tasks.app import internals
from celery_mcp_tasks.cli.doctor import (
    Row,
    clock_check,
    diagnose,
    doctor,
    encryption_check,
    push_check,
    render,
    tool_queues,
)
from celery_mcp_tasks.cli.shared import supervised_queues
from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.model import TaskRecord, TaskStatus
from celery_mcp_tasks.ops.probes import ProbeEngine
from celery_mcp_tasks.preflight import script_heads
from celery_mcp_tasks.store.base import ANY
from celery_mcp_tasks.store.codec import KeyRing, new_key
from celery_mcp_tasks.store.rekeying import reencrypt
from celery_mcp_tasks.store.sql import SqlStore
from tests.conftest import needs_pg_redis, needs_postgres
from tests.support import POSTGRES_URL, REDIS_URL, free_port, fresh_postgres_database

(HEAD,) = script_heads()[0]  # the package's newest migration

APP = """
from celery_mcp_tasks import McpTasks

tasks = McpTasks("doctor-test")
celery = tasks.celery
tasks.celery.conf.task_routes = {"*.report": {"queue": "reports"}}


@tasks.mcp_task
def summarize(text: str) -> str:
    return text[:10]


@tasks.mcp_task
def report(topic: str) -> str:
    return topic
"""


@pytest.fixture
def app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An app module of this test's own (imported fresh), on the embedded default under tmp_path."""
    name = f"doctor_app_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(APP))
    monkeypatch.syspath_prepend(str(tmp_path))
    for key in ("MCP_TASKS_DATABASE_URL", "CELERY_BROKER_URL", "MCP_TASKS_NOTIFY", "MCP_TASKS_QUEUE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MCP_TASKS_DATA_DIR", str(tmp_path / "data"))
    yield name
    sys.modules.pop(name, None)


def by_name(rows: list[Row]) -> dict[str, Row]:
    return {row.name: row for row in rows}


def test_an_app_that_does_not_load_is_a_config_fail_and_nothing_else_runs() -> None:
    rows = diagnose("no_such_module_for_doctor")
    assert rows[0].name == "config" and rows[0].status == "FAIL"
    assert "cannot import 'no_such_module_for_doctor'" in rows[0].detail
    assert [row.status for row in rows[1:]] == ["SKIP"] * 8


def test_the_embedded_store_before_its_first_upgrade_is_a_database_fail_with_its_fix(app_module: str) -> None:
    rows = by_name(diagnose(app_module, timeout_s=0.5))
    assert rows["config"].status == "OK"
    assert rows["config"].detail.startswith("2 task tool(s) (report, summarize); store sqlite:///")
    assert rows["database"].status == "FAIL"
    assert rows["database"].detail == "the task store does not exist yet; run `celery-mcp-tasks db upgrade`"
    assert "celery-mcp-tasks db upgrade" in rows["database"].fix
    assert rows["schema"] == Row("schema", "SKIP", "needs database")
    assert rows["janitor"].status == rows["clock"].status == "SKIP"
    assert rows["broker"].status == "OK"


def test_an_app_without_the_attribute_celery_finds_is_a_config_warning_naming_the_line_to_add(
    app_module: str, tmp_path: Path
) -> None:
    """`celery -A APP worker` finds a Celery app by a module attribute; a worker started as the docs say would
    stop at once with Celery's own error, and the workers row would then only say none has the tools."""
    module = tmp_path / f"{app_module}.py"
    module.write_text(module.read_text().replace("celery = tasks.celery\n", ""))
    config = by_name(diagnose(app_module, timeout_s=0.5))["config"]
    assert config.status == "WARN"
    assert config.detail.startswith(
        f"`celery -A {app_module} worker` cannot find this app's Celery app: add `celery = tasks.celery` to "
        f"{app_module}; store sqlite:///"
    )


def test_a_misspelled_setting_is_a_config_warning_and_under_strict_settings_a_fail(
    app_module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `serve` and the worker say of it: doctor's config row must not pass what they refuse."""
    monkeypatch.setenv("MCP_TASKS_JANITOR_INTERVAL", "30")
    config = by_name(diagnose(app_module, timeout_s=0.5))["config"]
    assert config.status == "WARN"
    assert config.detail.startswith(
        "MCP_TASKS_JANITOR_INTERVAL is not a celery-mcp-tasks setting and is ignored (did you mean "
        "MCP_TASKS_JANITOR_INTERVAL_S?); MCP_TASKS_STRICT_SETTINGS=on makes this an error; store sqlite:///"
    )
    monkeypatch.setenv("MCP_TASKS_STRICT_SETTINGS", "on")
    rows = diagnose(app_module, timeout_s=0.5)
    assert (rows[0].name, rows[0].status) == ("config", "FAIL")
    assert rows[0].detail == (
        "configuration error: MCP_TASKS_JANITOR_INTERVAL is not a celery-mcp-tasks setting (did you mean "
        "MCP_TASKS_JANITOR_INTERVAL_S?); MCP_TASKS_STRICT_SETTINGS is on"
    )


def test_a_schema_behind_head_is_a_schema_fail_with_the_upgrade_command(app_module: str, tmp_path: Path) -> None:
    upgrade(Settings(data_dir=tmp_path / "data").store_url, "0004")
    rows = by_name(diagnose(app_module, timeout_s=0.5))
    assert rows["database"].status == "OK"
    assert rows["schema"].status == "FAIL"
    assert f"behind {HEAD}" in rows["schema"].detail
    assert rows["schema"].fix.startswith("run `celery-mcp-tasks db upgrade`")
    assert rows["janitor"] == Row("janitor", "SKIP", "needs schema")


def test_on_a_swept_embedded_store_only_the_missing_worker_fails(app_module: str, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    upgrade(settings.store_url)
    stream = io.StringIO()
    rows = diagnose(app_module, timeout_s=0.5)
    statuses = {row.name: row.status for row in rows}
    janitor = next(row for row in rows if row.name == "janitor")
    assert statuses["janitor"] == "WARN", "never swept yet: a fresh deployment's first sweep is an interval away"
    assert "the first sweep comes about 5s after the sweeper starts" in janitor.detail  # the app's interval
    assert "celery -A" in janitor.fix and "beat" in janitor.fix
    internals(sys.modules[app_module].tasks).sweep()
    rows = diagnose(app_module, timeout_s=0.5)
    statuses = {row.name: row.status for row in rows}
    assert statuses == {
        "config": "OK",
        "database": "OK",
        "schema": "OK",
        "broker": "OK",
        "workers": "FAIL",
        "janitor": "OK",
        "push": "SKIP",
        "clock": "OK",
        "encryption": "OK",
    }
    workers = by_name(rows)["workers"]
    assert workers.detail == "no worker answered within 0.5s"
    assert workers.fix == f"start a worker with this app's settings: `celery -A {app_module} worker -Q celery,reports`"
    render(rows, stream=stream)
    text = stream.getvalue()
    assert text.splitlines()[0].split() == ["CHECK", "STATUS", "DETAIL"]
    assert f"fix: start a worker with this app's settings: `celery -A {app_module} worker -Q celery,reports`" in text


def test_json_output_and_the_exit_status(app_module: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor(app_module, json_output=True, timeout_s=0.3) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["status"] == "fail"
    assert [check["name"] for check in document["checks"]] == [
        "config",
        "database",
        "schema",
        "broker",
        "workers",
        "janitor",
        "push",
        "clock",
        "encryption",
    ]
    assert set(document["checks"][0]) == {"name", "status", "detail", "fix"}


def test_no_password_is_printed(app_module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()  # nothing listens: the database check fails with the driver's own words
    monkeypatch.setenv("MCP_TASKS_DATABASE_URL", f"postgresql://doctor:s3cr3t-pw@127.0.0.1:{port}/db")
    monkeypatch.setenv("CELERY_BROKER_URL", f"redis://:br0ker-pw@127.0.0.1:{free_port()}/0")
    rows = diagnose(app_module, timeout_s=0.3)
    stream = io.StringIO()
    render(rows, stream=stream)
    render(rows, json_output=True, stream=stream)
    text = stream.getvalue()
    assert by_name(rows)["database"].status == "FAIL" and by_name(rows)["broker"].status == "FAIL"
    assert "s3cr3t-pw" not in text and "br0ker-pw" not in text
    assert f"postgresql://doctor:***@127.0.0.1:{port}/db" in text


def test_tool_queues_follow_the_jobs_own_routing(tmp_path: Path) -> None:
    tasks = McpTasks("queues", settings=Settings(data_dir=tmp_path, queue="main"))

    @tasks.mcp_task
    def one() -> None: ...

    @tasks.mcp_task
    def two() -> None: ...

    tasks.celery.conf.task_routes = {"*.two": {"queue": "slow"}}

    assert tool_queues(tasks) == {"main": ["one"], "slow": ["two"]}


def test_a_tool_routed_by_exchange_alone_has_no_queue_to_consume_or_check(tmp_path: Path) -> None:
    tasks = McpTasks("exchanges", settings=Settings(data_dir=tmp_path, queue="main"))

    @tasks.mcp_task
    def one() -> None: ...

    @tasks.mcp_task
    def two() -> None: ...

    tasks.celery.conf.task_routes = {"*.two": {"exchange": "jobs", "routing_key": "two"}}

    assert tool_queues(tasks) == {"main": ["one"]}  # never a queue called "None"


def test_with_fair_queues_the_default_queues_tools_are_sent_to_each_shard(tmp_path: Path) -> None:
    tasks = McpTasks("fair", settings=Settings(data_dir=tmp_path, queue="main", fair_queues=2))

    @tasks.mcp_task
    def one() -> None: ...

    @tasks.mcp_task
    def two() -> None: ...

    tasks.celery.conf.task_routes = {"*.two": {"queue": "slow"}}

    assert tool_queues(tasks) == {"main.fair0": ["one"], "main.fair1": ["one"], "slow": ["two"]}
    assert supervised_queues(tasks) == ["main", "slow", "main.fair0", "main.fair1"]  # main: the janitor's


# -- with real servers -------------------------------------------------------------------


@pytest.fixture
def postgres_store() -> Iterator[str]:
    if not POSTGRES_URL:
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL to run")
    with fresh_postgres_database(POSTGRES_URL) as url:
        upgrade(url)
        yield url


@pytest.mark.postgres
@needs_postgres
def test_the_clock_of_this_host_agrees_with_the_databases(postgres_store: str) -> None:
    verdict = clock_check(ProbeEngine(postgres_store))
    assert verdict.status == "OK" and "±" in verdict.detail


@pytest.mark.postgres
@needs_postgres
def test_a_hint_goes_round_postgres_notify_and_listen(postgres_store: str, tmp_path: Path) -> None:
    tasks = McpTasks("push-pg", settings=Settings(database_url=postgres_store, broker_url="filesystem://"))
    verdict = push_check(tasks, ProbeEngine(postgres_store), timeout_s=5)
    assert verdict.status == "OK", verdict
    assert verdict.detail.startswith("postgres: a hint published and received in ")


@pytest.mark.postgres
@pytest.mark.redis
@needs_pg_redis
def test_a_hint_goes_round_the_brokers_fanout(postgres_store: str) -> None:
    assert REDIS_URL
    settings = Settings(database_url=postgres_store, broker_url=REDIS_URL, notify="broker")
    tasks = McpTasks("push-broker", settings=settings)
    verdict = push_check(tasks, ProbeEngine(postgres_store), timeout_s=5)
    assert verdict.status == "OK", verdict
    assert verdict.detail.startswith("broker: a hint published and received in ")


@pytest.mark.postgres
@needs_postgres
def test_a_listener_that_cannot_connect_is_a_push_fail(postgres_store: str) -> None:
    unreachable = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"
    tasks = McpTasks("push-down", settings=Settings(database_url=unreachable, broker_url="filesystem://"))
    verdict = push_check(tasks, ProbeEngine(postgres_store), timeout_s=1)
    assert verdict.status == "FAIL"
    assert verdict.detail == "postgres: the listener did not connect within 1s"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_the_rich_table_with_each_fix() -> None:
    rows = [
        Row("database", "OK", "reachable (3 ms)"),
        Row("workers", "FAIL", "no worker answered within 3s", "start a worker: `celery -A app worker [-Q q]`"),
    ]
    stream = Terminal()
    render(rows, stream=stream)
    text = re.sub(r"\x1b\[[0-9;]*m", "", stream.getvalue())
    assert text.startswith("┏") and "┃ check" in text
    assert "fix: start a worker: `celery -A app worker [-Q q]`" in text, "markup in a fix is printed, not parsed"
    assert "CHECK     STATUS" not in text


# -- the key ring against the store (SQLite and PostgreSQL) -------------------------------


def test_the_encryption_row_follows_the_ring_through_a_rotation(store_url: str, tmp_path: Path) -> None:
    old, new = new_key(), new_key()
    old_id, new_id = (KeyRing.parse([key]).primary_id for key in (old, new))

    def verdict(*ring: str) -> tuple[str, str, str]:
        tasks = McpTasks("ring", settings=Settings(database_url=store_url, encryption_keys=ring, data_dir=tmp_path))
        found = encryption_check(tasks, ProbeEngine(store_url))
        return found.status, found.detail, found.fix

    def write(key: str, at: int, *ring: str) -> None:
        store = SqlStore.from_url(store_url, ring=KeyRing.parse(ring) if ring else None)
        record = TaskRecord(
            key=key, owner=None, tool="t", status=TaskStatus.WORKING, created_at=at, updated_at=at, ttl_ms=None
        )
        store.create(record, max_rows=None)
        store.dispose()

    assert verdict() == ("OK", "off: 0 task(s) stored in clear (set MCP_TASKS_ENCRYPTION_KEYS to seal payloads)", "")
    write("a" * 64, 1_000)  # written before encryption was turned on
    status, detail, fix = verdict(old)
    assert (status, detail) == (
        "WARN",
        f"on: 0 task(s) sealed with key {old_id}, the first of 1; 0 sealed with an older key, 1 in clear",
    )
    assert fix.startswith("run `celery-mcp-tasks db reencrypt`")

    write("b" * 64, 2_000, old)
    status, detail, fix = verdict(new)  # a process given the wrong ring: what every process refuses to start with
    assert status == "FAIL" and detail.startswith("MCP_TASKS_ENCRYPTION_KEYS: none of its keys opens")
    assert "the same on every process" in fix
    status, detail, _ = verdict()
    assert status == "FAIL" and detail.startswith("MCP_TASKS_ENCRYPTION_KEYS: unset, but the task store holds")

    write("c" * 64, 3_000, new, old)  # rotated: the new key seals, the old one still opens
    assert verdict(new, old)[:2] == (
        "WARN",
        f"on: 1 task(s) sealed with key {new_id}, the first of 2; 1 sealed with an older key, 1 in clear",
    )
    status, detail, fix = verdict(new)  # retired before `db reencrypt`: the old row reads as a failed task
    assert (status, detail) == ("WARN", f"1 task(s) sealed with a key not in the ring read as failed: key {old_id} (1)")
    assert "put that key back" in fix and "db reencrypt" in fix

    engine = SqlStore.from_url(store_url).engine
    try:
        assert reencrypt(engine, KeyRing.parse([new, old])).rewritten == 2
    finally:
        engine.dispose()
    assert verdict(new) == ("OK", f"on: 3 task(s) sealed with key {new_id}, the first of 1", "")

    # A process still sealing with the old key finishes a job afterwards: that one column is the old key's.
    late = SqlStore.from_url(store_url, ring=KeyRing.parse([old, new]))
    late.update("c" * 64, ANY, lambda record: record.completed({"content": []}, 4_000))
    late.dispose()
    status, detail, _ = verdict(new)
    assert (status, detail) == ("WARN", f"1 task(s) sealed with a key not in the ring read as failed: key {old_id} (1)")
