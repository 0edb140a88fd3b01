"""The host's stdin as lines for the SDK's stdio server, read by a daemon thread.

The SDK reads stdin in a worker thread that a cancellation cannot interrupt, so a proxy told to
stop (SIGTERM) while the host keeps its end of the pipe open would never exit, and the wrapped
server would never be stopped. A daemon thread handing lines over a memory stream lets the event
loop stop at once; the thread is left blocked in its read and dies with the process.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import threading
from typing import Any, Self

import anyio
from anyio.from_thread import run as run_in_event_loop
from anyio.lowlevel import EventLoopToken, current_token

#: A JSON escape of a UTF-16 surrogate (lone or half of a pair).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def without_lone_surrogates(line: str) -> str:
    """``line`` with each lone UTF-16 surrogate escape (valid JSON, and what a JavaScript host's
    JSON.stringify writes for such a string) replaced by U+FFFD, as invalid UTF-8 is: the SDK's
    parser rejects them, and drops the message without an answer, so the host's call would hang."""
    if _SURROGATE_ESCAPE.search(line) is None:
        return line
    try:
        message = json.loads(line)
    except ValueError:
        return line  # the SDK reports it as it reports any line that is not JSON
    return json.dumps(_replaced(message), ensure_ascii=False) + ("\n" if line.endswith("\n") else "")


def _replaced(value: Any) -> Any:
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_replaced(item) for item in value]
    if isinstance(value, dict):
        return {_replaced(key): _replaced(item) for key, item in value.items()}
    return value


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
                text = without_lone_surrogates(line.decode("utf-8", errors="replace"))
                run_in_event_loop(self._send.send, text, token=self._token)
        with contextlib.suppress(Exception):
            run_in_event_loop(self._send.aclose, token=self._token)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> str:
        try:
            return await self._receive.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None
