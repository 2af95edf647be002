"""Alembic: the repository's `alembic upgrade head`, the CLI and the programmatic API agree
with the models, leave other tables alone, and never drift (`alembic check`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from celery_mcp_tasks import migrate
from celery_mcp_tasks.store.schema import VERSION_TABLE
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


def test_the_wheel_ships_the_migrations_inside_the_package():
    shipped = Path(migrate.SCRIPT_LOCATION)
    assert (shipped / "env.py").is_file() and list((shipped / "versions").glob("0001_*.py"))


@pytest.mark.parametrize("url", ["postgresql://user:p%40ss@localhost/db"])
def test_urls_with_percent_escapes_survive_the_ini_interpolation(url: str):
    assert migrate.alembic_config(url).get_main_option("sqlalchemy.url") == "postgresql+psycopg://user:p%40ss@localhost/db"
