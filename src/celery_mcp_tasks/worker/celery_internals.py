"""Every place this package reaches past Celery's public API (pinned: celery 5.7.x; kombu's: `kombu_internals`).
tests/worker/test_celery_internals.py fails when one moves.

1. `TRACE_LOGGER`, `trace_templates`: `celery.app.trace`'s log templates, to recognise its lines and keep
   our jobs' results out of them. Structured fields (an event name) on those records would remove it.
2. `exec_options`: `Task._get_exec_options()`, what `send_task` merges before routing, to predict where a
   send goes. A public `Task.exec_options` (or `Router.route_for_task`) would remove it.
3. `pool_terminates`: a prefork pool sets its own `terminate_job` when it starts; every other keeps
   `BasePool.terminate_job`, which raises. A public `BasePool.can_terminate` would remove it.
4. `soft_limit_handler`: billiard's pool process raises `SoftTimeLimitExceeded` from its handler
   (`billiard.pool.soft_timeout_sighandler`) of `billiard.pool.SIG_SOFT_TIMEOUT` (SIGUSR1), installed after
   `worker_process_init` has run (`worker.soft_limits`). A hook around the soft limit would remove it.
5. `CONSUMER_LOGGER`, `unknown_task_template`: the line the worker's consumer logs for a message of a task it
   does not have, its arguments (the task's name, the message body, its headers, its delivery info), to keep
   an MCP task's arguments and record out of it (`worker.tracelog`). A body-free template would remove it.
6. `find_app`: `celery.app.utils.find_app`, how `celery -A NAME` finds the Celery app in a module, so the
   commands can tell whether `-A NAME` would find this one (`cli.shared.celery_target`). A documented finder
   would remove it.
7. `pool_term_signal`: `billiard.common.TERM_SIGNAL`, the signal a prefork pool process gets from its parent
   when it is to end (SIGTERM unless REMAP_SIGTERM names another), which our threads block
   (`worker.termination`). A public constant on the pool would remove it.
8. `stop_requested`: `celery.worker.state.should_stop` / `should_terminate`, set by the worker's shutdown
   signal handlers and read by its loops, so the embedded broker's waits end when the worker is told to stop
   (`kombu_internals.filesystem_transport`). A stop event on the consumer would remove it.
9. `task_name_taken`: the app's registry (`Celery._tasks`) and its tasks declared but not yet made
   (`Celery._pending`, each a `PromiseProxy` holding the function and the options it will be made with), to
   refuse a job whose name another task already has: Celery keeps the first task of a name, and ours, made at
   once, would silently replace one declared before it. A public "is this name taken" would remove it.
"""

from __future__ import annotations

from collections.abc import Callable
from types import FrameType
from typing import Any

VERSIONS = ("5.7",)
"""The Celery releases whose internals this module was checked against."""

TRACE_LOGGER = "celery.app.trace"


def trace_templates() -> dict[str, str]:
    """Celery's trace-line templates by what they say: received, succeeded, failed, retry, ignored, rejected."""
    from celery.app import trace

    return {
        "received": trace.LOG_RECEIVED,
        "succeeded": trace.LOG_SUCCESS,
        "failed": trace.LOG_FAILURE,
        "retry": trace.LOG_RETRY,
        "ignored": trace.LOG_IGNORED,
        "rejected": trace.LOG_REJECTED,
    }


def exec_options(task: Any) -> dict[str, Any]:
    """The options a registered task adds to its sends (queue, routing key, ...), None values left out."""
    return {key: value for key, value in task._get_exec_options().items() if value is not None}


def pool_terminates(pool: Any) -> bool:
    """Whether a started Celery pool can kill a running job."""
    from celery.concurrency.base import BasePool

    method = getattr(pool, "terminate_job", None)
    return method is not None and getattr(method, "__func__", None) is not BasePool.terminate_job


def soft_limit_handler() -> tuple[int, Callable[[int, FrameType | None], Any]] | None:
    """The signal a prefork pool process gets when a job reaches its soft time limit, and the pool's handler of
    it (raising the limit); None where there is no such limit."""
    from billiard import pool

    number = pool.SIG_SOFT_TIMEOUT
    return None if number is None else (int(number), pool.soft_timeout_sighandler)


CONSUMER_LOGGER = "celery.worker.consumer.consumer"


def unknown_task_template() -> str:
    """The template of the consumer's line for a message of a task this worker does not have."""
    from celery.worker.consumer import consumer

    return str(consumer.UNKNOWN_TASK_ERROR)


def find_app(module_name: str) -> Any:
    """The Celery app `celery -A module_name` would use (AttributeError when it finds none)."""
    from celery.app.utils import find_app as celery_find_app

    return celery_find_app(module_name)


def pool_term_signal() -> int:
    """The signal a prefork pool process's parent ends it with."""
    from billiard.common import TERM_SIGNAL

    return int(TERM_SIGNAL)


def stop_requested() -> bool:
    """Whether this process's worker was told to stop (warm or cold): what Celery's `maybe_shutdown` reads."""
    from celery.worker import state

    return any(flag is not None and flag is not False for flag in (state.should_stop, state.should_terminate))


def task_name_taken(app: Any, name: str) -> bool:
    """Whether `app` has a task of that name, made or declared (`@app.task` on an app not finalized yet)."""
    if name in app._tasks:
        return True
    for pending in app._pending:
        if pending.__evaluated__():
            continue  # made: in the registry above
        (fun,) = object.__getattribute__(pending, "_Proxy__args")
        options = object.__getattribute__(pending, "_Proxy__kwargs")
        if (options.get("name") or app.gen_task_name(fun.__name__, fun.__module__)) == name:
            return True
    return False
