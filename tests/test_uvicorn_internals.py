"""Contract test for what this package relies on of uvicorn (`celery_mcp_tasks.uvicorn_internals`): it fails
with the installed uvicorn's version in its message the day that moves."""

from __future__ import annotations

import asyncio
import signal

import pytest
import uvicorn

from celery_mcp_tasks.uvicorn_internals import on_server_exit

WHERE = f"uvicorn {uvicorn.__version__}: its exit handler moved; update celery_mcp_tasks/uvicorn_internals.py"


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
