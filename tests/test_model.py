import hashlib
import re
from dataclasses import replace

import pytest

from celery_mcp_tasks.model import (
    ANY,
    RESTARTED_AFTER_LOSS,
    RESUMED,
    DuplicateInputKeys,
    InvalidInputResponse,
    InvalidTransition,
    PastTtl,
    Run,
    Superseded,
    TaskRecord,
    TaskStatus,
    TerminalTask,
    new_task_id,
    owner_bytes,
    owner_namespace,
    owner_of,
    owner_scope,
    spelled_namespace,
    task_key,
)
from celery_mcp_tasks.protocol import render_task
from tests.builders import record


def test_task_id_is_43_char_base64url_and_unique():
    ids = {new_task_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{43}", i) for i in ids)


def test_row_key_is_the_sha256_of_the_id_in_hex():
    # The published contract (DESIGN, decision 1): a known vector, so a weaker or different hash fails here.
    assert task_key("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    task_id = new_task_id()
    assert task_key(task_id) == hashlib.sha256(task_id.encode("ascii")).hexdigest() != task_id
    assert len({task_key(new_task_id()) for _ in range(100)}) == 100


def test_an_id_no_encoder_accepts_still_hashes_to_a_key_that_is_no_one_elses():
    keys = {task_key("\ud800"), task_key("\udfff"), task_key("")}
    assert len(keys) == 3 and all(re.fullmatch(r"[0-9a-f]{64}", key) for key in keys)


@pytest.mark.parametrize("final", ["completed", "failed", "cancelled"])
def test_terminal_states_are_final(final):
    ended = {
        "completed": lambda r: r.completed({"content": []}, 2),
        "failed": lambda r: r.failed({"code": -32603, "message": "x"}, 2),
        "cancelled": lambda r: r.cancelled(2),
    }[final](record())
    for move in (
        lambda r: r.with_progress("x", 3),
        lambda r: r.completed({}, 3),
        lambda r: r.cancelled(3),
        lambda r: r.failed({"code": 1, "message": "m"}, 3),
        lambda r: r.requiring_input({"a": {}}, 3),
    ):
        with pytest.raises(TerminalTask):
            move(ended)


ASKED = {"a": {"method": "roots/list", "params": {}}}

# (name, the record it starts from, the transition at 5000 ms, what it must have changed)
VISIBLE = [
    ("progress", record(), lambda r: r.with_progress("half way", 5000), {"status_message": "half way"}),
    (
        "numeric progress",
        record(),
        lambda r: r.with_progress("2 of 4", 5000, current=2, total=4),
        {"status_message": "2 of 4", "progress": 2.0, "progress_total": 4.0},
    ),
    (
        "a run started",
        record(dispatches=1, status_message="Queued"),
        lambda r: r.began(Run(1), 5000, stale_before_ms=0),
        {"status_message": "Started", "started_at": 5000, "heartbeat_at": 5000},
    ),
    (
        "a late retry signal said at the start",
        record(dispatches=1),
        lambda r: r.began(Run(1, 1), 5000, stale_before_ms=0),
        {"attempt": 1, "status_message": "Started (attempt 2)"},
    ),
    (
        "retrying",
        record(dispatches=1),
        lambda r: r.retrying(Run(1, 1), 5000, start_by_ms=9000),
        {"attempt": 1, "heartbeat_at": 9000},
    ),
    (
        "a re-send that says so",
        record(dispatches=1),
        lambda r: r.dispatched(5000, "again", resend=True),
        {"dispatches": 2, "resends": 1, "status_message": "again"},
    ),
    ("completed", record(), lambda r: r.completed({"content": []}, 5000), {"status": TaskStatus.COMPLETED}),
    ("failed", record(), lambda r: r.failed({"message": "boom"}, 5000), {"status": TaskStatus.FAILED}),
    ("cancelled", record(), lambda r: r.cancelled(5000), {"status": TaskStatus.CANCELLED}),
    ("requiring input", record(), lambda r: r.requiring_input(ASKED, 5000), {"status": TaskStatus.INPUT_REQUIRED}),
    (
        "answered",
        record().requiring_input(ASKED, 2000),
        lambda r: r.answered({"a": {}}, 5000)[0],
        {"status": TaskStatus.WORKING, "input_requests": {}},
    ),
]


@pytest.mark.parametrize(("start", "move", "changed"), [case[1:] for case in VISIBLE], ids=[c[0] for c in VISIBLE])
def test_every_visible_transition_bumps_the_version_and_last_updated(start, move, changed):
    nxt = move(start)
    assert (nxt.version, nxt.updated_at) == (start.version + 1, 5000)
    assert {name: getattr(nxt, name) for name in changed} == changed
    assert move(replace(start, updated_at=9000)).updated_at == 9000  # a late clock never moves it backwards


BOOKKEEPING = [
    (
        "a run claimed that already says so",  # a stale copy taken over a second time
        record(dispatches=1, started_at=2000, heartbeat_at=2000, status_message=RESTARTED_AFTER_LOSS),
        lambda r: r.began(Run(1), 5000, stale_before_ms=3000),
        {"started_at": 5000, "heartbeat_at": 5000},
    ),
    ("a send", record(), lambda r: r.dispatched(5000), {"dispatches": 1, "heartbeat_at": 5000}),
    ("unparking", record().requiring_input(ASKED, 1000, park=True), lambda r: r.unparked(), {"parked": False}),
]


@pytest.mark.parametrize(("start", "move", "changed"), [c[1:] for c in BOOKKEEPING], ids=[c[0] for c in BOOKKEEPING])
def test_bookkeeping_bumps_the_version_but_not_what_clients_see(start, move, changed):
    nxt = move(start)
    assert nxt.version == start.version + 1 and nxt.updated_at == start.updated_at
    assert {name: getattr(nxt, name) for name in changed} == changed
    assert render_task("ID", nxt) == render_task("ID", start)


def test_transitions_with_nothing_to_record_return_the_same_record():
    current = record(dispatches=1)
    assert current.retrying(Run(1, 0), 5000, start_by_ms=0) is current  # not a newer attempt
    assert current.unparked() is current  # nothing was parked


def test_a_run_that_is_not_the_current_one_may_not_write():
    current = record(dispatches=2, attempt=1)
    for run in (Run(1, 1), Run(3, 1), Run(2, 0)):  # older dispatch, a dispatch never sent, older attempt
        with pytest.raises(Superseded):
            current.with_progress("stale", 5000, run=run)
        with pytest.raises(Superseded):
            current.completed({"content": []}, 5000, run=run)
    with pytest.raises(Superseded):
        record(dispatches=1).requiring_input(ASKED, 2).began(Run(1), 5000, stale_before_ms=0)  # waiting for input


def test_partial_answer_keeps_remaining_keys_then_last_answer_resumes():
    asked = record().requiring_input({"a": {"m": 1}, "b": {"m": 2}}, 2)
    partial, resumed = asked.answered({"a": {"action": "accept"}, "zzz": {"ignored": True}}, 3)
    assert not resumed and partial.status is TaskStatus.INPUT_REQUIRED and list(partial.input_requests) == ["b"]
    assert partial.input_responses == {"a": {"action": "accept"}}
    done, resumed = partial.answered({"b": {"action": "decline"}}, 4)
    assert resumed and done.status is TaskStatus.WORKING and done.input_requests == {}
    assert set(done.input_responses) == {"a", "b"}


def test_answers_for_nothing_outstanding_change_nothing():
    with pytest.raises(InvalidTransition):
        record().answered({"a": {}}, 3)
    asked = record().requiring_input({"a": {}}, 2)
    with pytest.raises(InvalidTransition):
        asked.answered({"other": {}}, 3)


def test_input_keys_are_single_use_for_the_whole_life():
    asked = record().requiring_input({"a": {}}, 2)
    resumed, _ = asked.answered({"a": {}}, 3)
    with pytest.raises(DuplicateInputKeys) as raised:
        resumed.requiring_input({"a": {}, "b": {}}, 4)
    assert raised.value.keys == ["a"]


def test_only_answers_to_outstanding_keys_must_be_objects():
    asked = record().requiring_input({"a": {}}, 2)
    with pytest.raises(InvalidInputResponse):
        asked.answered({"a": "yes"}, 3)
    nxt, resumed = asked.answered({"a": {"action": "accept"}, "stranger": "not checked"}, 3)
    assert resumed and "stranger" not in nxt.input_responses


# -- a run's start is visible ------------------------------------------------------------------

FIRST = record(dispatches=1, status_message="Queued")
STARTS = [
    ("the first run", FIRST, Run(1), "Started"),
    ("the first run of a synchronous call", replace(FIRST, status_message=None), Run(1), "Started"),
    ("a first run with answers given before the task", replace(FIRST, input_responses={"a": {}}), Run(1), "Started"),
    ("a Celery retry", FIRST.retrying(Run(1, 1), 2000, start_by_ms=2000), Run(1, 1), "Started (attempt 2)"),
    ("a Celery retry whose signal is late", FIRST, Run(1, 2), "Started (attempt 3)"),
    (
        "the reaper's re-send",
        FIRST.dispatched(2000, "The worker was lost; running the job again", resend=True),
        Run(2),
        RESTARTED_AFTER_LOSS,
    ),
    (
        "a stale copy of the run taken over",
        FIRST.began(Run(1), 2000, stale_before_ms=0).with_progress("Writing", 2500),
        Run(1),
        RESTARTED_AFTER_LOSS,
    ),
    ("a run after the answers", FIRST.requiring_input(ASKED, 2000).answered({"a": {}}, 3000)[0], Run(2), RESUMED),
]


@pytest.mark.parametrize(("start", "run", "said"), [c[1:] for c in STARTS], ids=[c[0] for c in STARTS])
def test_a_start_says_which_start_it_is_and_moves_last_updated(start: TaskRecord, run: Run, said: str) -> None:
    began = start.began(run, 5000, stale_before_ms=4000)
    assert (began.status_message, began.updated_at, began.version) == (said, 5000, start.version + 1)
    assert began.started_at == 5000 and began.attempt == run.attempt


def test_a_run_of_a_task_past_its_ttl_does_not_start() -> None:
    """Its client was told it expired; until the janitor removes it, a late message must not run its body."""
    assert FIRST.expires_at is not None
    FIRST.began(Run(1), FIRST.expires_at - 1, stale_before_ms=0)
    with pytest.raises(PastTtl):
        FIRST.began(Run(1), FIRST.expires_at, stale_before_ms=0)


def test_a_start_keeps_the_numeric_progress_of_an_earlier_run() -> None:
    reported = FIRST.with_progress("2 of 4", 2000, current=2, total=4)
    began = reported.dispatched(3000, "again", resend=True).began(Run(2), 5000, stale_before_ms=0)
    assert (began.progress, began.progress_total) == (2.0, 4.0)


# -- numeric progress ----------------------------------------------------------------------------


def test_a_report_with_current_replaces_both_numbers_and_one_without_keeps_them() -> None:
    counted = record().with_progress("a", 2, current=1, total=10)
    assert (counted.progress, counted.progress_total) == (1.0, 10.0)
    worded = counted.with_progress("b", 3)
    assert (worded.status_message, worded.progress, worded.progress_total) == ("b", 1.0, 10.0)
    unbounded = worded.with_progress("c", 4, current=2.5)
    assert (unbounded.progress, unbounded.progress_total) == (2.5, None)


def test_a_failed_or_cancelled_task_keeps_the_last_numbers_and_a_completed_one_fills_its_bar() -> None:
    """How far a task that did not finish got; and a job that said "2 of 3" before the last step is done."""
    counted = record().with_progress("a", 2, current=2, total=3)
    for final in (counted.failed({"message": "boom"}, 3), counted.cancelled(3)):
        assert (final.progress, final.progress_total) == (2.0, 3.0)
    done = counted.completed({"content": []}, 3)
    assert (done.progress, done.progress_total) == (3.0, 3.0)
    beyond = record().with_progress("a", 2, current=5, total=3).completed({"content": []}, 3)
    assert (beyond.progress, beyond.progress_total) == (5.0, 3.0)  # never backwards
    unbounded = record().with_progress("a", 2, current=7).completed({"content": []}, 3)
    assert (unbounded.progress, unbounded.progress_total) == (7.0, None)
    silent = record().completed({"content": []}, 3)
    assert (silent.progress, silent.progress_total) == (None, None)


@pytest.mark.parametrize(
    ("current", "total", "complaint"),
    [
        (None, 10, "total needs a current value"),
        (-1, None, "current must not be negative"),
        (1, -5, "total must not be negative"),
        (float("nan"), None, "current must be a finite number"),
        (1, float("inf"), "total must be a finite number"),
        pytest.param(1, 10**400, "total must be a finite number", id="an-int-beyond-any-float"),
        (True, None, "current must be a number, not bool"),
        ("3", None, "current must be a number, not str"),
    ],
)
def test_bad_progress_numbers_are_refused_with_a_clear_message(current: object, total: object, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        record().with_progress("x", 2, current=current, total=total)  # type: ignore[arg-type]


def test_the_owner_rule_is_one_scope_per_kind_of_caller() -> None:
    assert owner_scope(ANY) == "any"  # server side: every task
    assert owner_scope(None) == "none"  # a server without authentication: owner-less tasks only
    assert owner_scope("sub:iss:alice") == "one"  # a principal: its own tasks only


def test_an_owner_string_names_its_claim_and_issuer_and_keeps_parts_apart() -> None:
    user = owner_of("https://id.example", subject="a:b")
    assert user == "sub:https%3A%2F%2Fid.example:a%3Ab"
    assert owner_of("https://id.example", client_id="a:b") != user  # a client cannot pose as a user
    assert owner_of(None) is None
    assert owner_namespace(user) == "sub:https%3A%2F%2Fid.example"
    assert owner_namespace(None) == "anonymous"


@pytest.mark.parametrize(
    "issuer", ["https://id.example", "https://id.example/t%2Fa", "id.example", "", "a b", "x%zz", "HTTPS://ID:8443/"]
)
def test_a_namespace_is_spelled_as_owners_spell_it_whichever_form_it_was_given_in(issuer: str) -> None:
    """The console's owner filter: the issuer as the provider writes it, or percent-encoded as the list shows."""
    for claim in ("sub", "client_id"):
        stored = owner_namespace(owner_of(issuer, **{"subject" if claim == "sub" else "client_id": "u"}))
        assert spelled_namespace(f"{claim}:{issuer}") == stored
        assert spelled_namespace(stored) == stored
        assert spelled_namespace(re.sub("%[0-9A-F]{2}", lambda e: e[0].lower(), stored)) == stored
    assert spelled_namespace("anonymous") == "anonymous"


def test_per_owner_hashes_take_the_owner_as_they_always_did() -> None:
    """Quota locks and fair shards are shared across processes and versions: the bytes must not move."""
    assert owner_bytes(None) == b"\1"
    assert owner_bytes("sub:i:s") == b"\2sub:i:s"


def test_a_reported_message_is_kept_as_a_line_for_a_person() -> None:
    from celery_mcp_tasks.model import MAX_STATUS_MESSAGE

    working = record()
    huge = working.with_progress("x" * (8 * 1024 * 1024), 2)
    assert huge.status_message == "x" * (MAX_STATUS_MESSAGE - 1) + "\u2026"
    assert working.with_progress("a\x00b", 2).status_message == "a\ufffdb"
    assert working.with_progress("a\ud800b\udfff", 2).status_message == "a\ufffdb\ufffd"  # UTF-8 has no lone half
    assert working.with_progress("\u00e9t\u00e9 \U0001f30a", 2).status_message == "\u00e9t\u00e9 \U0001f30a"
    assert working.with_progress("y" * MAX_STATUS_MESSAGE, 2).status_message == "y" * MAX_STATUS_MESSAGE
    failed = working.failed({"message": "boom"}, 3, "Job failed: " + "z" * MAX_STATUS_MESSAGE)
    assert failed.status_message is not None and len(failed.status_message) == MAX_STATUS_MESSAGE


@pytest.mark.parametrize("issuer", ["https://idp.example/realms/a b", "", "urn:x:y"])
@pytest.mark.parametrize("principal", ["alice", "alice@example.com", "a:b/c d"])
def test_an_owner_within_its_namespace_is_the_owner_string_its_principal_gets(issuer: str, principal: str) -> None:
    """`tasks ls --owner NAMESPACE --subject WHO` hashes the owner string the server made for that principal,
    whether the operator writes the issuer as the provider does or percent-encoded as the console shows it."""
    from urllib.parse import quote

    from celery_mcp_tasks.model import owner_of, owner_within

    for spelled in (issuer, quote(issuer, safe="")):
        assert owner_within(f"sub:{spelled}", principal) == owner_of(issuer, subject=principal)
        assert owner_within(f"client_id:{spelled}", principal) == owner_of(issuer, client_id=principal)
