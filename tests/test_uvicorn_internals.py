"""Contract test for what this package relies on of uvicorn (`celery_mcp_tasks.uvicorn_internals`): it fails
with the installed uvicorn's version in its message the day that moves."""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
import time

import pytest
import uvicorn

from celery_mcp_tasks.uvicorn_internals import has_started, on_server_exit, stop

WHERE = f"uvicorn {uvicorn.__version__}: what celery_mcp_tasks/uvicorn_internals.py relies on moved; update it"


def test_on_server_exit_chains_onto_the_handler_uvicorn_installs(monkeypatch: pytest.MonkeyPatch) -> None:
    """uvicorn installs `Server.handle_exit` with `signal.signal` while it serves; ours runs first, then its."""
    raised: list[int] = []
    monkeypatch.setattr(signal, "raise_signal", raised.append)  # uvicorn re-raises a captured signal on its way out
    server = uvicorn.Server(uvicorn.Config(app=None))
    heard: list[str] = []

    async def serving() -> None:
        with server.capture_signals():
            assert signal.getsignal(signal.SIGTERM) == server.handle_exit, WHERE
            restore = on_server_exit(lambda: heard.append("exit"))
            handler = signal.getsignal(signal.SIGTERM)
            assert callable(handler) and handler != server.handle_exit, WHERE
            handler(signal.SIGTERM, None)
            await asyncio.sleep(0)  # the callback runs on the loop, never inside the signal handler
            restore()
            assert signal.getsignal(signal.SIGTERM) == server.handle_exit, WHERE

    asyncio.run(serving())
    assert heard == ["exit"]
    assert server.should_exit, WHERE  # uvicorn's own handler ran after ours
    assert raised == [signal.SIGTERM], WHERE


def test_a_server_on_a_thread_says_when_it_accepts_and_stops_when_told() -> None:
    """`dev --call`: serve on a thread, call once the server accepts, then end it gracefully."""

    async def app(scope: dict[str, object], receive: object, send: object) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":  # type: ignore[operator]
                await send({"type": "lifespan.startup.complete"})  # type: ignore[operator]
            await send({"type": "lifespan.shutdown.complete"})  # type: ignore[operator]

    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning"))
    assert not has_started(server), WHERE
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not has_started(server) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert has_started(server), WHERE
    socket.create_connection(sock.getsockname(), timeout=5).close()  # it accepts once it says so
    stop(server)
    thread.join(timeout=10)
    assert not thread.is_alive(), WHERE
