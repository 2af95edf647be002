"""The operators' console: every task of a deployment, live, in web pages, a JSON API and the CLI.

An adapter: it imports the domain (model, store, service), config, notify,
Starlette and Jinja2, never `mcp`, `worker`, `ops` or `cli`. It is off unless
started (`celery-mcp-tasks console APP`) or mounted (`McpTasks.console_app()`).
"""
