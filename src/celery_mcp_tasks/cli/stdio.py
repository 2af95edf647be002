"""`celery-mcp-tasks stdio`: the same app over stdin/stdout, for clients that launch a local command.

stdout is the wire and nothing else: from the first line of start-up, file descriptor 1 points at
stderr (an app's `print` at import, a library's banner) until the SDK's stdio transport claims it.
On the embedded default the command starts and supervises its own worker (with beat), as `dev` does.
Nothing outlives the client: stdin closing, SIGTERM or SIGINT ends the worker's process group and
then the server, within the 2 s grace the SDK's client gives before it kills the server.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

from celery_mcp_tasks.cli.shared import (
    Stopped,
    WorkerSupervisor,
    banner,
    celery_target,
    load_app,
    prepare,
    sigterm_stops,
)
from celery_mcp_tasks.config import redact_url

PREFIX = "celery-mcp-tasks stdio"
# How long the worker gets to finish after the client leaves: this wait and the process's own exit (a few
# hundred ms, more on a loaded machine) are to fit the SDK client's 2 s grace. A job still running then is
# killed; the janitor re-sends (or fails) its task, as for any lost worker. (An idle prefork worker's own warm
# shutdown takes 3 s, its pool's threads looking up once a second: it is killed all the same, and a job that
# ends within the wait is recorded.)
WARM_SHUTDOWN_S = 1.0
# How long a signal or the worker's death waits for the in-flight synchronous calls' tasks to be
# cancelled: milliseconds normally, bounded so that a hung store cannot hold the exit.
ABANDON_S = 1.0


@contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Point file descriptor 1 at stderr for the duration (restored after): the wire stays clean."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        try:
            sys.stdout.flush()
        finally:
            os.dup2(saved, 1)
            os.close(saved)


def wants_worker(option: bool | None, broker_url: str) -> bool:
    """`--worker`/`--no-worker` when given; otherwise a worker exactly when the broker is local."""
    return option if option is not None else broker_url.startswith(("filesystem://", "memory://"))


async def serve(tasks: Any, worker: WorkerSupervisor | None) -> None:
    """Serve over stdin/stdout until the client closes stdin; a signal or the worker's death ends the process.

    The SDK reads stdin in a thread no cancellation reaches, so those two cannot unwind the serve loop: they
    cancel the synchronous calls' hidden tasks (their handlers never get to), end the worker and exit there.
    """
    import anyio

    from celery_mcp_tasks.app import internals
    from celery_mcp_tasks.mcp.serving import STOPPED

    async def leave(outcome: str) -> None:
        """Cancel the synchronous calls' hidden tasks (no job runs on for nobody), end the worker, exit."""
        abandon = partial(internals(tasks).abandon_synchronous_calls, STOPPED)
        with anyio.move_on_after(ABANDON_S):
            await anyio.to_thread.run_sync(abandon, abandon_on_cancel=True)  # a hung store is left to the exit
        exit_now(finish(worker, outcome))

    async def on_signal() -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                await leave(signal.Signals(signum).name)

    async def on_worker_death() -> None:
        while worker is not None and worker.died is None:  # noqa: ASYNC110 - set by the supervisor's thread
            await anyio.sleep(0.2)
        await leave("worker")

    async with anyio.create_task_group() as group:
        group.start_soon(on_signal)
        if worker is not None:
            group.start_soon(on_worker_death)
        async with internals(tasks).serving(exit_signals=False):  # what `asgi_app()`'s lifespan runs
            try:
                await tasks.server.run_stdio_async()
            except* (BrokenPipeError, ConnectionResetError):
                pass  # the client is gone (killed: stdout closed under an answer): it left, as closed stdin says
            finally:
                wire_closed()
        group.cancel_scope.cancel()


def wire_closed() -> None:
    """The wire is over and the SDK gave fd 1 back to stdout: point it at stderr for the rest of the process, so
    what the app printed and `sys.stdout` still buffers never follows the last message."""
    try:
        os.dup2(2, 1)
        sys.stdout.flush()
    except (OSError, ValueError):  # a closed stdout: nothing of it can follow the wire either
        pass


def exit_now(status: int) -> NoReturn:
    """Leave at once, what is buffered written: the interpreter's own shutdown (its last garbage collection,
    0.4-1.3 s measured) would not fit in the SDK client's 2 s grace after the worker's wait, and the client
    then ends the server with SIGTERM."""
    wire_closed()  # what the app printed and is still buffered goes to stderr, not lost
    logging.shutdown()
    sys.stderr.flush()
    os._exit(status)


def finish(worker: WorkerSupervisor | None, outcome: str) -> int:
    """End the worker's process group (warm, then killed) and say how the server ends: its exit status."""
    if worker is not None:
        with sigterm_stops():  # a second SIGTERM cuts the warm shutdown short
            worker.stop(WARM_SHUTDOWN_S)
        if worker.died is not None:
            _say(f"{PREFIX}: {worker.why()}")
            return 1
    return 0 if outcome in ("closed", "SIGTERM") else 130


def _say(*lines: str) -> None:
    for line in lines:
        print(line, file=sys.stderr, flush=True)


def run(options: argparse.Namespace) -> int:
    """Serve APP over stdio (with a supervised worker when asked). It leaves the process itself (`exit_now`),
    its exit status saying what happened; it returns only by raising."""
    import anyio

    worker: WorkerSupervisor | None = None
    try:
        with sigterm_stops():  # until the serve loop listens: SIGTERM leaves as `Stopped`
            with stdout_to_stderr():
                if options.directory:
                    try:
                        os.chdir(options.directory)
                    except OSError as exc:
                        raise SystemExit(f"{PREFIX}: --directory {options.directory}: {exc.strerror or exc}") from None
                if options.data_dir:  # wins over MCP_TASKS_DATA_DIR; the worker inherits it
                    os.environ["MCP_TASKS_DATA_DIR"] = str(Path(options.data_dir).expanduser().resolve())
                tasks = load_app(options.app)
                broker_url = str(tasks.celery.conf.broker_url)
                target = celery_target(options.app, tasks) if wants_worker(options.worker, broker_url) else None
                if target is not None:  # a data directory another `dev` or `stdio` works on: refused first
                    worker = WorkerSupervisor(target, tasks, command="stdio", schedule="stdio-beat-schedule")
                    worker.claim()
                prepare(tasks, "stdio", migrate=not options.no_migrate)
                _say(f"{PREFIX}: serving {options.app} over stdin/stdout", *banner(tasks))
                if worker is not None:
                    worker.start()
                    assert worker.proc is not None
                    _say(f"  worker  pid {worker.proc.pid} (celery -A {target} worker -B, supervised)")
                else:
                    _say(f"  worker  none started: jobs run on workers of {redact_url(broker_url)}")
            anyio.run(serve, tasks, worker)
        outcome = "closed"
    except KeyboardInterrupt:
        outcome = "SIGINT"
    except Stopped as stop:
        outcome = str(stop)
    except BaseException:
        finish(worker, "error")
        raise
    exit_now(finish(worker, outcome))
