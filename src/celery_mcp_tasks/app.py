"""`McpTasks`: the composition root a user instantiates once per application.

It owns the Celery app, the SDK `MCPServer` (with the Tasks extension), the
settings, and one store and service per process. The web process and the
workers import the same module, so `celery -A APP worker` and
`celery-mcp-tasks serve APP` share every definition.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

from celery import Celery, Task

from celery_mcp_tasks.config import ConfigError, Settings, redact_url
from celery_mcp_tasks.mcp.extension import TasksExtension
from celery_mcp_tasks.mcp.listen import TaskListenHandler
from celery_mcp_tasks.mcp.principal import GuardedVerifier
from celery_mcp_tasks.mcp.request_state import share_request_state, warn_unless_shared
from celery_mcp_tasks.mcp.security import transport_security
from celery_mcp_tasks.mcp.server import TasksServer
from celery_mcp_tasks.mcp.serving import (
    attach_listen,
    listen_bus,
    push_hub,
    request_state_sealed,
    serving,
    with_request_guards,
    with_serving,
)
from celery_mcp_tasks.mcp.toolspec import TOOL_OPTIONS, IdempotencyKey, Prepare, TaskMode, TaskTool
from celery_mcp_tasks.model import DEFAULT, TaskRecord, _Default
from celery_mcp_tasks.notify.base import Notifier
from celery_mcp_tasks.notify.push import BrokerAccess, Push
from celery_mcp_tasks.observe import Observers
from celery_mcp_tasks.ops import plugins_from_settings  # the package alone: it names its modules, imports none
from celery_mcp_tasks.plugin import Plugin, overrides, store_built_hook
from celery_mcp_tasks.preflight import preflight
from celery_mcp_tasks.protocol import answer_problem
from celery_mcp_tasks.service import PayloadLimits, TaskService
from celery_mcp_tasks.store.base import Quota
from celery_mcp_tasks.store.ledger import Ledger
from celery_mcp_tasks.store.sql import SqlStore
from celery_mcp_tasks.worker import bridge, held, termination
from celery_mcp_tasks.worker.celery_internals import task_name_taken
from celery_mcp_tasks.worker.context import TaskContext
from celery_mcp_tasks.worker.dispatch import CeleryDispatcher
from celery_mcp_tasks.worker.fairness import consume_shards, shard_queues, unconsumed_shards
from celery_mcp_tasks.worker.janitor import MetricHook, SweepReport, install_janitor, sweep
from celery_mcp_tasks.worker.job import McpJob, McpTaskDecorator, McpTaskJob, WorkerRuntime, make_run
from celery_mcp_tasks.worker.kombu_internals import fixed_transport
from celery_mcp_tasks.worker.startup import install_startup

__all__ = ["Internals", "McpTasks", "internals"]

REDIS_SOCKET_TIMEOUT_S = 5.0
"""How long a Redis broker may leave a connect or a command unanswered (kombu's `socket_timeout` and
`socket_connect_timeout`, None by default: forever): a broker gone silent without closing the connection
(a failover, a partition) fails a send in seconds, its task readable, instead of holding the request."""


logger = logging.getLogger("celery_mcp_tasks")

_R = TypeVar("_R")
_T = TypeVar("_T")


def configure_celery(app: Celery, settings: Settings) -> None:
    """Broker and safe defaults, without overriding what the user configured."""
    conf = app.conf
    if settings.broker_url or not conf.broker_url:
        conf.broker_url = settings.celery_broker_url
    transport = fixed_transport(conf)
    if transport is not None:
        conf.broker_transport = transport
    if str(conf.broker_url).partition("://")[0].lower() in ("redis", "rediss", "sentinel"):
        options = dict(conf.broker_transport_options or {})
        options.setdefault("socket_timeout", REDIS_SOCKET_TIMEOUT_S)
        options.setdefault("socket_connect_timeout", REDIS_SOCKET_TIMEOUT_S)
        conf.broker_transport_options = options
    if str(conf.broker_url).startswith("filesystem://"):
        # The folders are made when the transport connects (`worker.kombu_internals.filesystem_transport`), not here.
        folder = settings.broker_folder
        options = dict(conf.broker_transport_options or {})
        options.setdefault("data_folder_in", str(folder / "queue"))
        options.setdefault("data_folder_out", str(folder / "queue"))
        options.setdefault("processed_folder", str(folder / "processed"))
        options.setdefault("control_folder", str(folder / "control"))
        options.setdefault("store_processed", False)
        # The 1 s default grows to seconds of latency; 0.1 s costs ~1% CPU idle.
        options.setdefault("polling_interval", 0.1)
        conf.broker_transport_options = options
    if conf.broker_connection_retry_on_startup is None:
        conf.broker_connection_retry_on_startup = True
    if settings.queue:
        conf.task_default_queue = settings.queue
    if settings.fair_queues is not None:
        consume_shards(conf, settings.fair_queues)


def _check_transport(conf: Any) -> None:
    """`ConfigError` naming CELERY_BROKER_URL when kombu has no transport for a URL's scheme (`redsi://`) or cannot
    read the URL: else the web process starts and fails every send, and the worker dies with a traceback. Read
    from kombu's transport table and URL parser: no transport (nor its client library) is imported, nothing
    connects. A transport the configuration names (`broker_transport`) is the one used, whatever the scheme."""
    import difflib

    from kombu.transport import TRANSPORT_ALIASES
    from kombu.utils.url import url_to_parts

    urls = conf.broker_url if isinstance(conf.broker_url, list | tuple) else str(conf.broker_url).split(";")
    for url in filter(None, (str(each).strip() for each in urls)):
        scheme = url.partition("://")[0].partition("+")[0].lower()  # `sqla+postgresql://`: kombu's `sqla`
        if not conf.broker_transport and scheme not in TRANSPORT_ALIASES:
            close = difflib.get_close_matches(scheme, list(TRANSPORT_ALIASES), n=1)
            hint = f"; did you mean {close[0]}://?" if close else ""
            raise ConfigError(f"CELERY_BROKER_URL: kombu has no transport named {scheme!r}{hint}")
        try:
            url_to_parts(url)
        except ValueError:  # its text may quote the URL, password included
            raise ConfigError(
                "CELERY_BROKER_URL: not a URL kombu can read (a password with / or # must be %-escaped)"
            ) from None


class McpTasks:
    """Declare task tools with `@tasks.mcp_task`; serve `tasks.server`; run workers on `tasks.celery`."""

    def __init__(
        self,
        name: str,
        *,
        celery: Celery | None = None,
        settings: Settings | None = None,
        notifier: Notifier | _Default | None = DEFAULT,
        metric: MetricHook | None = None,
        version: str | None = None,
        plugins: Sequence[Plugin] = (),
        **server_options: Any,
    ) -> None:
        """`notifier`: left out, every change is pushed to listen streams over the transport
        MCP_TASKS_NOTIFY selects (PostgreSQL NOTIFY, the broker's fanout, or row polling);
        `None` turns push off (streams only acknowledge; clients poll `tasks/get`); a
        `Notifier` replaces the publisher in every process (to hear every change and keep
        push, leave this out and add a plugin with a `task_changed` hook). `plugins`:
        operations to turn on (`celery_mcp_tasks.ops`:
        `Prometheus()`, `Health()`, `Logs()`, `Tracing()`, `JanitorWatcher()`), beside
        those the settings turn on (MCP_TASKS_METRICS=on, ...); none by default.
        `metric`: deprecated (a `DeprecationWarning`); a plugin with a `swept` hook is told of
        every sweep instead. Other keyword arguments go to `MCPServer`.
        """
        # One construction order, nothing calling back into a half-built object: settings -> Celery -> tools
        # and dispatcher -> push -> (per process: store -> push bound to it -> service) -> the SDK server with
        # our extension and listen handler -> the Celery signals.
        self.name = name
        with _refusing_to_start():
            self.settings = settings or Settings.from_env()
        self.celery = celery or Celery(name)
        if bridge.serves(self.celery):  # before anything of it changes
            raise ValueError(
                f"McpTasks({name!r}): this Celery app has an McpTasks already; give each McpTasks its own Celery "
                "app (one app's workers run one store's jobs, its beat one janitor)"
            )
        configure_celery(self.celery, self.settings)
        # Celery drops what was set on a configured app when it loads a configuration again (a project's
        # `config_from_object` after this line): set it again each time.
        # Strongly, on purpose: the Celery app keeps this object (and the receivers it holds, connected weakly to
        # Celery's process-wide signals) alive as long as it lives; `celery -A module` may find only the app.
        self.celery.on_after_configure.connect(self._reconfigure, weak=False)  # connected by call: Celery is untyped
        with _refusing_to_start():
            _check_transport(self.celery.conf)
        self._tools: dict[str, TaskTool] = {}
        self._payload_limits: dict[str, PayloadLimits] = {}
        # With encryption at rest the arguments stay out of the broker too (the job reads the stored ones).
        self._dispatcher = CeleryDispatcher(
            self.celery,
            self._tools,
            fair_queues=self.settings.fair_queues,
            send_arguments=not self.settings.encryption_keys,
        )
        with _refusing_to_start():  # MCP_TASKS_NOTIFY a transport this store or broker cannot carry
            self._push = Push(self.settings, notifier=notifier, broker=BrokerAccess.of(self.celery))
        self._lock = threading.Lock()
        self._built: TaskService | None = None
        self._built_pid: int | None = None
        self._checked_pid: int | None = None  # the process whose start a web role's checks passed
        self._app: Any = None
        self._mcp_path: str | None = None
        self._runtime = _Runtime(self)
        self._plugins = _chosen([*plugins, *_metric_shim(metric)], self.settings)
        self._observers = Observers(p for p in self._plugins if overrides(p, "task_changed"))  # told of every commit
        self._extension = TasksExtension(
            self._tools,
            self._service,
            known_tool=self._known_tool,
            sync_timeout_s=self.settings.sync_timeout_s,
            hub=push_hub(self._push),
            sealed_state=lambda: request_state_sealed(self.server),
            quota=quota_of(self.settings),
            refused=_each([p.creation_refused for p in self._plugins if overrides(p, "creation_refused")]),
            anonymous_per_client=self.settings.quota_anonymous == "per_client",
        )
        bus = listen_bus(server_options)
        self._shared_state = share_request_state(self.settings, server_options)  # MCP_TASKS_REQUEST_STATE_SECRET
        if version is not None:  # the server's version is the application's; the SDK's default otherwise
            server_options["version"] = version
        if server_options.get("token_verifier") is not None:  # a verifier that raises: a 503 to retry, not a 500
            server_options["token_verifier"] = GuardedVerifier(server_options["token_verifier"])
        self.server = TasksServer(name, extensions=[self._extension], **server_options)
        self._listen = attach_listen(
            self.server,
            bus,
            self._service,
            self._push,
            max_streams_per_caller=self.settings.quota_streams,
            per_client=self.settings.quota_anonymous == "per_client",
        )
        bridge.install(self.celery, self._service)
        held.install()  # a message the worker holds but has not started keeps its task alive
        termination.install()  # a prefork pool process that ends never leaves the pool's result lock held
        # Connected weakly to Celery's process-wide signals and kept here: dropped with its Celery app, this object
        # takes them along.
        self._receivers = install_startup(self.celery, self._preflight, self._startup_lines)
        in_worker = self.settings.janitor == "worker"
        self._receivers += install_janitor(
            self.celery, self._sweep, self.settings.janitor_interval_s, in_worker=in_worker, ledger=self._ledger
        )
        # e.g. the metrics' error listener on each process's engine (before set_up, which may build the service)
        self._store_hooks = [store_built_hook(p) for p in self._plugins if overrides(p, "store_built")]
        for plugin in self._plugins:
            with _refusing_to_start():  # a plugin refuses a setting with `ConfigError`, as `Settings` does
                plugin.setup(self._runtime)
        if self._listen is not None:
            self._listen.observers.extend(p for p in self._plugins if overrides(p, "stream_opened"))
        # Entered for the served app's whole life (inside its lifespan): e.g. the janitor watch.
        self._serving_contexts = [_serving(p) for p in self._plugins if overrides(p, "serving")]

    def _reconfigure(self, sender: Any = None, **_: Any) -> None:
        if sender is self.celery:
            configure_celery(self.celery, self.settings)

    # -- per-process state ---------------------------------------------------------------

    def _service(self) -> TaskService:
        """This process's service. Rebuilt after a fork: an engine must never cross one."""
        pid = os.getpid()
        if self._built is not None and self._built_pid == pid:
            return self._built
        with self._lock:
            if self._built is None or self._built_pid != pid:
                store = SqlStore.from_url(
                    self.settings.store_url,
                    change_hint=self._push.change_hint,
                    ring=self.settings.key_ring(),
                    pool_size=self.settings.database_pool_size,
                )
                for hook in self._store_hooks:
                    hook(store, store.engine)
                self._push.bind_store(store, store.engine)
                self._built = TaskService(
                    store,
                    notifier=self._push.notifier,
                    dispatcher=self._dispatcher,
                    max_rows=self.settings.max_rows,
                    default_ttl_ms=self.settings.default_ttl_ms,
                    default_poll_interval_ms=self.settings.poll_interval_ms,
                    observer=self._observers,
                    idempotency_secret=_secret(self.settings.idempotency_secret),
                    limits=self._limits,
                    answer_problem=answer_problem,
                )
                self._built_pid = pid
        return self._built

    def task_handle(self, key: str) -> TaskContext:
        """Drive a task from outside a job (e.g. a webhook) by its row key (`ctx.key` in the job)."""
        service = self._service()
        return TaskContext(service, key, record=service.record(key))

    def _ledger(self) -> Ledger | None:
        """This process's sweep ledger (when the janitor last swept), on the service's store."""
        return self._service().ledger()

    def _sweep(self) -> SweepReport:
        hooks = [plugin.swept for plugin in self._plugins if overrides(plugin, "swept")]
        return sweep(self._service(), self.settings, metric=_each(hooks), max_sends=self._max_sends)

    def _limits(self, tool: str) -> PayloadLimits:
        """A tool's payload limits: its `@mcp_task` options, else the settings (worked out once per tool)."""
        found = self._payload_limits.get(tool)
        if found is not None:
            return found
        spec, settings = self._tools.get(tool), self.settings
        found = PayloadLimits(
            arguments=spec.max_arguments_bytes if spec and spec.max_arguments_bytes else settings.max_arguments_bytes,
            answers=spec.max_answer_bytes if spec and spec.max_answer_bytes else settings.max_answer_bytes,
            result=spec.max_result_bytes if spec and spec.max_result_bytes else settings.max_result_bytes,
        )
        if spec is not None:
            self._payload_limits[tool] = found
        return found

    def _max_sends(self, tool: str) -> int | None:
        spec = self._tools.get(tool)
        return spec.max_sends if spec is not None else None

    def _known_tool(self, name: str) -> bool:
        return self.server.has_tool(name)

    def _preflight(self, role: str, *, need_schema: bool = True) -> None:
        """Raise `ConfigError` if a `role` process ("serve", "stdio", "worker", "beat") must not start; once per start."""
        preflight(self.settings, role=role, need_schema=need_schema, broker_url=str(self.celery.conf.broker_url))
        derived = sorted(tool.name for tool in self._tools.values() if tool.idempotency_key is not None)
        if role == "serve" and derived and self.settings.idempotency_secret is None:
            raise ConfigError(
                f"MCP_TASKS_IDEMPOTENCY_SECRET: task tools {', '.join(derived)} derive idempotency keys;"
                " set a secret of at least 32 bytes, the same in every web process"
            )
        if need_schema and role in ("serve", "stdio"):
            self._checked_pid = os.getpid()

    def _startup_lines(self, consumed: Collection[str]) -> list[str]:
        lines = [
            f"celery-mcp-tasks: store {redact_url(self.settings.store_url)}",
            f"celery-mcp-tasks: task tools {', '.join(sorted(self._tools)) or '(none)'}",
        ]
        shards = self.settings.fair_queues
        queue = str(self.celery.conf.task_default_queue)
        left_out = unconsumed_shards(queue, consumed, shards) if shards is not None else []
        if left_out:  # a `-Q` naming the default queue alone: jobs sent to the shards would wait for nobody
            every = ",".join([queue, *shard_queues(queue, shards or 0)])
            lines.append(
                f"celery-mcp-tasks: warning: this worker consumes {queue!r} but not its shards {', '.join(left_out)}"
                f" (MCP_TASKS_FAIR_QUEUES={shards}): unless other workers do, their jobs wait until the janitor fails"
                f" them as lost; consume them too (-Q {every})"
            )
        return lines

    # -- declaring tools ------------------------------------------------------------------

    @overload
    def mcp_task(self, fn: Callable[..., _R], /) -> McpTaskJob[_R]: ...

    @overload
    def mcp_task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        mode: TaskMode = "optional",
        needs: tuple[Literal["elicitation", "elicitation.url", "sampling", "roots"], ...] = (),
        ttl_ms: int | Literal["default"] | None = "default",
        poll_interval_ms: int | Literal["default"] | None = "default",
        sync_timeout_s: float | None = None,
        prepare: Prepare | None = None,
        terminate: bool = False,
        max_sends: int | None = None,
        max_active: int | None = None,
        idempotency_key: IdempotencyKey | None = None,
        max_arguments_bytes: int | None = None,
        max_answer_bytes: int | None = None,
        max_result_bytes: int | None = None,
        **celery_options: Any,
    ) -> McpTaskDecorator: ...

    def mcp_task(self, fn: Callable[..., _R] | None = None, /, **options: Any) -> McpTaskJob[_R] | McpTaskDecorator:
        """Make `fn` a Celery task and an MCP tool that answers `tools/call` with a task.

        `mode`: "optional" (a task when the client declared the extension, else run and wait),
        "required" (-32021 without the extension) or "forbidden" (always run and wait). `needs`:
        client capabilities the job's input requests use. `terminate`: tasks/cancel also kills a
        running job (prefork pools, best effort). `max_sends`: sends of one run before a lost job
        fails (MCP_TASKS_MAX_SENDS). `max_active`: unfinished tasks of this tool per caller
        (MCP_TASKS_QUOTA_ACTIVE_PER_TOOL). `idempotency_key`: a function of the arguments giving
        the key of a call a client sends none for, or "arguments": a repeat within the task's TTL
        gets the first task back (needs MCP_TASKS_IDEMPOTENCY_SECRET). `max_arguments_bytes`,
        `max_answer_bytes`, `max_result_bytes`: this tool's payload limits (MCP_TASKS_MAX_ARGUMENTS_BYTES,
        MCP_TASKS_MAX_ANSWER_BYTES, MCP_TASKS_MAX_RESULT_BYTES).
        Other keyword arguments go to Celery's `@app.task`: with `bind=True` the function takes the
        job first (`self.retry(...)`); jobs default to `acks_late` with a bounded `retry_on_worker_lost`;
        `base` (else the app's `task_cls`) is a base class of the job. A run for an MCP task leaves no
        result in a result backend (the store has it); a detached run (`.delay()`) does.
        """
        if fn is None:

            def decorate(f: Callable[..., _T]) -> McpTaskJob[_T]:
                return self._register(f, **options)

            return decorate
        return self._register(fn, **options)

    def _register(self, fn: Callable[..., _R], **celery_options: Any) -> McpTaskJob[_R]:
        if isinstance(fn, Task):  # @mcp_task over @app.task: the job would be named after Celery's lazy wrapper
            raise ValueError(
                f"@mcp_task({fn.__name__}): decorate the plain function, not a Celery task (the tool is a Celery task)"
            )
        tool_options = {key: celery_options.pop(key) for key in TOOL_OPTIONS & celery_options.keys()}
        tool_options["name"] = tool_options.get("name") or fn.__name__
        tool_options["description"] = tool_options.get("description") or (fn.__doc__ or "").strip() or fn.__name__
        needs = tool_options.get("needs", ())
        if isinstance(needs, str):  # needs=("elicitation") without its comma: a string, not a tuple of one
            raise ValueError(f"task tool {tool_options['name']!r}: needs is a tuple of names, e.g. needs=({needs!r},)")
        tool_options["needs"] = frozenset(needs)
        bound = bool(celery_options.get("bind"))
        tool = TaskTool(fn=fn, context_type=TaskContext, bound=bound, **tool_options)
        if tool.name in self._tools or self._known_tool(tool.name):
            raise ValueError(f"task tool {tool.name!r}: a tool of that name is already registered on this server")
        celery_name = self.celery.gen_task_name(fn.__name__, fn.__module__)  # what Celery names the job below
        if task_name_taken(self.celery, celery_name):  # Celery would keep one of the two, and drop the other unseen
            raise ValueError(
                f"task tool {tool.name!r}: the Celery app has a task named {celery_name!r} already; "
                "rename the function (the job's Celery name is its module and function name)"
            )
        # The user's base class (else the app's `task_cls`) under ours: its hooks and attributes are the job's,
        # over the defaults below.
        base = celery_options.pop("base", None) or self.celery.Task
        declared = {  # a class Celery bound has its configuration's values copied in: not the user's word
            name
            for cls in base.__mro__
            if cls not in Task.__mro__ and not vars(cls).get("__bound__")
            for name in vars(cls)
        }
        for name in ("acks_late", "retry_on_worker_lost"):  # bounded by max_retries, unlike reject_on_worker_lost
            if name not in declared:
                celery_options.setdefault(name, True)
        celery_options.setdefault("shared", False)  # a guest: Celery's default adds the job to every app in the process
        mine = {"typing": base.typing} if "typing" in declared else {}
        job_class = base if issubclass(base, McpJob) else type(f"Mcp{base.__name__}", (McpJob, base), mine)
        runtime: WorkerRuntime = self._runtime  # what a job knows of the app (typed: Celery's task() is not)
        job: McpTaskJob[_R] = self.celery.task(base=job_class, mcp_tool=tool, mcp_runtime=runtime, **celery_options)(
            make_run(tool)
        )
        tool.celery_name = job.name
        self._tools[tool.name] = tool
        self.server.add_tool(tool.schema_function(), name=tool.name, description=tool.description)
        return job

    # -- serving ---------------------------------------------------------------------------

    def asgi_app(self, *, host: str = "127.0.0.1", path: str = "/mcp") -> Any:
        """The Starlette app serving the MCP endpoint (uvicorn runs it); its lifespan runs the push listener."""
        self._mcp_path = path
        security = transport_security(host, self.settings.allowed_hosts)
        warn_unless_shared(self._shared_state, str(self.celery.conf.broker_url))
        limit = self.settings.max_request_bytes  # the SDK enforces it; we only say it as JSON-RPC
        app = self.server.streamable_http_app(
            streamable_http_path=path, host=host, transport_security=security, max_request_body_size=limit
        )
        self._app = with_serving(with_request_guards(app, limit), self._serving, path)
        return self._app

    def ops_app(self) -> Any:
        """A Starlette app of the plugins' operations routes (`/metrics`, `/healthz`, `/readyz`), to serve
        apart from the MCP app: `celery-mcp-tasks serve --ops-port`, or a port or mount of your own."""
        from starlette.applications import Starlette

        return Starlette(routes=[route for plugin in self._plugins for route in plugin.routes()])

    def console_app(
        self, *, operator: Callable[[Any], Any] | None = None, path: str = "/console", standalone: bool = False
    ) -> Any:
        """The operators' console (`celery_mcp_tasks.console`), a Starlette app to mount at `path`:

            app = Starlette(routes=[Mount("/console", app=tasks.console_app()), Mount("/", app=tasks.asgi_app())],
                            lifespan=tasks.lifespan)

        Never on the MCP endpoint's path (refused). Operators sign in with MCP_TASKS_CONSOLE_TOKEN,
        or through your application's authentication: `operator(request) -> str | None` (may be async)
        names the operator or refuses. Its live updates run in `tasks.lifespan` (without it, each request
        is refused: 503 and one line saying so). `standalone`: served
        alone at the root (`celery-mcp-tasks console`), with its own push listener in its own lifespan.
        """
        from celery_mcp_tasks.console.app import check_mount_path, create_app, serving
        from celery_mcp_tasks.console.auth import AuthConfig
        from celery_mcp_tasks.console.context import Console

        mount = None if standalone else check_mount_path(path, self._mcp_path or "/mcp")
        console = Console(
            self._service,
            hub=None if self._push.mode == "off" else self._push.hub,
            queue_of=self._queue_of,
            terminable=lambda tool: tool in self._tools and self._tools[tool].terminate,
            stale_timeout_s=self.settings.stale_timeout_s,
            payloads_allowed=self.settings.console_payloads,
            tools=lambda: list(self._tools),
            poll_s=0.1 if self._push.mode in ("poll", "off") else 1.0,
            quota_active=self.settings.quota_active,
        )
        app = create_app(
            console,
            AuthConfig(token=self.settings.console_token, operator=operator),
            lifespan_contexts=[self._push.serving] if standalone else [],
            mount_path=mount,
        )
        if not standalone:
            self._serving_contexts.append(lambda: serving(console))
        return app

    def _queue_of(self, record: TaskRecord) -> str | None:
        """The Celery queue the task's job is sent to, as the dispatcher routes it (None: a tool this app lacks, a
        route by exchange alone, or a router of the user's that fails, as its send would)."""
        if record.tool not in self._tools:
            return None
        try:
            return self._dispatcher.queue_of(record)
        except Exception:  # noqa: BLE001 - a user's router: the console shows no queue rather than a guess
            return None

    def lifespan(self, _parent: Any = None) -> Any:
        """The served app's lifespan (the SDK's session manager, the push listener), for an
        application that mounts `asgi_app()` inside its own Starlette or FastAPI app:

            mcp_app = tasks.asgi_app()
            app = FastAPI(lifespan=tasks.lifespan)
            app.mount("/", mcp_app)          # MCP at /mcp

        A mounted app's own lifespan never runs, so without this push would never start.
        """
        if self._app is None:
            raise RuntimeError("call tasks.asgi_app() before using tasks.lifespan")
        return self._app.router.lifespan_context(self._app)

    def _serving(self, *, exit_signals: bool = True) -> AbstractAsyncContextManager[None]:
        """The served app's life; first the web process's start-up checks, unless this process's command ran
        them (`celery-mcp-tasks serve`, `dev`, `stdio`): an app run by another ASGI server, or mounted in
        one's own, refuses an unmigrated store as `serve` does, not at its first call."""
        if self._checked_pid != os.getpid():
            self._preflight("serve")
        return serving(
            self._push,
            self._listen,
            self._service,
            self._serving_contexts,
            abandon=self._extension.abandon_synchronous_calls,
            exit_signals=exit_signals,
        )


class _Runtime:
    """What plugins (`plugin.Runtime`) and jobs (`worker.job.WorkerRuntime`) know of the app: a narrow view."""

    def __init__(self, tasks: McpTasks) -> None:
        self._tasks = tasks
        self.name, self.settings, self.celery = tasks.name, tasks.settings, tasks.celery
        self.tools: Collection[str] = tasks._tools.keys()  # a live view: tools declared later are in it
        self.heartbeat_interval_s = max(tasks.settings.stale_timeout_s / 4, 0.5)
        self.stale_timeout_s = tasks.settings.stale_timeout_s

    def service(self) -> TaskService:
        return self._tasks._service()  # looked up at each call: the app's own, whatever replaced it


@dataclass(frozen=True)
class Internals:
    """What the package's own commands, benchmarks and tests use of an app beyond its public surface.

    Not for applications: `internals(tasks)` may change in any release.
    """

    tools: Mapping[str, TaskTool]
    push: Push
    listen: TaskListenHandler | None
    plugins: Sequence[Plugin]
    observers: Observers
    serving: Callable[..., AbstractAsyncContextManager[None]]
    """`serving(exit_signals=False)`: what the served app's lifespan runs, for a server that is not ASGI (stdio)."""
    abandon_synchronous_calls: Callable[[str], object]
    service: Callable[[], TaskService]
    """This process's task service (built on first use, rebuilt after a fork)."""
    ledger: Callable[[], Ledger | None]
    """This process's sweep ledger (when the janitor last swept)."""
    sweep: Callable[[], SweepReport]
    """One janitor sweep now, in this process, telling the plugins' `swept` hooks."""
    preflight: Callable[..., None]
    """`preflight(role, need_schema=True)`: raise `ConfigError` if a `role` process must not start."""


def internals(tasks: McpTasks) -> Internals:
    return Internals(
        tools=tasks._tools,
        push=tasks._push,
        listen=tasks._listen,
        plugins=tasks._plugins,
        observers=tasks._observers,
        serving=tasks._serving,
        abandon_synchronous_calls=tasks._extension.abandon_synchronous_calls,
        service=tasks._service,
        ledger=tasks._ledger,
        sweep=tasks._sweep,
        preflight=tasks._preflight,
    )


def quota_of(settings: Settings) -> Quota | None:
    """Each principal's limits as the settings give them; None when every one is unlimited (the default)."""
    quota = Quota(
        active=settings.quota_active,
        active_tool=settings.quota_active_per_tool,
        creations=settings.quota_creations,
        window_ms=round(settings.quota_window_s * 1000),
    )
    return None if quota.unlimited else quota


def _secret(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


@contextmanager
def _refusing_to_start() -> Iterator[None]:
    """A wrong setting stops the process with one line naming it: a `SystemExit`, not a traceback, which
    `celery -A app worker` would wrap in its 40-line "Unable to load celery application"."""
    try:
        yield
    except ConfigError as exc:
        raise SystemExit(f"celery-mcp-tasks: configuration error: {exc}") from None


def _chosen(explicit: Sequence[Plugin], settings: Settings) -> list[Plugin]:
    """The plugins given, then those the settings turn on whose kind was not given (the code's wins)."""
    given = list(explicit)
    kinds = {type(plugin) for plugin in given}
    try:
        by_setting = plugins_from_settings(settings)
    except ImportError as exc:
        raise SystemExit(f"celery-mcp-tasks: configuration error: a plugin could not be imported: {exc}") from None
    return given + [plugin for plugin in by_setting if type(plugin) not in kinds]


def _serving(plugin: Plugin) -> Callable[[], AbstractAsyncContextManager[Any]]:
    def context() -> AbstractAsyncContextManager[Any]:
        entered = plugin.serving()
        return entered if entered is not None else nullcontext()

    return context


class _SweptHook(Plugin):
    """`McpTasks(metric=fn)`, deprecated: `fn` told of every sweep, as a plugin's `swept` hook is."""

    def __init__(self, hook: MetricHook) -> None:
        self._hook = hook

    def swept(self, name: str, counts: dict[str, int]) -> None:
        self._hook(name, counts)


def _metric_shim(metric: MetricHook | None) -> list[Plugin]:
    """The README once showed `McpTasks(..., metric=fn)`: it still works, as a plugin, with a warning."""
    if metric is None:
        return []
    warnings.warn(
        "McpTasks(metric=...) is deprecated: list a plugin with a `swept` hook in `plugins=[...]`"
        " (celery_mcp_tasks.plugin.Plugin)",
        DeprecationWarning,
        stacklevel=3,
    )
    return [_SweptHook(metric)]


def _each(hooks: Sequence[Callable[[str, Any], None]]) -> Callable[[str, Any], None] | None:
    """One callback telling each of the plugins' `hooks` in turn: one that raises is logged, never raised."""
    if not hooks:
        return None

    def tell(name: str, detail: Any) -> None:
        for hook in hooks:
            try:
                hook(name, detail)
            except Exception:
                logger.exception("plugin hook %s raised", getattr(hook, "__qualname__", "?"))

    return tell
