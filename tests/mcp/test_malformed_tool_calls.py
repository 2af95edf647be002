"""Malformed `tools/call` fields through the real HTTP app: always -32602, never -32603, never a task.

A seeded generator builds 2026-07-28 `tools/call` requests for task tools
(optional, required, one with a `prepare=` question; with and without the extension declared)
and breaks one or more of the fields this package or the SDK reads on the way to a task: the
`task` object and its `ttl`/`pollInterval`, `_meta` and the capability keys inside it, the
progress token, the related task, the idempotency key, MRTR `inputResponses` and `requestState`.
Another breaks the fields an earlier era's call reads (its `task` param is checked there). Each
answer must be -32602 (the client's mistake, with a message), and the store must hold exactly the
rows it held before.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from mcp_types import ElicitRequest, ElicitRequestFormParams, InputRequiredResult
from starlette.testclient import TestClient

from celery_mcp_tasks import McpTasks, TaskContext
from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.protocol import IDEMPOTENCY_META_KEY, MAX_IDEMPOTENCY_KEY
from tests.support import EXT, PROTOCOL

VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
RELATED_TASK_KEY = "io.modelcontextprotocol/related-task"
WITH_EXT: dict[str, Any] = {"elicitation": {}, "extensions": {EXT: {}}}
WITHOUT_EXT: dict[str, Any] = {"elicitation": {}}
ARGUMENTS = {"topic": "fuzz"}


async def _ask_first(arguments: dict[str, Any], answers: Any) -> Any:
    if "go" in answers:
        return {}
    schema = {"type": "object", "properties": {"go": {"type": "boolean"}}, "required": ["go"]}
    ask = ElicitRequest(params=ElicitRequestFormParams(message="Go?", requested_schema=schema))
    return InputRequiredResult(input_requests={"go": ask}, request_state="asked")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, sa.Engine]]:
    data = tmp_path_factory.mktemp("malformed")
    app_settings = Settings(data_dir=Path(data), sync_timeout_s=1)
    upgrade(app_settings.store_url)
    tasks = McpTasks("malformed", settings=app_settings, notifier=None)

    @tasks.mcp_task
    def optional(topic: str, ctx: TaskContext) -> str:
        return topic

    @tasks.mcp_task(mode="required")
    def required(topic: str, ctx: TaskContext) -> str:
        return topic

    @tasks.mcp_task(needs=("elicitation",), prepare=_ask_first)
    def prepared(topic: str, ctx: TaskContext) -> str:
        return topic

    engine = sa.create_engine(app_settings.store_url)
    with TestClient(tasks.asgi_app(), base_url="http://127.0.0.1") as client:
        yield client, engine
    engine.dispose()


def rows(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM mcp_tasks_task")).scalar_one())


ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def post(
    client: TestClient, tool: str, params: dict[str, Any], session: dict[str, str] | None = None
) -> tuple[int, Any]:
    """One `tools/call`: on 2026-07-28, or in an earlier era's `session` (its headers)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, **params}}
    headers = ACCEPT | (session or {"MCP-Protocol-Version": PROTOCOL, "Mcp-Method": "tools/call", "Mcp-Name": tool})
    response = client.post("/mcp", content=json.dumps(body), headers=headers)
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        finals = [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")]
        return response.status_code, next(m for m in finals if "id" in m)
    return response.status_code, response.json()


# -- what is malformed (a seeded generator: the same requests every run) -----------------------

SEED = 20
REQUESTS = 2000
BIG = 2**64
Gen = random.Random


def not_an_object(r: Gen) -> Any:
    return r.choice(["", "x", "{}", 0, -1, 1.5, True, False, [], [1, None], [{}]])


def not_an_int(r: Gen) -> Any:
    return r.choice(["", "ten", "1e3", "0x10", 1.5, -0.25, 1e300, [], [1], {}, {"a": None}])


def bad_ttl(r: Gen) -> Any:
    return r.choice([not_an_int(r), -1, -r.randrange(1, BIG), r.randrange(BIG, BIG**2), -(BIG**2), True, False])


def bad_poll(r: Gen) -> Any:
    return r.choice([not_an_int(r), -1, -r.randrange(1, 10**6), r.randrange(BIG, BIG**2), True])


def nested_null(r: Gen, depth: int = 3) -> Any:
    if depth == 0 or r.random() < 0.3:
        return None
    return {r.choice(["a", "ttl", EXT]): nested_null(r, depth - 1) for _ in range(r.randint(1, 2))}


def bad_capabilities(r: Gen) -> Any:
    return r.choice(
        [
            None,
            not_an_object(r),
            {"extensions": not_an_object(r)},
            {"extensions": {EXT: r.choice([not_an_object(r), None])}},
            {"elicitation": r.choice(["x", 1, [None]]), "extensions": {EXT: {}}},
            {"extensions": {EXT: {}, "x": nested_null(r) or "x"}, "sampling": r.choice([[], "x", 0])},
        ]
    )


def bad_response(r: Gen) -> Any:
    return r.choice(
        [
            None,
            not_an_object(r),
            {"action": r.choice([1, None, "ACCEPT", "", [], {}])},
            {"action": "accept", "content": r.choice(["x", 1, [], [None], True])},
            {"action": "accept", "content": {"go": r.choice([[None], {"a": None}, {"b": [None]}])}},
            {"roots": r.choice([None, "x", [1], [{"uri": None}]])},
            {"role": r.choice([None, 1]), "content": None, "model": []},
            nested_null(r) or {"content": None},
        ]
    )


def bad_idempotency_key(r: Gen) -> Any:
    return r.choice([None, "", 0, 1.5, True, [], ["k"], {}, {"k": None}, "k" * (MAX_IDEMPOTENCY_KEY + 1)])


def bad_related_task(r: Gen) -> Any:
    return r.choice([not_an_object(r), {"taskId": r.choice([None, 1, []])}])


def bad_input_responses(r: Gen) -> Any:
    if r.random() < 0.3:
        return r.choice(["x", 1, [], [{}], True])
    return {r.choice(["go", "x", ""]): bad_response(r) for _ in range(r.randint(1, 2))}


def meta_with(**changes: Any) -> dict[str, Any]:
    return {VERSION_KEY: PROTOCOL, CAPABILITIES_KEY: WITH_EXT, **changes}


LEGACY_TASK: list[Any] = [
    lambda r: {"task": not_an_object(r)},
    lambda r: {"task": {"ttl": bad_ttl(r)}},
    lambda r: {"task": {"ttl": r.choice([None, 1000]), "pollInterval": bad_poll(r)}},
    lambda r: {"task": {r.choice(["ttl", "pollInterval"]): nested_null(r) or {"a": None}}},
]
"""The legacy `task` param: on 2026-07-28 it MUST be ignored (however malformed), on earlier eras it is checked."""

MUTATIONS: list[Any] = [
    lambda r: {"_meta": r.choice([None, not_an_object(r)])},
    lambda r: {"_meta": meta_with(**{CAPABILITIES_KEY: bad_capabilities(r)})},
    lambda r: {"_meta": meta_with(progressToken=r.choice([None, [], [1], True, {}, {"a": None}, 1.5]))},
    lambda r: {"_meta": meta_with(**{RELATED_TASK_KEY: bad_related_task(r)})},
    lambda r: {"_meta": meta_with(**{IDEMPOTENCY_META_KEY: bad_idempotency_key(r)})},
    lambda r: {"inputResponses": bad_input_responses(r)},
    lambda r: {"requestState": r.choice([1, [], [None], True, {}, 1.5])},
    lambda r: {
        "inputResponses": bad_input_responses(r),
        "requestState": r.choice(["asked", "celery-mcp-tasks/sync/1:x"]),
    },
]


EARLIER_ERA = "2025-11-25"
EARLIER_MUTATIONS: list[Any] = [
    lambda r: {"task": not_an_object(r)},
    lambda r: {"task": {"ttl": bad_ttl(r)}},
    lambda r: {"_meta": not_an_object(r)},
    lambda r: {"_meta": {"progressToken": r.choice([[], [1], True, {}, {"a": None}, 1.5])}},
    lambda r: {"_meta": {RELATED_TASK_KEY: bad_related_task(r)}},
    lambda r: {"_meta": {IDEMPOTENCY_META_KEY: bad_idempotency_key(r)}},
]
"""What an earlier era's call reads on the way to a task: its `task` param (`ttl`; a client's `pollInterval` is
not a field of it there) and `_meta` (no capability keys: those are the session's)."""


def malformed_calls(seed: int, count: int, mutations: list[Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """`count` (tool, params) pairs, each with one to three malformed fields (on 2026-07-28: a `_meta` with or
    without the extension declared; in an earlier era's session, which declared it: none)."""
    r = random.Random(seed)
    for _ in range(count):
        tool = r.choice(["optional", "required", "prepared"])
        capabilities = r.choice([WITH_EXT, WITHOUT_EXT])
        params: dict[str, Any] = {"arguments": ARGUMENTS}
        if mutations is MUTATIONS:
            params["_meta"] = meta_with(**{CAPABILITIES_KEY: capabilities})
        for mutate in r.sample(mutations, r.randint(1, 3)):
            params.update(mutate(r))
        yield tool, params


def earlier_session(client: TestClient) -> dict[str, str]:
    """An initialized session of `EARLIER_ERA` declaring the tasks capability: its request headers."""
    hello = {
        "protocolVersion": EARLIER_ERA,
        "capabilities": {"tasks": {"requests": {"tools": {"call": {}}}}},
        "clientInfo": {"name": "fuzz", "version": "0"},
    }
    opened = client.post(
        "/mcp", json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello}, headers=ACCEPT
    )
    session = {"Mcp-Session-Id": opened.headers["mcp-session-id"], "MCP-Protocol-Version": EARLIER_ERA}
    client.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=ACCEPT | session)
    return session


@pytest.mark.parametrize("era", [PROTOCOL, EARLIER_ERA])
def test_a_malformed_tools_call_field_is_invalid_params_and_creates_no_task(
    world: tuple[TestClient, sa.Engine], era: str
) -> None:
    client, engine = world
    before = rows(engine)
    session, mutations, requests, status_wanted = None, MUTATIONS, REQUESTS, 400
    if era != PROTOCOL:  # a session's errors travel in a 200 response, as the SDK answers there
        session, mutations, requests, status_wanted = earlier_session(client), EARLIER_MUTATIONS, REQUESTS // 4, 200
    wrong: dict[tuple[Any, ...], tuple[int, dict[str, Any], Any]] = {}
    for tool, params in malformed_calls(SEED, requests, mutations):
        status, answer = post(client, tool, params, session)
        error = answer.get("error") if isinstance(answer, dict) else None
        if error is None or error.get("code") != -32602 or status != status_wanted:
            kind = (tool, tuple(sorted(params)), status, error and error.get("code"))
            count = wrong[kind][0] + 1 if kind in wrong else 1
            wrong[kind] = (count, params, answer)
    report = "\n".join(
        f"{n}x {kind}: {json.dumps(p)[:300]} -> {json.dumps(a)[:200]}" for kind, (n, p, a) in wrong.items()
    )
    assert not wrong, f"answers other than -32602 (kind: tool, fields, status, code):\n{report}"
    assert rows(engine) == before


def test_the_same_call_well_formed_creates_its_task(world: tuple[TestClient, sa.Engine]) -> None:
    """The control: the fields the generator breaks, each well formed (or null), are accepted."""
    client, engine = world
    before = rows(engine)
    meta = meta_with(progressToken="p-1", **{RELATED_TASK_KEY: {"taskId": "another"}})
    for task in ({"ttl": 60_000, "pollInterval": 500}, {"ttl": None}, None, {"ttl": 0, "extra": {"a": None}}):
        status, answer = post(client, "optional", {"arguments": ARGUMENTS, "_meta": meta, "task": task})
        assert status == 200 and answer["result"]["resultType"] == "task", answer
    assert rows(engine) == before + 4


def test_a_malformed_legacy_task_param_is_ignored_on_2026_07_28(world: tuple[TestClient, sa.Engine]) -> None:
    """The Tasks extension: the legacy `task: {ttl, pollInterval}` param MUST be ignored. What the SDK's own
    request model cannot parse at all (`task` not an object, `ttl` not a number) is its -32602; anything it
    parses is ignored, and the call is what it would be without it (here: a task, the client declared the
    extension). Never -32603."""
    client, engine = world
    r = random.Random(SEED)
    created = refused = 0
    before = rows(engine)
    for _ in range(60):
        params: dict[str, Any] = {"arguments": ARGUMENTS, "_meta": meta_with()}
        params.update(r.choice(LEGACY_TASK)(r))
        status, answer = post(client, "optional", params)
        if "error" in answer:
            assert (status, answer["error"]["code"]) == (400, -32602), (params, answer)
            refused += 1
        else:
            assert status == 200 and answer["result"].get("resultType") == "task", (params, answer)
            created += 1
    assert created and refused  # both kinds were sent
    assert rows(engine) == before + created


@pytest.mark.parametrize("method", ["tasks/get", "tasks/cancel", "tasks/update"])
@pytest.mark.parametrize("task_id", [5, None, ["t"], True, {"id": "t"}, "absent"])
def test_a_task_id_missing_or_not_a_string_is_invalid_params_naming_it(
    world: tuple[TestClient, sa.Engine], method: str, task_id: Any
) -> None:
    """-32602 saying what is wrong (was the SDK's bare "Invalid request parameters"), before the routing name's
    check: a body's `taskId` that is not a string is the params' mistake, not the header's (whether one came)."""
    client, _ = world
    params: dict[str, Any] = {"_meta": meta_with(), "inputResponses": {}}
    if task_id != "absent":
        params["taskId"] = task_id
    for name in ({"Mcp-Name": json.dumps(task_id)}, {}):
        headers = ACCEPT | {"MCP-Protocol-Version": PROTOCOL, "Mcp-Method": method} | name
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        response = client.post("/mcp", content=json.dumps(body), headers=headers)
        assert response.status_code == 400, response.text
        assert response.json()["error"] == {"code": -32602, "message": "Invalid params: taskId must be a string"}
