"""`celery-mcp-tasks`: dev | serve | db | call.

    celery-mcp-tasks dev APP [--call TOOL ARGS]   web + worker + beat on the embedded default
    celery-mcp-tasks serve APP [--host --port]    the web process (uvicorn), MCP at /mcp
    celery-mcp-tasks db upgrade|check|current     migrate the store (MCP_TASKS_DATABASE_URL)
    celery-mcp-tasks call URL TOOL ARGS           call a tool as a task and follow it to the end

APP is a module path such as `examples.quickstart.app` holding one `McpTasks`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from celery_mcp_tasks.config import ConfigError, Settings

__all__ = ["load_app", "main"]


def load_app(path: str) -> Any:
    """Import APP (`module` or `module:attribute`) and return its `McpTasks`; one-line errors otherwise."""
    from celery_mcp_tasks.app import McpTasks

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise SystemExit(
                f"celery-mcp-tasks: cannot import {module_name!r} (APP is a module path such as "
                f"myapp.tasks, importable from {os.getcwd()})"
            ) from None
        raise
    if attribute:
        found = getattr(module, attribute, None)
        if not isinstance(found, McpTasks):
            raise SystemExit(f"celery-mcp-tasks: {path} is not a McpTasks instance")
        return found
    candidates = [value for value in vars(module).values() if isinstance(value, McpTasks)]
    if len(candidates) != 1:
        raise SystemExit(
            f"celery-mcp-tasks: {module_name} must define exactly one McpTasks "
            f"(found {len(candidates)}); name it as {module_name}:NAME"
        )
    return candidates[0]


def quiet_libraries() -> None:
    """The SDK configures root logging at INFO; migrations and HTTP client chatter are noise here."""
    for name in ("alembic", "httpx", "httpx2"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _serve(app_path: str, host: str, port: int, migrate: bool, log_level: str) -> None:
    import uvicorn

    tasks = load_app(app_path)
    quiet_libraries()
    if migrate:  # checked first: a store that cannot be reached, or must not be used, is never migrated
        from celery_mcp_tasks.migrate import upgrade

        tasks.preflight("serve", need_schema=False)
        upgrade(tasks.settings.store_url)
    tasks.preflight("serve")  # once per start: never an "Internal server error" at the first call
    uvicorn.run(
        tasks.asgi_app(host=host),
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=5,
    )


def _dev(args: argparse.Namespace) -> int:
    from celery_mcp_tasks.dev import DevOptions, run_dev

    return run_dev(
        DevOptions(
            app=args.app,
            host=args.host,
            port=args.port,
            data_dir=args.data_dir,
            keep_env=args.keep_env,
            call=tuple(args.call) if args.call else None,
        )
    )


_FINAL = ("completed", "failed", "cancelled")


def call(url: str, tool: str, arguments: str, *, abort: Callable[[], bool] | None = None) -> int:
    """Call `tool` with the tasks extension declared and print each state until the task ends.

    Exit status: 0 completed, 1 failed (or the server went away), 130 cancelled by Ctrl-C.
    """
    import httpx2 as httpx  # the SDK's own HTTP client: no second stack

    from celery_mcp_tasks.protocol import EXTENSION_ID

    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"celery-mcp-tasks call: ARGS is not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise SystemExit('celery-mcp-tasks call: ARGS must be a JSON object, e.g. \'{"topic": "tides"}\'')
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}, "extensions": {EXTENSION_ID: {}}},
    }

    def post(client: httpx.Client, method: str, params: dict[str, Any], name: str) -> dict[str, Any]:
        headers = {
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": method,
            "Mcp-Name": name,
        }
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
        try:
            reply = client.post(url, json=body, headers=headers).json()
        except httpx.TransportError as exc:
            raise SystemExit(f"celery-mcp-tasks call: cannot reach {url}: {type(exc).__name__}") from None
        if "error" in reply:
            raise SystemExit(f"{method}: error {reply['error']['code']}: {reply['error']['message']}")
        return dict(reply["result"])

    with httpx.Client(timeout=30) as client:
        created = post(client, "tools/call", {"name": tool, "arguments": parsed}, tool)
        if created.get("resultType") != "task":
            _print_result(created)
            return 1 if created.get("isError") else 0
        task_id = created["taskId"]
        print(f"created task: status={created['status']}", flush=True)
        last = None
        try:
            while True:
                if abort is not None and abort():
                    return 1
                task = post(client, "tasks/get", {"taskId": task_id}, task_id)
                seen = (task["status"], task.get("statusMessage"))
                if seen != last:
                    message = f"  ({task['statusMessage']})" if task.get("statusMessage") else ""
                    print(f"status={task['status']}{message}", flush=True)
                    last = seen
                if task["status"] in _FINAL:
                    if task["status"] == "completed":
                        _print_result(task.get("result") or {})
                        return 1 if (task.get("result") or {}).get("isError") else 0
                    error = task.get("error") or {}
                    if error:
                        print(f"error {error.get('code')}: {error.get('message')}", flush=True)
                    return 1 if task["status"] == "failed" else 130
                time.sleep(0.2)
        except KeyboardInterrupt:
            print("interrupted: cancelling the task", file=sys.stderr, flush=True)
            try:
                client.timeout = httpx.Timeout(2.0)
                post(client, "tasks/cancel", {"taskId": task_id}, task_id)
            except (SystemExit, httpx.HTTPError):
                pass
            return 130


def _print_result(result: dict[str, Any]) -> None:
    """Text content as text (what a person wants to read); anything else as JSON."""
    texts = [item.get("text", "") for item in result.get("content") or [] if item.get("type") == "text"]
    if texts:
        for text in texts:
            print(text, flush=True)
    else:
        shown = {k: v for k, v in result.items() if k not in ("resultType", "_meta")}
        print(json.dumps(shown, indent=2), flush=True)


def _db(args: argparse.Namespace) -> int:
    from celery_mcp_tasks import migrate
    from celery_mcp_tasks.preflight import preflight

    settings = Settings.from_env()
    preflight(settings, role="db", need_schema=False)  # unreachable: one line, not alembic's traceback
    url = settings.store_url
    if args.action == "upgrade":
        migrate.upgrade(url, args.revision or "head")
    elif args.action == "downgrade":
        migrate.downgrade(url, args.revision or "base")
    elif args.action == "check":
        migrate.check(url)
    else:
        migrate.current(url)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="celery-mcp-tasks", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the web process (uvicorn)")
    serve.add_argument("app")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--no-migrate", action="store_true", help="do not apply migrations at start")
    serve.add_argument("--log-level", default="info")

    dev = sub.add_parser("dev", help="web + worker + beat on SQLite and the filesystem broker")
    dev.add_argument("app")
    dev.add_argument("--host", default="127.0.0.1")
    dev.add_argument("--port", type=int, default=8000)
    dev.add_argument(
        "--data-dir",
        default=None,
        help="where the embedded store and broker live (wins over MCP_TASKS_DATA_DIR; "
        "default: MCP_TASKS_DATA_DIR or .celery-mcp-tasks)",
    )
    dev.add_argument("--keep-env", action="store_true", help="keep MCP_TASKS_DATABASE_URL / CELERY_BROKER_URL")
    dev.add_argument("--call", nargs=2, metavar=("TOOL", "ARGS_JSON"), help="call one tool, follow it, then exit")

    db = sub.add_parser("db", help="migrate the task store")
    db.add_argument("action", choices=["upgrade", "downgrade", "check", "current"])
    db.add_argument("revision", nargs="?")

    caller = sub.add_parser("call", help="call a tool as a task and follow it")
    caller.add_argument("url")
    caller.add_argument("tool")
    caller.add_argument("arguments", nargs="?", default="{}")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve":
            _serve(args.app, args.host, args.port, not args.no_migrate, args.log_level)
            return 0
        if args.command == "dev":
            return _dev(args)
        if args.command == "db":
            return _db(args)
        return call(args.url, args.tool, args.arguments)
    except ConfigError as exc:
        print(f"celery-mcp-tasks: configuration error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # the store failed after the start-up checks passed: one line, not a traceback
        from alembic.util import CommandError
        from sqlalchemy.exc import DBAPIError

        if isinstance(exc, DBAPIError):
            reason = (str(exc.orig or "").strip().splitlines() or [type(exc.orig or exc).__name__])[0]
            print(f"celery-mcp-tasks: database error: {reason[:300]}", file=sys.stderr)
        elif isinstance(exc, CommandError):  # e.g. a store migrated by a newer release
            print(f"celery-mcp-tasks: migration error: {str(exc).strip().splitlines()[0]}", file=sys.stderr)
        else:
            raise
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
