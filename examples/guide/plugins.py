"""Turning operations on in code (docs/operations.md): the same as MCP_TASKS_METRICS=on and MCP_TASKS_HEALTH=on."""

# --8<-- [start:plugins]
from celery_mcp_tasks import McpTasks
from celery_mcp_tasks.ops import Health, Prometheus

tasks = McpTasks("reports", plugins=[Prometheus(), Health()])
celery = tasks.celery
ops_app = tasks.ops_app()  # /metrics, /healthz, /readyz: serve it on a port of its own, never the MCP one
# --8<-- [end:plugins]
