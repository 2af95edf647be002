"""Settings, read from the environment once at start-up: a wrong value stops the process naming the variable.

With nothing set, everything lives in one local data directory (SQLite store, `filesystem://` broker).
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import make_url

if TYPE_CHECKING:
    from celery_mcp_tasks.store.codec import KeyRing


# Settings that once meant something and are now ignored when set (a warning, never an error):
# MCP_TASKS_LISTEN_ENTRY chose a second HTTP entry for `subscriptions/listen`, removed in issue 20.
RETIRED_SETTINGS = ("MCP_TASKS_LISTEN_ENTRY",)
_PREFIX = "MCP_TASKS_"
STRICT_SETTINGS = "MCP_TASKS_STRICT_SETTINGS"  # on: an unknown MCP_TASKS_* name stops the process
READ_ELSEWHERE = (
    "MCP_TASKS_OPS_HOST",
    "MCP_TASKS_OPS_PORT",
    "MCP_TASKS_TOKEN",
    "MCP_TASKS_CONSOLE_URL",
    STRICT_SETTINGS,
)
"""Names read outside `Settings.from_env`: the ops listener's address (`ops/serving.py`), the token
`call` sends (`cli/call.py`), where `tasks` finds the console (`cli/tasks.py`), and the strict switch itself."""
NOT_SETTINGS = ("MCP_TASKS_TEST_", "MCP_TASKS_SMOKE_")
"""Prefixes of names the test suite and CI read (service URLs): never settings, never flagged."""
MIN_SECRET_BYTES = 32
MIN_CONSOLE_TOKEN_BYTES = 16
DEFAULT_WORKER_METRICS_PORT = 9808
DEFAULT_INPUT_TIMEOUT_S = 86_400.0
"""An `input_required` task nobody answers fails after a day (MCP_TASKS_INPUT_TIMEOUT_S), so it frees its row."""
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
"""The largest HTTP request body the MCP endpoint reads (MCP_TASKS_MAX_REQUEST_BYTES): the SDK's own default."""
_UNSET: Any = object()
"""What a parser answers for a variable that is unset or empty: the field's default in `Settings` applies."""


class ConfigError(ValueError):
    """A setting has a wrong value; the message names the setting."""


def _int(
    env: Mapping[str, str], name: str, default: int | None = _UNSET, *, minimum: int = 1, allow_none: bool = False
) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    text = raw.strip().lower()
    if allow_none and text in ("none", "null", "unlimited", "off"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{name}: expected an integer{', or none/off' if allow_none else ''}, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name}: must be >= {minimum}, got {value}")
    return value


def _float(
    env: Mapping[str, str], name: str, default: float = _UNSET, *, allow_off: bool = False, minimum: float = 0.0
) -> float | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    if allow_off and raw.strip().lower() in ("off", "none", "0"):
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}: expected a number of seconds, got {raw!r}") from None
    if value <= 0 or value < minimum:
        bound = f">= {minimum:g}" if minimum else "> 0"
        raise ConfigError(f"{name}: must be {bound}{' (or off)' if allow_off else ''}, got {raw!r}")
    return value


_YES_NO = dict.fromkeys(("1", "on", "true", "yes"), True) | dict.fromkeys(("0", "off", "false", "no"), False)


def yes_no(text: str) -> bool | None:
    """A switch's words: on/true/1/yes, off/false/0/no (any case), None for anything else."""
    return _YES_NO.get(text.strip().lower())


def _switch(env: Mapping[str, str], name: str, default: bool = _UNSET) -> bool:
    raw = env.get(name) or ""
    if not raw.strip():
        return default
    value = yes_no(raw)
    if value is None:
        raise ConfigError(f"{name}: expected on or off, got {raw!r}")
    return value


def _choice(env: Mapping[str, str], name: str, default: str = _UNSET) -> str:
    raw = env.get(name)
    return raw.strip().lower() if raw else default


def _secret(env: Mapping[str, str], name: str) -> str | None:
    return (env.get(name) or "").strip() or None


def _list(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in (env.get(name) or "").split(",") if item.strip())


def _ring(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    """A comma-separated key ring; an empty entry is a mistake (a ring of "," would turn encryption off
    unseen, and every later key's position would shift), so it stops the process naming where it is."""
    raw = (env.get(name) or "").strip()
    if not raw:
        return ()
    entries = tuple(item.strip() for item in raw.split(","))
    for position, entry in enumerate(entries, start=1):
        if not entry:
            raise ConfigError(f"{name}: entry {position} of {len(entries)} is empty (a stray comma?)")
    return entries


def redact_url(url: str) -> str:
    """A URL fit for a log line or a banner: the password replaced by `***` (in each URL of a `;`-separated
    failover list, as Celery takes a broker's)."""
    parts = url.split(";")
    if len(parts) > 1 and all("://" in part for part in parts):  # not a `;` in a store's password
        return ";".join(redact_url(part) for part in parts)
    scheme, sep, rest = url.partition("://")
    authority = rest.split("/", 1)[0]
    if authority.count("@") > 1:  # an `@` in the password: parsers disagree on where it ends, so hide all of it
        return f"{scheme}{sep}***@{authority.rsplit('@', 1)[1]}{rest[len(authority) :]}"
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not an RFC-1738 URL: keep only what follows the credentials
        return f"{scheme}{sep}***@{rest.rsplit('@', 1)[1]}" if "@" in rest else url


_STORE_DRIVERS = {"sqlite": "sqlite3", "postgresql": "psycopg"}


def _check_store_url(url: str) -> None:
    """The store must be SQLite or PostgreSQL, with its driver installed (not a surprise on the first task)."""
    name = "MCP_TASKS_DATABASE_URL"
    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - whatever make_url rejects, the one-line answer is the same
        raise ConfigError(f"{name}: not a database URL (expected postgresql://... or sqlite:///...)") from None
    backend = "postgresql" if parsed.get_backend_name() in ("postgresql", "postgres") else parsed.get_backend_name()
    if backend not in _STORE_DRIVERS:
        raise ConfigError(f"{name}: unsupported database {backend!r}; use postgresql://... or sqlite:///...")
    driver = parsed.get_driver_name() if "+" in parsed.drivername else _STORE_DRIVERS[backend]
    if backend == "postgresql" and driver not in ("psycopg", "psycopg_async"):
        raise ConfigError(f"{name}: the store speaks psycopg 3; use postgresql:// or postgresql+psycopg://")
    if importlib.util.find_spec(_STORE_DRIVERS[backend]) is None:
        raise ConfigError(f"{name}: the {backend} driver is not installed (pip install 'celery-mcp-tasks[postgres]')")


class _ReadNames(Mapping[str, str]):
    """An empty environment that remembers every name read from it (`Mapping.get` asks `__getitem__`)."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def __getitem__(self, name: str) -> str:
        self.names.add(name)
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


@functools.cache
def known_settings() -> frozenset[str]:
    """Every MCP_TASKS_* name this release reads (`from_env` with nothing set reads each one)."""
    read = _ReadNames()
    Settings.from_env(read)
    return frozenset(name for name in read.names if name.startswith(_PREFIX)) | frozenset(READ_ELSEWHERE)


def unknown_settings(env: Mapping[str, str]) -> list[str]:
    """One line for each MCP_TASKS_* name in `env` that is not a setting (sorted), naming the closest one;
    with MCP_TASKS_STRICT_SETTINGS on, the first raises `ConfigError` (a retired one never does)."""
    known = known_settings()
    strict = _switch(env, STRICT_SETTINGS, False)  # read first: a malformed value is refused even with no unknown name
    lines = []
    for name in sorted(env):
        if not name.startswith(_PREFIX) or name in known or name.startswith(NOT_SETTINGS):
            continue
        if name in RETIRED_SETTINGS:
            lines.append(f"{name} is retired and ignored now; remove it")
            continue
        # Compared without the shared prefix, which would make every name look close to every other.
        suffixes = {known_name.removeprefix(_PREFIX): known_name for known_name in known - {STRICT_SETTINGS}}
        suffixes["BROKER_URL"] = "CELERY_BROKER_URL"  # the broker is Celery's own setting
        close = difflib.get_close_matches(name.removeprefix(_PREFIX), sorted(suffixes), n=1, cutoff=0.6)
        hint = f"did you mean {suffixes[close[0]]}?" if close else "no setting has a close name"
        line = f"{name} is not a celery-mcp-tasks setting and is ignored ({hint})"
        if strict:
            raise ConfigError(f"{line.replace(' and is ignored', '')}; {STRICT_SETTINGS} is on")
        lines.append(f"{line}; {STRICT_SETTINGS}=on makes this an error")
    return lines


@dataclass(frozen=True)
class Settings:
    data_dir: Path = Path(".celery-mcp-tasks")
    database_url: str | None = None
    database_pool_size: int = 10  # each process's kept PostgreSQL connections (and as many more at a peak)
    broker_url: str | None = None
    max_rows: int | None = 10_000
    default_ttl_ms: int | None = 3_600_000
    poll_interval_ms: int | None = 1_000
    retention_ms: int = 3_600_000
    janitor_interval_s: float | None = 60.0
    stale_timeout_s: float = 300.0
    max_sends: int = 3
    sync_timeout_s: float = 60.0
    notify: str = "auto"
    queue: str | None = None
    allowed_hosts: tuple[str, ...] = ()
    metrics: bool = False
    health: bool = False
    janitor_watch: bool = False
    worker_metrics_port: int | None = DEFAULT_WORKER_METRICS_PORT
    worker_metrics_host: str | None = None  # None: 127.0.0.1 on the embedded default, else every interface
    tracing: str = "off"
    janitor: str = "beat"
    input_timeout_s: float | None = DEFAULT_INPUT_TIMEOUT_S
    log_format: str = "text"
    request_state_secrets: tuple[str, ...] = field(default=(), repr=False)
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    console_token: str | None = field(default=None, repr=False)
    console_payloads: bool = False
    # Per-principal quotas (None: unlimited, the default) and idempotent creation's secret.
    quota_active: int | None = None
    quota_active_per_tool: int | None = None
    quota_creations: int | None = None
    quota_window_s: float = 60.0
    quota_anonymous: str = "shared"
    quota_streams: int | None = None  # a caller's open `subscriptions/listen` streams, per web process
    fair_queues: int | None = None
    idempotency_secret: str | None = field(default=None, repr=False)
    # Payload limits: a task's arguments, one `tasks/update`'s answers and a job's result, as compact JSON in
    # UTF-8 bytes (what the store keeps); None: unlimited.
    max_arguments_bytes: int | None = 1024 * 1024
    max_answer_bytes: int | None = 1024 * 1024
    max_result_bytes: int | None = 4 * 1024 * 1024
    encryption_keys: tuple[str, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        for name, value, choices in (
            ("MCP_TASKS_JANITOR", self.janitor, ("beat", "worker")),
            ("MCP_TASKS_LOG_FORMAT", self.log_format, ("text", "json")),
            ("MCP_TASKS_TRACING", self.tracing, ("off", "on", "otlp", "console")),
            ("MCP_TASKS_QUOTA_ANONYMOUS", self.quota_anonymous, ("shared", "per_client")),
            ("MCP_TASKS_NOTIFY", self.notify, ("auto", "postgres", "broker", "poll", "off")),
        ):
            if value not in choices:
                raise ConfigError(f"{name}: expected one of {', '.join(choices)}, got {value!r}")
        for secret in self.request_state_secrets:
            if len(secret.encode()) < MIN_SECRET_BYTES:
                raise ConfigError(
                    f"MCP_TASKS_REQUEST_STATE_SECRET: each secret must be at least {MIN_SECRET_BYTES} bytes "
                    f"(got one of {len(secret.encode())}); generate one with `openssl rand -base64 48`"
                )
        if len(set(self.request_state_secrets)) < len(self.request_state_secrets):
            raise ConfigError("MCP_TASKS_REQUEST_STATE_SECRET: a secret is listed twice; list each one once")
        if self.worker_metrics_port is not None and not 0 < self.worker_metrics_port < 65536:
            raise ConfigError(
                f"MCP_TASKS_WORKER_METRICS_PORT: expected a TCP port or off, got {self.worker_metrics_port}"
            )
        if self.broker_url is not None and "://" not in self.broker_url:
            raise ConfigError(f"CELERY_BROKER_URL: expected a URL such as redis://host:6379/0, got {self.broker_url!r}")
        if self.database_url is not None:
            _check_store_url(self.database_url)
        if self.max_request_bytes < 1:
            raise ConfigError(f"MCP_TASKS_MAX_REQUEST_BYTES: must be >= 1, got {self.max_request_bytes}")
        if self.console_token is not None and len(self.console_token.encode()) < MIN_CONSOLE_TOKEN_BYTES:
            raise ConfigError(
                f"MCP_TASKS_CONSOLE_TOKEN: the operators' token must be at least {MIN_CONSOLE_TOKEN_BYTES} bytes "
                f"(got {len(self.console_token.encode())}); generate one with `openssl rand -base64 32`"
            )
        for name, limit, what, minimum in (
            ("MCP_TASKS_QUOTA_ACTIVE", self.quota_active, "an integer", 1),
            ("MCP_TASKS_QUOTA_ACTIVE_PER_TOOL", self.quota_active_per_tool, "an integer", 1),
            ("MCP_TASKS_QUOTA_CREATIONS", self.quota_creations, "an integer", 1),
            ("MCP_TASKS_QUOTA_STREAMS", self.quota_streams, "an integer", 1),
            ("MCP_TASKS_FAIR_QUEUES", self.fair_queues, "an integer", 2),
            ("MCP_TASKS_MAX_ARGUMENTS_BYTES", self.max_arguments_bytes, "a number of bytes", 1),
            ("MCP_TASKS_MAX_ANSWER_BYTES", self.max_answer_bytes, "a number of bytes", 1),
            ("MCP_TASKS_MAX_RESULT_BYTES", self.max_result_bytes, "a number of bytes", 1),
        ):
            if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < minimum):
                raise ConfigError(f"{name}: expected {what} >= {minimum} or none, got {limit!r}")
        if not self.quota_window_s > 0:
            raise ConfigError(f"MCP_TASKS_QUOTA_WINDOW_S: must be > 0, got {self.quota_window_s!r}")
        if self.idempotency_secret is not None and len(self.idempotency_secret.encode()) < MIN_SECRET_BYTES:
            raise ConfigError(
                f"MCP_TASKS_IDEMPOTENCY_SECRET: must be at least {MIN_SECRET_BYTES} bytes "
                f"(got {len(self.idempotency_secret.encode())}); generate one with `openssl rand -base64 48`"
            )
        self.key_ring()  # a malformed key stops the start here, naming the setting
        if self.stale_timeout_s < 1:
            raise ConfigError(
                f"MCP_TASKS_STALE_TIMEOUT_S: must be >= 1 (heartbeats need room), got {self.stale_timeout_s:g}"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        env = os.environ if env is None else env
        database_url = env.get("MCP_TASKS_DATABASE_URL") or None
        broker_url = env.get("CELERY_BROKER_URL") or None
        embedded = database_url is None and broker_url is None  # one machine: it recovers lost work in seconds
        sends = _int(env, "MCP_TASKS_MAX_SENDS")
        # Unset or empty: the field's default (`_UNSET`), but for those that depend on `embedded`.
        values: dict[str, Any] = {
            "data_dir": Path(env["MCP_TASKS_DATA_DIR"]) if env.get("MCP_TASKS_DATA_DIR") else _UNSET,
            "database_url": database_url,
            "database_pool_size": _int(env, "MCP_TASKS_DATABASE_POOL_SIZE"),
            "broker_url": broker_url,
            "max_rows": _int(env, "MCP_TASKS_MAX_ROWS", allow_none=True),
            "default_ttl_ms": _int(env, "MCP_TASKS_DEFAULT_TTL_MS", allow_none=True),
            "poll_interval_ms": _int(env, "MCP_TASKS_POLL_INTERVAL_MS", allow_none=True),
            "retention_ms": _int(env, "MCP_TASKS_RETENTION_MS", minimum=0),
            "janitor_interval_s": _float(
                env, "MCP_TASKS_JANITOR_INTERVAL_S", 5.0 if embedded else 60.0, allow_off=True
            ),
            "stale_timeout_s": _float(env, "MCP_TASKS_STALE_TIMEOUT_S", 15.0 if embedded else 300.0, minimum=1.0),
            # MCP_TASKS_MAX_DISPATCHES: the setting's name in 0.1.0, still read when the new one is unset
            "max_sends": _int(env, "MCP_TASKS_MAX_DISPATCHES") if sends is _UNSET else sends,
            "sync_timeout_s": _float(env, "MCP_TASKS_SYNC_TIMEOUT_S"),
            "notify": _choice(env, "MCP_TASKS_NOTIFY"),
            "queue": env.get("MCP_TASKS_QUEUE") or None,
            "allowed_hosts": _list(env, "MCP_TASKS_ALLOWED_HOSTS"),
            # Operations are opt-in plugins (celery_mcp_tasks.plugin): each of these turns one on.
            "metrics": _switch(env, "MCP_TASKS_METRICS"),
            "health": _switch(env, "MCP_TASKS_HEALTH"),
            "janitor_watch": _switch(env, "MCP_TASKS_JANITOR_WATCH"),
            "worker_metrics_port": _int(env, "MCP_TASKS_WORKER_METRICS_PORT", allow_none=True),
            "worker_metrics_host": env.get("MCP_TASKS_WORKER_METRICS_HOST", "").strip() or None,
            "tracing": _choice(env, "MCP_TASKS_TRACING"),
            "janitor": _choice(env, "MCP_TASKS_JANITOR"),
            "input_timeout_s": _float(env, "MCP_TASKS_INPUT_TIMEOUT_S", allow_off=True),
            "log_format": _choice(env, "MCP_TASKS_LOG_FORMAT"),
            "max_request_bytes": _int(env, "MCP_TASKS_MAX_REQUEST_BYTES"),
            # The operators' console: who may look, and whether payloads may be revealed.
            "console_token": _secret(env, "MCP_TASKS_CONSOLE_TOKEN"),
            "console_payloads": _switch(env, "MCP_TASKS_CONSOLE_PAYLOADS"),
            # Per-principal quotas: unlimited unless set (MCP_TASKS_QUOTA_*), decided by the store.
            "quota_active": _int(env, "MCP_TASKS_QUOTA_ACTIVE", allow_none=True),
            "quota_active_per_tool": _int(env, "MCP_TASKS_QUOTA_ACTIVE_PER_TOOL", allow_none=True),
            "quota_creations": _int(env, "MCP_TASKS_QUOTA_CREATIONS", allow_none=True),
            "quota_window_s": _float(env, "MCP_TASKS_QUOTA_WINDOW_S"),
            "quota_anonymous": _choice(env, "MCP_TASKS_QUOTA_ANONYMOUS"),
            "quota_streams": _int(env, "MCP_TASKS_QUOTA_STREAMS", allow_none=True),
            "fair_queues": _int(env, "MCP_TASKS_FAIR_QUEUES", minimum=2, allow_none=True),
            "idempotency_secret": _secret(env, "MCP_TASKS_IDEMPOTENCY_SECRET"),
            # Payload limits, in bytes of compact JSON (none: unlimited); a tool's @mcp_task options win.
            "max_arguments_bytes": _int(env, "MCP_TASKS_MAX_ARGUMENTS_BYTES", allow_none=True),
            "max_answer_bytes": _int(env, "MCP_TASKS_MAX_ANSWER_BYTES", allow_none=True),
            "max_result_bytes": _int(env, "MCP_TASKS_MAX_RESULT_BYTES", allow_none=True),
            # Encryption at rest: a key ring, the first key seals, every one opens (comma-separated).
            "encryption_keys": _ring(env, "MCP_TASKS_ENCRYPTION_KEYS"),
            # A rotation ring: the first secret seals, every one unseals (comma-separated).
            "request_state_secrets": _ring(env, "MCP_TASKS_REQUEST_STATE_SECRET"),
        }
        values = {name: value for name, value in values.items() if value is not _UNSET}
        values.update(overrides)
        return cls(**values)

    def key_ring(self) -> KeyRing | None:
        """The payload encryption ring (MCP_TASKS_ENCRYPTION_KEYS), None when encryption is off."""
        if not self.encryption_keys:
            return None
        from celery_mcp_tasks.store.codec import KeyRing

        try:
            return KeyRing.parse(self.encryption_keys)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    @property
    def resolved_data_dir(self) -> Path:
        return self.data_dir.expanduser().resolve()

    @property
    def store_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.resolved_data_dir / 'tasks.db'}"

    @property
    def celery_broker_url(self) -> str:
        return self.broker_url or "filesystem://"

    @property
    def embedded_broker(self) -> bool:
        return self.celery_broker_url.startswith("filesystem://")

    @property
    def broker_folder(self) -> Path:
        return self.resolved_data_dir / "broker"
