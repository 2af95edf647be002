"""Alembic: the repository's `alembic upgrade head`, the CLI and the programmatic API agree
with the models, leave other tables alone, never drift (`alembic check`), and carry a
populated database from the first revision to head."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import MISSING, fields, replace
from pathlib import Path

import pytest
import sqlalchemy as sa

from celery_mcp_tasks import migrate
from celery_mcp_tasks.model import TaskRecord, TaskStatus, new_task_id, now_ms, task_key
from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.store.engine import normalize_url
from celery_mcp_tasks.store.schema import VERSION_TABLE
from celery_mcp_tasks.store.sql import SqlStore
from tests.builders import SendOnly
from tests.conftest import needs_postgres
from tests.support import POSTGRES_URL, ROOT, fresh_postgres_database


def _head() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(migrate.alembic_config("sqlite://")).get_current_head()
    assert head is not None
    return head


def _run(argv: list[str], url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MCP_TASKS_DATABASE_URL": url}
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def _assert_migrated_without_drift(url: str) -> None:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.connect() as conn:
        tables = set(sa.inspect(conn).get_table_names())
        assert {"mcp_tasks_task", VERSION_TABLE} <= tables
        assert "alembic_version" not in tables  # a host app's own history is untouched
        assert conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar_one() == _head()
    engine.dispose()
    migrate.check(url)  # raises on any difference between models and schema


def _check_both_entry_points(url_a: str, url_b: str) -> None:
    alembic = _run([sys.executable, "-m", "alembic", "upgrade", "head"], url_a)
    assert alembic.returncode == 0, alembic.stderr
    check = _run([sys.executable, "-m", "alembic", "check"], url_a)
    assert check.returncode == 0 and "No new upgrade operations detected" in check.stdout + check.stderr
    cli = _run([sys.executable, "-m", "celery_mcp_tasks.cli", "db", "upgrade"], url_b)
    assert cli.returncode == 0, cli.stderr
    _assert_migrated_without_drift(url_a)
    _assert_migrated_without_drift(url_b)


@pytest.mark.integration
def test_sqlite_upgrade_head_then_check_reports_no_drift(tmp_path: Path):
    _check_both_entry_points(f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}")


@needs_postgres
@pytest.mark.integration
def test_postgres_upgrade_head_then_check_reports_no_drift():
    assert POSTGRES_URL
    with fresh_postgres_database(POSTGRES_URL) as url_a, fresh_postgres_database(POSTGRES_URL) as url_b:
        _check_both_entry_points(url_a, url_b)


def test_downgrade_to_base_and_up_again(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'c.db'}"
    migrate.upgrade(url)
    migrate.downgrade(url, "base")
    engine = sa.create_engine(url)
    assert "mcp_tasks_task" not in sa.inspect(engine).get_table_names()
    engine.dispose()
    migrate.upgrade(url)
    _assert_migrated_without_drift(url)


# What the wheel holds is proven on the real wheel, built from the sdist, by .ci/check_wheel.py
# (run from .ci/install_paths.sh). The tests below prove that check can fail.


def _console_assets() -> list[str]:
    """The console's templates and static files, as the wheel names them."""
    console = ROOT / "src" / "celery_mcp_tasks" / "console"
    return sorted(
        p.relative_to(ROOT / "src").as_posix() for d in ("templates", "static") for p in (console / d).iterdir()
    )


def _check_wheel(tmp_path: Path, drop: str | None = None) -> tuple[int, str]:
    """Run .ci/check_wheel.py on a wheel and an sdist laid out like the real ones, minus `drop`."""
    import importlib.util
    import io
    import tarfile
    import zipfile
    from contextlib import redirect_stderr, redirect_stdout

    versions = sorted(p.name for p in (ROOT / "migrations" / "versions").glob("*.py"))
    info = "celery_mcp_tasks-0.1.0.dist-info"
    members = {
        "celery_mcp_tasks/migrations/env.py": "",
        "celery_mcp_tasks/migrations/script.py.mako": "",
        **{f"celery_mcp_tasks/migrations/versions/{v}": "" for v in versions},
        "celery_mcp_tasks/py.typed": "",
        **dict.fromkeys(_console_assets(), ""),
        f"{info}/licenses/LICENSE": "Apache",
        f"{info}/METADATA": "Name: celery-mcp-tasks\nLicense-Expression: Apache-2.0\nLicense-File: LICENSE\n",
    }
    dist = tmp_path / "dist"
    dist.mkdir()
    with zipfile.ZipFile(dist / "celery_mcp_tasks-0.1.0-py3-none-any.whl", "w") as wheel:
        for name, text in members.items():
            if name != drop:
                wheel.writestr(name, text)
    with tarfile.open(dist / "celery_mcp_tasks-0.1.0.tar.gz", "w:gz") as sdist:
        for name in ("LICENSE", "src/celery_mcp_tasks/migrations/env.py"):
            data = b"x"
            entry = tarfile.TarInfo(f"celery_mcp_tasks-0.1.0/{name}")
            entry.size = len(data)
            sdist.addfile(entry, io.BytesIO(data))
    spec = importlib.util.spec_from_file_location("check_wheel", ROOT / ".ci" / "check_wheel.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = io.StringIO()
    argv, sys.argv = sys.argv, ["check_wheel.py", str(dist), str(ROOT)]
    try:
        with redirect_stdout(out), redirect_stderr(out):
            status = module.main()
    finally:
        sys.argv = argv
    return status, out.getvalue()


def test_the_ci_wheel_check_passes_a_wheel_with_every_migration(tmp_path: Path):
    status, output = _check_wheel(tmp_path)
    assert status == 0, output
    assert all(v.name in output for v in (ROOT / "migrations" / "versions").glob("*.py"))


def test_the_ci_wheel_check_fails_a_wheel_missing_the_newest_migration(tmp_path: Path):
    newest = sorted(p.name for p in (ROOT / "migrations" / "versions").glob("*.py"))[-1]
    status, output = _check_wheel(tmp_path, drop=f"celery_mcp_tasks/migrations/versions/{newest}")
    assert status == 1 and f"missing celery_mcp_tasks/migrations/versions/{newest}" in output


def test_the_ci_wheel_check_fails_a_wheel_missing_a_console_template(tmp_path: Path):
    status, output = _check_wheel(tmp_path, drop="celery_mcp_tasks/console/templates/base.html")
    assert status == 1 and "missing celery_mcp_tasks/console/templates/base.html" in output


# -- a database migrated long ago, with tasks in it ------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def unmigrated_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    if not POSTGRES_URL:
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL to run")
    with fresh_postgres_database(POSTGRES_URL) as url:
        yield url


def _tasks_written_at_0001() -> list[tuple[str, TaskRecord]]:
    """One task in each state, every 0001 column holding something other than its default."""
    asked = {
        "ok": {
            "method": "elicitation/create",
            "params": {
                "message": "Go?",
                "requestedSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
            },
        }
    }
    at = now_ms() - 120_000  # two minutes ago: alive by TTL, long silent by heartbeat
    base = dict(
        tool="report",
        created_at=at,
        updated_at=at + 1_000,
        ttl_ms=86_400_000,
        poll_interval_ms=750,
        arguments={"topic": "tides", "n": 3},
        version=4,
        dispatches=1,
        heartbeat_at=at + 500,
    )
    states = [
        dict(owner="sub:alice", status=TaskStatus.WORKING, status_message="Writing section 2"),
        dict(
            owner="sub:bob",
            status=TaskStatus.INPUT_REQUIRED,
            status_message="Waiting",
            input_requests=asked,
            issued_keys=("ok",),
        ),
        dict(
            owner=None,
            status=TaskStatus.COMPLETED,
            input_responses={"ok": {"action": "accept"}},
            issued_keys=("ok",),
            result={"content": [{"type": "text", "text": "done"}], "isError": False},
        ),
        dict(
            owner="client_id:app",
            status=TaskStatus.FAILED,
            status_message="Job failed: boom",
            error={"code": -32603, "message": "Job failed: boom"},
            ttl_ms=None,
        ),
        dict(owner="sub:alice", status=TaskStatus.CANCELLED, status_message="Cancelled by the client"),
    ]
    tasks = []
    for state in states:
        task_id = new_task_id()
        tasks.append((task_id, TaskRecord(key=task_key(task_id), **{**base, **state})))  # type: ignore[arg-type]
    return tasks


def test_tasks_written_at_revision_0001_survive_upgrading_to_head(unmigrated_url: str):
    """The first upgrade a user runs on a live database: every row reads back whole, columns added
    since 0001 read as a new record's defaults, and the tasks go on (answer, cancel, reap)."""
    migrate.upgrade(unmigrated_url, "0001")
    written = _tasks_written_at_0001()
    engine = sa.create_engine(normalize_url(unmigrated_url))
    try:
        old_table = sa.Table("mcp_tasks_task", sa.MetaData(), autoload_with=engine)
        old_columns = set(old_table.c.keys())
        with engine.begin() as conn:
            for _, record in written:
                row = {f.name: getattr(record, f.name) for f in fields(TaskRecord)}
                row.update(
                    status=record.status.value, issued_keys=list(record.issued_keys), expires_at=record.expires_at
                )
                conn.execute(old_table.insert(), {k: v for k, v in row.items() if k in old_columns})
    finally:
        engine.dispose()
    added = [f for f in fields(TaskRecord) if f.name not in old_columns]
    assert added, "no column was added since 0001: this test no longer tests an upgrade"

    migrate.upgrade(unmigrated_url)
    migrate.check(unmigrated_url)  # and the upgraded schema is exactly head's
    store = SqlStore.from_url(unmigrated_url)
    try:
        for _, record in written:
            defaults = {f.name: f.default_factory() if f.default_factory is not MISSING else f.default for f in added}
            assert store.get(record.key) == replace(record, **defaults), record.status
        sends: list[TaskRecord] = []
        service = TaskService(store, dispatcher=SendOnly(sends.append))
        (working_id, working), (asking_id, _), (done_id, _), _, _ = written
        assert service.get(working_id, "sub:alice").status_message == "Writing section 2"
        resumed = service.answer(asking_id, "sub:bob", {"ok": {"action": "accept", "content": {"ok": True}}})
        assert resumed.status is TaskStatus.WORKING and [r.key for r in sends] == [resumed.key]
        # The reaper sees the pre-upgrade run whose heartbeat is long gone (not the one just sent).
        assert [r.key for r in store.stale(heartbeat_before_ms=now_ms() - 60_000, limit=10)] == [working.key]
        cancelled, changed = service.cancel(working_id, "sub:alice")
        assert changed and cancelled.status is TaskStatus.CANCELLED
        assert service.cancel(done_id, None) == (store.get(written[2][1].key), False)  # final stays final
    finally:
        store.dispose()


@pytest.mark.parametrize("url", ["postgresql://user:p%40ss@localhost/db"])
def test_urls_with_percent_escapes_survive_the_ini_interpolation(url: str):
    assert (
        migrate.alembic_config(url).get_main_option("sqlalchemy.url") == "postgresql+psycopg://user:p%40ss@localhost/db"
    )


def test_the_console_indexes_are_built_concurrently_on_postgresql(capsys: pytest.CaptureFixture[str]):
    """A big live table keeps taking writes while 0006 indexes it: CONCURRENTLY, outside the transaction."""
    from alembic import command

    command.upgrade(migrate.alembic_config("postgresql://user@localhost/db"), "0005:0006", sql=True)
    sql = capsys.readouterr().out
    assert sql.count("CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_mcp_tasks_task_") == 5
    assert sql.index("COMMIT") < sql.index("CREATE INDEX CONCURRENTLY")  # after the preceding transaction


@pytest.mark.parametrize(
    ("url", "dialect"), [("postgresql://user@localhost/db", "postgresql"), ("sqlite:///x.db", "sqlite")]
)
def test_migration_0009_builds_the_partial_index_the_schema_declares(
    url: str, dialect: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The drift check compares an index's columns, not its WHERE: the migration's predicate is checked here against
    the schema's (`UNFINISHED`), which the quota's count must repeat word for word to use the index."""
    from alembic import command
    from sqlalchemy.dialects import postgresql, sqlite
    from sqlalchemy.schema import CreateIndex

    from celery_mcp_tasks.store.schema import tasks

    command.upgrade(migrate.alembic_config(url), "0008:0009", sql=True)
    built = next(line for line in capsys.readouterr().out.splitlines() if "ix_mcp_tasks_task_owner_caller" in line)
    (index,) = [index for index in tasks.indexes if index.name == "ix_mcp_tasks_task_owner_caller"]
    declared = str(CreateIndex(index).compile(dialect=(postgresql if dialect == "postgresql" else sqlite).dialect()))

    def shape(ddl: str) -> tuple[str, str]:
        head, _, where = ddl.partition(" WHERE ")
        return head[head.index(" ON ") :].strip(), "".join(ch for ch in where if ch not in "() ;\n")

    assert shape(built) == shape(declared), (built, declared)


@needs_postgres
@pytest.mark.integration
def test_two_migrators_at_once_both_end_at_head_through_the_concurrent_index_builds():
    """The migration lock is a session lock: it holds across 0006's autocommit block, so the second
    migrator waits for the first and then finds nothing to do (an xact lock would let it in half-way)."""
    with fresh_postgres_database(POSTGRES_URL) as url:
        env = {**os.environ, "MCP_TASKS_DATABASE_URL": url}
        argv = [sys.executable, "-m", "celery_mcp_tasks.cli", "db", "upgrade"]
        migrators = [
            subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        said = []
        for migrator in migrators:
            stdout, stderr = migrator.communicate(timeout=120)
            assert migrator.returncode == 0, stderr
            said.append(stdout.strip())
        _assert_migrated_without_drift(url)
    # Each says what it did itself: the one that waited applied nothing. (It read the store's revision before
    # the lock once, and said "upgraded ... from base" too, or from a revision half-way through the other's run.)
    upgraded = [line for line in said if " upgraded the task store " in line]
    assert len(upgraded) == 1 and " from base (no tables) to " in upgraded[0], said
    assert len([line for line in said if " is already at " in line]) == 1, said


@needs_postgres
@pytest.mark.integration
def test_an_index_build_that_died_half_way_is_built_again_valid():
    """A cancelled or failed CREATE INDEX CONCURRENTLY leaves an INVALID index of that name: the run
    after it must not keep it (IF NOT EXISTS alone would), or the console's lists never get their index."""
    assert POSTGRES_URL
    with fresh_postgres_database(POSTGRES_URL) as url:
        migrate.upgrade(url, "0001")
        (_, record), *_ = _tasks_written_at_0001()
        engine = sa.create_engine(normalize_url(url), isolation_level="AUTOCOMMIT")
        try:
            old_table = sa.Table("mcp_tasks_task", sa.MetaData(), autoload_with=engine)
            row = {f.name: getattr(record, f.name) for f in fields(TaskRecord)}
            row.update(status=record.status.value, issued_keys=[], expires_at=record.expires_at)
            with engine.connect() as conn:
                conn.execute(old_table.insert(), {k: v for k, v in row.items() if k in old_table.c})
            migrate.upgrade(url, "0005")
            with engine.connect() as conn, pytest.raises(sa.exc.DataError):  # a build that fails on the row
                conn.execute(
                    sa.text(
                        "CREATE INDEX CONCURRENTLY ix_mcp_tasks_task_created_at_key "
                        "ON mcp_tasks_task ((1 / (version - version)))"
                    )
                )
            migrate.upgrade(url)
            with engine.connect() as conn:
                invalid = conn.execute(
                    sa.text(
                        "SELECT count(*) FROM pg_index WHERE NOT indisvalid AND indrelid = 'mcp_tasks_task'::regclass"
                    )
                ).scalar()
                built = conn.execute(
                    sa.text("SELECT pg_get_indexdef('ix_mcp_tasks_task_created_at_key'::regclass)")
                ).scalar()
        finally:
            engine.dispose()
        assert invalid == 0
        assert str(built).endswith("(created_at, key)")
        _assert_migrated_without_drift(url)


def test_every_migration_only_adds_so_the_release_before_runs_on_a_migrated_store() -> None:
    """docs/production.md's upgrade order rests on it: an old process keeps working mid-upgrade only if no
    migration drops, renames or changes what it reads and writes."""
    changing = ("drop_column", "alter_column", "drop_table", "rename_table", "drop_constraint")
    versions = Path(migrate.SCRIPT_LOCATION) / "versions"
    for script in sorted(versions.glob("*.py")):
        text = script.read_text()
        upgrade = text[text.index("def upgrade(") : text.index("def downgrade(")]
        assert not [word for word in changing if word in upgrade], script.name
