"""A misconfigured process refuses to start: exit status != 0, one stderr line naming the setting and
the fix, no traceback, the password redacted, and nothing written to the store.

Real `celery -A ... worker|beat` and `celery-mcp-tasks serve|db` processes, one per case.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
import sqlalchemy as sa

from celery_mcp_tasks import migrate
from celery_mcp_tasks.store.schema import VERSION_TABLE
from tests.conftest import needs_pg_redis, needs_postgres
from tests.support import (
    POSTGRES_URL,
    REDIS_URL,
    ROOT,
    free_port,
    fresh_postgres_database,
    spawn,
    tool,
    wait_until,
)

pytestmark = pytest.mark.integration

APP = "tests.apps.runtime_app"
WORKER = ["-m", "celery", "-A", APP, "worker", "-P", "solo", "--without-mingle", "--without-gossip"]
BEAT = ["-m", "celery", "-A", APP, "beat"]
SERVE = ["-m", "celery_mcp_tasks.cli", "serve", APP, "--port", "0"]
SERVE_NO_MIGRATE = [*SERVE, "--no-migrate"]
DB_UPGRADE = ["-m", "celery_mcp_tasks.cli", "db", "upgrade"]
SECRET = "s3cr3t-pw"
UPGRADE_HINT = "run `celery-mcp-tasks db upgrade`"


def run(argv: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    # The caller's PYTHONPATH after ROOT (as tests.support does): a checkout's src/ wins over an installed copy.
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    base = {"PATH": "/usr/bin:/bin", "PYTHONPATH": path, "MCP_TASKS_DATA_DIR": str(tmp_path / "data")}
    beat_schedule = ["-s", str(tmp_path / "beat-schedule")] if "beat" in argv else []
    return subprocess.run(
        [sys.executable, *argv, *beat_schedule],
        cwd=tmp_path,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=90,
    )


def assert_refused(done: subprocess.CompletedProcess[str], *expected: str) -> str:
    """Exit != 0 and exactly one stderr line, starting with the setting, saying what to do."""
    assert done.returncode != 0, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert line.startswith("celery-mcp-tasks: configuration error: MCP_TASKS_DATABASE_URL"), line
    for text in expected:
        assert text in line, line
    output = done.stdout + done.stderr
    assert "Traceback" not in output and SECRET not in output
    return line


def tables(url: str) -> set[str]:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            return set(sa.inspect(conn).get_table_names())
    finally:
        engine.dispose()


def task_rows(url: str) -> int:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT count(*) FROM mcp_tasks_task")).scalar_one())
    finally:
        engine.dispose()


def revision(url: str) -> str:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            return str(conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar_one())
    finally:
        engine.dispose()


def with_password(url: str) -> str:
    return sa.engine.make_url(url).set(password=SECRET).render_as_string(hide_password=False)


@pytest.fixture
def empty_postgres() -> Iterator[str]:
    """A database that exists and answers, with no schema (trust auth ignores the password)."""
    if not POSTGRES_URL:
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL to run")
    with fresh_postgres_database(POSTGRES_URL) as url:
        yield url


EVERY_PROCESS = [WORKER, BEAT, SERVE, SERVE_NO_MIGRATE, DB_UPGRADE]
IDS = ["worker", "beat", "serve", "serve-no-migrate", "db-upgrade"]


@pytest.mark.parametrize("argv", EVERY_PROCESS, ids=IDS)
def test_an_unreachable_database_is_one_line_naming_it_with_the_password_redacted(
    argv: list[str], tmp_path: Path
) -> None:
    url = f"postgresql://mcp:{SECRET}@127.0.0.1:{free_port()}/tasks"  # nothing listens on that port
    line = assert_refused(run(argv, tmp_path, MCP_TASKS_DATABASE_URL=url), "cannot connect", "mcp:***@127.0.0.1")
    assert "Connection refused" in line


@pytest.mark.parametrize("argv", EVERY_PROCESS, ids=IDS)
def test_a_malformed_database_url_is_one_line_naming_it(argv: list[str], tmp_path: Path) -> None:
    assert_refused(
        run(argv, tmp_path, MCP_TASKS_DATABASE_URL=f"mysql://mcp:{SECRET}@db/tasks"), "unsupported database 'mysql'"
    )


@pytest.mark.parametrize("argv", [WORKER, BEAT, SERVE_NO_MIGRATE], ids=["worker", "beat", "serve-no-migrate"])
@needs_postgres
def test_an_unmigrated_database_is_refused_and_left_untouched(
    argv: list[str], tmp_path: Path, empty_postgres: str
) -> None:
    done = run(argv, tmp_path, MCP_TASKS_DATABASE_URL=with_password(empty_postgres))
    assert_refused(done, "not migrated", UPGRADE_HINT)
    assert tables(empty_postgres) == set()


@pytest.mark.parametrize("argv", [WORKER, BEAT, SERVE_NO_MIGRATE], ids=["worker", "beat", "serve-no-migrate"])
@needs_postgres
def test_a_schema_behind_head_is_refused(argv: list[str], tmp_path: Path, empty_postgres: str) -> None:
    migrate.upgrade(empty_postgres, "0001")
    assert_refused(run(argv, tmp_path, MCP_TASKS_DATABASE_URL=empty_postgres), "at revision 0001, behind", UPGRADE_HINT)
    assert revision(empty_postgres) == "0001" and task_rows(empty_postgres) == 0


@pytest.mark.parametrize("argv", [WORKER, BEAT, SERVE_NO_MIGRATE], ids=["worker", "beat", "serve-no-migrate"])
def test_the_embedded_store_not_yet_created_is_refused_without_creating_it(argv: list[str], tmp_path: Path) -> None:
    assert_refused(run(argv, tmp_path), "does not exist yet", UPGRADE_HINT)
    assert not (tmp_path / "data" / "tasks.db").exists()


@pytest.mark.parametrize("argv", [WORKER, BEAT, SERVE, SERVE_NO_MIGRATE], ids=IDS[:4])
def test_a_remote_broker_with_the_embedded_default_store_is_refused(argv: list[str], tmp_path: Path) -> None:
    broker = f"redis://:{SECRET}@127.0.0.1:{free_port()}/13"
    line = assert_refused(run(argv, tmp_path, CELERY_BROKER_URL=broker), "unset", "remote broker", "redis://:***@")
    assert "set MCP_TASKS_DATABASE_URL" in line
    assert not (tmp_path / "data" / "tasks.db").exists()  # serve did not migrate it either


@pytest.mark.parametrize("argv", [WORKER, BEAT, SERVE], ids=["worker", "beat", "serve"])
def test_a_broker_url_naming_no_transport_and_a_notify_that_cannot_work_are_one_line(
    argv: list[str], tmp_path: Path
) -> None:
    """A typo in the broker's scheme started serve (every send then failed) and killed the worker with a
    traceback; MCP_TASKS_NOTIFY=broker on the embedded broker killed the worker with two."""
    cases = (
        (
            {"CELERY_BROKER_URL": "redsi://127.0.0.1:6379/13"},
            "CELERY_BROKER_URL: kombu has no transport named 'redsi'; did you mean redis://?",
        ),
        ({"MCP_TASKS_NOTIFY": "broker"}, "MCP_TASKS_NOTIFY: broker needs a Redis or RabbitMQ broker"),
    )
    for env, said in cases:
        done = run(argv, tmp_path, **env)
        output = done.stdout + done.stderr
        assert done.returncode != 0 and "Traceback" not in output, output
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"celery-mcp-tasks: configuration error: {said}"), output
        assert not (tmp_path / "data" / "tasks.db").exists()


@pytest.mark.parametrize("argv", [WORKER, BEAT], ids=["worker", "beat"])
@pytest.mark.parametrize("refusal", ["vhost", "password"])
def test_a_rabbitmq_refusing_the_vhost_or_the_login_is_one_line_naming_the_setting(
    argv: list[str], refusal: str, tmp_path: Path
) -> None:
    """A vhost RabbitMQ does not have: the worker's consumer reconnected several times a second, a traceback
    each time, for ever; a wrong password: one CRITICAL traceback. Neither named the setting."""
    url = os.environ.get("MCP_TASKS_TEST_RABBITMQ_URL")
    if not url:
        pytest.skip("set MCP_TASKS_TEST_RABBITMQ_URL to run")
    parts = urlsplit(url)
    host = f"{parts.hostname}:{parts.port or 5672}"
    broker, reason = {
        "vhost": (f"amqp://{parts.username}:{parts.password}@{host}/mcp-tasks-no-such-vhost", "NOT_ALLOWED"),
        "password": (f"amqp://{parts.username}:{SECRET}@{host}//", "ACCESS_REFUSED"),
    }[refusal]
    store = f"sqlite:///{tmp_path / 'tasks.db'}"
    migrate.upgrade(store)
    done = run(argv, tmp_path, MCP_TASKS_DATABASE_URL=store, CELERY_BROKER_URL=broker)
    output = done.stdout + done.stderr
    assert done.returncode != 0 and "Traceback" not in output and SECRET not in output, output
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(
        f"celery-mcp-tasks: configuration error: CELERY_BROKER_URL: the broker amqp://{parts.username}:***@{host}/"
    ), line
    assert reason in line and line.endswith("check its user, password and vhost"), line


@pytest.fixture(scope="module")
def redis_with_a_password(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A `redis-server` of the module's own that asks for a password: its port."""
    port = free_port()
    binary = tool("redis-server", "Debian: apt-get install redis-server")
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--requirepass", "the-right-one"]
    with (tmp_path_factory.mktemp("redis-auth") / "redis.log").open("ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: _answers(port), 10, "redis-server to answer")
        yield port
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _answers(port: int) -> bool:
    try:
        redis.Redis(port=port, password="the-right-one", socket_connect_timeout=0.2).ping()
    except redis.RedisError:
        return False
    return True


@pytest.mark.parametrize("argv", [WORKER, BEAT], ids=["worker", "beat"])
@pytest.mark.parametrize("password", [SECRET, None], ids=["wrong", "none"])
def test_a_redis_refusing_the_password_is_one_line_naming_the_setting(
    argv: list[str], password: str | None, redis_with_a_password: int, tmp_path: Path
) -> None:
    """The worker retried a wrong Redis password for ever, an ERROR line each time, naming no setting."""
    host = f"127.0.0.1:{redis_with_a_password}"
    broker = f"redis://:{password}@{host}/0" if password else f"redis://{host}/0"
    store = f"sqlite:///{tmp_path / 'tasks.db'}"
    migrate.upgrade(store)
    done = run(argv, tmp_path, MCP_TASKS_DATABASE_URL=store, CELERY_BROKER_URL=broker)
    output = done.stdout + done.stderr
    assert done.returncode != 0 and "Traceback" not in output and SECRET not in output, output
    (line,) = done.stderr.strip().splitlines()
    shown = f"redis://:***@{host}/0" if password else f"redis://{host}/0"
    assert line.startswith(f"celery-mcp-tasks: configuration error: CELERY_BROKER_URL: the broker {shown} "), line
    assert line.endswith("check its password (and user)"), line


MOUNTED = ["-m", "uvicorn", "tests.apps.mounted_app:app", "--port", "0"]


def test_an_app_mounted_in_ones_own_runs_the_start_up_checks_in_its_lifespan(tmp_path: Path) -> None:
    """Served by another ASGI server (FastAPI's lifespan=tasks.lifespan), the app refuses what `serve` refuses
    before it takes a request: an embedded store not yet created, the embedded store on a remote broker. The
    refusal is uvicorn's start-up failure with a `ConfigError`, not one wrapped in the SDK's task group's."""
    for env in ({}, {"CELERY_BROKER_URL": f"redis://127.0.0.1:{free_port()}/13"}):
        done = run(MOUNTED, tmp_path, **env)
        output = done.stdout + done.stderr
        assert done.returncode != 0 and "Application startup complete" not in output, output
        assert "ConfigError: MCP_TASKS_DATABASE_URL" in output, output
        assert "ExceptionGroup" not in output, output  # the refusal as itself, not inside the SDK's task group
        assert ("remote broker" if env else UPGRADE_HINT) in output, output
        assert not (tmp_path / "data" / "tasks.db").exists()
    assert run(DB_UPGRADE, tmp_path).returncode == 0
    port = free_port()
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": path, "MCP_TASKS_DATA_DIR": str(tmp_path / "data")}
    server = spawn("mounted", [sys.executable, *MOUNTED[:-1], str(port)], env, tmp_path)
    try:
        wait_until(lambda: "Application startup complete" in server.text(), 60, "the mounted app to start")
    finally:
        server.stop()


def test_db_upgrade_creates_the_schema_on_an_empty_database_and_serve_no_migrate_then_starts(
    tmp_path: Path, empty_postgres: str
) -> None:
    assert run(DB_UPGRADE, tmp_path, MCP_TASKS_DATABASE_URL=empty_postgres).returncode == 0
    assert {"mcp_tasks_task", VERSION_TABLE} <= tables(empty_postgres)
    port = free_port()
    web = spawn(
        "web",
        [sys.executable, "-m", "celery_mcp_tasks.cli", "serve", APP, "--port", str(port), "--no-migrate"],
        {
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(ROOT),
            "MCP_TASKS_DATABASE_URL": empty_postgres,
            "MCP_TASKS_DATA_DIR": str(tmp_path / "data"),
            "MCP_TASKS_NOTIFY": "poll",
        },
        tmp_path,
    )
    try:
        wait_until(lambda: "Uvicorn running" in web.text() or web.popen.poll() is not None, 60, "serve to start")
        assert web.popen.poll() is None, web.text()
    finally:
        web.stop()


@needs_pg_redis
def test_an_explicit_sqlite_store_on_a_remote_broker_is_the_users_choice_and_the_worker_says_what_it_serves(
    tmp_path: Path,
) -> None:
    assert REDIS_URL
    url = f"sqlite:///{tmp_path / 'explicit.db'}"
    migrate.upgrade(url)
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
        "MCP_TASKS_DATABASE_URL": url,
        "CELERY_BROKER_URL": REDIS_URL,
        "MCP_TASKS_QUEUE": f"refusals-{free_port()}",
    }
    worker = spawn(
        "worker",
        [
            sys.executable,
            *WORKER[:5],
            "-P",
            "prefork",
            "-c",
            "2",
            "--loglevel",
            "INFO",
            "--without-mingle",
            "--without-gossip",
        ],
        env,
        tmp_path,
    )
    try:
        wait_until(lambda: " ready." in worker.text() or worker.popen.poll() is not None, 60, "the worker")
        text = worker.text()
        assert worker.popen.poll() is None, text
        assert text.count(f"celery-mcp-tasks: store {url}") == 1  # once, by the main process
        tools = next(line for line in text.splitlines() if line.startswith("celery-mcp-tasks: task tools "))
        assert {"two_rounds", "work", "hopeless"} <= set(
            tools.removeprefix("celery-mcp-tasks: task tools ").split(", ")
        )
    finally:
        worker.stop()


@pytest.mark.parametrize("argv", [WORKER, BEAT, SERVE_NO_MIGRATE], ids=["worker", "beat", "serve-no-migrate"])
def test_every_process_names_a_misspelled_setting_once_at_start(argv: list[str], tmp_path: Path) -> None:
    """The warning comes before the start-up checks: here, before the refusal of a store not yet created."""
    done = run(argv, tmp_path, MCP_TASKS_JANITOR_INTERVAL="5", MCP_TASKS_TEST_ANYTHING="ignored")
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2, done.stderr
    assert "MCP_TASKS_JANITOR_INTERVAL is not a celery-mcp-tasks setting and is ignored" in lines[0]  # beat: a log line
    assert "did you mean MCP_TASKS_JANITOR_INTERVAL_S?" in lines[0]
    assert lines[1].startswith("celery-mcp-tasks: configuration error: MCP_TASKS_DATABASE_URL"), lines


@pytest.mark.parametrize("argv", EVERY_PROCESS, ids=IDS)
def test_with_strict_settings_a_misspelled_setting_is_one_refusing_line(argv: list[str], tmp_path: Path) -> None:
    done = run(argv, tmp_path, MCP_TASKS_JANITOR_INTERVAL="5", MCP_TASKS_STRICT_SETTINGS="1")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "celery-mcp-tasks: configuration error: MCP_TASKS_JANITOR_INTERVAL is not a celery-mcp-tasks setting "
        "(did you mean MCP_TASKS_JANITOR_INTERVAL_S?); MCP_TASKS_STRICT_SETTINGS is on"
    ]


@pytest.mark.parametrize(
    ("setting", "value", "why"),
    [
        ("MCP_TASKS_QUOTA_ACTIVE", "-1", "must be >= 1, got -1"),
        ("MCP_TASKS_QUOTA_CREATIONS", "lots", "expected an integer, or none/off"),
        ("MCP_TASKS_MAX_RESULT_BYTES", "-5", "must be >= 1"),
        ("MCP_TASKS_ENCRYPTION_KEYS", "not-a-key", "key 1 of 1 is not a base64 32-byte key"),
        ("MCP_TASKS_STRICT_SETTINGS", "yesplease", "expected on or off, got 'yesplease'"),
    ],
)
@pytest.mark.parametrize("argv", [WORKER, SERVE], ids=["worker", "serve"])
def test_a_bad_limit_or_key_ring_is_one_refusing_line_naming_the_setting(
    argv: list[str], setting: str, value: str, why: str, tmp_path: Path
) -> None:
    """Issue 23's bad input: refused at start by every process, before anything else is checked or created."""
    done = run(argv, tmp_path, **{setting: value})
    assert done.returncode != 0, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"celery-mcp-tasks: configuration error: {setting}: "), done.stderr
    assert why in lines[0] and "Traceback" not in done.stdout + done.stderr
    assert not (tmp_path / "data").exists()  # the embedded store was not created
