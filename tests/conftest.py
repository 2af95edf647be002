from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.store.sql import SqlStore
from tests.support import POSTGRES_URL, REDIS_URL, Backend, fresh_postgres_database

_running: pytest.Item | None = None
_popen_init = subprocess.Popen.__init__


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    global _running
    _running = item
    try:
        yield
    finally:
        _running = None


def _guarded_popen_init(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
    """`-m "not integration"` is the fast loop: a test (or its fixtures) that starts a process must say so."""
    if _running is not None and _running.get_closest_marker("integration") is None:
        raise RuntimeError(
            f"{_running.nodeid} starts a process: mark its module `pytestmark = pytest.mark.integration`"
        )
    _popen_init(self, *args, **kwargs)


subprocess.Popen.__init__ = _guarded_popen_init  # type: ignore[method-assign]

needs_postgres = pytest.mark.skipif(not POSTGRES_URL, reason="set MCP_TASKS_TEST_POSTGRES_URL to run")
needs_pg_redis = pytest.mark.skipif(
    not (POSTGRES_URL and REDIS_URL), reason="set MCP_TASKS_TEST_POSTGRES_URL and MCP_TASKS_TEST_REDIS_URL to run"
)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    if not POSTGRES_URL:
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL to run")
    with fresh_postgres_database(POSTGRES_URL) as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A migrated, empty store on each database."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'tasks.db'}"
        upgrade(url)
        yield url
        return
    if not POSTGRES_URL:
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL to run")
    with fresh_postgres_database(POSTGRES_URL) as url:
        upgrade(url)
        yield url


@pytest.fixture
def store(store_url: str) -> Iterator[SqlStore]:
    store = SqlStore.from_url(store_url)
    yield store
    store.dispose()


def _embedded(tmp: Path) -> Backend:
    return Backend("embedded", {"MCP_TASKS_DATA_DIR": str(tmp)})


@pytest.fixture(
    scope="session", params=["embedded", pytest.param("pg_redis", marks=[pytest.mark.postgres, pytest.mark.redis])]
)
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    """A deployment's worth of infrastructure: embedded (no servers) or PostgreSQL + Redis."""
    if request.param == "embedded":
        yield _embedded(tmp_path_factory.mktemp("embedded"))
        return
    if not (POSTGRES_URL and REDIS_URL):
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL and MCP_TASKS_TEST_REDIS_URL to run")
    with fresh_postgres_database(POSTGRES_URL) as url:
        yield Backend("pg_redis", {"MCP_TASKS_DATABASE_URL": url, "CELERY_BROKER_URL": REDIS_URL})
