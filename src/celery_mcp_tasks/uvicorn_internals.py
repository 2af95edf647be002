"""Every place this package relies on uvicorn past its documented API, in one module (checked: uvicorn 0.55).

`tests/test_uvicorn_internals.py` fails, naming uvicorn's version, as soon as it moves.

1. `on_server_exit`: chains onto the SIGTERM/SIGINT handler uvicorn's `Server.capture_signals` installs
   (`Server.handle_exit`), since an open listen stream keeps uvicorn from ever running the lifespan's
   shutdown. A shutdown hook in the MCP SDK's session manager that ends open SSE streams would remove it.
2. `has_started` and `stop`: `dev --call` serves on a thread, calls once `Server.started` is set (the lifespan
   has started and the socket accepts), then ends the server with `Server.should_exit`: plain attributes of
   uvicorn's `Server`, which its docs do not name.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import uvicorn


def on_server_exit(callback: Callable[[], None]) -> Callable[[], None]:
    """Run `callback` on the loop when the server is told to exit; returns the undo.

    Chains onto a handler the server installed (uvicorn's `handle_exit`), and
    only from the main thread, where signal handlers live; otherwise a no-op.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return lambda: None
    previous: dict[int, Callable[[int, FrameType | None], Any]] = {}

    def handler(signum: int, frame: FrameType | None) -> None:
        loop.call_soon_threadsafe(callback)  # never touch the loop's state from inside a signal handler
        prior = previous.get(signum)
        if prior is not None:
            prior(signum, frame)

    for sig in (signal.SIGTERM, signal.SIGINT):
        prior = signal.getsignal(sig)
        if callable(prior):
            previous[sig] = prior
            signal.signal(sig, handler)

    def restore() -> None:
        for sig, prior in previous.items():
            if signal.getsignal(sig) is handler:
                signal.signal(sig, prior)

    return restore


def has_started(server: uvicorn.Server) -> bool:
    """Whether `server` accepts connections: its lifespan has started and its sockets listen."""
    return bool(server.started)


def stop(server: uvicorn.Server) -> None:
    """Tell `server` (serving on another thread) to shut down gracefully, as its signal handler does."""
    server.should_exit = True
