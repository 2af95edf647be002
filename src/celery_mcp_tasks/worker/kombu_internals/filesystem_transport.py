"""kombu's `filesystem://` transport (the embedded default's broker), safe for a reader and a writer at once.

kombu 5.7.0's `Channel._put` creates the message file under its final name and writes it afterwards; a
`_get` in another process that comes between reads an empty or half-written file, and the `JSONDecodeError`
ends the worker ("Unrecoverable error"). Here a message is written as `....msg.part` and renamed into place
(atomic within a folder); a reader that still meets an unreadable file (from a writer without this fix)
waits briefly, then logs one line and moves on. kombu also opens a new exchange table (`control/*.exchange`)
with "wb" before taking its lock, so two processes declaring queues at once can lose one's queue or parse
an empty file: here a new table is written aside and linked into place only if absent. Celery's loop for a
transport like this one (`synloop`) drains 2 s at a time and once more after a stop was asked, so an idle
worker took ~4 s to notice Ctrl-C (and `dev` killed it before its warm shutdown ended): here a wait with a
timeout is drained in slices, and ends as timed out once the worker was told to stop. That relies on kombu's
`Transport.drain_events` raising `socket.timeout` once a wait found nothing, and on Celery's `synloop` draining
with a timeout (both pinned by the tests).

A guest: its folders are made when a connection is established, not when an app is configured, and it
declares no default host (kombu would warn "No hostname was supplied"). `McpTasks` selects it for
`filesystem://` unless the application set `broker_transport`; tests/worker/test_filesystem_transport.py
names the kombu version whose `_put`, `_get` and `_queue_bind` it overrides.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from queue import Empty
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem as kombu_filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

from celery_mcp_tasks.worker.celery_internals import stop_requested

logger = logging.getLogger("celery_mcp_tasks.worker")

PARTIAL_SUFFIX = ".part"
_SLICE_S = 0.25  # a drain's longest wait before it looks whether the worker is stopping
_SETTLE_S = (0.01, 0.05, 0.2)  # how long a reader waits, in steps, for a writer without the fix


class Channel(kombu_filesystem.Channel):
    # kombu's own classes disagree on the parameter's name (AbstractChannel: message; filesystem: payload)
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """Write the message under a name readers skip, then rename it into place (atomic)."""
        name = f"{round(time.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = final + PARTIAL_SUFFIX
        try:
            with open(partial, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {name!r} to directory") from exc

    def _queue_bind(self, exchange: Any, routing_key: Any, pattern: Any, queue: Any) -> None:
        """kombu's, except that a new exchange table appears whole (linked into place only if absent)."""
        table: Path = self._exchange_file(exchange)  # type: ignore[no-untyped-call]
        self.control_folder.mkdir(exist_ok=True)
        if not table.exists():
            entry = [kombu_filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")]
            partial = table.with_name(f"{table.name}.{uuid.uuid4().hex}{PARTIAL_SUFFIX}")
            try:
                partial.write_bytes(str_to_bytes(dumps(entry)))
                os.link(partial, table)  # fails when another process created the table first
                return
            except FileExistsError:
                pass  # it exists now, whole: add this queue to it under the lock (kombu's own path)
            except OSError as exc:
                raise ChannelError(f"Cannot create the exchange table {table.name!r}") from exc
            finally:
                partial.unlink(missing_ok=True)
        super()._queue_bind(exchange, routing_key, pattern, queue)  # type: ignore[no-untyped-call]

    def _get(self, queue: Any, timeout: Any = None) -> Any:
        """The oldest whole message of `queue`; an unreadable one is skipped with a log line."""
        wanted = f"{queue}.msg"
        for name in sorted(os.listdir(self.data_folder_in)):
            if name.partition(".")[2] != wanted:
                continue  # another queue's message, or one still being written (.part)
            target = self.processed_folder if self.store_processed else tempfile.gettempdir()
            try:
                shutil.move(os.path.join(self.data_folder_in, name), target)
            except OSError:
                continue  # another consumer took it first
            path = os.path.join(target, name)
            payload = self._read_whole(path)
            if not self.store_processed:
                try:
                    os.remove(path)
                except OSError:
                    pass
            if payload is None:
                logger.error("filesystem broker: skipped an unreadable message file of queue %s", queue)
                continue
            return payload
        raise Empty()

    @staticmethod
    def _read_whole(path: str) -> Any:
        """The message in `path`, waiting briefly for a writer still at it; None when it never becomes whole."""
        for pause in (*_SETTLE_S, None):
            try:
                with open(path, "rb") as f:
                    raw = f.read()
            except OSError as exc:
                raise ChannelError(f"Cannot read file {path!r} from queue.") from exc
            try:
                return loads(bytes_to_str(raw))
            except ValueError:
                if pause is None:
                    return None
                time.sleep(pause)
        return None


FOLDER_OPTIONS = ("data_folder_in", "data_folder_out", "control_folder")
"""The transport options naming the folders every connection uses (`processed_folder` only with `store_processed`)."""


class Transport(kombu_filesystem.Transport):
    Channel = Channel

    @property
    def default_connection_params(self) -> dict[str, Any]:
        """kombu's virtual transports default to host "localhost" (and warn when a URL names none): none here."""
        return {"port": self.default_port}

    def establish_connection(self) -> Any:
        """The folders the transport options name, made if missing, before kombu's first channel."""
        client: Any = self.client  # the kombu Connection this transport serves (set by its constructor)
        options = client.transport_options
        names = [*FOLDER_OPTIONS, *(["processed_folder"] if options.get("store_processed") else [])]
        for folder in dict.fromkeys(options[name] for name in names if options.get(name)):
            try:
                Path(folder).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ChannelError(f"cannot make the broker's folder {folder}: {exc.strerror or exc}") from exc
        return super().establish_connection()  # type: ignore[no-untyped-call]

    def drain_events(self, connection: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        """kombu's, waiting at most `_SLICE_S` at a time: a wait with a timeout ends as timed out (what the caller
        handles already) as soon as the worker was told to stop. Without a timeout, kombu's own wait."""
        if timeout is None:
            return super().drain_events(connection, **kwargs)  # type: ignore[no-untyped-call]
        deadline = time.monotonic() + timeout
        while not stop_requested():  # no new job once stopping (Celery drains once more after the stop)
            try:
                left = max(deadline - time.monotonic(), 0.0)
                return super().drain_events(connection, timeout=min(left, _SLICE_S), **kwargs)  # type: ignore[no-untyped-call]
            except TimeoutError:  # socket.timeout, what kombu raises once a wait found nothing
                if time.monotonic() >= deadline:
                    raise
        raise TimeoutError("the worker is stopping")
