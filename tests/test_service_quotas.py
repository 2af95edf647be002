"""Idempotent creation and per-principal quotas in `TaskService`, on a real store (SQLite and PostgreSQL).

The clock is the service's own (driven, never slept); the racing creations are real threads on
their own connections, as two replicas would be.
"""

from __future__ import annotations

import logging
import re
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import sqlalchemy as sa

from celery_mcp_tasks import TaskContext, elicit
from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.model import (
    STARTED,
    Run,
    TaskRecord,
    TaskStatus,
    TerminalTask,
    celery_message_id,
    derived_task_id,
    task_key,
)
from celery_mcp_tasks.service import IdempotencyKeyReused, TaskExpired, TaskService, _CapRefusals
from celery_mcp_tasks.store.base import Quota, QuotaExceeded, TaskLimitReached, TaskNotFound
from celery_mcp_tasks.store.quotas import RowGauge
from celery_mcp_tasks.store.schema import tasks
from celery_mcp_tasks.store.sql import SqlStore
from tests.builders import SendOnly

SECRET = b"s" * 32


class Clock:
    def __init__(self, at: int = 1_000_000) -> None:
        self.at = at

    def __call__(self) -> int:
        return self.at


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def sent() -> list[TaskRecord]:
    return []


@pytest.fixture
def service(store: SqlStore, clock: Clock, sent: list[TaskRecord]) -> TaskService:
    return TaskService(store, dispatcher=SendOnly(sent.append), clock=clock, idempotency_secret=SECRET)


def rows(store: SqlStore) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM mcp_tasks_task")).scalar_one())


# -- idempotent creation ---------------------------------------------------------------------


def test_a_retry_with_the_same_key_gets_the_same_task_and_sends_no_second_job(
    service: TaskService, store: SqlStore, sent: list[TaskRecord]
) -> None:
    first_id, first = service.create(owner="sub:alice", tool="t", arguments={"x": 1}, idempotency_key="order-1")
    again_id, again = service.create(owner="sub:alice", tool="t", arguments={"x": 1}, idempotency_key="order-1")
    assert again_id == first_id and again.key == first.key == task_key(first_id)
    assert len(sent) == 1 and rows(store) == 1
    assert len(first_id) == 43  # shaped as every task id


def test_the_id_is_derived_from_the_secret_so_a_key_alone_opens_nothing(service: TaskService) -> None:
    task_id, _ = service.create(owner="sub:alice", tool="t", arguments={}, idempotency_key="k")
    assert task_id == derived_task_id(SECRET, "sub:alice", "t", "k")
    assert task_id != derived_task_id(b"o" * 32, "sub:alice", "t", "k")


def test_another_principal_with_the_same_key_gets_its_own_task(service: TaskService, sent: list[TaskRecord]) -> None:
    alice, _ = service.create(owner="sub:alice", tool="t", arguments={"x": 1}, idempotency_key="k")
    bob, _ = service.create(owner="sub:bob", tool="t", arguments={"x": 1}, idempotency_key="k")
    anonymous, _ = service.create(owner=None, tool="t", arguments={"x": 1}, idempotency_key="k")
    assert len({alice, bob, anonymous}) == 3 and len(sent) == 3
    with pytest.raises(TaskNotFound):  # bob's id is not alice's task
        service.get(bob, "sub:alice")


def test_the_same_key_with_other_arguments_is_refused_and_creates_nothing(
    service: TaskService, store: SqlStore, sent: list[TaskRecord]
) -> None:
    service.create(owner="sub:alice", tool="t", arguments={"x": 1}, idempotency_key="k")
    with pytest.raises(IdempotencyKeyReused):
        service.create(owner="sub:alice", tool="t", arguments={"x": 2}, idempotency_key="k")
    assert len(sent) == 1 and rows(store) == 1


def test_a_key_is_free_again_once_its_finished_task_has_expired(
    service: TaskService, clock: Clock, sent: list[TaskRecord]
) -> None:
    first_id, first = service.create(owner="sub:a", tool="t", arguments={}, ttl_ms=1000, idempotency_key="k")
    service.complete(first.key, {"content": []})
    clock.at += 1000
    again_id, again = service.create(owner="sub:a", tool="t", arguments={}, ttl_ms=1000, idempotency_key="k")
    assert again_id == first_id and again.status is TaskStatus.WORKING and again.created_at == clock.at
    assert len(sent) == 2


def test_once_its_finished_task_expired_a_key_starts_a_new_one_whatever_the_arguments_were(
    service: TaskService, clock: Clock, sent: list[TaskRecord]
) -> None:
    """Before the janitor evicted the expired row, the arguments it held were still compared, and refused."""
    _, first = service.create(owner="sub:a", tool="t", arguments={"x": 1}, ttl_ms=1000, idempotency_key="k")
    service.complete(first.key, {"content": []})
    clock.at += 1000
    _, again = service.create(owner="sub:a", tool="t", arguments={"x": 2}, ttl_ms=1000, idempotency_key="k")
    assert again.arguments == {"x": 2} and again.status is TaskStatus.WORKING and len(sent) == 2


def test_a_retry_after_the_ttl_while_the_job_runs_on_is_refused_not_handed_an_id_that_reads_as_expired(
    service: TaskService, store: SqlStore, clock: Clock, sent: list[TaskRecord]
) -> None:
    task_id, first = service.create(owner="sub:a", tool="t", arguments={}, ttl_ms=1000, idempotency_key="k")
    clock.at += 1000
    with pytest.raises(TaskExpired):
        service.get(task_id, "sub:a")
    with pytest.raises(IdempotencyKeyReused) as refused:
        service.create(owner="sub:a", tool="t", arguments={}, ttl_ms=1000, idempotency_key="k")
    assert refused.value.how == IdempotencyKeyReused.UNFINISHED
    assert len(sent) == 1 and rows(store) == 1 and store.get(first.key) == first  # nothing written


@pytest.mark.parametrize("freed_by", ["the retry", "the janitor"])
def test_a_task_created_again_under_its_key_is_out_of_reach_of_the_last_ones_job(
    service: TaskService, store: SqlStore, clock: Clock, freed_by: str
) -> None:
    """Cancelled without terminate, the key's task keeps its job running; once it expired, its row is deleted
    (by the retry, or by the janitor before it) and a retry creates the next task under the same key, its
    counters from 1 again. The last task's job reaches none of it: its writes (on a record of the same version),
    its heartbeats, its message id; to that job its task is gone."""
    task_id, first = service.create(owner="sub:a", tool="t", arguments={}, ttl_ms=1000, idempotency_key="k")
    run = Run(first.dispatches, 0, first.created_at)
    ctx = TaskContext(
        service, first.key, record=service.begin(first.key, run, stale_before_ms=0, expected=first), run=run
    )
    service.cancel(task_id, "sub:a")
    clock.at += 2000
    if freed_by == "the janitor":
        assert store.delete(first.key)
    again_id, again = service.create(owner="sub:a", tool="t", arguments={}, ttl_ms=1000, idempotency_key="k")
    assert again_id == task_id and again.status is TaskStatus.WORKING and again.created_at > first.created_at
    assert celery_message_id(again) != celery_message_id(first)  # a revoke of the last run is not this one's
    started = service.begin(again.key, Run(again.dispatches, 0, again.created_at), stale_before_ms=0, expected=again)
    assert (started.version, started.status_message) == (ctx.last_record.version, STARTED)  # type: ignore[union-attr]
    for write in (
        lambda: ctx.progress("from the last task's job"),
        lambda: ctx.require_input({"q": elicit("From the last task?", {"ok": bool})}),
        lambda: ctx.complete("the last task's result"),
    ):
        with pytest.raises(TerminalTask):  # `Superseded`: the row is another task's
            write()
    assert not service.heartbeat(first.key, run)
    assert ctx.cancelled()
    # the last run's outcome as a worker's main process settles it (on the row as it reads it now)
    with pytest.raises(TerminalTask):
        service.complete(first.key, {"content": []}, run=run, expected=started)
    assert service.record(first.key) == started


def test_racing_retries_create_one_task(store_url: str, clock: Clock) -> None:
    """Eight replicas (own stores, own connections) receive the same retried call at once."""
    stores = [SqlStore.from_url(store_url) for _ in range(8)]
    sent: list[TaskRecord] = []
    lock = threading.Lock()

    def send(record: TaskRecord) -> None:
        with lock:
            sent.append(record)

    try:
        services = [TaskService(s, dispatcher=SendOnly(send), clock=clock, idempotency_secret=SECRET) for s in stores]
        barrier = threading.Barrier(len(services))

        def call(service: TaskService) -> str:
            barrier.wait()
            return service.create(owner="sub:a", tool="t", arguments={"n": 1}, idempotency_key="k")[0]

        with ThreadPoolExecutor(len(services)) as pool:
            ids = set(pool.map(call, services))
        assert len(ids) == 1 and len(sent) == 1 and rows(stores[0]) == 1
    finally:
        for s in stores:
            s.dispose()


def _replicas(store_url: str, n: int, **options: Any) -> list[SqlStore]:
    """`n` stores on `store_url`, each with its own engine and connections, as `n` web processes have."""
    return [SqlStore.from_url(store_url, **options) for _ in range(n)]


def _at_once(services: list[TaskService], call: Callable[[TaskService], Any]) -> list[Any]:
    """`call` on every service from its own thread, released together; what each returned or raised."""
    barrier = threading.Barrier(len(services))

    def one(service: TaskService) -> Any:
        barrier.wait()
        try:
            return call(service)
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            return exc

    with ThreadPoolExecutor(len(services)) as pool:
        return list(pool.map(one, services))


@pytest.mark.parametrize("quota", [None, Quota(active=100)], ids=["no quota", "quota"])
def test_racing_retries_of_an_expired_key_all_get_its_one_next_task(
    store_url: str, clock: Clock, quota: Quota | None
) -> None:
    """The key's task finished and expired; eight replicas receive its retry at once. Each frees the key (unless
    another did and created the next task already) and creates again: all get the one next task, none the old
    one, none an error (the key's row may vanish between a conflict and its read)."""
    stores = _replicas(store_url, 8)
    services = [TaskService(s, clock=clock, idempotency_secret=SECRET) for s in stores]
    try:
        for round_ in range(5):
            key = f"k{round_}"
            first_id, first = services[0].create(
                owner="sub:a", tool="t", arguments={}, ttl_ms=1000, idempotency_key=key, quota=quota
            )
            services[0].complete(first.key, {"content": []})
            clock.at += 1000  # expired
            answers = _at_once(
                services,
                lambda service, key=key: service.create(
                    owner="sub:a", tool="t", arguments={}, ttl_ms=1000, idempotency_key=key, quota=quota
                ),
            )
            assert not [a for a in answers if isinstance(a, Exception)], answers
            assert {task_id for task_id, _ in answers} == {first_id}
            assert {(r.status, r.created_at) for _, r in answers} == {(TaskStatus.WORKING, clock.at)}
            clock.at += 10_000
        assert rows(stores[0]) == 5
    finally:
        for s in stores:
            s.dispose()


def test_anonymous_callers_told_apart_sending_one_key_at_once_get_one_task(store_url: str, clock: Clock) -> None:
    """Anonymous callers share idempotency keys (one task a key), while a quota counts each apart: two of them
    racing with one key, each under its own lock, meet at the row's key: both get the one task."""
    stores = _replicas(store_url, 2)
    services = [TaskService(s, clock=clock, idempotency_secret=SECRET) for s in stores]
    callers = {id(services[0]): "client-a", id(services[1]): "client-b"}
    try:
        for round_ in range(20):
            answers = _at_once(
                services,
                lambda service, n=round_: service.create(
                    owner=None,
                    tool="t",
                    arguments={"order": n},
                    quota=Quota(active=100),
                    idempotency_key=f"order-{n}",
                    caller=callers[id(service)],
                ),
            )
            assert not [a for a in answers if isinstance(a, Exception)], answers
            assert len({task_id for task_id, _ in answers}) == 1
        assert rows(stores[0]) == 20
    finally:
        for s in stores:
            s.dispose()


def test_an_idempotent_retry_is_answered_even_at_the_row_cap(store: SqlStore, clock: Clock) -> None:
    service = TaskService(store, clock=clock, idempotency_secret=SECRET, max_rows=1)
    first_id, _ = service.create(owner="sub:a", tool="t", arguments={}, idempotency_key="k")
    assert service.create(owner="sub:a", tool="t", arguments={}, idempotency_key="k")[0] == first_id
    with pytest.raises(TaskLimitReached):
        service.create(owner="sub:a", tool="t", arguments={}, idempotency_key="other")


# -- quotas ------------------------------------------------------------------------------------


def refused(create: Callable[[], Any]) -> QuotaExceeded:
    with pytest.raises(QuotaExceeded) as caught:
        create()
    return caught.value


def test_unfinished_tasks_per_principal_are_capped_and_a_finished_one_frees_room(
    service: TaskService, store: SqlStore, sent: list[TaskRecord]
) -> None:
    quota = Quota(active=2)
    _, a = service.create(owner="sub:alice", tool="t", arguments={}, quota=quota)
    service.create(owner="sub:alice", tool="u", arguments={}, quota=quota)
    refusal = refused(lambda: service.create(owner="sub:alice", tool="t", arguments={}, quota=quota))
    assert (refusal.limit, refusal.allowed, refusal.retry_after_ms) == ("active", 2, None)
    assert rows(store) == 2 and len(sent) == 2  # the refusal created nothing
    service.create(owner="sub:bob", tool="t", arguments={}, quota=quota)  # bob has his own
    service.complete(a.key, {"content": []})
    service.create(owner="sub:alice", tool="t", arguments={}, quota=quota)


def test_a_task_past_its_ttl_holds_no_slot_though_the_janitor_has_not_deleted_it_yet(
    service: TaskService, store: SqlStore, clock: Clock
) -> None:
    """Past its TTL a task is gone for its caller (tasks/get and tasks/cancel say it expired): it must not keep
    the caller's slot until the next sweep, or forever where no janitor runs."""
    quota = Quota(active=1, active_tool=1)
    service.create(owner="sub:a", tool="t", arguments={}, quota=quota, ttl_ms=2_000)
    assert refused(lambda: service.create(owner="sub:a", tool="t", arguments={}, quota=quota)).limit == "active_tool"
    clock.at += 2_001
    service.create(owner="sub:a", tool="t", arguments={}, quota=quota)
    assert rows(store) == 2  # the expired one is still stored


def test_a_retry_after_is_never_longer_than_the_window(service: TaskService, clock: Clock) -> None:
    """A task stamped by a host whose clock runs ahead (here: this clock going back) would say 'retry in more
    than the window'; the window is the longest any creation can hold a slot."""
    quota = Quota(creations=1, window_ms=10_000)
    service.create(owner="sub:a", tool="t", arguments={}, quota=quota)
    clock.at -= 90_000
    refusal = refused(lambda: service.create(owner="sub:a", tool="t", arguments={}, quota=quota))
    assert refusal.limit == "creations" and refusal.retry_after_ms == 10_000


def test_the_per_tool_cap_counts_only_that_tool(service: TaskService) -> None:
    quota = Quota(active_tool=1)
    service.create(owner="sub:a", tool="t", arguments={}, quota=quota)
    service.create(owner="sub:a", tool="u", arguments={}, quota=quota)
    refusal = refused(lambda: service.create(owner="sub:a", tool="t", arguments={}, quota=quota))
    assert refusal.limit == "active_tool"


def test_anonymous_callers_share_one_quota(service: TaskService) -> None:
    quota = Quota(active=1)
    service.create(owner=None, tool="t", arguments={}, quota=quota)
    assert refused(lambda: service.create(owner=None, tool="t", arguments={}, quota=quota)).limit == "active"
    service.create(owner="sub:a", tool="t", arguments={}, quota=quota)


def test_creations_per_window_are_capped_and_the_refusal_says_when_to_retry(service: TaskService, clock: Clock) -> None:
    quota = Quota(creations=3, window_ms=10_000)
    for step in (0, 2_000, 3_000):
        clock.at += step
        _, record = service.create(owner="sub:a", tool="t", arguments={}, quota=quota)
        service.complete(record.key, {"content": []})  # finished tasks still count towards the rate
    clock.at += 1_000  # 6 s after the first of the three
    refusal = refused(lambda: service.create(owner="sub:a", tool="t", arguments={}, quota=quota))
    assert (refusal.limit, refusal.allowed, refusal.retry_after_ms, refusal.window_ms) == (
        "creations",
        3,
        4_000,
        10_000,
    )
    clock.at += 4_000  # the first has left the window
    service.create(owner="sub:a", tool="t", arguments={}, quota=quota)


def test_an_idempotent_retry_is_not_refused_by_the_quota_it_already_counted_in(service: TaskService) -> None:
    quota = Quota(active=1)
    first_id, _ = service.create(owner="sub:a", tool="t", arguments={}, quota=quota, idempotency_key="k")
    assert service.create(owner="sub:a", tool="t", arguments={}, quota=quota, idempotency_key="k")[0] == first_id


def test_racing_creations_of_one_principal_never_exceed_its_quota(store_url: str, clock: Clock) -> None:
    """Eight replicas create for the same principal at once: exactly the quota's worth get in."""
    stores = [SqlStore.from_url(store_url) for _ in range(8)]
    quota = Quota(active=3)
    try:
        services = [TaskService(s, clock=clock) for s in stores]
        barrier = threading.Barrier(len(services))

        def call(service: TaskService) -> bool:
            barrier.wait()
            try:
                service.create(owner="sub:flood", tool="t", arguments={}, quota=quota)
            except QuotaExceeded:
                return False
            return True

        with ThreadPoolExecutor(len(services)) as pool:
            created = list(pool.map(call, services))
        assert created.count(True) == 3 and rows(stores[0]) == 3
        assert stores[0].count_by_status()["working"] == 3
    finally:
        for s in stores:
            s.dispose()


@pytest.mark.postgres
def test_the_quota_holds_where_the_servers_default_isolation_is_repeatable_read(
    postgres_url: str, clock: Clock
) -> None:
    """A database whose default is REPEATABLE READ (`default_transaction_isolation`): the store's sessions run at
    READ COMMITTED all the same, so the quota's count sees what the lock's last holder committed (under that
    default every racing creation got in) and a conditional write never fails on a row changed meanwhile."""
    upgrade(postgres_url)
    options = {"connect_args": {"options": "-c default_transaction_isolation=repeatable\\ read"}}
    stores = _replicas(postgres_url, 8, **options)
    services = [TaskService(s, clock=clock) for s in stores]
    try:
        with stores[0].engine.connect() as conn:  # the database's default, overruled for the store's sessions
            assert conn.exec_driver_sql("SHOW default_transaction_isolation").scalar() == "read committed"
        for _ in range(3):
            owner = f"sub:flood-{uuid.uuid4().hex}"  # the database is the session's: an owner of this round's own
            answers = _at_once(
                services,
                lambda service, owner=owner: service.create(owner=owner, tool="t", arguments={}, quota=Quota(active=3)),
            )
            assert all(isinstance(a, tuple | QuotaExceeded) for a in answers), answers
            assert sum(isinstance(a, tuple) for a in answers) == 3, answers
    finally:
        for s in stores:
            s.dispose()


def test_without_a_quota_a_creation_is_one_statement(store: SqlStore, clock: Clock) -> None:
    """Quotas off cost nothing: the hot path stays the one INSERT (no lock, and the row cap's count in the INSERT
    only once a second per process: `RowGauge`)."""
    store._row_gauge = RowGauge(clock=lambda: 0.0)
    TaskService(store, clock=clock).create(owner="sub:a", tool="t", arguments={})  # this second's count of the rows
    statements: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    sa.event.listen(store.engine, "before_cursor_execute", record)
    try:
        TaskService(store, clock=clock).create(owner="sub:a", tool="t", arguments={})
        TaskService(store, clock=clock).create(owner="sub:a", tool="t", arguments={}, quota=Quota())
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", record)
    assert len(statements) == 2 and all(s.lstrip().upper().startswith("INSERT") for s in statements)


def test_when_the_rate_and_an_active_cap_are_both_reached_the_refusal_is_the_rates(service: TaskService) -> None:
    """Retrying once a task ends would be refused again by the rate: the refusal says when the rate frees."""
    quota = Quota(active_tool=1, creations=1, window_ms=10_000)
    service.create(owner="sub:a", tool="t", arguments={}, quota=quota)  # still working: both limits reached
    refusal = refused(lambda: service.create(owner="sub:a", tool="t", arguments={}, quota=quota))
    assert (refusal.limit, refusal.retry_after_ms) == ("creations", 10_000)


def test_anonymous_callers_told_apart_have_a_quota_each(service: TaskService) -> None:
    quota = Quota(active=1, creations=5)
    service.create(owner=None, tool="t", arguments={}, quota=quota, caller="client-1")
    refusal = refused(lambda: service.create(owner=None, tool="t", arguments={}, quota=quota, caller="client-1"))
    assert refusal.limit == "active"
    _, other = service.create(owner=None, tool="t", arguments={}, quota=quota, caller="client-2")
    assert other.caller == "client-2"
    # an authenticated caller is its owner: a caller value is not kept for it
    assert service.create(owner="sub:a", tool="t", arguments={}, quota=quota, caller="client-1")[1].caller is None


def test_the_row_caps_refusals_are_said_in_a_line_a_minute_with_their_count(
    store: SqlStore, caplog: pytest.LogCaptureFixture
) -> None:
    """At the cap every creation is refused: the operator reads it (a web process said nothing), but in one line
    a minute at most, however many there are."""
    service = TaskService(store, max_rows=1)
    now = [100.0]
    service._cap_refusals = _CapRefusals(clock=lambda: now[0])
    service.create(owner=None, tool="t", arguments={})
    with caplog.at_level(logging.WARNING, logger="celery_mcp_tasks.service"):
        for _ in range(3):
            with pytest.raises(TaskLimitReached):
                service.create(owner=None, tool="t", arguments={})
        now[0] += _CapRefusals.EVERY_S
        with pytest.raises(TaskLimitReached):
            service.create(owner=None, tool="t", arguments={})
    said = [r.getMessage() for r in caplog.records]
    first = "1 task creation refused since the last such line (the last of tool 't'): the store holds"
    assert [line.split(" MCP_")[0] for line in said] == [first, first.replace("1 task creation", "3 task creations")]


@pytest.mark.parametrize(
    ("owner", "caller", "quota"),
    [
        ("sub:a", None, Quota(active=5)),
        ("sub:a", None, Quota(active_tool=5)),
        (None, "client-1", Quota(active=5)),
    ],
)
def test_the_active_counts_read_the_principals_unfinished_tasks_not_its_history(
    store: SqlStore, clock: Clock, owner: str | None, caller: str | None, quota: Quota
) -> None:
    """A quota's count runs in every creation it checks, while the caller's creations queue on its lock: it is
    planned on the partial index of unfinished tasks (migration 0009), not on the caller's settled history (a
    scan of the table, 22 ms at 100,000 rows). Each database plans the statement the store sends, as it sends it
    (on PostgreSQL as a generic plan: a custom one would use the index even with the statuses bound as values)."""
    settled = [
        {
            "key": f"{n:064x}",
            "owner": owner,
            "caller": caller,
            "tool": "t",
            "status": "completed",
            "created_at": n,
            "updated_at": n,
            "arguments": {},
            "input_requests": {},
            "input_responses": {},
            "issued_keys": [],
            "version": 2,
            "dispatches": 1,
        }
        for n in range(3_000)
    ]
    with store.engine.begin() as conn:
        conn.execute(tasks.insert(), settled)
        conn.exec_driver_sql("ANALYZE")
    sent: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if "count(" in statement:
            sent.append((statement, parameters))

    sa.event.listen(store.engine, "before_cursor_execute", record)
    try:
        TaskService(store, clock=clock).create(owner=owner, tool="t", arguments={}, quota=quota, caller=caller)
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", record)
    (statement, parameters), *_ = sent
    with store.engine.connect() as conn:
        if store.dialect == "sqlite":
            rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters)
        else:  # as psycopg prepares a statement run often: planned once, generically, for any values
            names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", statement)))
            prepared = re.sub(r"%\((\w+)\)s", lambda found: f"${names.index(found[1]) + 1}", statement)
            conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
            conn.exec_driver_sql(f"PREPARE quota_count AS {prepared}")
            from psycopg.sql import Literal  # the postgres extra: only where PostgreSQL runs

            driver = conn.connection.dbapi_connection
            values = ", ".join(Literal(parameters[name]).as_string(driver) for name in names)
            rows = conn.exec_driver_sql(f"EXPLAIN EXECUTE quota_count({values})")
        plan = " ".join(str(row[-1]) for row in rows)
    assert "ix_mcp_tasks_task_owner_caller" in plan, plan
