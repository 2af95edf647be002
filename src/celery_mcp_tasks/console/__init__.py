"""The operators' console: every task of a deployment, live, in web pages, a JSON API and the CLI.

Off unless started (`celery-mcp-tasks console APP`) or mounted (`McpTasks.console_app()`).
"""
