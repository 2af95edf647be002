"""Programmatic migrations without an alembic.ini: the scripts ship inside the package (`celery_mcp_tasks/migrations`,
linked from the repository's top level), so this works from a plain `pip install`."""

from __future__ import annotations

import io
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


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def check(url: str) -> None:
    """Raise if the models and the migrated schema differ (alembic's `check`, whose "No new upgrade
    operations detected." is not printed: the CLI says its own line)."""
    config = alembic_config(url)
    config.stdout = io.StringIO()
    command.check(config)


def current(url: str) -> None:
    command.current(alembic_config(url))
