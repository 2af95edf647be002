"""Configuration is validated at start-up: a wrong value stops the process with one line naming the setting."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from celery_mcp_tasks import ConfigError, McpTasks
from celery_mcp_tasks.config import RETIRED_SETTINGS, Settings, known_settings, unknown_settings
from tests.support import ROOT

WRONG = [
    ("MCP_TASKS_DATABASE_URL", "mysql://db/tasks", "unsupported database 'mysql'"),
    ("MCP_TASKS_DATABASE_URL", "not a url", "not a database URL"),
    ("MCP_TASKS_DATABASE_URL", "postgresql+psycopg2://db/tasks", "psycopg 3"),
    ("MCP_TASKS_DATABASE_POOL_SIZE", "0", "must be >= 1"),
    ("MCP_TASKS_DATABASE_POOL_SIZE", "many", "expected an integer"),
    ("MCP_TASKS_MAX_ROWS", "0", "must be >= 1"),
    ("MCP_TASKS_MAX_ROWS", "lots", "expected an integer, or none/off"),
    ("MCP_TASKS_DEFAULT_TTL_MS", "-5", "must be >= 1"),
    ("MCP_TASKS_POLL_INTERVAL_MS", "1.5", "expected an integer"),
    ("MCP_TASKS_RETENTION_MS", "-1", "must be >= 0"),
    ("MCP_TASKS_JANITOR_INTERVAL_S", "-60", "must be > 0 (or off)"),
    ("MCP_TASKS_STALE_TIMEOUT_S", "0.2", "must be >= 1"),
    ("MCP_TASKS_STALE_TIMEOUT_S", "0", "must be >= 1"),  # the same bound for every value under it
    ("MCP_TASKS_WORKER_METRICS_PORT", "x", "expected an integer, or none/off"),
    ("MCP_TASKS_STALE_TIMEOUT_S", "soon", "expected a number of seconds"),
    ("MCP_TASKS_MAX_SENDS", "0", "must be >= 1"),
    ("MCP_TASKS_NOTIFY", "carrier-pigeon", "expected one of"),
    ("CELERY_BROKER_URL", "localhost:6379", "expected a URL"),
    ("MCP_TASKS_QUOTA_ACTIVE", "-1", "must be >= 1"),
    ("MCP_TASKS_QUOTA_ACTIVE", "ten", "expected an integer, or none/off"),
    ("MCP_TASKS_QUOTA_ACTIVE_PER_TOOL", "0", "must be >= 1"),
    ("MCP_TASKS_QUOTA_CREATIONS", "2.5", "expected an integer, or none/off"),
    ("MCP_TASKS_QUOTA_STREAMS", "0", "must be >= 1"),
    ("MCP_TASKS_QUOTA_WINDOW_S", "-60", "must be > 0"),
    ("MCP_TASKS_QUOTA_WINDOW_S", "a minute", "expected a number of seconds"),
    ("MCP_TASKS_IDEMPOTENCY_SECRET", "short", "at least 32 bytes"),
    ("MCP_TASKS_FAIR_QUEUES", "1", "must be >= 2"),
    ("MCP_TASKS_QUOTA_ANONYMOUS", "per_ip", "expected one of shared, per_client"),
    ("MCP_TASKS_FAIR_QUEUES", "many", "expected an integer, or none/off"),
    ("MCP_TASKS_MAX_ARGUMENTS_BYTES", "big", "expected an integer, or none/off"),
    ("MCP_TASKS_MAX_ANSWER_BYTES", "0", "must be >= 1"),
    ("MCP_TASKS_MAX_RESULT_BYTES", "-5", "must be >= 1"),
    ("MCP_TASKS_ENCRYPTION_KEYS", "not-a-key", "key 1 of 1 is not a base64 32-byte key"),
    ("MCP_TASKS_ENCRYPTION_KEYS", "A" * 43 + "=,c2hvcnQ=", "key 2 of 2 is not a base64 32-byte key"),
    ("MCP_TASKS_REQUEST_STATE_SECRET", "s" * 40 + ",t" * 20, "at least 32 bytes"),
    ("MCP_TASKS_REQUEST_STATE_SECRET", ",".join(["s" * 40] * 2), "listed twice"),
    # a stray comma: "," turned encryption off unseen, and "K,,bad" named the bad key's position wrongly
    ("MCP_TASKS_ENCRYPTION_KEYS", ",", "entry 1 of 2 is empty"),
    ("MCP_TASKS_ENCRYPTION_KEYS", "A" * 43 + "=,,c2hvcnQ=", "entry 2 of 3 is empty"),
    ("MCP_TASKS_REQUEST_STATE_SECRET", "s" * 40 + ", ", "entry 2 of 2 is empty"),
]


def test_no_secret_shows_in_the_settings_repr() -> None:
    """A failing assert that prints `tasks.settings` in CI prints none of them."""
    secrets = {
        "MCP_TASKS_REQUEST_STATE_SECRET": "r" * 40,
        "MCP_TASKS_IDEMPOTENCY_SECRET": "i" * 40,
        "MCP_TASKS_CONSOLE_TOKEN": "c" * 40,
        "MCP_TASKS_ENCRYPTION_KEYS": "A" * 43 + "=",
    }
    shown = repr(Settings.from_env(secrets))
    assert not [name for name, value in secrets.items() if value.rstrip("=") in shown]


@pytest.mark.parametrize(("name", "value", "why"), WRONG)
def test_a_wrong_setting_is_refused_naming_it(name: str, value: str, why: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({name: value})
    assert str(refused.value).startswith(f"{name}: ") and why in str(refused.value)


def test_the_defaults_and_the_off_switches_are_valid() -> None:
    settings = Settings.from_env(
        {"MCP_TASKS_DEFAULT_TTL_MS": "none", "MCP_TASKS_MAX_ROWS": "unlimited", "MCP_TASKS_JANITOR_INTERVAL_S": "off"}
    )
    assert (settings.default_ttl_ms, settings.max_rows, settings.janitor_interval_s) == (None, None, None)
    production = Settings.from_env(
        {"MCP_TASKS_DATABASE_URL": "postgresql://db/tasks", "CELERY_BROKER_URL": "redis://r"}
    )
    assert (production.stale_timeout_s, production.janitor_interval_s) == (300.0, 60.0)


def test_the_store_pool_is_the_settings_size_on_postgresql_and_sqlite_keeps_its_own(tmp_path: Path) -> None:
    """A threads or gevent worker runs `-c` jobs at once: its pool is sized by MCP_TASKS_DATABASE_POOL_SIZE."""
    from celery_mcp_tasks.app import internals

    postgres = McpTasks(
        "pool",
        settings=Settings.from_env(
            {
                "MCP_TASKS_DATABASE_URL": "postgresql://127.0.0.1:9/none",
                "CELERY_BROKER_URL": "memory://",
                "MCP_TASKS_DATABASE_POOL_SIZE": "40",
            }
        ),
    )
    assert Settings.from_env({}).database_pool_size == 10
    engine = internals(postgres).service().store.engine  # type: ignore[attr-defined]
    assert engine.pool.size() == 40  # built, not connected
    engine.dispose()
    sqlite = McpTasks(
        "pool-sqlite",
        settings=Settings.from_env({"MCP_TASKS_DATA_DIR": str(tmp_path), "MCP_TASKS_DATABASE_POOL_SIZE": "40"}),
    )
    engine = internals(sqlite).service().store.engine  # type: ignore[attr-defined]
    assert engine.pool.size() != 40
    engine.dispose()


def test_quotas_are_off_by_default_and_unlimited_turns_one_off() -> None:
    settings = Settings.from_env({"MCP_TASKS_QUOTA_ACTIVE": "unlimited", "MCP_TASKS_QUOTA_CREATIONS": "100"})
    assert (settings.quota_active, settings.quota_active_per_tool, settings.quota_creations) == (None, None, 100)
    assert Settings.from_env({}).quota_creations is None and Settings.from_env({}).idempotency_secret is None


def test_a_quota_given_in_code_is_checked_too() -> None:
    with pytest.raises(ConfigError, match=r"^MCP_TASKS_QUOTA_ACTIVE: expected an integer >= 1 or none, got -2$"):
        Settings(quota_active=-2)


def test_the_embedded_default_recovers_lost_work_in_seconds() -> None:
    embedded = Settings.from_env({})
    assert embedded.stale_timeout_s <= 30 and embedded.janitor_interval_s is not None
    assert embedded.janitor_interval_s <= 10
    assert Settings.from_env({"MCP_TASKS_STALE_TIMEOUT_S": "120"}).stale_timeout_s == 120.0  # an explicit value wins


def test_the_app_stops_with_one_line_when_built_from_a_wrong_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCP_TASKS_STALE_TIMEOUT_S", "soon")
    with pytest.raises(SystemExit) as stopped:
        McpTasks("wrong")
    assert str(stopped.value) == (
        "celery-mcp-tasks: configuration error: MCP_TASKS_STALE_TIMEOUT_S: expected a number of seconds, got 'soon'"
    )


@pytest.mark.integration
@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "celery", "-A", "tests.apps.runtime_app", "worker"],
        ["-m", "celery", "-A", "tests.apps.runtime_app", "beat"],
        ["-m", "celery_mcp_tasks.cli", "serve", "tests.apps.runtime_app"],
    ],
    ids=["worker", "beat", "serve"],
)
def test_every_process_refuses_to_start_with_one_line(argv: list[str], tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
        "MCP_TASKS_DATA_DIR": str(tmp_path),
        "MCP_TASKS_MAX_ROWS": "lots",
    }
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "celery-mcp-tasks: configuration error: MCP_TASKS_MAX_ROWS: expected an integer, or none/off, got 'lots'"
    ]
    assert "Traceback" not in done.stdout + done.stderr


def test_an_unknown_name_is_a_warning_naming_the_closest_setting() -> None:
    lines = unknown_settings({"MCP_TASKS_JANITOR_INTERVAL": "5", "MCP_TASKS_BROKER_URL": "redis://r", "HOME": "/"})
    assert lines == [
        "MCP_TASKS_BROKER_URL is not a celery-mcp-tasks setting and is ignored (did you mean CELERY_BROKER_URL?); "
        "MCP_TASKS_STRICT_SETTINGS=on makes this an error",
        "MCP_TASKS_JANITOR_INTERVAL is not a celery-mcp-tasks setting and is ignored "
        "(did you mean MCP_TASKS_JANITOR_INTERVAL_S?); MCP_TASKS_STRICT_SETTINGS=on makes this an error",
    ]
    assert "no setting has a close name" in unknown_settings({"MCP_TASKS_FOO": "1"})[0]


def test_the_strict_option_makes_an_unknown_name_an_error_but_not_a_retired_one() -> None:
    strict = {"MCP_TASKS_STRICT_SETTINGS": "1"}
    with pytest.raises(ConfigError) as refused:
        unknown_settings({**strict, "MCP_TASKS_METRIC": "on"})
    assert str(refused.value) == (
        "MCP_TASKS_METRIC is not a celery-mcp-tasks setting (did you mean MCP_TASKS_METRICS?); "
        "MCP_TASKS_STRICT_SETTINGS is on"
    )
    assert unknown_settings({**strict, "MCP_TASKS_LISTEN_ENTRY": "sse"}) == [
        "MCP_TASKS_LISTEN_ENTRY is retired and ignored now; remove it"
    ]


def test_a_malformed_strict_switch_is_refused_even_with_every_name_known() -> None:
    with pytest.raises(ConfigError) as refused:
        unknown_settings({"MCP_TASKS_STRICT_SETTINGS": "yesplease", "MCP_TASKS_METRICS": "on"})
    assert str(refused.value) == "MCP_TASKS_STRICT_SETTINGS: expected on or off, got 'yesplease'"


def test_names_that_are_not_settings_are_never_flagged() -> None:
    env = {
        "MCP_TASKS_TEST_POSTGRES_URL": "postgresql://x",  # the test suite's
        "MCP_TASKS_SMOKE_REDIS_URL": "redis://x",  # CI's
        "MCP_TASKS_TOKEN": "t",  # `call`'s bearer token
        "MCP_TASKS_OPS_PORT": "9101",
        "MCP_TASKS_MAX_DISPATCHES": "3",  # 0.1.0's name, still read
        "MCP_TASKS_STRICT_SETTINGS": "1",
    }
    assert unknown_settings(env) == []


def test_every_name_the_code_and_docs_mention_is_known() -> None:
    """A new setting is known once `Settings.from_env` reads it; one read elsewhere goes in READ_ELSEWHERE."""
    mentioned: set[str] = set()
    files = [ROOT / "README.md", ROOT / "docker-compose.yml"]
    for folder in ("src", "docs", "examples", "deploy", ".ci"):
        files += [path for path in (ROOT / folder).rglob("*") if path.suffix in (".py", ".md", ".yml", ".yaml", ".sh")]
    for path in files:
        if path.is_file():
            mentioned |= set(re.findall(r"\bMCP_TASKS_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")))
    flagged = unknown_settings(dict.fromkeys(mentioned - {*RETIRED_SETTINGS, "MCP_TASKS_STRICT_SETTINGS"}, "1"))
    assert flagged == []
    assert "MCP_TASKS_DATABASE_URL" in known_settings() and "MCP_TASKS_OPS_HOST" in known_settings()


def test_a_redacted_url_shows_no_password_of_any_url_in_a_failover_list() -> None:
    from celery_mcp_tasks.config import redact_url

    assert redact_url("amqp://u:secret1@a:5672/v;amqp://u:secret2@b:5672/v") == (
        "amqp://u:***@a:5672/v;amqp://u:***@b:5672/v"
    )
    assert redact_url("redis://:pw@h:6379/0") == "redis://:***@h:6379/0"
    assert redact_url("postgresql+psycopg://app:s3;cr3t@db:5432/tasks") == "postgresql+psycopg://app:***@db:5432/tasks"


def test_a_password_with_an_at_sign_is_hidden_whole() -> None:
    """kombu takes the password to the last `@`, SQLAlchemy's parser to the first: a near-miss password showed
    its tail in the refusal meant to name it."""
    from celery_mcp_tasks.config import redact_url

    assert redact_url("redis://:p@ss@127.0.0.1:6379/0") == "redis://***@127.0.0.1:6379/0"
    assert redact_url("amqp://u:a@b@c@rabbit:5672/v@x") == "amqp://***@rabbit:5672/v@x"
