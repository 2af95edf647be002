"""JSON logs turned on in code, `plugins=[Logs(json=True)]`, not by MCP_TASKS_LOG_FORMAT (tests/integration/test_json_logs.py)."""

from __future__ import annotations

from celery_mcp_tasks import McpTasks
from celery_mcp_tasks.ops import Logs

tasks = McpTasks("json-logs-code-tests", plugins=[Logs(json=True)])
celery = tasks.celery
