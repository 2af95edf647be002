"""How the store fails: a dropped connection retried once, a write in doubt settled, the rest `StoreUnavailable`."""

from __future__ import annotations

import functools
import logging
import sqlite3
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import sqlalchemy as sa

from celery_mcp_tasks.model import TaskRecord
from celery_mcp_tasks.store.base import StoreUnavailable

logger = logging.getLogger("celery_mcp_tasks.store.sql")

F = TypeVar("F", bound=Callable[..., Any])


def _reconnecting(method: F) -> F:
    """Run again, once, when the database dropped the pooled connection (a restart, a failover).

    The pool does not ping before every checkout (a round trip on the hot path): the first statement on a dead
    connection fails and invalidates the pool. A retry is safe for work the server never committed and for
    idempotent writes; a connection lost *during* a COMMIT is `_CommitInDoubt`, never retried blindly.
    """

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except sa.exc.DBAPIError as exc:
            if not exc.connection_invalidated:
                raise
            logger.warning("store connection was lost (%s); retrying once", type(exc.orig).__name__)
            return method(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _reported(method: F) -> F:
    """The store's failures leave it as `StoreUnavailable`: a fixed text, the database's own in the cause."""
    operation = method.__name__

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except _CommitInDoubt as doubt:
            raise StoreUnavailable(operation, loggable(doubt.cause)) from doubt.cause
        except sa.exc.SQLAlchemyError as exc:
            raise StoreUnavailable(operation, loggable(exc)) from exc

    return wrapper  # type: ignore[return-value]


_SQLSTATES = {
    "25006": "the database is read-only (a standby, or default_transaction_read_only)",
    "57014": "a statement was cancelled (statement_timeout, or an operator's cancel)",
    "55P03": "a row lock was not granted in time (lock_timeout)",
    "25P03": "the session sat idle in a transaction too long (idle_in_transaction_session_timeout)",
    "42501": "permission denied: the role needs SELECT, INSERT, UPDATE and DELETE on the mcp_tasks_ tables",
    "53100": "the database's disk is full",
    "40P01": "a deadlock was detected",
}
"""PostgreSQL's conditions a person can act on, said in the setting's words (its own text may quote values)."""


def loggable(exc: BaseException) -> str:
    """What a log line may say of a database failure: SQLite's own first line ("database disk image is
    malformed", "disk I/O error": it never quotes a value); PostgreSQL's refusal of a connection (the server's
    FATAL line, "too many connections for role ...": no statement ran yet, so it quotes none), after the driver
    error's type; a condition in `_SQLSTATES`, in its words; else that type alone (PostgreSQL's text may quote
    a statement's values)."""
    orig = exc.orig if isinstance(exc, sa.exc.DBAPIError) and exc.orig is not None else exc
    text = str(orig).strip()
    if isinstance(orig, sqlite3.Error) and text:
        return text.splitlines()[0][:200]
    _, fatal, refusal = text.partition("FATAL:")
    if fatal and text.startswith("connection") and refusal.strip():
        return f"{type(orig).__name__}: {refusal.strip().splitlines()[0][:200]}"
    said = _SQLSTATES.get(getattr(orig, "sqlstate", None) or "")
    return f"{type(orig).__name__}: {said}" if said else type(orig).__name__


def _operation(method: F) -> F:
    """A store operation that may simply run again: `_reconnecting`, inside `_reported`."""
    return _reported(_reconnecting(method))


class _CommitInDoubt(Exception):
    """The connection was lost while a write's commit was in flight: applied or not, nobody knows yet.

    For an update: the record the transition was computed on (`before`), the one written, the columns set."""

    def __init__(
        self,
        cause: BaseException,
        before: TaskRecord | None = None,
        after: TaskRecord | None = None,
        changes: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__("the outcome of a COMMIT is unknown")
        self.cause, self.before, self.after, self.changes = cause, before, after, changes or {}


def _in_doubt(exc: sa.exc.DBAPIError, *written: Any) -> _CommitInDoubt:
    """A write that failed on a connection the database dropped is in doubt; any other failure is raised."""
    if not exc.connection_invalidated:
        raise exc
    return _CommitInDoubt(exc, *written)
