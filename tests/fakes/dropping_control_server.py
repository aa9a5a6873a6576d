"""FAKE control endpoint server that drops connections: a fault injector for tunelab's control calls.

This is a fake, for tests only. It serves fixed answers per path over plain HTTP/1.1 (keep-alive) from its own
thread and event loop, so sync and async clients both reach it, and it drops the first ``drop_first``
connections: it reads the request, then closes the socket without an answer, as a server that had just closed a
keep-alive connection (httpx then raises ``RemoteProtocolError: Server disconnected without sending a response``).

``routes``: path -> (status, body bytes, content type); an unknown path gets 404. ``paths`` lists every request
the fake read, dropped ones included, in order; ``dropped`` counts the dropped connections.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

__all__ = ["DroppingControlServer", "json_route"]


def json_route(obj: Any, status: int = 200) -> tuple[int, bytes, str]:
    """A route answering ``obj`` as JSON with ``status``."""
    return status, json.dumps(obj).encode(), "application/json"


class DroppingControlServer:
    """Context manager: starts the fake on a free port of 127.0.0.1 (``base_url``) and stops it on exit."""

    def __init__(self, routes: dict[str, tuple[int, bytes, str]], drop_first: int = 1) -> None:
        self.routes = routes
        self.drop_first = drop_first
        self.paths: list[str] = []
        self.dropped = 0
        self._connections = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.base_url = ""

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        drop = self._connections <= self.drop_first
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                length = next((int(ln.split(":", 1)[1]) for ln in lines if ln.lower().startswith("content-length:")),
                              0)
                if length:
                    await reader.readexactly(length)
                self.paths.append(path)
                if drop:
                    self.dropped += 1
                    break  # closes without an answer
                status, body, ctype = self.routes.get(path, (404, b'{"detail":"Not Found"}', "application/json"))
                writer.write(f"HTTP/1.1 {status} X\r\ncontent-type: {ctype}\r\ncontent-length: {len(body)}\r\n\r\n"
                             .encode() + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def __enter__(self) -> "DroppingControlServer":
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop).result(10)
        port = self._server.sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: Any) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
