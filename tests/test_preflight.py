"""The start-up checks, in process: what each misconfiguration says, and where the checks run.

The same refusals from real `serve`, `db`, worker and beat processes: tests/test_start_refusals.py.
"""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import sqlalchemy as sa
from celery import Celery, signals

from celery_mcp_tasks import ConfigError, McpTasks
from celery_mcp_tasks import preflight as preflight_module
from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.migrate import downgrade, upgrade
from celery_mcp_tasks.preflight import preflight, script_heads
from celery_mcp_tasks.store.schema import VERSION_TABLE
from tests.conftest import needs_postgres
from tests.support import POSTGRES_URL, free_port, fresh_postgres_database

(HEAD,) = script_heads()[0]  # the package's newest migration


def refusal(settings: Settings, **kwargs: object) -> str:
    kwargs.setdefault("role", "worker")
    with pytest.raises(ConfigError) as refused:
        preflight(settings, **kwargs)  # type: ignore[arg-type]
    message = str(refused.value)
    assert message.startswith("MCP_TASKS_DATABASE_URL") and "\n" not in message
    return message


def test_the_embedded_store_before_its_first_upgrade_is_refused_and_not_created(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    assert "does not exist yet; run `celery-mcp-tasks db upgrade`" in refusal(settings)
    assert not (tmp_path / "tasks.db").exists()
    preflight(settings, role="db", need_schema=False)  # `db upgrade` may create it
    upgrade(settings.store_url)
    preflight(settings, role="worker")


def test_a_schema_behind_head_is_refused_and_one_at_head_passes(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    upgrade(settings.store_url, "0001")
    assert f"is at revision 0001, behind {HEAD}; run `celery-mcp-tasks db upgrade`" in refusal(settings, role="beat")
    preflight(settings, role="serve", need_schema=False)  # serve migrates right after this one
    upgrade(settings.store_url)
    preflight(settings, role="serve")


def test_an_empty_database_file_is_not_migrated(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    sa.create_engine(url).connect().close()
    assert "is not migrated; run `celery-mcp-tasks db upgrade`" in refusal(Settings(database_url=url))


def test_a_data_dir_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    settings = Settings(data_dir=tmp_path / "a-file" / "data")  # its parent is a file: mkdir fails
    for role in ("db", "serve"):  # `db upgrade` and `dev` (which migrates right after) alike
        said = refusal(settings, role=role, need_schema=False)
        assert "MCP_TASKS_DATABASE_URL" in said and "cannot open the task store (Not a directory)" in said


def test_a_schema_from_a_newer_release_is_refused(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    upgrade(settings.store_url)
    engine = sa.create_engine(settings.store_url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = '0099'"))
    engine.dispose()
    assert "revision 0099, which this release of celery-mcp-tasks does not know" in refusal(settings)


def test_a_remote_broker_needs_a_named_store(tmp_path: Path) -> None:
    remote = Settings(data_dir=tmp_path, broker_url="amqp://guest:guest@127.0.0.1:5672//")
    message = refusal(remote, role="serve")
    assert "unset" in message and "amqp://guest:***@127.0.0.1:5672//" in message and ":guest@" not in message
    assert "so this web process keeps tasks" in message  # the role as a reader names it (`dev` checks as serve)
    assert "so this worker keeps tasks" in refusal(remote, role="worker")
    # A broker configured on the Celery app itself (not through CELERY_BROKER_URL) counts the same.
    assert "remote broker redis://h:6379/0" in refusal(Settings(data_dir=tmp_path), broker_url="redis://h:6379/0")
    explicit = f"sqlite:///{tmp_path / 'shared.db'}"
    upgrade(explicit)
    preflight(Settings(data_dir=tmp_path, database_url=explicit, broker_url="redis://h:6379/0"), role="worker")
    upgrade(remote.store_url)
    # `db` too: it would migrate a file nothing serves, and say it had upgraded the task store
    assert "so this db command keeps tasks" in refusal(remote, role="db", need_schema=False)
    preflight(Settings(data_dir=tmp_path), role="worker", broker_url="memory://")


def test_an_unreachable_database_is_named_with_its_password_redacted() -> None:
    url = f"postgresql://mcp:hunter2@127.0.0.1:{free_port()}/tasks"  # nothing listens: refused at once
    message = refusal(Settings(database_url=url), role="db", need_schema=False)
    assert message.startswith("MCP_TASKS_DATABASE_URL=postgresql://mcp:***@127.0.0.1:")
    assert "cannot connect to the task store" in message and "hunter2" not in message


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])  # the store accepts both: so does its deadline
def test_a_database_that_accepts_but_never_answers_is_given_up_on_after_the_connect_timeout(
    monkeypatch: pytest.MonkeyPatch, scheme: str
) -> None:
    """A black hole (a firewall dropping replies, a hung server): without the timeout, start-up would hang."""
    monkeypatch.setattr(preflight_module, "CONNECT_TIMEOUT_S", 1)
    with socket.socket() as black_hole:
        black_hole.bind(("127.0.0.1", 0))
        black_hole.listen(8)  # the kernel completes the handshake; nobody ever answers
        url = f"{scheme}://mcp:hunter2@127.0.0.1:{black_hole.getsockname()[1]}/tasks"
        message = refusal(Settings(database_url=url), role="db", need_schema=False)
    assert "cannot connect to the task store (connection timeout expired)" in message


@needs_postgres
def test_a_missing_postgres_database_says_so() -> None:
    assert POSTGRES_URL
    url = sa.engine.make_url(POSTGRES_URL).set(database="mcp_tasks_no_such_db").render_as_string(hide_password=False)
    assert 'database "mcp_tasks_no_such_db" does not exist' in refusal(Settings(database_url=url))


@needs_postgres
def test_a_migrated_postgres_store_passes() -> None:
    assert POSTGRES_URL
    with fresh_postgres_database(POSTGRES_URL) as url:
        assert "not migrated" in refusal(Settings(database_url=url))
        upgrade(url)
        preflight(Settings(database_url=url), role="worker")


# -- where the checks run: Celery's start-up signals ----------------------------------------------


class Sender:
    """What the signals carry: a beat `Service` or a worker, each knowing its app (hashable, as Celery needs)."""

    def __init__(self, app: Celery, quiet: bool = False) -> None:
        self.app, self.quiet = app, quiet


def runtime(tmp_path: Path) -> McpTasks:
    # No worker metrics: `celeryd_init` in this process would otherwise switch it to multiprocess files.
    settings = Settings(data_dir=tmp_path, worker_metrics_port=None)
    return McpTasks("preflight-unit", celery=Celery("preflight-unit"), settings=settings)


def test_a_standalone_beat_refuses_with_one_line_and_exit_status_1(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    tasks = runtime(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        signals.beat_init.send(sender=Sender(tasks.celery))
    assert stopped.value.code == 1
    assert capfd.readouterr().err.strip().splitlines() == [
        "celery-mcp-tasks: configuration error: MCP_TASKS_DATABASE_URL (unset: the embedded store "
        f"sqlite:///{tmp_path / 'tasks.db'}): the task store does not exist yet; run `celery-mcp-tasks db upgrade`"
    ]


def test_the_worker_main_process_checks_once_and_its_embedded_beat_trusts_it(tmp_path: Path) -> None:
    tasks = runtime(tmp_path)
    runtime(tmp_path / "other")  # unmigrated: it would refuse, were another app's worker its business
    upgrade(tasks.settings.store_url)
    signals.celeryd_init.send(sender="w@h", instance=Sender(tasks.celery), conf=None, options={})
    downgrade(tasks.settings.store_url, "base")
    signals.beat_init.send(sender=Sender(tasks.celery))  # `worker -B`: already checked
    with pytest.raises(SystemExit):
        signals.celeryd_init.send(sender="w@h", instance=Sender(tasks.celery), conf=None, options={})


def test_the_worker_prints_its_store_and_tools_before_the_banner(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    tasks = runtime(tmp_path)

    @tasks.mcp_task
    def write_report(topic: str) -> str:
        return topic

    signals.celeryd_after_setup.send(sender="w@h", instance=Sender(tasks.celery), conf=None)
    assert capfd.readouterr().out.splitlines() == [
        f"celery-mcp-tasks: store sqlite:///{tmp_path / 'tasks.db'}",
        "celery-mcp-tasks: task tools write_report",
    ]
    signals.celeryd_after_setup.send(sender="w@h", instance=Sender(tasks.celery, quiet=True), conf=None)
    assert capfd.readouterr().out == ""


def test_an_unknown_setting_is_said_once_per_process_and_strict_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(preflight_module, "_said", set())
    monkeypatch.setenv("MCP_TASKS_JANITOR_INTERVAL", "5")
    settings = Settings(data_dir=tmp_path)
    with caplog.at_level("WARNING", logger="celery_mcp_tasks"):
        preflight(settings, role="db", need_schema=False)
        preflight(settings, role="db", need_schema=False)  # `serve` checks twice when it migrates
    said = [record.getMessage() for record in caplog.records if "MCP_TASKS_JANITOR_INTERVAL" in record.getMessage()]
    assert len(said) == 1 and "did you mean MCP_TASKS_JANITOR_INTERVAL_S?" in said[0]
    monkeypatch.setenv("MCP_TASKS_STRICT_SETTINGS", "on")
    with pytest.raises(ConfigError, match=r"^MCP_TASKS_JANITOR_INTERVAL is not a celery-mcp-tasks setting"):
        preflight(settings, role="db", need_schema=False)


@needs_postgres
def test_a_host_clock_off_the_databases_is_said_at_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Heartbeats, TTLs and input timeouts are stamped on one host's clock and judged on another's: a process
    whose clock is off the database's says so once at start (and still starts); one that agrees says nothing."""
    assert POSTGRES_URL
    with fresh_postgres_database(POSTGRES_URL) as url:
        upgrade(url)
        settings = Settings(database_url=url, broker_url="redis://127.0.0.1:1/0")
        with caplog.at_level("WARNING", logger="celery_mcp_tasks"):
            preflight(settings, role="worker")
            assert "clock" not in caplog.text
            behind = SimpleNamespace(time=lambda: time.time() - 50)  # this host's clock, driven 50 s back
            monkeypatch.setattr(preflight_module, "time", behind)
            monkeypatch.setattr(preflight_module, "_said", set())
            preflight(settings, role="worker")
            preflight(settings, role="serve")  # said once per process (serve checks twice when it migrates)
    (line,) = [record.getMessage() for record in caplog.records if "clock" in record.getMessage()]
    assert line.startswith("this host's clock is 50.0 s behind the database's") and "NTP" in line


@needs_postgres
def test_a_role_that_cannot_write_the_tables_is_refused_in_one_line() -> None:
    """Without UPDATE the store would answer reads and fail every write, each taken for an outage; without
    SELECT too, the encryption keys' check (which reads the table) must not say it first as a connection error."""
    assert POSTGRES_URL
    role = f"mcp_tasks_reader_{uuid.uuid4().hex[:8]}"
    with fresh_postgres_database(POSTGRES_URL) as url:
        upgrade(url)
        admin = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1), isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(sa.text(f'CREATE ROLE "{role}" LOGIN'))
                conn.execute(
                    sa.text(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "{role}"')
                )
                conn.execute(sa.text(f'REVOKE SELECT, UPDATE, DELETE ON mcp_tasks_task FROM "{role}"'))
            as_role = sa.engine.make_url(url).set(username=role, password=None).render_as_string(hide_password=False)
            message = refusal(Settings(database_url=as_role), role="serve")
            assert message.endswith(
                "the database role lacks mcp_tasks_task: SELECT, UPDATE, DELETE: GRANT SELECT, INSERT, UPDATE, DELETE ON "
                "the mcp_tasks_ tables TO it"
            ), message
            preflight(Settings(database_url=url), role="serve")  # the owner passes
        finally:
            with admin.connect() as conn:
                conn.execute(sa.text(f'DROP OWNED BY "{role}"'))
                conn.execute(sa.text(f'DROP ROLE IF EXISTS "{role}"'))
            admin.dispose()
