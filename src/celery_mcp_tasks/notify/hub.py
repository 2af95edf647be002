"""The in-process hub: a hint about a row wakes the listen streams watching it.

One per web process. Transports feed it hints `(row key, version)`; streams register the keys they
follow. A hint is only a nudge: the stream re-reads the row, checks the owner and decides what to send,
so a lost or duplicated hint costs latency, never correctness, and a burst for one row coalesces into one
wake-up. Keys in, wake-ups out: no task ids, owners or wire. It runs on the event loop; a transport's
thread hands them over with `from_thread`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import anyio
import anyio.from_thread
import anyio.lowlevel

logger = logging.getLogger(__name__)


class Watch:
    """One stream's registration: the keys it follows and the hints not yet taken.

    Usable without a hub (push off): it is then only the stream's wake-up for
    other inputs (core events, shutdown) through `wake`.
    """

    def __init__(self, keys: Iterable[str] = (), hub: Hub | None = None, *, every: bool = False) -> None:
        self._keys = set(keys)
        self._hub = hub
        self.every = every  # follows every key (the console), not a given set
        self._pending: dict[str, int | None] = {}
        self._event = anyio.Event()
        self.resynced = False  # an every-key watch: hints may have been lost, its owner re-reads what it shows

    def offer(self, key: str, version: int | None) -> None:
        """Record a hint (keeping the highest version seen; None: "re-read to find out") and wake the stream."""
        if not self.every and key not in self._keys:
            return
        if key in self._pending:
            known = self._pending[key]
            version = None if known is None or version is None else max(known, version)
        self._pending[key] = version
        self._event.set()

    def wake(self) -> None:
        self._event.set()

    async def next(self, timeout: float | None = None) -> dict[str, int | None] | None:  # noqa: ASYNC109 - None on timeout, not an exception
        """Wait until woken, then take the pending hints (maybe none); None when `timeout` s passed first."""
        if not self._event.is_set():
            with anyio.move_on_after(timeout):
                await self._event.wait()
            if not self._event.is_set():
                return None
        self._event = anyio.Event()
        taken, self._pending = self._pending, {}
        return taken

    def forget(self, key: str) -> None:
        """Stop following `key` (its task finished, or it is not the caller's)."""
        self._keys.discard(key)
        self._pending.pop(key, None)
        if self._hub is not None:
            self._hub._unindex(self, [key])

    def close(self) -> None:
        """Unregister; idempotent, and wakes a stream still waiting on it."""
        if self._hub is not None:
            self._hub._every.discard(self)
            self._hub._unindex(self, self._keys)
        self._keys.clear()
        self._pending.clear()
        self._event.set()


class Hub:
    """Routes hints to the watches that follow a key. One per web process."""

    def __init__(self) -> None:
        self._by_key: dict[str, set[Watch]] = {}
        self._every: set[Watch] = set()
        self._token: anyio.lowlevel.EventLoopToken | None = None
        self._followed: anyio.Event | None = None  # made on the loop, by the first `until_followed`

    def bind(self) -> None:
        """Remember the running event loop so threads can hand hints over. Call from the loop."""
        self._token = anyio.lowlevel.current_token()

    def watch(self, keys: Iterable[str]) -> Watch:
        watch = Watch(keys, self)
        for key in watch._keys:
            self._by_key.setdefault(key, set()).add(watch)
        self._follow_changed()
        return watch

    def watch_every(self) -> Watch:
        """A watch hinted about every key (the operators' console): one per process, fanned out by its owner.

        It adds nothing to `watched_keys`: the polling transport cannot poll every row, so
        under polling its owner finds changed rows itself.
        """
        watch = Watch((), self, every=True)
        self._every.add(watch)
        self._follow_changed()
        return watch

    def _unindex(self, watch: Watch, keys: Iterable[str]) -> None:
        for key in keys:
            watchers = self._by_key.get(key)
            if watchers is None:
                continue
            watchers.discard(watch)
            if not watchers:
                del self._by_key[key]
        self._follow_changed()

    @property
    def followed(self) -> bool:
        """Whether some watch follows a row (or every row): only then is a transport's hint of use here."""
        return bool(self._by_key or self._every)

    async def until_followed(self) -> None:
        """Return once some watch follows a row (at once if one does)."""
        while not self.followed:
            if self._followed is None or self._followed.is_set():
                self._followed = anyio.Event()
            await self._followed.wait()

    def _follow_changed(self) -> None:
        if self._followed is not None and self.followed:
            self._followed.set()

    def watched_keys(self) -> list[str]:
        """Every key some stream follows (the polling transport asks for these rows)."""
        return list(self._by_key)

    @property
    def watch_count(self) -> int:
        return len({watch for watchers in self._by_key.values() for watch in watchers} | self._every)

    def hint(self, key: str, version: int | None) -> None:
        """A row changed (on the loop). Unwatched keys cost one dict lookup (and the every-key watches)."""
        for watch in [*self._by_key.get(key, ()), *self._every]:
            watch.offer(key, version)

    def resync(self) -> None:
        """Wake every stream to re-read everything it follows (hints may have been lost)."""
        for key, watchers in self._by_key.items():
            for watch in watchers:
                watch.offer(key, None)
        for watch in self._every:
            watch.resynced = True
            watch.wake()

    def from_thread(self, fn: Callable[..., None], *args: object) -> None:
        """Run `hint` or `resync` from a transport thread. Dropped (harmlessly) when the loop is gone."""
        if self._token is None:
            logger.debug("hub not bound to a loop yet; hint dropped")
            return
        try:
            anyio.from_thread.run_sync(fn, *args, token=self._token)
        except (RuntimeError, anyio.RunFinishedError):
            logger.debug("event loop gone; hint dropped")
