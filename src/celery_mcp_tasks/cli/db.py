"""`celery-mcp-tasks db`: migrate, check and re-key the task store that MCP_TASKS_DATABASE_URL names."""

from __future__ import annotations

import argparse
import re
import sys

import sqlalchemy as sa
from alembic.util import CommandError

from celery_mcp_tasks import migrate
from celery_mcp_tasks.cli.shared import named_revisions
from celery_mcp_tasks.config import ConfigError, Settings, redact_url
from celery_mcp_tasks.preflight import (
    NOT_CREATED,
    current_revisions,
    missing_sqlite_file,
    preflight,
    probe_engine,
    revision_problem,
    script_heads,
    shared_store_problem,
    short_reason,
)
from celery_mcp_tasks.store.codec import new_key
from celery_mcp_tasks.store.engine import create_store_engine, read
from celery_mcp_tasks.store.rekeying import newest_sealed_key, reencrypt


def _revisions(url: str) -> tuple[str, ...]:
    """The store's revisions now (() for an empty database, or a SQLite file not created yet)."""
    if missing_sqlite_file(url):
        return ()
    engine = probe_engine(url)
    try:
        with engine.connect() as conn:
            return current_revisions(conn)
    finally:
        engine.dispose()


def _usage_problem(action: str, revision: str | None, force: bool) -> str | None:
    """Why `db ACTION [REVISION] [--force]` is refused before anything runs (None: it is not): what the action
    takes none of, or a REVISION no migration of this release names (the app's module path, out of habit)."""
    if force and action != "reencrypt":
        return f"--force is for db reencrypt, not db {action}"
    if revision is None:
        return None
    if action not in ("upgrade", "downgrade"):
        return f"db {action} takes no REVISION (got {revision!r})"
    known = sorted(script_heads()[1])
    # a revision, alembic's names (head, base), or a step from either or from here (0005+2, head-1, -1)
    named = re.fullmatch(r"(\w+)?([+-]\d+)?", revision)
    if named and named[1] in {None, "head", "heads", "base", *known}:
        return None
    return (
        f"unknown revision {revision!r}: this release's are {known[0]} to {known[-1]}, or head, or base "
        "(db takes no APP: the store is MCP_TASKS_DATABASE_URL's)"
    )


def run(args: argparse.Namespace) -> int:
    problem = _usage_problem(args.action, args.revision, args.force)
    if problem is not None:
        print(f"celery-mcp-tasks db: {problem}", file=sys.stderr)
        return 2
    if args.action == "newkey":
        print(new_key())
        return 0
    if args.action == "downgrade" and not args.revision:  # never by default: `base` drops every task
        print(
            "celery-mcp-tasks db: downgrade needs the REVISION to go back to (`base` drops the package's tables "
            "and every task in them)",
            file=sys.stderr,
        )
        return 2
    settings = Settings.from_env()
    shared = shared_store_problem(settings, "db", settings.celery_broker_url)
    if shared is not None:  # before `check` or `current` says to create a file `upgrade` would then refuse
        raise ConfigError(shared)
    url = settings.store_url
    if args.action in ("current", "check") and missing_sqlite_file(url):  # asked, never created (a mistyped path)
        print(f"celery-mcp-tasks db: {NOT_CREATED} ({redact_url(url)})", file=sys.stderr)
        return 1
    if args.action == "current":  # read-only: says where any store is, one a newer release migrated too
        try:
            revisions = _revisions(url)
        except Exception:  # noqa: BLE001 - unreachable, a bad URL, a directory missing: preflight says which, in one line
            revisions = None
        if revisions is not None and set(revisions) - script_heads()[1]:
            print(f"{', '.join(sorted(revisions))} (newer than this release of celery-mcp-tasks: upgrade the package)")
            return 0
    preflight(settings, role="db", need_schema=False)  # unreachable: one line, not alembic's traceback
    if args.action == "reencrypt":
        return _reencrypt(settings, force=args.force)
    if args.action in ("upgrade", "downgrade"):
        moved = (migrate.upgrade if args.action == "upgrade" else migrate.downgrade)(url, args.revision or "head")
        if moved is None:  # nothing to do, or another migrator running at once did it
            now = _revisions(url)
            past = args.action == "upgrade" and args.revision not in (None, "head", "heads", *now)
            print(
                f"celery-mcp-tasks db: the task store {redact_url(url)} is already at {named_revisions(now)}"
                + (
                    f", past {args.revision}: to go back to it, `celery-mcp-tasks db downgrade {args.revision}`"
                    if past
                    else ""
                )
            )
        else:
            print(
                f"celery-mcp-tasks db: {args.action}d the task store {redact_url(url)} from {named_revisions(moved[0])} "
                f"to {named_revisions(moved[1])}"
            )
    elif args.action == "check":
        return _check(url)
    else:
        migrate.current(url)
        if not _revisions(url):
            print("base (no tables): run `celery-mcp-tasks db upgrade`")
    return 0


def _check(url: str) -> int:
    """0 when the store is at this release's head and its schema is the one the models describe; else 1, saying why."""
    store, revisions = redact_url(url), _revisions(url)
    problem = revision_problem(revisions)
    if problem is not None:
        print(f"celery-mcp-tasks db check: {problem} ({store})", file=sys.stderr)
        return 1
    try:
        migrate.check(url)  # alembic compares the models with the tables: a column changed by hand shows here
    except CommandError as exc:
        detail = str(exc).strip().splitlines()[0]
        print(
            f"celery-mcp-tasks db check: the task store {store} differs from this release's schema: {detail}",
            file=sys.stderr,
        )
        return 1
    print(
        f"celery-mcp-tasks db check: the task store {store} is at {named_revisions(revisions)}, as this release expects"
    )
    return 0


def _reencrypt(settings: Settings, *, force: bool = False) -> int:
    """Seal every row's payloads with the ring's first key, in batches, while everything runs.

    Unless `force`d, only once the running processes are seen sealing with that key (the tasks created last
    are): a row re-encrypted with a key they lack would read as failed to every one of them."""
    ring = settings.key_ring()
    if ring is None:
        raise ConfigError("MCP_TASKS_ENCRYPTION_KEYS: unset; set the ring to re-encrypt with (the new key first)")
    problem = revision_problem(_revisions(settings.store_url))
    if problem is not None:
        raise ConfigError(f"MCP_TASKS_DATABASE_URL: {problem}")
    engine = create_store_engine(settings.store_url)
    try:
        newest = None if force else read(engine, newest_sealed_key)
        if not force and newest != ring.primary_id:
            sealed = (
                "none of the tasks created last is sealed"
                if newest is None
                else f"the tasks created last are sealed with key {newest}"
            )
            print(
                f"celery-mcp-tasks db reencrypt: {sealed}, not with {ring.primary_id}, the ring's first key: the "
                "running processes do not appear to seal with it yet, and a row sealed with a key they lack reads as "
                f"failed to them. Restart every web process, worker and beat with {ring.primary_id} first in "
                "MCP_TASKS_ENCRYPTION_KEYS, then run this again (--force: re-encrypt all the same)",
                file=sys.stderr,
            )
            return 1
        done = reencrypt(engine, ring, batch_size=500)
    except sa.exc.SQLAlchemyError as exc:  # each batch is its own commit: what was done stays done
        print(
            f"celery-mcp-tasks db reencrypt: the task store failed part-way ({short_reason(exc)}); the rows "
            "re-encrypted so far stay so: run it again",
            file=sys.stderr,
        )
        return 1
    finally:
        engine.dispose()
    print(
        f"celery-mcp-tasks db reencrypt: {done.rewritten} rows re-encrypted with key {ring.primary_id}, "
        f"{done.current} already were, {done.unreadable} sealed with a key not in the ring (left as they are), "
        f"{done.busy} kept changing (run it again)"
    )
    return 1 if done.busy or done.unreadable else 0
