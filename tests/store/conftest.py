"""Store test fixtures shared by the files in this folder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.store.sql import SqlStore
from tests.support import POSTGRES_URL, fresh_postgres_database


@pytest.fixture
def pg_store() -> Iterator[SqlStore]:
    """A migrated store on a fresh PostgreSQL database of its own, dropped after the test."""
    if not POSTGRES_URL:
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL to run")
    with fresh_postgres_database(POSTGRES_URL) as url:
        upgrade(url)
        store = SqlStore.from_url(url)
        yield store
        store.dispose()
