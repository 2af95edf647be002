"""`celery-mcp-tasks dev`'s own listening socket: accepted connections as fast as uvicorn's own."""

from __future__ import annotations

import asyncio
import socket

from celery_mcp_tasks.cli.dev import bind_port


def test_connections_accepted_on_the_dev_socket_have_tcp_nodelay() -> None:
    """asyncio sets TCP_NODELAY only on a listening socket made with IPPROTO_TCP (DESIGN.md decision 17)."""
    sock = bind_port("127.0.0.1", 0)
    assert sock.proto == socket.IPPROTO_TCP
    port = sock.getsockname()[1]
    accepted: list[int] = []

    async def main() -> None:
        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_connect, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(200):
                if accepted:
                    break
                await asyncio.sleep(0.01)
            writer.close()

    asyncio.run(main())
    assert accepted and accepted[0] != 0, "accepted connections lack TCP_NODELAY: every response waits a delayed ACK"
