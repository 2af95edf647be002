"""Owner scoping over real HTTP with bearer-token principals: another principal's task
answers exactly like a missing one on every method, and is never changed by it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Backend, Deployment, McpHttp, wait_until

pytestmark = pytest.mark.integration

NOT_FOUND = {"code": -32602, "message": "Failed to retrieve task: Task not found"}


@pytest.fixture(scope="module")
def authed(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with Deployment("tests.apps.push_app", backend, tmp_path_factory.mktemp("owners")) as deployment:
        deployment.web()  # no worker: ownership is the web process's and the store's business
        yield deployment


def as_user(deployment: Deployment, token: str) -> McpHttp:
    return McpHttp(deployment.url, headers={"Authorization": f"Bearer {token}"})


def test_a_foreign_task_is_not_found_on_every_method_and_stays_untouched(authed: Deployment, tmp_path: Path):
    alice, mallory = as_user(authed, "alice"), as_user(authed, "mallory")
    task_id = alice.create("idle", {"gate_dir": str(tmp_path)})
    before = alice.get(task_id)

    for method, extra in (("tasks/get", {}), ("tasks/update", {"inputResponses": {"x": {}}}), ("tasks/cancel", {})):
        foreign = mallory.task(method, task_id, **extra)
        missing = mallory.task(method, "no-such-task-id-at-all-just-a-probe-000000", **extra)
        assert foreign["error"] == missing["error"] == NOT_FOUND
        assert task_id not in str(foreign)

    after = alice.get(task_id)
    assert after["status"] == "working" and after["lastUpdatedAt"] == before["lastUpdatedAt"]
    assert alice.task("tasks/cancel", task_id)["result"]["resultType"] == "complete"
    assert alice.get(task_id)["status"] == "cancelled"
    alice.close()
    mallory.close()


def test_requests_without_a_token_are_refused_before_anything_runs(authed: Deployment):
    anonymous = McpHttp(authed.url)
    response = anonymous.raw("tasks/get", {"taskId": "x"}, name="x")
    assert response.status_code == 401
    anonymous.close()


def test_a_principal_longer_than_the_owner_column_owns_its_tasks(authed: Deployment, tmp_path: Path):
    """A subject whose owner string passes the column's length (200 "é": 1,200 characters encoded) creates and
    reads its tasks on PostgreSQL too, which refuses an over-long value; a subject one character longer is
    another principal."""
    long, longer = as_user(authed, "long:200"), as_user(authed, "long:201")
    task_id = long.create("idle", {"gate_dir": str(tmp_path)})
    assert long.get(task_id)["status"] == "working"
    assert longer.task("tasks/get", task_id)["error"] == NOT_FOUND
    assert long.task("tasks/cancel", task_id)["result"]["resultType"] == "complete"
    long.close()
    longer.close()


def test_a_token_naming_no_principal_is_refused_and_creates_nothing(authed: Deployment, tmp_path: Path):
    """No subject and an empty client id: taken as anonymous, every such token would share one owner's tasks."""
    nobody = as_user(authed, "nobody")
    reply = nobody.call_tool("idle", {"gate_dir": str(tmp_path)})
    assert reply["error"]["code"] == -32600, reply
    assert "token_verifier" in reply["error"]["message"]
    assert nobody.task("tasks/get", "no-such-task-id-at-all-just-a-probe-000000")["error"]["code"] == -32600
    nobody.close()


def test_a_verifier_that_raises_is_a_503_to_retry_and_the_connection_serves_on(authed: Deployment):
    """The SDK answers a verifier's exception with a plain-text 500 that drops the connection, and a 401 would
    send an OAuth client to sign in again: here it is a 503 to retry, with a JSON-RPC error the SDK's client
    shows, said in the log once by the exception's class, never with the token."""
    client = McpHttp(authed.url, headers={"Authorization": "Bearer raises"})
    for _ in range(2):  # the same keep-alive connection answers again
        response = client.raw("tasks/get", {"taskId": "x"}, name="x")
        assert response.status_code == 503 and response.headers["retry-after"] == "5", response.text
        error = response.json()["error"]
        assert error["message"] == "The server cannot verify access tokens right now; try again shortly"
    client.close()
    alice = as_user(authed, "alice")  # the others' requests are not touched
    assert alice.task("tasks/get", "no-such-task-id-at-all-just-a-probe-000000")["error"] == NOT_FOUND
    alice.close()
    web = authed.procs[0]
    wait_until(lambda: "token_verifier raised ConnectionError" in web.text(), 10, "the verifier's failure logged")
    assert web.text().count("token_verifier raised") == 1  # once per outage, not once per request
    assert "Bearer raises" not in web.text() and "Traceback" not in web.text()
