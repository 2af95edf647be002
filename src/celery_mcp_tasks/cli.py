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
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from celery_mcp_tasks.config import ConfigError, Settings

__all__ = ["load_app", "main"]


def load_app(path: str) -> Any:
    """Import APP (`module` or `module:attribute`) and return its `McpTasks`."""
    from celery_mcp_tasks.app import McpTasks

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module_name, _, attribute = path.partition(":")
    module = importlib.import_module(module_name)
    if attribute:
        found = getattr(module, attribute)
        if not isinstance(found, McpTasks):
            raise SystemExit(f"{path} is not a McpTasks instance")
        return found
    candidates = [value for value in vars(module).values() if isinstance(value, McpTasks)]
    if len(candidates) != 1:
        raise SystemExit(f"{module_name} must define exactly one McpTasks (found {len(candidates)}); use MODULE:NAME")
    return candidates[0]


def _quiet_libraries() -> None:
    """The SDK configures root logging at INFO; migrations and HTTP client chatter are noise here."""
    for name in ("alembic", "httpx"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _serve(app_path: str, host: str, port: int, migrate: bool, log_level: str) -> None:
    import uvicorn

    tasks = load_app(app_path)
    _quiet_libraries()
    if migrate:
        from celery_mcp_tasks.migrate import upgrade

        upgrade(tasks.settings.store_url)
    uvicorn.run(
        tasks.asgi_app(host=host), host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5,
    )


def _dev(args: argparse.Namespace) -> int:
    """Everything on one machine with no servers: SQLite store, filesystem broker, a worker with beat."""
    os.environ.setdefault("MCP_TASKS_DATA_DIR", args.data_dir)
    if not args.keep_env:
        for name in ("MCP_TASKS_DATABASE_URL", "CELERY_BROKER_URL"):
            os.environ.pop(name, None)
    tasks = load_app(args.app)
    _quiet_libraries()
    from celery_mcp_tasks.migrate import upgrade

    upgrade(tasks.settings.store_url)
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "--quiet", "-A", args.app, "worker", "-B", "-P", "threads", "-c", "4",
         "--loglevel", "WARNING", "--without-mingle", "--without-gossip",
         "-s", str(tasks.settings.resolved_data_dir / "beat-schedule")],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))},
    )
    try:
        if args.call:
            server = threading.Thread(
                target=_serve, args=(args.app, "127.0.0.1", args.port, False, "warning"), daemon=True
            )
            server.start()
            return call(f"http://127.0.0.1:{args.port}/mcp", args.call[0], args.call[1], wait_for_server=30.0)
        print(f"celery-mcp-tasks dev: MCP endpoint http://127.0.0.1:{args.port}/mcp (data in {args.data_dir})")
        _serve(args.app, "127.0.0.1", args.port, False, "info")
        return 0
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=10)
        except subprocess.TimeoutExpired:
            worker.kill()


def call(url: str, tool: str, arguments: str, *, wait_for_server: float = 0.0) -> int:
    """Call `tool` with the tasks extension declared and print each state until the task ends."""
    import httpx

    from celery_mcp_tasks.mcp.wire import EXTENSION_ID

    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}, "extensions": {EXTENSION_ID: {}}},
    }

    def post(client: httpx.Client, method: str, params: dict[str, Any], name: str) -> dict[str, Any]:
        headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28",
                   "Mcp-Method": method, "Mcp-Name": name}
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
        reply = client.post(url, json=body, headers=headers).json()
        if "error" in reply:
            raise SystemExit(f"{method}: error {reply['error']['code']}: {reply['error']['message']}")
        return reply["result"]

    deadline = time.monotonic() + wait_for_server
    with httpx.Client(timeout=30) as client:
        while True:
            try:
                created = post(client, "tools/call", {"name": tool, "arguments": json.loads(arguments)}, tool)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        if created.get("resultType") != "task":
            print(json.dumps(created, indent=2))
            return 0
        task_id = created["taskId"]
        print(f"created task: status={created['status']}")
        last = None
        while True:
            task = post(client, "tasks/get", {"taskId": task_id}, task_id)
            seen = (task["status"], task.get("statusMessage"))
            if seen != last:
                print(f"status={task['status']}" + (f"  ({task['statusMessage']})" if task.get("statusMessage") else ""))
                last = seen
            if task["status"] in ("completed", "failed", "cancelled"):
                print(json.dumps(task.get("result") or task.get("error"), indent=2))
                return 0 if task["status"] == "completed" else 1
            time.sleep(0.2)


def _db(args: argparse.Namespace) -> int:
    from celery_mcp_tasks import migrate

    url = Settings.from_env().store_url
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
    dev.add_argument("--port", type=int, default=8000)
    dev.add_argument("--data-dir", default=".celery-mcp-tasks")
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


if __name__ == "__main__":
    sys.exit(main())
