"""Polling transport, for the embedded default (SQLite + filesystem broker), which has no fan-out.

Every ~100 ms the web process reads the versions of the rows its streams watch, in one read (the store
binds them in batches), and hints the hub about each version it has not seen. Nothing is published (every
write bumps the version); nothing is read while no stream is open.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import anyio
import anyio.to_thread

from celery_mcp_tasks.notify.hub import Hub
from celery_mcp_tasks.outage_log import OutageLog

logger = logging.getLogger(__name__)

_INTERVAL_S = 0.1


class RowPoller:
    def __init__(self, versions: Callable[[Iterable[str]], dict[str, int]], hub: Hub) -> None:
        self._versions = versions
        self._hub = hub
        self._seen: dict[str, int] = {}
        self._outage = OutageLog(logger)  # a store outage: said once, and once more when it is over
        self.ready = anyio.Event()

    async def poll_once(self) -> None:
        keys = self._hub.watched_keys()
        if not keys:
            self._seen.clear()
            return
        try:
            found = await anyio.to_thread.run_sync(self._versions, keys)
        except Exception as exc:  # noqa: BLE001 - a locked or unreachable store: try again next tick
            self._outage.failed("task change poll failed (%s); retrying", type(exc).__name__)
            return
        self._outage.answered("task change poll reads the store again")
        for key, version in found.items():
            # A key seen for the first time is hinted too: its stream may have read it
            # just before a change, and it drops a hint that brings nothing new.
            if self._seen.get(key) != version:
                self._hub.hint(key, version)
        self._seen = found

    async def run(self) -> None:
        self.ready.set()
        while True:
            await self.poll_once()
            await anyio.sleep(_INTERVAL_S)
