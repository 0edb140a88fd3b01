"""The host's stdin as lines for the SDK's stdio server, read by a daemon thread.

The SDK reads stdin in a worker thread that a cancellation cannot interrupt, so a proxy told to
stop (SIGTERM) while the host keeps its end of the pipe open would never exit, and the wrapped
server would never be stopped. A daemon thread handing lines over a memory stream lets the event
loop stop at once; the thread is left blocked in its read and dies with the process.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Self

import anyio
from anyio.from_thread import run as run_in_event_loop
from anyio.lowlevel import EventLoopToken, current_token


class HostStdin:
    """Async iteration over the lines of stdin (text, UTF-8); ends at end of input."""

    def __init__(self) -> None:
        self._send, self._receive = anyio.create_memory_object_stream[str](1)
        self._token: EventLoopToken | None = None

    def start(self) -> Self:
        """Start reading; call from the event loop that will iterate."""
        self._token = current_token()
        # A private descriptor, so nothing else that reads fd 0 takes the host's messages.
        stream = os.fdopen(os.dup(sys.stdin.fileno()), "rb", buffering=0)
        threading.Thread(target=self._read, args=(stream,), name="mcp-proxy-stdin", daemon=True).start()
        return self

    def _read(self, stream) -> None:
        # Any failure means no more input: the event loop has ended, or the host's pipe broke.
        with contextlib.suppress(Exception), stream:
            for line in iter(stream.readline, b""):
                run_in_event_loop(self._send.send, line.decode("utf-8", errors="replace"), token=self._token)
        with contextlib.suppress(Exception):
            run_in_event_loop(self._send.aclose, token=self._token)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> str:
        try:
            return await self._receive.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None
