"""`celery-mcp-tasks serve` (the MCP endpoint) and `console` (the operators' console): APP under uvicorn."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

import uvicorn

from celery_mcp_tasks.cli.shared import bind_port, load_app, prepare, start_ops_server, uvicorn_logging

_logger = logging.getLogger("celery_mcp_tasks.cli")


def run(args: argparse.Namespace) -> int:
    # A busy port is one line before anything else; uvicorn binds it again once the app has started, so a
    # connection until then is refused, and uvicorn says where it serves.
    bind_port(args.command, args.host, args.port).close()
    tasks = load_app(args.app)
    console = args.command == "console"
    if console and tasks.settings.console_token is None:
        print(
            "celery-mcp-tasks console: MCP_TASKS_CONSOLE_TOKEN is not set: the console needs an operator token "
            "(generate one with `openssl rand -base64 32`)",
            file=sys.stderr,
        )
        return 2
    prepare(tasks, "serve", migrate=not console and not args.no_migrate)
    if not console:
        warn_unless_broker_answers(tasks)
    ops = (
        None
        if console
        else start_ops_server(
            tasks, args.ops_host, args.ops_port, log_level=args.log_level, set_by="--ops-port or MCP_TASKS_OPS_PORT"
        )
    )
    try:
        uvicorn.run(
            tasks.console_app(standalone=True) if console else tasks.asgi_app(host=args.host),
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            log_config=uvicorn_logging(tasks),
            timeout_graceful_shutdown=5,
        )
    finally:
        if ops is not None:
            ops.stop()
    return 0


def warn_unless_broker_answers(tasks: Any) -> None:
    """A web process starts whatever the broker's state (it may come up later), but says at once when it cannot
    reach it: until it can, every task call fails with "Could not enqueue the job"."""
    from celery_mcp_tasks.config import redact_url
    from celery_mcp_tasks.ops.probes import broker_probe

    finding = broker_probe(tasks.celery)
    if finding.status == "fail":
        url = redact_url(str(tasks.celery.conf.broker_url))
        reason = finding.detail.rstrip(".")
        _logger.warning(  # through logging: a JSON record under MCP_TASKS_LOG_FORMAT=json, as every other line
            "celery-mcp-tasks: warning: %s; every task call fails until it answers; "
            "start the broker or fix CELERY_BROKER_URL (now %s)",
            reason,
            url,
        )
