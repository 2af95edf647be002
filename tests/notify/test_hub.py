"""The in-process hub and the row poller, with no servers."""

from __future__ import annotations

import threading
from collections.abc import Iterable

import anyio
import pytest

from celery_mcp_tasks.notify.hub import Hub, Watch
from celery_mcp_tasks.notify.polling import RowPoller

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_hint_wakes_only_the_streams_watching_that_row() -> None:
    hub = Hub()
    a, b = hub.watch(["k1", "k2"]), hub.watch(["k2"])
    hub.hint("k1", 3)
    assert await a.next(0) == {"k1": 3}
    assert await b.next(0) is None  # not woken: timed out


async def test_hints_for_one_row_coalesce_to_the_newest_version() -> None:
    hub = Hub()
    watch = hub.watch(["k"])
    for version in (2, 5, 4):
        hub.hint("k", version)
    assert await watch.next(0) == {"k": 5}


async def test_an_unknown_version_means_re_read_and_wins_over_known_ones() -> None:
    hub = Hub()
    watch = hub.watch(["k"])
    hub.hint("k", 7)
    hub.resync()
    hub.hint("k", 9)
    assert await watch.next(0) == {"k": None}


async def test_a_forgotten_or_closed_watch_hears_nothing_and_is_unindexed() -> None:
    hub = Hub()
    watch, other = hub.watch(["k1", "k2"]), hub.watch(["k3"])
    watch.forget("k1")
    hub.hint("k1", 2)
    assert await watch.next(0) is None
    assert sorted(hub.watched_keys()) == ["k2", "k3"]
    other.close()
    assert hub.watched_keys() == ["k2"]
    assert hub.watch_count == 1


async def test_a_wake_without_hints_returns_an_empty_batch() -> None:
    watch = Watch()
    watch.wake()
    assert await watch.next(5) == {}


async def test_threads_hand_hints_to_the_loop() -> None:
    hub = Hub()
    hub.bind()
    watch = hub.watch(["k"])
    thread = threading.Thread(target=hub.from_thread, args=(hub.hint, "k", 4))
    thread.start()
    with anyio.fail_after(10):
        got = await watch.next(10)
    await anyio.to_thread.run_sync(thread.join)
    assert got == {"k": 4}


async def test_the_poller_hints_new_and_changed_rows_and_reads_nothing_when_nobody_listens() -> None:
    rows = {"k1": 1, "k2": 1}
    asked: list[list[str]] = []

    def versions(keys: Iterable[str]) -> dict[str, int]:
        wanted = list(keys)
        asked.append(wanted)
        return {key: rows[key] for key in wanted if key in rows}

    hub = Hub()
    poller = RowPoller(versions, hub)
    await poller.poll_once()
    assert asked == []  # no stream, no query

    watch = hub.watch(["k1", "k2", "gone"])
    await poller.poll_once()
    assert await watch.next(0) == {"k1": 1, "k2": 1}  # first sight is hinted: the stream drops what it has seen
    await poller.poll_once()
    assert await watch.next(0) is None  # nothing changed
    rows["k2"] = 2
    await poller.poll_once()
    assert await watch.next(0) == {"k2": 2}
    assert len(asked) == 3  # one batched query per tick


async def test_the_hub_says_whether_any_watch_follows_a_row() -> None:
    """What a transport asks before it listens: a stream that follows no task does not count."""
    hub = Hub()
    woken: list[bool] = []

    async def until_followed() -> None:
        await hub.until_followed()
        woken.append(True)

    empty = hub.watch([])
    assert not hub.followed
    async with anyio.create_task_group() as tg:
        tg.start_soon(until_followed)
        await anyio.wait_all_tasks_blocked()
        assert not woken
        watch = hub.watch(["k1"])
        await anyio.wait_all_tasks_blocked()
        assert woken and hub.followed
    watch.forget("k1")
    assert not hub.followed
    every = hub.watch_every()
    assert hub.followed
    every.close()
    empty.close()
    assert not hub.followed
