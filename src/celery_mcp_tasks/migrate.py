"""Programmatic migrations without an alembic.ini: the scripts ship inside the package (`celery_mcp_tasks/migrations`,
linked from the repository's top level), so this works from a plain `pip install`."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config

from celery_mcp_tasks.store.engine import normalize_url

SCRIPT_LOCATION = str(Path(__file__).resolve().parent / "migrations")


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    # configparser interpolation: a URL-encoded password carries '%'.
    config.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return config


Moved = tuple[tuple[str, ...], tuple[str, ...]]
"""The revisions a migration run started from and ended at (() is base: no tables)."""


def upgrade(url: str, revision: str = "head") -> Moved | None:
    """Migrate up to `revision`; what this run moved the store from and to, None when it applied nothing (the
    store was there already, or another migrator running at once took it there)."""
    return _moving(command.upgrade, url, revision)


def downgrade(url: str, revision: str) -> Moved | None:
    return _moving(command.downgrade, url, revision)


def _moving(run: Callable[[Config, str], None], url: str, revision: str) -> Moved | None:
    config = alembic_config(url)
    applied: list[Moved] = []
    config.attributes["applied"] = applied  # filled by the environment's `on_version_apply`
    run(config, revision)
    return (applied[0][0], applied[-1][1]) if applied else None


def check(url: str) -> None:
    """Raise if the models and the migrated schema differ (alembic's `check`, whose "No new upgrade
    operations detected." is not printed: the CLI says its own line)."""
    config = alembic_config(url)
    config.stdout = io.StringIO()
    command.check(config)


def current(url: str) -> None:
    command.current(alembic_config(url))
