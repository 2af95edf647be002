"""`celery-mcp-tasks`: dev | serve | stdio | db | call | doctor | console | tasks.

APP is a module path such as `examples.quickstart.app` holding one `McpTasks`.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable
from importlib import import_module
from typing import Any

APP_HELP = "the module holding your McpTasks, e.g. examples.quickstart.app (imported from the current directory)"


def _ops_port(text: str) -> int:
    """`--ops-port` takes what MCP_TASKS_OPS_PORT takes (`ops.serving.ops_port`), said as argparse says it."""
    from celery_mcp_tasks.ops.serving import ops_port

    try:
        return ops_port(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_seconds(text: str) -> float:
    """`--timeout`'s type: a positive number of seconds (0 would fail every check that waits)."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return seconds


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="celery-mcp-tasks", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, *, host: str = "", port: int = 0, **kwargs: Any) -> argparse.ArgumentParser:
        """A subcommand taking APP, and --host/--port when `host` says what they are."""
        found = sub.add_parser(name, **kwargs)
        found.add_argument("app", metavar="APP", help=APP_HELP)
        if host:
            found.add_argument("--host", default="127.0.0.1", help=host)
            found.add_argument("--port", type=int, default=port, help=f"the port to listen on (default {port})")
        return found

    def data_dir(found: argparse.ArgumentParser) -> None:
        found.add_argument(
            "--data-dir",
            default=None,
            help="where the embedded store and broker live (wins over MCP_TASKS_DATA_DIR; "
            "default: MCP_TASKS_DATA_DIR or .celery-mcp-tasks)",
        )

    def no_migrate(found: argparse.ArgumentParser) -> None:
        found.add_argument("--no-migrate", action="store_true", help="do not apply migrations at start")

    def log_level(
        found: argparse.ArgumentParser, default: str | None = "info", text: str = "uvicorn's log level (default info)"
    ) -> None:
        found.add_argument(
            "--log-level",
            default=default,
            type=str.lower,
            choices=["critical", "error", "warning", "info", "debug", "trace"],
            help=text,
        )

    serve = command(
        "serve",
        help="run the web process (uvicorn)",
        host="the address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)",
        port=8000,
    )
    no_migrate(serve)
    log_level(serve)
    serve.add_argument(
        "--ops-host",
        default=None,
        help="where the plugins' /metrics, /healthz, /readyz listen (default: MCP_TASKS_OPS_HOST or 127.0.0.1)",
    )
    serve.add_argument(
        "--ops-port",
        type=_ops_port,
        default=None,
        help="their port (default: MCP_TASKS_OPS_PORT or 9101; off or 0: none)",
    )

    dev = command("dev", help="web + worker + beat on SQLite and the filesystem broker")
    dev.add_argument("--host", default="127.0.0.1", help="the address the MCP endpoint listens on (default 127.0.0.1)")
    dev.add_argument("--port", type=int, default=8000, help="its port (default 8000); a busy port is an error at once")
    data_dir(dev)
    dev.add_argument("--keep-env", action="store_true", help="keep MCP_TASKS_DATABASE_URL / CELERY_BROKER_URL")
    dev.add_argument("--call", nargs=2, metavar=("TOOL", "ARGS_JSON"), help="call one tool, follow it, then exit")
    log_level(
        dev,
        default=None,
        text="uvicorn's log level (default info, without a line per request; warning with --call), and when given "
        "the worker's (else warning); given as info, debug or trace, a line per request too",
    )

    db = sub.add_parser(
        "db",
        help="migrate the task store",
        description="Migrate the task store that MCP_TASKS_DATABASE_URL names (unset: the embedded SQLite store in "
        "MCP_TASKS_DATA_DIR).",
    )
    db.add_argument(
        "action",
        choices=["upgrade", "downgrade", "check", "current", "newkey", "reencrypt"],
        help="upgrade (to head) or downgrade (to REVISION) and say from which revision to which; check: the schema "
        "matches this release; current: print the store's revision; newkey: print a fresh key for "
        "MCP_TASKS_ENCRYPTION_KEYS; reencrypt: seal every task's payloads with the ring's first key (safe while "
        "web processes and workers run)",
    )
    db.add_argument(
        "revision",
        nargs="?",
        help="the revision to upgrade to (default: head), or to downgrade to (required; base: no tables)",
    )
    db.add_argument(
        "--force",
        action="store_true",
        help="reencrypt only: go ahead although the tasks created last are not sealed with the ring's first "
        "key (no running process is seen sealing with it)",
    )

    stdio = command(
        "stdio",
        help="serve over stdin/stdout, for clients that launch a command (desktop, IDE)",
        description="Serve APP over stdin/stdout (JSON-RPC only on stdout; logs, banner and worker output on "
        "stderr). Store and broker as for serve (MCP_TASKS_DATABASE_URL, CELERY_BROKER_URL); on the embedded "
        "default (SQLite + filesystem broker) it starts and supervises its own worker with beat, so one "
        "command in the client's configuration is the whole deployment. Everything it started ends when "
        "the client closes stdin or sends SIGTERM.",
    )
    stdio.add_argument(
        "--worker",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="start a supervised worker (with beat) beside the server; default: on when the broker is the "
        "embedded filesystem:// one, off for a networked broker whose workers run elsewhere",
    )
    stdio.add_argument(
        "--directory",
        default=None,
        metavar="DIR",
        help="change to DIR first: APP is imported from it and the default data dir lives in it "
        "(for clients whose configuration cannot set a working directory)",
    )
    data_dir(stdio)
    no_migrate(stdio)
    caller = sub.add_parser(
        "call",
        help="call a tool as a task and follow it",
        usage="%(prog)s URL TOOL [ARGS] [options]\n       %(prog)s URL --resume=TASK_ID [options]",
        description="Call TOOL at URL (the MCP endpoint) as a task and follow it to the end: a live status "
        "line on a terminal, plain lines otherwise. Questions from the job are asked at the prompt; "
        "Ctrl-C cancels the task, a second Ctrl-C leaves at once.",
        epilog="exit status: 0 completed; 1 failed, a result with isError, or the server unreachable or "
        "refusing; 2 bad usage (ARGS not a JSON object, ...); 124 --timeout expired (the task keeps "
        "running: follow it with --resume); 130 the task was cancelled.",
    )
    caller.add_argument("url", metavar="URL", help="the MCP endpoint, e.g. http://127.0.0.1:8000/mcp")
    caller.add_argument("tool", metavar="TOOL", nargs="?", help="the tool to call (not with --resume)")
    caller.add_argument(
        "arguments",
        metavar="ARGS",
        nargs="?",
        help="the tool's arguments, a JSON object (default {}); @PATH reads them from a file, - from stdin",
    )
    caller.add_argument(
        "--resume",
        metavar="TASK_ID",
        help="follow a task started earlier instead of calling a tool; write --resume=TASK_ID (an id may begin with -)",
    )
    caller.add_argument("--no-wait", action="store_true", help="print the new task's id alone and exit 0")
    caller.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="wait at most this long; then exit 124 and leave the task running (the message says how to resume), "
        "or give up a call the tool answers without a task (mode=forbidden)",
    )
    caller.add_argument("--json", dest="json_output", action="store_true", help="print only the final result, as JSON")
    caller.add_argument(
        "--token",
        default=None,
        help="bearer token sent as `Authorization: Bearer ...` (default: $MCP_TASKS_TOKEN); never printed",
    )

    console = command(
        "console",
        help="the operators' console: every task, live, in web pages and a JSON API (needs MCP_TASKS_CONSOLE_TOKEN)",
        host="the address to listen on (default 127.0.0.1)",
        port=9102,
    )
    log_level(console)
    from celery_mcp_tasks.cli.tasks import add_parser as add_tasks_parser

    add_tasks_parser(sub)

    doctor = command(
        "doctor",
        help="check a deployment: configuration, database, broker, workers, janitor, push, clock",
        description="Check APP's deployment with its own settings (run it with the environment the web process "
        "and the workers have): the configuration, the database and its schema, the broker, a worker consuming "
        "each task tool's queue with the tools registered, the janitor's last sweep, push delivering a hint end "
        "to end, and this host's clock against the database's. One row per check: OK, WARN or FAIL with the fix "
        "(SKIP when a check it needs failed).",
        epilog="exit status: 0 no check failed (warnings allowed); 1 at least one FAIL.",
    )
    doctor.add_argument("--json", dest="json_output", action="store_true", help="print the checks as one JSON document")
    doctor.add_argument(
        "--timeout",
        type=_positive_seconds,
        default=3.0,
        metavar="SECONDS",
        help="how long to wait for worker replies and for the push hint (default 3)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """The `celery-mcp-tasks` command; its exit status. Ctrl-C at any point, the imports included, is one
    line and 130 (this module imports nothing heavy: the command's own imports happen in here).

    SIGINT raises `KeyboardInterrupt` for the whole run, also when the command was started with SIGINT
    ignored (a shell script's background job): uvicorn stops on SIGINT whatever the disposition, then
    re-raises it to leave as interrupted, and an ignored re-raise ended `dev` and `serve` with status 0."""
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler) if main_thread else None
    try:
        return _command(argv)
    except KeyboardInterrupt:
        print("celery-mcp-tasks: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`... | head`): no traceback, nor one at exit's flush
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


def _command(argv: list[str] | None) -> int:
    from celery_mcp_tasks.cli.tasks import id_as_key

    args = _parser().parse_args(id_as_key(sys.argv[1:] if argv is None else argv))
    from celery_mcp_tasks.config import ConfigError

    try:
        # Each command lives in a module of its name, with its `run(args)` (`console` is served as `serve` is).
        module = "serve" if args.command == "console" else args.command
        run: Callable[[argparse.Namespace], int] = import_module(f"celery_mcp_tasks.cli.{module}").run
        return run(args)
    except ConfigError as exc:
        print(f"celery-mcp-tasks: configuration error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # the store failed after the start-up checks passed: one line, not a traceback
        from alembic.util import CommandError
        from sqlalchemy.exc import DBAPIError

        if isinstance(exc, DBAPIError):
            from celery_mcp_tasks.preflight import short_reason

            print(f"celery-mcp-tasks: database error: {short_reason(exc)}", file=sys.stderr)
        elif isinstance(exc, CommandError):  # e.g. a store migrated by a newer release
            print(f"celery-mcp-tasks: migration error: {str(exc).strip().splitlines()[0]}", file=sys.stderr)
        else:
            raise
        return 1
