"""Payload limits and encryption at rest, end to end: `celery-mcp-tasks serve` and a separate Celery worker
on PostgreSQL + Redis, driven over real HTTP; the table read back raw, column by column."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.model import task_key
from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.store.codec import KeyRing, new_key
from celery_mcp_tasks.store.engine import normalize_url
from celery_mcp_tasks.store.schema import tasks
from celery_mcp_tasks.store.sql import SqlStore
from tests.integration.test_protocol_eras import LegacySession
from tests.support import POSTGRES_URL, REDIS_URL, ROOT, Backend, Deployment, McpHttp, fresh_postgres_database

pytestmark = [pytest.mark.integration, pytest.mark.postgres, pytest.mark.redis]

APP = "tests.apps.payload_app"
OLD, NEW = new_key(), new_key()
RING = "MCP_TASKS_ENCRYPTION_KEYS"


@pytest.fixture(scope="module")
def backend() -> Iterator[Backend]:
    if not (POSTGRES_URL and REDIS_URL):
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL and MCP_TASKS_TEST_REDIS_URL to run")
    with fresh_postgres_database(POSTGRES_URL) as url:
        yield Backend("pg_redis", {"MCP_TASKS_DATABASE_URL": url, "CELERY_BROKER_URL": REDIS_URL})


@pytest.fixture
def own_store(backend: Backend) -> Iterator[Backend]:
    """The module's broker with a database of the test's own: a test that seals with the new key leaves
    the module's store to the old one, so the module's deployment starts whichever test ran first."""
    with fresh_postgres_database(POSTGRES_URL) as url:
        yield Backend("own", {**backend.env, "MCP_TASKS_DATABASE_URL": url})


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("payload-logs")


def start(backend: Backend, log_dir: Path, ring: str, name: str) -> Deployment:
    deployment = Deployment(APP, backend, log_dir)
    deployment.web(f"web-{name}", **{RING: ring})
    deployment.worker(f"worker-{name}", concurrency=1, env={RING: ring})
    return deployment


@pytest.fixture(scope="module")
def deployment(backend: Backend, log_dir: Path) -> Iterator[Deployment]:
    with start(backend, log_dir, OLD, "old") as running:
        yield running


@pytest.fixture
def client(deployment: Deployment) -> Iterator[McpHttp]:
    http = McpHttp(deployment.url)
    yield http
    http.close()


def rows(url: str) -> list[dict[str, Any]]:
    """Every column of every row as text, as the database returns it (what a dump would hold)."""
    engine = sa.create_engine(normalize_url(url))
    try:
        with engine.connect() as conn:
            columns = [sa.cast(column, sa.Text).label(column.name) for column in tasks.columns]
            return [dict(row) for row in conn.execute(sa.select(*columns)).mappings()]
    finally:
        engine.dispose()


def answer(client: McpHttp, task_id: str, key: str, content: dict[str, Any]) -> dict[str, Any]:
    return client.task("tasks/update", task_id, inputResponses={key: {"action": "accept", "content": content}})


# -- payload limits ------------------------------------------------------------------------------------------


def test_arguments_over_the_tools_limit_are_refused_with_32602_naming_it_and_create_nothing(
    client: McpHttp, backend: Backend, deployment: Deployment
):
    before = len(rows(backend.store_url))
    reply = client.call_tool("bounded", {"text": "a" * 300, "result_size": 1})
    assert reply["error"]["code"] == -32602
    assert (
        "Arguments too large" in reply["error"]["message"]
        and "over the limit of 200 bytes" in reply["error"]["message"]
    )
    assert "max_arguments_bytes" in reply["error"]["message"]
    without_tasks = client.call_tool("bounded", {"text": "a" * 300, "result_size": 1}, capabilities={"elicitation": {}})
    assert without_tasks["error"]["code"] == -32602  # the synchronous path: the same refusal
    assert "over the limit of 200 bytes" in without_tasks["error"]["message"]
    assert len(rows(backend.store_url)) == before
    logs = deployment.logs()  # the web process says which limit refused what, never the payload
    assert "tool 'bounded': a creation was refused: Arguments too large" in logs and "a" * 50 not in logs


def test_answers_over_the_limit_are_refused_and_change_nothing_then_a_result_over_it_fails_the_task(
    client: McpHttp, backend: Backend, deployment: Deployment
):
    task_id = client.create("bounded", {"text": "hi", "result_size": 2000})
    asking = client.wait_for(task_id, "input_required")
    refused = answer(client, task_id, "word", {"word": "w" * 400})
    assert refused["error"]["code"] == -32602
    assert (
        "Answers too large" in refused["error"]["message"]
        and "over the limit of 300 bytes" in refused["error"]["message"]
    )
    still = client.get(task_id)
    assert still["status"] == "input_required" and still["inputRequests"] == asking["inputRequests"]
    assert "tool 'bounded': answers were refused: Answers too large" in deployment.logs()

    assert "error" not in answer(client, task_id, "word", {"word": "ok"})
    failed = client.wait_for(task_id)
    assert failed["status"] == "failed" and failed["error"]["code"] == -32603
    message = failed["error"]["message"]
    assert "Result too large" in message and "over the limit of 500 bytes" in message
    assert "MCP_TASKS_MAX_RESULT_BYTES" in message and "result" not in failed
    row = next(r for r in rows(backend.store_url) if r["key"] == task_key(task_id))
    assert row["status"] == "failed" and row["result"] in (None, "null")  # nothing of the result was written
    logs = deployment.logs()
    assert "over the limit of 500 bytes" in logs and "r" * 100 not in logs and "w" * 100 not in logs
    assert task_id not in logs


def test_a_result_within_the_limit_completes(client: McpHttp):
    task_id = client.create("bounded", {"text": "hi", "result_size": 100})
    client.wait_for(task_id, "input_required")
    answer(client, task_id, "word", {"word": "ok"})
    done = client.wait_for(task_id)
    assert done["status"] == "completed" and done["result"]["content"][0]["text"] == "r" * 100


def test_payloads_nested_too_deeply_are_refused_and_the_worker_runs_on(
    client: McpHttp, backend: Backend, deployment: Deployment
):
    """500 nested arrays (~1 KB, far under every byte limit) stopped the prefork worker at every redelivery
    (its pool pickles the arguments: RecursionError), and in an answer left the task unreadable: -32602."""
    deep: list[Any] = []
    for _ in range(499):
        deep = [deep]
    before = len(rows(backend.store_url))
    for options in ({}, {"capabilities": {"elicitation": {}}}):  # the tasks extension, then the synchronous path
        reply = client.call_tool("secret_echo", {"secret": "s", "extra": deep}, **options)
        assert reply["error"]["code"] == -32602, reply
        assert reply["error"]["message"].startswith("Arguments nested too deeply: more than 100 levels")
    assert len(rows(backend.store_url)) == before

    task_id = client.create("secret_echo", {"secret": "s"})
    client.wait_for(task_id, "input_required")
    refused = client.task(
        "tasks/update",
        task_id,
        inputResponses={"confirm": {"action": "accept", "content": {"answer": "y"}, "extra": deep}},
    )
    assert refused["error"]["code"] == -32602
    assert refused["error"]["message"].startswith("Answers nested too deeply")
    assert client.get(task_id)["status"] == "input_required"
    assert "error" not in answer(client, task_id, "confirm", {"answer": "y"})
    done = client.wait_for(task_id)  # the worker is alive: it runs the answered task to its end
    assert done["status"] == "completed", done
    assert "RecursionError" not in deployment.logs()


def test_arguments_over_the_limit_are_refused_the_same_way_on_the_2025_eras(client: McpHttp, backend: Backend):
    before = len(rows(backend.store_url))
    for version in ("2025-06-18", "2025-11-25"):
        legacy = LegacySession(client.url, version, {"elicitation": {}}).open()
        try:
            reply = legacy.call_tool("bounded", {"text": "a" * 300, "result_size": 1})
        finally:
            legacy.close()
        assert reply["error"]["code"] == -32602, reply
        assert "Arguments too large" in reply["error"]["message"]
        assert "over the limit of 200 bytes" in reply["error"]["message"]
    assert len(rows(backend.store_url)) == before


# -- encryption at rest --------------------------------------------------------------------------------------


def test_with_encryption_on_the_table_holds_no_argument_question_answer_or_result_in_clear(
    client: McpHttp, backend: Backend
):
    task_id = client.create("secret_echo", {"secret": "ARG-7f3a9c"})
    asking = client.wait_for(task_id, "input_required")  # the worker wrote the question: sealed, and it reads it back
    assert "ARG-7f3a9c" in str(asking["inputRequests"])
    answer(client, task_id, "confirm", {"answer": "ANSWER-51be02"})
    done = client.wait_for(task_id)
    assert done["status"] == "completed"
    assert done["result"]["structuredContent"] == {"secret": "ARG-7f3a9c", "answer": "ANSWER-51be02"}

    dumped = repr(rows(backend.store_url))
    assert task_key(task_id) in dumped and "mcpenc1:" in dumped
    for clear in ("ARG-7f3a9c", "ANSWER-51be02", "Store ARG", '"answer"', "accept"):
        assert clear not in dumped


def test_with_encryption_on_the_celery_message_carries_no_arguments(own_store: Backend, log_dir: Path):
    import redis

    waiting = Deployment(APP, own_store, log_dir)  # a queue no worker consumes: the message stays on the broker
    with waiting:
        client = McpHttp(waiting.web("web-no-worker", **{RING: f"{NEW},{OLD}"}))
        try:
            task_id = client.create("secret_echo", {"secret": "MSG-0c4d1e"})
        finally:
            client.close()
        broker = redis.Redis.from_url(own_store.env["CELERY_BROKER_URL"])
        try:
            raw = broker.lrange(waiting.queue, 0, -1)
            broker.delete(waiting.queue)
        finally:
            broker.close()
    assert len(raw) == 1 and task_key(task_id).encode() in raw[0]
    message = json.loads(raw[0])
    body = base64.b64decode(message["body"]) if message["properties"]["body_encoding"] == "base64" else message["body"]
    args, kwargs, _ = json.loads(body)
    assert (args, kwargs) == ([], {})  # the job reads its arguments from the store's sealed row
    assert "MSG-0c4d1e" not in json.dumps(message) + str(body)


def test_the_console_reveals_sealed_payloads_through_the_same_decryption(own_store: Backend, log_dir: Path):
    """The operators' console process, given the ring, shows a sealed task's payloads on reveal, and only there."""
    import httpx

    token = "payload-console-token-0123456789"
    with Deployment(APP, own_store, log_dir) as sealed:
        client = McpHttp(sealed.web("web-console", **{RING: f"{NEW},{OLD}"}))
        try:
            key = task_key(client.create("secret_echo", {"secret": "CONSOLE-3b7e"}))
        finally:
            client.close()
        root = sealed.console(token, "console-sealed", **{RING: f"{NEW},{OLD}", "MCP_TASKS_CONSOLE_PAYLOADS": "on"})
        with httpx.Client(base_url=root, headers={"Authorization": f"Bearer {token}"}, timeout=10) as api:
            detail = api.get(f"/api/tasks/{key}")
            assert detail.status_code == 200 and "CONSOLE-3b7e" not in detail.text
            revealed = api.post(f"/api/tasks/{key}/reveal", json={}, headers={"X-Console-Operator": "pat"})
            assert revealed.status_code == 200, revealed.text
            assert revealed.json()["arguments"] == {"secret": "CONSOLE-3b7e"}
    assert "CONSOLE-3b7e" not in repr(rows(own_store.store_url))


def test_a_key_rotation_reencrypts_every_row_while_the_tasks_stay_readable(
    own_store: Backend, log_dir: Path, request: pytest.FixtureRequest
):
    deployment = start(own_store, log_dir, OLD, "old-rotated")  # its own: the test stops it halfway
    request.addfinalizer(deployment.stop)
    before = McpHttp(deployment.url)  # tasks sealed with the old key, waiting for an answer through the rotation
    try:
        ids = [before.create("secret_echo", {"secret": f"s{n}"}) for n in range(2)]
        for task_id in ids:
            before.wait_for(task_id, "input_required")
    finally:
        before.close()
    sealed_old = [row for row in rows(own_store.store_url) if row["key"] in {task_key(task_id) for task_id in ids}]
    assert len(sealed_old) == 2 and all(KeyRing.parse([OLD]).is_current(r["arguments"].strip('"')) for r in sealed_old)
    deployment.stop()  # the old ring's processes go; the rotated ring's come (new key first, old one still read)
    with start(own_store, log_dir, f"{NEW},{OLD}", "rotating") as rotating:
        client = McpHttp(rotating.url)
        try:
            ids.append(client.create("secret_echo", {"secret": "s2"}))
            client.wait_for(ids[2], "input_required")
            reads: list[str] = []
            stop = threading.Event()

            def read_all() -> None:  # every task stays readable while the command rewrites the rows
                reader = McpHttp(rotating.url)
                try:
                    while not stop.is_set():
                        for task_id in ids:
                            reads.append(reader.get(task_id)["status"])
                finally:
                    reader.close()

            thread = threading.Thread(target=read_all)
            thread.start()
            try:
                reencrypted = reencrypt(own_store, f"{NEW},{OLD}")
            finally:
                stop.set()
                thread.join()
            assert reencrypted.returncode == 0, reencrypted.stderr
            assert f"re-encrypted with key {KeyRing.parse([NEW]).primary_id}" in reencrypted.stdout
            assert re.fullmatch(  # the line docs/payloads.md shows
                r"celery-mcp-tasks db reencrypt: [2-9]\d* rows re-encrypted with key \S{8}, \d+ already were, 0 sealed "
                r"with a key not in the ring \(left as they are\), 0 kept changing \(run it again\)\n",
                reencrypted.stdout,
            ), reencrypted.stdout
            assert reads and set(reads) == {"input_required"}

            new_only = KeyRing.parse([NEW])
            for row in rows(own_store.store_url):
                for column in ("arguments", "input_requests", "input_responses", "result"):
                    assert row[column] in (None, "null") or new_only.is_current(row[column].strip('"')), column
            for n, task_id in enumerate(ids[:2]):  # the worker reads the re-encrypted rows
                answer(client, task_id, "confirm", {"answer": f"a{n}"})
                assert client.wait_for(task_id)["result"]["structuredContent"] == {"secret": f"s{n}", "answer": f"a{n}"}
        finally:
            client.close()

    with start(own_store, log_dir, NEW, "new") as retired:  # the old key retired: everything still reads
        client = McpHttp(retired.url)
        try:
            answer(client, ids[2], "confirm", {"answer": "late"})
            assert client.wait_for(ids[2])["result"]["structuredContent"] == {"secret": "s2", "answer": "late"}
            assert client.get(ids[0])["status"] == "completed"
        finally:
            client.close()


def test_reencrypt_waits_for_the_processes_to_seal_with_the_first_key_and_says_what_it_could_not_open(
    own_store: Backend,
) -> None:
    """Run with a key no process seals with yet (step 2 of the rotation skipped), it would make every row
    unreadable to them: it refuses and changes nothing, unless forced. Rows it cannot open fail its status."""
    upgrade(own_store.store_url)
    store = SqlStore.from_url(own_store.store_url, ring=KeyRing.parse([OLD]))  # the processes seal with OLD
    TaskService(store, max_rows=None).create(owner=None, tool="confirm", arguments={"secret": "s"}, dispatch=False)
    store.dispose()
    before = rows(own_store.store_url)
    new_id = KeyRing.parse([NEW]).primary_id
    refused = reencrypt(own_store, f"{NEW},{OLD}")
    assert refused.returncode == 1 and refused.stdout == "", refused
    assert refused.stderr == (
        f"celery-mcp-tasks db reencrypt: the tasks created last are sealed with key "
        f"{KeyRing.parse([OLD]).primary_id}, not with {new_id}, the ring's first key: the running processes do not appear to "
        "seal with it yet, and a row sealed with a key they lack reads as failed to them. Restart every web "
        f"process, worker and beat with {new_id} first in MCP_TASKS_ENCRYPTION_KEYS, then run this again "
        "(--force: re-encrypt all the same)\n"
    )
    assert rows(own_store.store_url) == before
    unopened = run(["-m", "celery_mcp_tasks.cli", "db", "reencrypt", "--force"], own_store, ROOT, NEW)
    assert unopened.returncode == 1, unopened  # the row sealed with OLD, not in this ring: left, and said
    assert ", 1 sealed with a key not in the ring (left as they are), " in unopened.stdout
    forced = run(["-m", "celery_mcp_tasks.cli", "db", "reencrypt", "--force"], own_store, ROOT, f"{NEW},{OLD}")
    assert forced.returncode == 0 and f"1 rows re-encrypted with key {new_id}" in forced.stdout, forced


def test_a_process_with_a_wrong_or_missing_ring_refuses_to_start_in_one_line(own_store: Backend, tmp_path: Path):
    upgrade(own_store.store_url)
    store = SqlStore.from_url(own_store.store_url, ring=KeyRing.parse([NEW]))
    TaskService(store, max_rows=None).create(owner=None, tool="confirm", arguments={"secret": "s"}, dispatch=False)
    store.dispose()
    worker = ["-m", "celery", "-A", APP, "worker", "-P", "solo", "--without-mingle", "--without-gossip"]
    serve = ["-m", "celery_mcp_tasks.cli", "serve", APP, "--port", "0", "--no-migrate"]
    dev = ["-m", "celery_mcp_tasks.cli", "dev", APP, "--keep-env", "--port", "0", "--data-dir", str(tmp_path / "dev")]
    dev += ["--call", "no_such_tool", "{}"]  # should it start after all, it ends by itself, its worker with it
    for argv in (worker, serve, dev):
        for ring, why in ((new_key(), "none of its keys opens"), ("", "unset, but the task store holds encrypted")):
            done = run(argv, own_store, tmp_path, ring)
            lines = done.stderr.strip().splitlines()
            assert done.returncode != 0 and len(lines) == 1, done.stderr
            assert lines[0].startswith(f"celery-mcp-tasks: configuration error: {RING}: ") and why in lines[0]
    malformed = run(serve, own_store, tmp_path, f"{NEW},not-a-key")
    assert malformed.returncode != 0
    assert malformed.stderr.strip().splitlines() == [
        f"celery-mcp-tasks: configuration error: {RING}: key 2 of 2 is not a base64 32-byte key "
        "(make one with `celery-mcp-tasks db newkey`)"
    ]


def run(argv: list[str], backend: Backend, tmp_path: Path, ring: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": path, **backend.env, RING: ring}
    return subprocess.run([sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90)


def reencrypt(backend: Backend, ring: str) -> subprocess.CompletedProcess[str]:
    return run(["-m", "celery_mcp_tasks.cli", "db", "reencrypt"], backend, ROOT, ring)


# -- the controls together, and a retired key over HTTP ------------------------------------------------------


def test_an_idempotent_retry_compares_the_arguments_through_the_decryption(own_store: Backend, log_dir: Path):
    """The stored arguments are sealed: a retry's comparison opens them (the same ones match, others are refused)."""
    key = "io.github.celery-mcp-tasks/idempotencyKey"
    with Deployment(APP, own_store, log_dir) as sealed:
        client = McpHttp(
            sealed.web("web-idempotent", **{RING: f"{NEW},{OLD}", "MCP_TASKS_IDEMPOTENCY_SECRET": "p" * 40})
        )
        try:
            first = client.call_tool("secret_echo", {"secret": "IDEM-5e1f"}, meta={key: "k-1"})["result"]["taskId"]
            again = client.call_tool("secret_echo", {"secret": "IDEM-5e1f"}, meta={key: "k-1"})
            assert again["result"]["taskId"] == first
            other = client.call_tool("secret_echo", {"secret": "IDEM-other"}, meta={key: "k-1"})
            assert other["error"]["code"] == -32602 and key in other["error"]["message"]
        finally:
            client.close()
    stored = [row for row in rows(own_store.store_url) if row["key"] == task_key(first)]
    assert len(stored) == 1 and stored[0]["arguments"].strip('"').startswith("mcpenc1:")
    assert "IDEM-" not in repr(rows(own_store.store_url))


def test_a_row_sealed_with_a_retired_key_reads_over_http_as_a_failed_task_naming_the_cause(tmp_path: Path):
    """Retire a key before `db reencrypt` ran: the web process answers the old task as failed, saying which key
    and which setting; the worker that meets its job neither crashes nor stops; no log line names the task."""
    if not (POSTGRES_URL and REDIS_URL):
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL and MCP_TASKS_TEST_REDIS_URL to run")
    retired, current = new_key(), new_key()
    queue = f"mcp-test-retired-{os.getpid()}"
    with fresh_postgres_database(POSTGRES_URL) as url:
        own = Backend("pg_redis", {"MCP_TASKS_DATABASE_URL": url, "CELERY_BROKER_URL": REDIS_URL})
        with Deployment(APP, own, tmp_path, queue=queue) as before:  # the retired key seals the old task
            client = McpHttp(before.web("web-retired", **{RING: retired}))
            old = client.create("secret_echo", {"secret": "OLD-9a2b"})
            client.close()
        with Deployment(APP, own, tmp_path, queue=queue) as rotated:  # rotated, but never re-encrypted
            client = McpHttp(rotated.web("web-rotated", **{RING: f"{current},{retired}"}))
            new = client.create("secret_echo", {"secret": "NEW-4c8d"})
            client.close()
        with Deployment(APP, own, tmp_path, queue=queue) as after:  # the retired key is gone
            client = McpHttp(after.web("web-current", **{RING: current}))
            after.worker("worker-current", concurrency=1, env={RING: current})
            try:
                assert client.wait_for(new, "input_required")["status"] == "input_required"  # old's job ran first
                failed = client.get(old)
                assert failed["status"] == "failed"
                message = failed["error"]["message"]
                assert message.startswith(
                    "The task cannot be read: the task's arguments column was encrypted with key "
                )
                assert KeyRing.parse([retired]).primary_id in message and RING in message
                refused = client.task("tasks/cancel", old)  # its real state is unknown here: refused, not dropped
                assert refused["error"]["code"] == -32603
                assert refused["error"]["message"].startswith("The task cannot be read: ")
                assert client.get(old)["status"] == "failed"
                answer(client, new, "confirm", {"answer": "fine"})
                assert client.wait_for(new)["status"] == "completed"  # the worker went on
                logs = after.logs()
                assert "cannot be read" in logs and old not in logs and "OLD-9a2b" not in logs
            finally:
                client.close()
