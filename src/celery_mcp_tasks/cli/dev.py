"""`celery-mcp-tasks dev`: the web process and a supervised worker (with beat) on one machine.

The port is bound here and the socket handed to uvicorn: a busy port is the first error, and
`--call` can never talk to some other server that happens to own it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time

from celery_mcp_tasks.cli.shared import (
    WARM_SHUTDOWN_S,
    Stopped,
    WorkerSupervisor,
    banner,
    bind_port,
    celery_target,
    load_app,
    prepare,
    sigterm_stops,
    start_ops_server,
    uvicorn_logging,
)
from celery_mcp_tasks.uvicorn_internals import has_started, stop

PREFIX = "celery-mcp-tasks dev"
STARTUP_WAIT_S = 60.0  # `--call` waits this long at most for the web app to start (a slow database at start)


def run(options: argparse.Namespace) -> int:
    """Serve (or call one tool) with a supervised worker; the exit status says what happened."""
    import uvicorn

    from celery_mcp_tasks.cli.call import CallError, CallOptions, parse_arguments, read_arguments, run_call

    if options.call:  # bad ARGS is a usage error before anything starts (or migrates); `@PATH` and `-` read once
        tool, given = options.call
        try:
            arguments = read_arguments(given, sys.stdin)
            parse_arguments(arguments)
        except CallError as exc:
            print(f"{PREFIX}: {exc}", file=sys.stderr)
            return exc.code
    sock = bind_port("dev", options.host, options.port)
    # --data-dir wins over MCP_TASKS_DATA_DIR; the worker inherits the one chosen here.
    os.environ["MCP_TASKS_DATA_DIR"] = options.data_dir or os.environ.get("MCP_TASKS_DATA_DIR") or ".celery-mcp-tasks"
    if not options.keep_env:
        ignored = [name for name in ("MCP_TASKS_DATABASE_URL", "CELERY_BROKER_URL") if os.environ.pop(name, None)]
        if ignored:
            print(f"{PREFIX}: ignoring {', '.join(ignored)}: dev runs embedded (--keep-env uses them)", file=sys.stderr)
    tasks = load_app(options.app)
    target = celery_target(options.app, tasks)
    if options.call:
        logging.getLogger("mcp").setLevel(logging.WARNING)  # the server's INFO lines would interleave the call's
    stopped = threading.Event()
    server: uvicorn.Server | None = None

    def on_worker_death() -> None:
        stopped.set()
        if server is not None:
            server.should_exit = True

    worker = WorkerSupervisor(target, tasks, on_death=on_worker_death, log_level=options.log_level)
    worker.claim()  # a data directory another `dev` or `stdio` works on is refused before anything is touched
    # Migrated, then checked as `serve` checks: a database (--keep-env) or a key ring that cannot work is one line.
    prepare(tasks, "serve", migrate=True)

    host = f"[{options.host}]" if ":" in options.host else options.host
    url = f"http://{host}:{options.port}/mcp"
    print("\n".join([f"{PREFIX}: MCP endpoint {url}", *banner(tasks)]), flush=True)

    log_level = options.log_level or ("warning" if options.call else "info")
    config = uvicorn.Config(
        tasks.asgi_app(host=options.host),
        log_level=log_level,
        # A line per request only when asked for: a client following a task polls once a second, and the lines
        # buried the worker's warnings and tracebacks in the terminal they share.
        access_log=options.log_level in ("info", "debug", "trace"),
        timeout_graceful_shutdown=3,
        lifespan="on",
        log_config=uvicorn_logging(tasks),
    )
    server = uvicorn.Server(config)
    status = 0
    with sigterm_stops():
        # MCP_TASKS_OPS_HOST/PORT, when a plugin added routes (`dev` has no --ops-port)
        ops = start_ops_server(tasks, None, None, log_level=log_level, set_by="MCP_TASKS_OPS_PORT")
        try:
            worker.start()
            if options.call:
                thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="dev-web", daemon=True)
                thread.start()
                # The socket listens once the app's lifespan has started: a call before that would be refused.
                deadline = time.monotonic() + STARTUP_WAIT_S
                while (
                    not has_started(server)
                    and thread.is_alive()
                    and not stopped.is_set()
                    and time.monotonic() < deadline
                ):
                    time.sleep(0.01)
                try:
                    status = run_call(CallOptions(url, tool, arguments), abort=stopped.is_set)
                finally:
                    stop(server)
                    thread.join(timeout=5)
            else:
                server.run(sockets=[sock])
        except (KeyboardInterrupt, Stopped):
            status = 130
        finally:
            if ops is not None:
                ops.stop()
            if worker.stop():
                print(
                    f"{PREFIX}: the worker had not finished its warm shutdown within {WARM_SHUTDOWN_S:g} s: killed it "
                    "and any job it ran (the janitor re-sends, or fails, their tasks at the next start)",
                    file=sys.stderr,
                    flush=True,
                )
            sock.close()
    if worker.died is not None:
        print(f"{PREFIX}: {worker.why()}", file=sys.stderr)
        return 1
    return status
