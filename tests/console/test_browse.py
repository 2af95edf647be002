"""The console's reads and actions on a real store (SQLite, and PostgreSQL when configured):
filters, keyset pages, the overview, a task's detail, the live fan-out and the audited actions."""

from __future__ import annotations

import base64
import hashlib
import json
import logging

import anyio
import pytest
import sqlalchemy as sa

from celery_mcp_tasks.cli.tasks import _owner_label
from celery_mcp_tasks.console.context import Ambiguous, Conflict, Console, NotFound, PayloadsHidden, Refused
from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.model import Run, TaskRecord, TaskStatus, celery_message_id, new_task_id, owner_of
from celery_mcp_tasks.notify.hub import Hub
from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.store.codec import KeyRing, new_key
from celery_mcp_tasks.store.rows import (
    SORTS,
    TOP_OWNERS,
    BadFilter,
    Filter,
    OwnerCount,
    Row,
    detail_of,
    encode_cursor,
    owner_label,
    owner_tag,
    parse_limit,
    parse_sort,
    row_of,
    trace_id_of,
)
from celery_mcp_tasks.store.schema import tasks
from celery_mcp_tasks.store.sql import SqlStore
from tests.builders import Clock, record
from tests.support import POSTGRES_URL, fresh_postgres_database

NOW = 10_000_000_000
ALICE = "sub:https%3A%2F%2Fidp.example:alice"
BOB = "client_id:https%3A%2F%2Fidp.example:robot"


def key(n: int) -> str:
    return hashlib.sha256(f"row-{n}".encode()).hexdigest()


def put(store: SqlStore, n: int, **changes: object) -> TaskRecord:
    values: dict[str, object] = {"key": key(n), "created_at": NOW - n * 1000, "updated_at": NOW - n * 1000}
    values.update(changes)
    rec = record(**values)
    store.create(rec, max_rows=None)
    return rec


def everything(store: SqlStore, filter: Filter, sort: str, limit: int) -> list[Row]:
    """Every page of a listing, following the cursors."""
    rows: list[Row] = []
    cursor = None
    for _ in range(1000):
        page = store.browse(filter, sort, cursor, limit, now_ms=NOW)
        assert len(page.rows) <= limit
        rows.extend(page.rows)
        cursor = page.next_cursor
        if cursor is None:
            return rows
    raise AssertionError("the cursors never ended")


# -- parsing ------------------------------------------------------------------------------


def test_a_filter_parses_its_query_and_renders_it_back() -> None:
    query = {"status": "working,FAILED", "tool": "slow", "owner": "sub:idp", "min_age": "90", "max_age": "2h", "q": "x"}
    parsed = Filter.parse(query)
    assert parsed == Filter(frozenset({"working", "failed"}), "slow", "sub:idp", 90, 7200, "x")
    assert Filter.parse(parsed.query()) == parsed
    assert Filter.parse({"status": "active"}).statuses == {"working", "input_required"}
    assert Filter.parse({"status": "", "tool": " ", "sort": "-created"}).empty  # blanks and others ignored


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"status": "running"}, "status"),
        ({"min_age": "ten"}, "min_age"),
        ({"max_age": "-5"}, "max_age"),
        ({"min_age": "2h", "max_age": "1h"}, "min_age"),
        ({"owner": "alice"}, "owner"),
        ({"owner": "sub:idp zz"}, "owner"),
        ({"q": "x" * 201}, "q"),
    ],
)
def test_a_bad_filter_names_its_field(query: dict[str, str], field: str) -> None:
    with pytest.raises(BadFilter) as caught:
        Filter.parse(query)
    assert caught.value.field == field and caught.value.message


def test_sort_and_limit_are_checked() -> None:
    assert parse_sort(None) == "-created" and parse_sort("updated") == "updated"
    assert parse_limit(None) == 50 and parse_limit("10") == 10
    for bad, parse, field in [
        ("created_at", parse_sort, "sort"),
        ("0", parse_limit, "limit"),
        ("x", parse_limit, "limit"),
        ("\uff11", parse_limit, "limit"),  # a full-width one: int() would take it
        ("1_0", parse_limit, "limit"),
        ("-1", parse_limit, "limit"),
    ]:
        with pytest.raises(BadFilter) as caught:
            parse(bad)  # type: ignore[operator]
        assert caught.value.field == field


def test_an_owner_filter_is_bounded_and_ages_take_ascii_digits_only() -> None:
    with pytest.raises(BadFilter, match="at most 1024 characters") as caught:
        Filter.parse({"owner": "sub:" + "x" * 2000})
    assert caught.value.field == "owner"
    with pytest.raises(BadFilter) as caught:
        Filter.parse({"min_age": "\uff11\uff10m"})  # full-width "10m"
    assert caught.value.field == "min_age"
    assert Filter.parse({"min_age": "10m"}).min_age_s == 600


def test_a_refusal_never_repeats_what_was_typed_a_pasted_task_id_least_of_all(store: SqlStore) -> None:
    pasted = new_task_id()
    refusals = []
    for name in ("status", "min_age", "max_age", "owner"):
        with pytest.raises(BadFilter) as caught:
            Filter.parse({name: pasted})
        refusals.append(caught.value)
    for parse in (parse_sort, parse_limit):
        with pytest.raises(BadFilter) as caught:
            parse(pasted)
        refusals.append(caught.value)
    cursor = base64.urlsafe_b64encode(json.dumps([pasted, 1, key(1)]).encode()).decode()
    with pytest.raises(BadFilter) as caught:
        store.browse(Filter(), "-created", cursor, 10, now_ms=NOW)
    refusals.append(caught.value)
    for refusal in refusals:
        assert pasted.lower() not in f"{refusal.field}: {refusal.message}".lower() and refusal.message, refusal.field


def test_an_owner_shows_as_its_namespace_and_a_short_hash_never_its_subject() -> None:
    row = row_of(record(key=key(1), owner=ALICE))
    assert row.owner_label == f"sub:https%3A%2F%2Fidp.example {owner_tag(ALICE)}"
    assert "alice" not in row.owner_label and "alice" not in str(row.as_json())
    assert row_of(record(key=key(1), owner=None)).owner_label == "anonymous"
    assert row.short == key(1)[:12]


# -- pages --------------------------------------------------------------------------------


@pytest.mark.parametrize("sort", SORTS)
def test_keyset_pages_list_every_row_once_in_order_even_with_ties(store: SqlStore, sort: str) -> None:
    for n in range(23):
        put(store, n, created_at=NOW - (n // 4) * 1000, updated_at=NOW - (n % 5) * 1000)  # many equal times
    rows = everything(store, Filter(), sort, limit=5)
    assert sorted(r.key for r in rows) == sorted(key(n) for n in range(23))
    value = (lambda r: (r.created_at, r.key)) if sort.endswith("created") else (lambda r: (r.updated_at, r.key))
    assert [value(r) for r in rows] == sorted((value(r) for r in rows), reverse=sort.startswith("-"))


def test_a_malformed_or_foreign_cursor_is_a_bad_filter_naming_the_cursor(store: SqlStore) -> None:
    put(store, 1)
    good = encode_cursor("-created", row_of(record(key=key(1))))
    deep = base64.urlsafe_b64encode(b"[" * 1200 + b"]" * 1200).decode()  # json.loads: RecursionError
    for cursor, sort in [
        ("not base64!", "-created"),
        ("e30", "-created"),
        (good, "updated"),
        (good[:-3], "-created"),
        (deep, "-created"),
    ]:
        with pytest.raises(BadFilter) as caught:
            store.browse(Filter(), sort, cursor, 10, now_ms=NOW)
        assert caught.value.field == "cursor"


def test_filters_by_status_tool_owner_age_and_text_alike_in_pages_and_for_given_rows(store: SqlStore) -> None:
    """Every rule holds for a list page and for "does this changed row belong on the list" (live.js asks)."""
    put(store, 1, tool="slow", owner=ALICE, status_message="Crunching 50% of the DATA")
    put(store, 2, tool="slow", owner=BOB, status=TaskStatus.FAILED, status_message="boom")
    put(store, 3, tool="fast", owner=None, status=TaskStatus.INPUT_REQUIRED)
    put(store, 400, tool="fast", owner=ALICE, status=TaskStatus.COMPLETED)  # 400 s old
    every_key = [key(1), key(2), key(3), key(400), key(99)]

    def keys(**query: str) -> set[str]:
        listed = {r.key for r in everything(store, Filter.parse(query), "-created", 2)}
        given = {r.key for r in store.rows(every_key, Filter.parse(query), now_ms=NOW)}
        assert listed == given, query
        return listed

    assert keys(status="failed,input_required") == {key(2), key(3)}
    assert keys(status="active") == {key(1), key(3)}
    assert keys(tool="slow") == {key(1), key(2)}
    assert keys(owner="anonymous") == {key(3)}
    assert keys(owner="sub:https%3A%2F%2Fidp.example") == {key(1), key(400)}
    assert keys(owner="client_id:https%3A%2F%2Fidp.example") == {key(2)}
    assert keys(owner="sub:https://idp.example") == {key(1), key(400)}  # the issuer as the provider writes it
    assert keys(owner=f"client_id:https://idp.example {owner_tag(BOB)}") == {key(2)}
    assert keys(owner="sub:https://idp.example/other") == set()
    assert keys(owner=str(owner_tag(BOB))) == {key(2)}
    assert keys(owner=str(owner_tag(BOB))[:5]) >= {key(2)}
    assert keys(owner=row_of(record(key=key(1), owner=ALICE)).owner_label) == {key(1), key(400)}
    assert keys(owner="0000000000") == set()
    # `tasks ls --owner NAMESPACE --subject WHO`: one owner by name, its tag computed by the command
    assert keys(owner=_owner_label("sub:https://idp.example", "alice")) == {key(1), key(400)}
    assert keys(owner=_owner_label("client_id:https%3A%2F%2Fidp.example", "robot")) == {key(2)}
    assert keys(owner=_owner_label("sub:https://idp.example", "bob")) == set()
    assert keys(min_age="60") == {key(400)}
    assert keys(max_age="1m") == {key(1), key(2), key(3)}
    assert keys(q="data") == {key(1)}
    assert keys(q="50%") == {key(1)} and keys(q="5_%") == set()  # LIKE wildcards are literal
    assert keys(tool="slow", status="failed", owner=str(owner_tag(BOB))) == {key(2)}
    put(store, 7, owner=owner_of("https://idp.example/realms/a b", subject="carol"))  # a space in its issuer
    carol = Filter.parse({"owner": _owner_label("sub:https://idp.example/realms/a b", "carol")})
    assert {r.key for r in everything(store, carol, "-created", 2)} == {key(7)}


def same_case_rules(store: SqlStore) -> None:
    put(store, 1, owner=ALICE, status_message="Äpfel and DATA")
    put(store, 2, owner="sub:https%3A%2F%2FIDP.example:bob", status_message="äpfel and data")
    every_key = [key(1), key(2)]

    def keys(**query: str) -> set[str]:
        listed = {r.key for r in everything(store, Filter.parse(query), "-created", 1)}
        assert listed == {r.key for r in store.rows(every_key, Filter.parse(query), now_ms=NOW)}, query
        return listed

    assert keys(owner="sub:https://idp.example") == {key(1)}
    assert keys(owner="sub:https://IDP.example") == {key(2)}
    assert keys(owner=f"sub:https://IDP.example {owner_tag(ALICE)}") == set()
    assert keys(q="data") == keys(q="DaTa") == {key(1), key(2)}
    assert keys(q="äpfel") == {key(2)} and keys(q="ÄPFEL") == {key(1)}


def test_a_namespace_keeps_its_letters_case_and_text_ignores_the_case_of_a_to_z_only(store: SqlStore) -> None:
    """One rule on every store: SQLite's LIKE ignores the case of A-Z (PostgreSQL's does not), so another issuer
    spelled in capitals was listed under a namespace on SQLite only; and an ICU database's lower() lowers "Ä"
    where SQLite's and a C database's do not."""
    same_case_rules(store)


@pytest.mark.postgres
def test_the_case_rules_hold_in_an_icu_database() -> None:
    if not POSTGRES_URL:
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL to run")
    with fresh_postgres_database(POSTGRES_URL, "TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US'") as url:
        upgrade(url)
        store = SqlStore.from_url(url)
        try:
            same_case_rules(store)
        finally:
            store.dispose()


@pytest.mark.postgres
def test_an_owner_tag_within_a_namespace_is_found_whatever_the_database_collation() -> None:
    """The official postgres image makes en_US databases. In a collation other than C, ';' sorts before ':',
    and the owners of a namespace were looked for between "ns:" and "ns;": nothing was ever found. Nor are a
    namespace's owners consecutive there: ICU puts an issuer spelled in capitals between them."""
    if not POSTGRES_URL:
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL to run")
    icu = "TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US'"
    with fresh_postgres_database(POSTGRES_URL, icu) as url:
        upgrade(url)
        store = SqlStore.from_url(url)
        try:
            put(store, 1, owner=ALICE)
            put(store, 2, owner=BOB)
            put(store, 3, owner="subway:https%3A%2F%2Fidp.example:carol")  # a namespace "sub" is a prefix of
            put(store, 4, owner="sub:https%3A%2F%2Fidp.EXAMPLE:bob")  # sorts between ALICE and ZED
            zed = ALICE.rsplit(":", 1)[0] + ":zed"
            put(store, 5, owner=zed)
            alice = Filter.parse({"owner": f"sub:https://idp.example {owner_tag(ALICE)}"})
            assert [r.key for r in store.browse(alice, "-created", None, 10, now_ms=NOW).rows] == [key(1)]
            later = Filter.parse({"owner": f"sub:https://idp.example {owner_tag(zed)}"})
            assert [r.key for r in store.browse(later, "-created", None, 10, now_ms=NOW).rows] == [key(5)]
            statements: list[str] = []
            sa.event.listen(store.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
            assert [r.key for r in store.rows([key(1), key(2), key(3)], alice, now_ms=NOW)] == [key(1)]
            # live.js asks this for every changed row: the tag is checked on the rows, the owners are not listed
            assert len(statements) == 1 and "RECURSIVE" not in statements[0]
            anyone = Filter.parse({"owner": str(owner_tag(BOB))})
            assert [r.key for r in store.browse(anyone, "-created", None, 10, now_ms=NOW).rows] == [key(2)]
        finally:
            store.dispose()


def test_a_short_hash_among_more_owners_than_are_looked_through_is_refused_not_answered_empty(
    store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the first owners are looked through for a short hash: past them, an empty page would say the owner
    has no tasks. The filter is refused, saying what to give instead; with few enough owners it answers."""
    from celery_mcp_tasks.store import browse

    monkeypatch.setattr(browse, "_MAX_OWNERS", 3)
    owners = [f"sub:https%3A%2F%2Fidp.example:user{n}" for n in range(3)]
    for n, owner in enumerate(owners):
        put(store, n, owner=owner)
    last = Filter.parse({"owner": str(owner_tag(owners[2]))})
    assert [r.key for r in store.browse(last, "-created", None, 10, now_ms=NOW).rows] == [key(2)]
    put(store, 3, owner="sub:https%3A%2F%2Fidp.example:user3")
    with pytest.raises(BadFilter) as refused:
        store.browse(last, "-created", None, 10, now_ms=NOW)
    assert refused.value.field == "owner"
    assert "at most 3 owners" in refused.value.message and "`<namespace> <hash>`" in refused.value.message
    within = Filter.parse({"owner": f"sub:https://idp.example {owner_tag(owners[2])}"})
    with pytest.raises(BadFilter, match="filter by the namespace alone"):
        store.browse(within, "-created", None, 10, now_ms=NOW)
    monkeypatch.setattr(browse, "_MAX_OWNERS", 4)
    assert [r.key for r in store.browse(within, "-created", None, 10, now_ms=NOW).rows] == [key(2)]
    # More owners than that sort after another namespace's only owner: its short hash is still found.
    monkeypatch.setattr(browse, "_MAX_OWNERS", 3)
    put(store, 4, owner=BOB)  # client_id: sorts before sub:
    robot = Filter.parse({"owner": f"client_id:https://idp.example {owner_tag(BOB)}"})
    assert [r.key for r in store.browse(robot, "-created", None, 10, now_ms=NOW).rows] == [key(4)]


def test_rows_changed_since_and_delete_of_a_final_row_only(store: SqlStore) -> None:
    put(store, 1, updated_at=NOW + 5)
    put(store, 2, status=TaskStatus.COMPLETED, updated_at=NOW + 10)
    put(store, 3)
    assert {r.key for r in store.rows([key(1), key(2), key(99)])} == {key(1), key(2)}
    assert [r.key for r in store.changed_since(NOW, limit=10)] == [key(1), key(2)]
    assert [r.key for r in store.changed_since(NOW, limit=1)] == [key(1)]
    assert not store.delete(key(1))  # working: stays
    assert store.delete(key(2)) and store.get(key(2)) is None
    assert not store.delete(key(2))


# -- overview and detail ----------------------------------------------------------------------


def test_the_overview_counts_active_tasks_and_those_ended_in_the_hour_by_status_tool_and_minute(
    store: SqlStore,
) -> None:
    minute = 60_000
    put(store, 1, tool="a", created_at=NOW - 5 * minute, updated_at=NOW - 5 * minute)
    put(store, 2, tool="a", created_at=NOW - 3 * minute, status=TaskStatus.COMPLETED, updated_at=NOW - minute)
    put(store, 3, tool="b", created_at=NOW - 3 * minute, status=TaskStatus.FAILED, updated_at=NOW)
    put(store, 4, tool="b", created_at=NOW - 2 * 3600_000, status=TaskStatus.INPUT_REQUIRED, updated_at=NOW - 3600_000)
    # ended before the hour: kept for its TTL, but not counted (counting every final row would scan the table)
    put(store, 5, tool="b", created_at=NOW - 3 * 3600_000, status=TaskStatus.COMPLETED, updated_at=NOW - 2 * 3600_000)
    put(store, 6, tool="a", created_at=NOW - 9 * minute, status=TaskStatus.CANCELLED, updated_at=NOW - 8 * minute)
    seen = store.overview(NOW)
    assert seen.by_status == {"working": 1, "input_required": 1, "completed": 1, "failed": 1, "cancelled": 1}
    assert seen.final_since_ms == (NOW // minute - 59) * minute
    assert seen.by_tool["b"]["completed"] == 0 and seen.by_tool["a"]["cancelled"] == 1
    assert (
        seen.by_tool["a"]["working"] == 1 and seen.by_tool["a"]["completed"] == 1 and seen.by_tool["b"]["failed"] == 1
    )
    assert len(seen.per_minute) == 60 and seen.per_minute[-1].minute_ms == NOW // minute * minute
    assert sum(m.created for m in seen.per_minute) == 4  # the tasks created hours ago are outside the hour
    assert [m.completed for m in seen.per_minute][-2] == 1 and seen.per_minute[-1].failed == 1
    assert seen.oldest_working is not None and seen.oldest_working.key == key(1)
    assert seen.oldest_input_required is not None and seen.oldest_input_required.key == key(4)
    assert seen.last_sweep is None
    assert seen.by_owner == [OwnerCount("anonymous", 1, 1)] and seen.owners_active == 1


def test_the_overview_lists_the_owners_with_the_most_active_tasks_by_label_never_by_name(store: SqlStore) -> None:
    """The tenants of a deployment at a glance: finished tasks do not count, the busiest come first, and at most
    `TOP_OWNERS` of them are listed while `owners_active` counts them all."""
    put(store, 1, owner=ALICE)
    put(store, 2, owner=ALICE, status=TaskStatus.INPUT_REQUIRED)
    put(store, 3, owner=ALICE, status=TaskStatus.COMPLETED)
    put(store, 4, owner=BOB, status=TaskStatus.INPUT_REQUIRED)
    put(store, 5, owner=None)
    for n in range(TOP_OWNERS):
        put(store, 100 + n, owner=f"sub::tenant-{n}")
    seen = store.overview(NOW)
    assert seen.owners_active == TOP_OWNERS + 3
    assert len(seen.by_owner) == TOP_OWNERS
    assert seen.by_owner[0] == OwnerCount(owner_label(ALICE), 1, 1) and seen.by_owner[0].active == 2
    assert seen.by_owner[0].owner == f"sub:https%3A%2F%2Fidp.example {owner_tag(ALICE)}"
    assert OwnerCount("anonymous", 1, 0) in seen.by_owner
    assert all("alice" not in counted.owner and "tenant" not in counted.owner for counted in seen.by_owner)
    # the label is the owner filter of that owner's tasks
    listed = {r.key for r in everything(store, Filter.parse({"owner": seen.by_owner[0].owner}), "-created", 5)}
    assert listed == {key(1), key(2), key(3)}


def test_a_detail_shows_questions_error_trace_and_message_id_and_payloads_only_revealed() -> None:
    rec = record(
        key=key(1),
        status=TaskStatus.INPUT_REQUIRED,
        arguments={"secret": 1},
        issued_keys=("name", "age", "old"),
        input_requests={"age": {"method": "elicitation/create", "params": {"message": "How old?"}}},
        input_responses={"name": {"action": "accept"}},
        dispatches=2,
        trace_context="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        error={"code": -32603, "message": "it broke", "data": "x"},
    )
    shown = detail_of(rec, queue="celery")
    assert [(q.key, q.state, q.message) for q in shown.questions] == [
        ("name", "answered", None),
        ("age", "outstanding", "How old?"),
        ("old", "dropped", None),
    ]
    assert shown.trace_id == "0af7651916cd43dd8448eb211c80319c" and shown.queue == "celery"
    assert shown.celery_message_id == celery_message_id(rec)
    assert shown.error is not None and shown.error.message == "it broke" and shown.error.code == -32603
    assert shown.arguments is None and shown.answers is None and "secret" not in str(shown.as_json())
    revealed = detail_of(rec, queue=None, reveal=True)
    assert revealed.arguments == {"secret": 1} and revealed.answers == {"name": {"action": "accept"}}
    assert trace_id_of("00-" + "0" * 32 + "-b7ad6b7169203331-01") is None and trace_id_of("junk") is None


# -- the console: actions and live updates --------------------------------------------------------


class Runner:
    def __init__(self) -> None:
        self.sent: list[TaskRecord] = []
        self.revoked: list[TaskRecord] = []

    def send(self, rec: TaskRecord) -> None:
        self.sent.append(rec)

    def revoke(self, rec: TaskRecord) -> None:
        self.revoked.append(rec)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def console(store: SqlStore) -> Console:
    clock = Clock()
    clock.now = NOW
    service = TaskService(store, dispatcher=Runner(), clock=clock)
    return Console(
        service,
        hub=Hub(),
        queue_of=lambda record: "celery",
        terminable=lambda tool: tool == "killable",
        stale_timeout_s=30,
        clock=clock,
    )


def audits(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "celery_mcp_tasks.console.audit"]


@pytest.mark.anyio
@pytest.mark.parametrize("terminate", [False, True])  # a tool that cannot terminate: the task's state decides first
async def test_a_cancel_that_loses_the_race_to_completed_is_a_conflict_and_changes_nothing(
    console: Console, caplog: pytest.LogCaptureFixture, terminate: bool
) -> None:
    caplog.set_level(logging.INFO, "celery_mcp_tasks.console.audit")
    _, rec = console.service.create(owner=ALICE, tool="t", arguments={})
    console.service.complete(rec.key, {"content": []})
    with pytest.raises(Conflict) as caught:
        await console.cancel(rec.key, "ops ann", terminate=terminate)
    assert caught.value.status == 409 and "completed" in caught.value.message
    after = console.service.store.get(rec.key)
    assert after is not None and after.status is TaskStatus.COMPLETED and after.version == rec.version + 1
    assert audits(caplog) == [f"operator=ops_ann action=cancel row={rec.key[:12]} outcome=conflict"]


@pytest.mark.anyio
async def test_cancel_with_terminate_only_where_the_tool_allows_it(console: Console) -> None:
    runner = console.service.dispatcher
    assert isinstance(runner, Runner)
    _, plain = console.service.create(owner=None, tool="t", arguments={})
    with pytest.raises(Refused):
        await console.cancel(plain.key, "ann", terminate=True)
    done = await console.cancel(plain.key, "ann", terminate=False)
    assert done.row is not None and done.row.status == "cancelled" and runner.revoked == []
    _, killable = console.service.create(owner=None, tool="killable", arguments={})
    await console.cancel(killable.key, "ann", terminate=True)
    assert [r.key for r in runner.revoked] == [killable.key]


@pytest.mark.anyio
async def test_resend_only_a_job_judged_lost_and_delete_only_a_final_task(
    console: Console, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "celery_mcp_tasks.console.audit")
    runner = console.service.dispatcher
    assert isinstance(runner, Runner)
    _, rec = console.service.create(owner=None, tool="t", arguments={})
    with pytest.raises(Refused) as caught:
        await console.resend(rec.key, "ann")
    assert caught.value.message == "the job was sent less than the stale timeout ago and has not started yet"
    assert len(runner.sent) == 1
    _, started = console.service.create(owner=None, tool="t", arguments={})
    console.service.begin(started.key, Run(started.dispatches), stale_before_ms=0)  # a worker took it
    with pytest.raises(Refused) as caught:
        await console.resend(started.key, "ann")
    assert caught.value.message == "the job is alive: its heartbeat is newer than the stale timeout"
    with pytest.raises(Refused):
        await console.delete(rec.key, "ann")
    assert isinstance(console.clock, Clock)
    console.clock.now += 31_000  # no heartbeat for longer than the stale timeout
    done = await console.resend(rec.key, "ann")
    assert done.row is not None and done.row.dispatches == 2 and done.row.resends == 1 and len(runner.sent) == 3
    await console.cancel(rec.key, "ann")
    await console.delete(rec.key, "ann")
    assert console.service.store.get(rec.key) is None
    with pytest.raises(NotFound):
        await console.delete(rec.key, "ann")
    with pytest.raises(NotFound):
        await console.detail("not-a-key")
    outcomes = [line.rsplit("outcome=", 1)[1] for line in audits(caplog)]
    assert outcomes == ["refused", "refused", "refused", "resent", "cancelled", "deleted", "not_found"]


@pytest.mark.anyio
async def test_a_row_key_prefix_as_lists_show_it_names_its_one_row_and_a_shared_one_is_refused(
    console: Console, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "celery_mcp_tasks.console.audit")
    one = put(console.service.store, 1, key="abcdef01" + "1" * 56)
    put(console.service.store, 2, key="abcdef01" + "2" * 56)
    put(console.service.store, 3, key="abcdef02" + "3" * 56)
    assert (await console.detail(one.key[:12])).key == one.key
    assert (await console.detail(one.key[:12].upper())).key == one.key  # as typed from a screen
    with pytest.raises(Ambiguous) as caught:
        await console.detail("abcdef01")
    assert caught.value.status == 400 and "several" in caught.value.message
    with pytest.raises(NotFound):
        await console.detail("abcdef0")  # 7 digits: too short to be a key
    with pytest.raises(NotFound):
        await console.detail("abcdef03")
    done = await console.cancel("abcdef02", "ann")
    assert done.key == "abcdef02" + "3" * 56 and done.row is not None and done.row.status == "cancelled"
    with pytest.raises(Ambiguous):
        await console.cancel("abcdef01", "ann")
    assert {r.key: r.status for r in console.service.store.rows([one.key, "abcdef01" + "2" * 56])} == {
        one.key: "working",
        "abcdef01" + "2" * 56: "working",
    }  # the ambiguous cancel changed nothing
    outcomes = [line.rsplit(" ", 2)[1:] for line in audits(caplog)]
    assert outcomes == [["row=abcdef023333", "outcome=cancelled"], ["row=abcdef01", "outcome=ambiguous"]]


@pytest.mark.anyio
async def test_payloads_are_revealed_only_when_allowed_and_each_reveal_is_audited(
    console: Console, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "celery_mcp_tasks.console.audit")
    _, rec = console.service.create(owner=None, tool="t", arguments={"x": 1})
    assert (await console.detail(rec.key)).arguments is None
    with pytest.raises(PayloadsHidden):
        await console.reveal(rec.key, "ann")
    console.payloads_allowed = True
    assert (await console.reveal(rec.key, "ann")).arguments == {"x": 1}
    assert [line.rsplit("outcome=", 1)[1] for line in audits(caplog)] == ["forbidden", "revealed"]


@pytest.mark.anyio
async def test_on_an_encrypted_store_the_console_reveals_payloads_only_through_the_stores_decryption(
    store_url: str,
) -> None:
    ring = KeyRing.parse([new_key()])
    store = SqlStore.from_url(store_url, ring=ring)
    try:
        console = Console(
            TaskService(store, dispatcher=Runner()),
            hub=Hub(),
            queue_of=lambda record: "celery",
            terminable=lambda tool: False,
            stale_timeout_s=30,
            payloads_allowed=True,
        )
        _, rec = console.service.create(owner=None, tool="t", arguments={"x": "hidden"})
        with store.engine.connect() as conn:
            stored = conn.execute(sa.select(tasks.c.arguments).where(tasks.c.key == rec.key)).scalar_one()
        assert isinstance(stored, str) and "hidden" not in stored
        assert (await console.detail(rec.key)).arguments is None
        assert (await console.reveal(rec.key, "ann")).arguments == {"x": "hidden"}
    finally:
        store.dispose()


@pytest.mark.anyio
async def test_live_changes_reach_every_page_with_one_read_per_tick(console: Console) -> None:
    async with anyio.create_task_group() as tg:
        tg.start_soon(console.run)
        pages = [console.events() for _ in range(20)]
        firsts = [anyio.Event() for _ in pages]
        received: list[list[tuple[str, str | None]]] = [[] for _ in pages]

        async def follow(i: int) -> None:
            async for change in pages[i]:
                assert change is not None
                received[i].append((change.key, change.status))
                firsts[i].set()

        for i in range(len(pages)):
            tg.start_soon(follow, i)
        with anyio.fail_after(5):
            while console.subscriber_count < len(pages):
                await anyio.sleep(0.01)
        _, rec = console.service.create(owner=None, tool="t", arguments={})
        console.service.progress(rec.key, "half", current=1, total=2)
        assert console.hub is not None
        console.hub.hint(rec.key, rec.version + 1)
        with anyio.fail_after(5):
            for event in firsts:
                await event.wait()
        reads = console.reads
        assert reads <= 3  # one read for the hinted row (and the poll for new rows), not one per page
        assert all(got[-1] == (rec.key, "working") for got in received)
        tg.cancel_scope.cancel()
