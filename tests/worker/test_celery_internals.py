"""Contract tests for every Celery internal this package uses (`celery_mcp_tasks.worker.celery_internals`).

Each fails with the installed version in its message the day the internal moves.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import logging

import pytest
from celery import Celery

from celery_mcp_tasks.worker import celery_internals

CELERY = importlib.metadata.version("celery")
WHERE = f"celery {CELERY}: an internal moved; update celery_mcp_tasks/worker/celery_internals.py"


def test_the_release_is_one_this_module_was_checked_against() -> None:
    assert CELERY.rsplit(".", 1)[0] in celery_internals.VERSIONS, WHERE


def test_the_trace_templates_are_the_ones_the_trace_logs_with() -> None:
    from celery.app import trace

    templates = celery_internals.trace_templates()
    assert set(templates) == {"received", "succeeded", "failed", "retry", "ignored", "rejected"}, WHERE
    assert all(isinstance(t, str) and "%(name)s[%(id)s]" in t for t in templates.values()), WHERE
    assert trace.logger is logging.getLogger(celery_internals.TRACE_LOGGER), WHERE


def test_exec_options_are_what_send_task_merges_from_the_registered_task() -> None:
    app = Celery("contract", set_as_current=False)

    @app.task(queue="slow", routing_key="slow.jobs")
    def job() -> None: ...

    options = celery_internals.exec_options(app.tasks[job.name])
    assert options["queue"] == "slow" and options["routing_key"] == "slow.jobs", WHERE
    assert None not in options.values(), WHERE
    assert "_get_exec_options" in inspect.getsource(Celery.send_task), WHERE


def test_only_a_started_prefork_pool_terminates() -> None:
    from celery.concurrency.base import BasePool
    from celery.concurrency.prefork import TaskPool as Prefork
    from celery.concurrency.solo import TaskPool as Solo
    from celery.concurrency.thread import TaskPool as Threads

    assert callable(getattr(BasePool, "terminate_job", None)), WHERE
    started = Prefork.__new__(Prefork)
    started.terminate_job = lambda pid, signal=None: None  # what `on_start` sets from billiard's pool
    assert celery_internals.pool_terminates(started), WHERE
    assert not celery_internals.pool_terminates(Threads.__new__(Threads)), WHERE
    assert not celery_internals.pool_terminates(Solo.__new__(Solo)), WHERE
    assert "self.terminate_job = " in inspect.getsource(Prefork.on_start), WHERE


def test_the_soft_limit_is_a_signal_whose_pool_handler_raises_the_limit() -> None:
    import signal

    import pytest
    from billiard import pool
    from celery.exceptions import SoftTimeLimitExceeded

    found = celery_internals.soft_limit_handler()
    assert found == (signal.SIGUSR1, pool.soft_timeout_sighandler), WHERE
    with pytest.raises(SoftTimeLimitExceeded):
        found[1](signal.SIGUSR1, None)
    assert "signal.signal(SIG_SOFT_TIMEOUT, soft_timeout_sighandler)" in inspect.getsource(pool.Worker.after_fork), (
        WHERE
    )


def test_a_message_of_a_task_the_worker_lacks_is_logged_with_the_template_body_and_headers_we_filter(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`Consumer.on_unknown_task` run on a message as the consumer gets it: its line is the template, its
    arguments the task's name, the body, the headers (what `tracelog.DroppedJobFilter` trims)."""
    from types import SimpleNamespace

    from celery.worker.consumer.consumer import Consumer, logger

    assert logger.name == celery_internals.CONSUMER_LOGGER, WHERE
    headers = {"id": "celery-id", "task": "app.added", "shadow": "added"}  # not one of our jobs': left unfiltered
    message = SimpleNamespace(
        headers=headers,
        delivery_info={"routing_key": "q"},
        properties={},
        body=b"{}",
        reject_log_error=lambda *args, **kwargs: None,
    )

    class Backend:
        def mark_as_failure(self, *args: object, **kwargs: object) -> None: ...

    class App:  # hashable, as a Celery app is: the task_unknown signal goes out with the consumer as its sender
        backend = Backend()

    class Stand:
        app = App()
        connection_errors = ()
        event_dispatcher = None

    consumer = Stand()
    with caplog.at_level(logging.ERROR, logger=celery_internals.CONSUMER_LOGGER):
        Consumer.on_unknown_task(consumer, [[], {"secret": "s3cret"}, {}], message, KeyError("app.added"))
    (record,) = [r for r in caplog.records if r.name == celery_internals.CONSUMER_LOGGER]
    assert record.msg == celery_internals.unknown_task_template(), WHERE
    assert isinstance(record.args, tuple) and "s3cret" in str(record.args[1]) and record.args[2] is headers, WHERE


def test_find_app_finds_the_celery_app_celery_dash_a_would_use() -> None:
    import sys
    import types

    module = types.ModuleType("contract_find_app")
    module.celery = Celery("contract-find-app", set_as_current=False)  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        assert celery_internals.find_app(module.__name__) is module.celery, WHERE  # type: ignore[attr-defined]
    finally:
        del sys.modules[module.__name__]


def test_the_pool_term_signal_is_sigterm_unless_remapped() -> None:
    import os
    import signal

    expected = signal.Signals[os.environ.get("REMAP_SIGTERM", "SIGTERM")]  # as Celery documents it (Heroku)
    assert celery_internals.pool_term_signal() == int(expected), WHERE


def test_a_stop_is_what_the_workers_shutdown_handlers_set_and_its_loops_read(monkeypatch: pytest.MonkeyPatch) -> None:
    from celery.apps import worker as worker_app
    from celery.worker import state

    assert not celery_internals.stop_requested(), WHERE
    for flag in ("should_stop", "should_terminate"):
        with monkeypatch.context() as patched:
            patched.setattr(state, flag, 0)  # EX_OK: a warm (or cold) shutdown asked with exit status 0
            assert celery_internals.stop_requested(), WHERE
    assert "should_stop" in inspect.getsource(worker_app._shutdown_handler), WHERE
    assert "should_stop" in inspect.getsource(state.maybe_shutdown), WHERE
    # the embedded broker's slices only help a loop that drains with a timeout and checks between drains
    from celery.worker import loops

    assert "drain_events(timeout=" in inspect.getsource(loops.synloop), WHERE


def test_a_task_name_is_taken_by_a_task_made_or_only_declared() -> None:
    app = Celery("names")

    @app.task(name="named.declared")
    def declared() -> None: ...

    @app.task
    def generated() -> None: ...

    assert not declared.__evaluated__() and not app.finalized  # both only declared
    assert celery_internals.task_name_taken(app, "named.declared"), WHERE
    assert celery_internals.task_name_taken(app, f"{__name__}.generated"), WHERE  # Celery's name: module.function
    assert not celery_internals.task_name_taken(app, "named.other")
    assert generated.name and generated.__evaluated__()  # made now
    assert celery_internals.task_name_taken(app, f"{__name__}.generated")
    app.finalize()
    assert celery_internals.task_name_taken(app, "celery.backend_cleanup")  # Celery's own, made at finalize
    assert not celery_internals.task_name_taken(app, "named.other")
