"""The wrapped server as a child process that the proxy speaks MCP to over its stdin and stdout.

The SDK's stdio_client keeps its process to itself, but the proxy has to know when the wrapped
server has exited, and how: then the proxy must stop too, since a host cannot otherwise tell that
every tool behind it is gone. This is that transport with the process in hand. Its shutdown is the
one the MCP spec asks for: close the server's stdin, give it time to exit, then end its process
group (with the SDK's own helper).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass

import anyio
import anyio.abc
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from anyio.streams.text import TextReceiveStream
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage

from checkpointd_client.mcp_proxy.options import StdioUpstream

logger = logging.getLogger(__name__)

# After its stdin is closed, the server has this long to exit before its process group is signalled.
EXIT_GRACE_S = 2.0
# Between that SIGTERM and the SIGKILL.
TERMINATE_GRACE_S = 2.0
# Messages the session already handed over get this long to reach the server before its stdin closes.
FLUSH_S = 0.5
# How often the exit status is looked at (process.wait() would also wait for every copy of its pipes).
EXIT_POLL_S = 0.1

_PIPE_CLOSED = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError)

ReadStream = MemoryObjectReceiveStream[SessionMessage | Exception]
WriteStream = MemoryObjectSendStream[SessionMessage]


def describe_exit(returncode: int) -> str:
    """How a process ended, as a shell user would say it."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = "an unknown signal"
    return f"was killed by signal {-returncode} ({name})"


class UpstreamGone(Exception):
    """The wrapped server is gone for good, so the proxy stops; the message says which and why."""


class UpstreamExited(UpstreamGone):
    """The wrapped server's process ended on its own."""

    def __init__(self, command: str, returncode: int, *, when: str = "") -> None:
        self.command = command
        self.returncode = returncode
        super().__init__(f"the wrapped MCP server ({command}) {describe_exit(returncode)}{when}")


@dataclass(frozen=True)
class UpstreamProcess:
    """The wrapped server's process, to learn when and how it ended."""

    process: anyio.abc.Process
    command: str

    async def exited(self, *, when: str = "") -> UpstreamExited:
        """Wait until the process has exited; why it did, as an exception to raise."""
        while (returncode := self.process.returncode) is None:
            await anyio.sleep(EXIT_POLL_S)
        return UpstreamExited(self.command, returncode, when=when)

    async def exited_within(self, seconds: float, *, when: str = "") -> UpstreamExited | None:
        with anyio.move_on_after(seconds):
            return await self.exited(when=when)
        return None


def _parse_line(line: str) -> SessionMessage | Exception:
    """One line of the server's stdout; what is not JSON-RPC goes to the session as an error value."""
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as error:
        logger.warning("the wrapped MCP server wrote a line that is not JSON-RPC: %.200s", line)
        return error


@asynccontextmanager
async def stdio_transport(upstream: StdioUpstream) -> AsyncIterator[tuple[ReadStream, WriteStream, UpstreamProcess]]:
    """Start the server (its stderr is the proxy's, which the host logs) and bridge its pipes to
    the streams an SDK ClientSession reads and writes; stop it on exit."""
    process = await anyio.open_process(
        [upstream.command, *upstream.args],
        env=dict(upstream.env),
        cwd=upstream.cwd,
        stderr=None,
        start_new_session=True,  # its own process group, so stopping it reaches its children
    )
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    writer_done = anyio.Event()

    async def read_stdout() -> None:
        assert process.stdout is not None
        try:
            async with read_writer:
                buffer = ""
                async for chunk in TextReceiveStream(process.stdout, errors="replace"):
                    *lines, buffer = (buffer + chunk).split("\n")
                    for line in lines:
                        if line.strip():
                            await read_writer.send(_parse_line(line))
        except _PIPE_CLOSED:
            pass  # the session is gone (we are stopping), or the server closed its stdout
        # Keep reading, so a server still writing is not blocked and can see its stdin close.
        with suppress(*_PIPE_CLOSED):
            while True:
                await process.stdout.receive()

    async def write_stdin() -> None:
        assert process.stdin is not None
        try:
            async with write_reader:
                async for message in write_reader:
                    line = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await process.stdin.send(line.encode())
        except _PIPE_CLOSED:
            # The server no longer reads: end the session's stream so no request waits forever.
            await read_writer.aclose()
        finally:
            writer_done.set()

    async with anyio.create_task_group() as pipes:
        pipes.start_soon(read_stdout)
        pipes.start_soon(write_stdin)
        try:
            yield read_stream, write_stream, UpstreamProcess(process, upstream.describe())
        finally:
            # Bounded at every step, and shielded: a cancelled proxy must not leave the server running.
            with anyio.CancelScope(shield=True):
                read_stream.close()
                write_stream.close()
                with anyio.move_on_after(FLUSH_S):
                    await writer_done.wait()
                await _stop(process)
            pipes.cancel_scope.cancel()


async def _stop(process: anyio.abc.Process) -> None:
    """Close the server's stdin (the spec's way to ask it to exit), then end its process group."""
    assert process.stdin is not None and process.stdout is not None
    with suppress(*_PIPE_CLOSED):
        await process.stdin.aclose()
    watched = UpstreamProcess(process, "")
    if await watched.exited_within(EXIT_GRACE_S) is None:
        await terminate_posix_process_tree(process, TERMINATE_GRACE_S)
        if await watched.exited_within(TERMINATE_GRACE_S) is None:
            logger.warning("the wrapped MCP server (pid %d) is still running after SIGKILL; leaving it", process.pid)
    with suppress(*_PIPE_CLOSED):
        await process.stdout.aclose()
