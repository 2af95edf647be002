"""Push across real processes: two web processes and a worker, per transport.

A stream on web 1 follows a task created through web 2; the worker's progress,
an input round answered through web 2 and the completion each arrive, in
order, and nothing follows the terminal notification. Another principal's
stream on the same web process is told nothing. Every visible change is
caused by one test action (a gate file the job waits for, or a request), so
nothing here depends on timing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.mcp.listen_client import SUBSCRIPTION_ID, ListenStream
from tests.support import Backend, Deployment, McpHttp, wait_until

pytestmark = pytest.mark.integration

APP = "tests.apps.push_app"


class Flow:
    """The deployment and clients one scenario needs."""

    def __init__(self, dep: Deployment, web1: str, web2: str, root: Path) -> None:
        self.dep = dep
        self.web1 = web1
        self.alice = McpHttp(web2, headers={"Authorization": "Bearer alice"})
        self.mallory = McpHttp(web2, headers={"Authorization": "Bearer mallory"})
        self.root = root
        self.streams: list[ListenStream] = []

    def gates(self, name: str) -> Path:
        path = self.root / "gates" / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def settled(self, client: McpHttp, task_id: str, message: str) -> None:
        """Wait (by polling tasks/get) until the job reached the point that says `message`."""
        wait_until(lambda: client.get(task_id).get("statusMessage") == message, 90, f"status {message!r}", 0.1)

    def listen(self, token: str, task_ids: list[str]) -> ListenStream:
        stream = ListenStream(self.web1, {"taskIds": task_ids}, token=token)
        self.streams.append(stream)
        return stream

    def close(self) -> None:
        for stream in self.streams:
            stream.close()
        self.alice.close()
        self.mallory.close()


@pytest.fixture(params=["auto", "broker"])
def flow(request: pytest.FixtureRequest, backend: Backend, tmp_path: Path) -> Iterator[Flow]:
    notify = request.param
    dep = Deployment(APP, backend, tmp_path)
    env = {"MCP_TASKS_NOTIFY": notify}
    try:
        web1 = dep.web("web1", **env)
        web2 = dep.web("web2", **env)
        dep.worker(concurrency=4, env=env)
        flow = Flow(dep, web1, web2, tmp_path)
        yield flow
        flow.close()
    except BaseException:
        print(dep.logs())
        raise
    finally:
        dep.stop()


def _task(stream: ListenStream, task_id: str) -> dict[str, Any]:
    params = stream.task()
    assert params["taskId"] == task_id, params
    assert params["_meta"][SUBSCRIPTION_ID] == stream.request_id
    assert "resultType" not in params
    return params


def test_a_task_followed_from_another_web_process_reports_every_change_in_order(flow: Flow) -> None:
    main_gates, alice_gates, mallory_gates = flow.gates("main"), flow.gates("alice"), flow.gates("mallory")
    task_id = flow.alice.create("gated_steps", {"gate_dir": str(main_gates)})
    alice_sentinel = flow.alice.create("idle", {"gate_dir": str(alice_gates)})
    mallory_sentinel = flow.mallory.create("idle", {"gate_dir": str(mallory_gates)})
    flow.settled(flow.alice, task_id, "at gate 1")
    flow.settled(flow.alice, alice_sentinel, "idling")
    flow.settled(flow.mallory, mallory_sentinel, "idling")

    stream = flow.listen("alice", [task_id, alice_sentinel])
    foreign = flow.listen("mallory", [task_id, mallory_sentinel])
    assert stream.ack()["notifications"] == {"taskIds": [task_id, alice_sentinel]}
    assert foreign.ack()["notifications"] == {"taskIds": [mallory_sentinel]}
    # each followed task as it stands, right after the ack (what was reached before the listen)
    assert [(n["taskId"], n["statusMessage"]) for n in (_task(stream, task_id), _task(stream, alice_sentinel))] == [
        (task_id, "at gate 1"),
        (alice_sentinel, "idling"),
    ]
    assert _task(foreign, mallory_sentinel)["statusMessage"] == "idling"

    (main_gates / "1").touch()
    assert _task(stream, task_id) | {"_meta": None} == _task_like(flow, task_id, "working", "step 1")
    (main_gates / "2").touch()
    assert _task(stream, task_id)["statusMessage"] == "step 2"
    (main_gates / "3").touch()
    asking = _task(stream, task_id)
    assert asking["status"] == "input_required"
    assert list(asking["inputRequests"]) == ["confirm"]

    reply = flow.alice.task(
        "tasks/update", task_id, inputResponses={"confirm": {"action": "accept", "content": {"ok": True}}}
    )
    assert reply["result"] == {"resultType": "complete", **_meta_of(reply)}
    resumed = [_task(stream, task_id)]
    while resumed[-1].get("statusMessage") != "resumed":  # the answer, then the job's run starts
        resumed.append(_task(stream, task_id))
    assert {n["status"] for n in resumed} == {"working"}
    assert "inputRequests" not in resumed[0]

    (main_gates / "4").touch()
    assert _task(stream, task_id)["statusMessage"] == "step 3"
    (main_gates / "5").touch()
    done = _task(stream, task_id)
    assert done["status"] == "completed"
    assert done["result"]["content"][0]["text"] == "done"

    # Nothing more about the finished task: the next thing on the stream is the sentinel's end.
    flow.alice.task("tasks/cancel", alice_sentinel)
    assert _task(stream, alice_sentinel)["status"] == "cancelled"
    # The other principal heard nothing of alice's task the whole time.
    flow.mallory.task("tasks/cancel", mallory_sentinel)
    assert _task(foreign, mallory_sentinel)["status"] == "cancelled"


def _meta_of(reply: dict[str, Any]) -> dict[str, Any]:
    meta = reply["result"].get("_meta")
    return {"_meta": meta} if meta is not None else {}


def _task_like(flow: Flow, task_id: str, status: str, message: str) -> dict[str, Any]:
    """What tasks/get says now, minus resultType: the notification must carry exactly that."""
    current = flow.alice.get(task_id)
    assert current["status"] == status and current.get("statusMessage") == message, current
    current.pop("resultType")
    current.pop("_meta", None)
    return current | {"_meta": None}
