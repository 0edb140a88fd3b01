"""CheckpointService: proto in, domain call, proto out. No logic of its own.

A Rollback or a DiffCheckpoints hands the domain a ``Cancellation``, set when the caller gives up:
on the asyncio server when the transport cancels the handler (the caller cancelled, its deadline
passed, the server stops), on a sync server by the call's termination callback. Its capture then
stops at its next check, unless it reached its commit point (see ``core.kernel.cancellation``).
A CreateCheckpoint runs to its end even so: a capture abandoned at each deadline would never be
recorded for a workspace whose capture outlasts the caller's deadline, where the one that goes on
is the base that makes the next capture quick, and a retry with its request_id gets it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import Executor
from typing import TypeVar

import grpc

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from checkpointd.api import convert
from checkpointd.api.interceptors import why_ended
from checkpointd.core.engine.checkpoints import Checkpoints
from checkpointd.core.engine.contents import Contents
from checkpointd.core.engine.pending_writes import PendingWrite
from checkpointd.core.engine.plans import Plans
from checkpointd.core.engine.requests import CreateRequest, RollbackRequest, Scope
from checkpointd.core.kernel.cancellation import NEVER, Cancellation

T = TypeVar("T")


class CheckpointServicer(pb_grpc.CheckpointServiceServicer):
    def __init__(self, checkpoints: Checkpoints) -> None:
        self.checkpoints = checkpoints
        self.plans = Plans(checkpoints.db, checkpoints.page_tokens)
        self.contents = Contents(checkpoints.db, checkpoints.store, checkpoints.trees, checkpoints.page_tokens)

    def CreateCheckpoint(self, request: pb.CreateCheckpointRequest, context: grpc.ServicerContext):
        created = self.checkpoints.create(_create_request(request))
        return pb.CreateCheckpointResponse(checkpoint=convert.checkpoint(created))

    def GetCheckpoint(self, request: pb.GetCheckpointRequest, context: grpc.ServicerContext):
        convert.known_enum_value(pb.CheckpointView, request.view, "view")
        found = self.checkpoints.get(request.checkpoint_id, with_state=request.view == pb.CHECKPOINT_VIEW_FULL)
        return pb.GetCheckpointResponse(checkpoint=convert.checkpoint(found))

    def ListCheckpoints(self, request: pb.ListCheckpointsRequest, context: grpc.ServicerContext):
        found, token = self.checkpoints.list(request.plan_id, request.page_size, request.page_token, request.filter)
        listed, cut = convert.checkpoints(found)
        if cut:  # the page ends early, where its answer is full
            token = self.checkpoints.page_token_after(request.plan_id, request.filter, found[len(listed) - 1])
        return pb.ListCheckpointsResponse(checkpoints=listed, next_page_token=token)

    def DeleteCheckpoint(self, request: pb.DeleteCheckpointRequest, context: grpc.ServicerContext):
        self.checkpoints.delete(request.checkpoint_id)
        return pb.DeleteCheckpointResponse()

    def DiffCheckpoints(self, request: pb.DiffCheckpointsRequest, context: grpc.ServicerContext):
        return self._diff(request, _cancelled_when_ended(context))

    def _diff(self, request: pb.DiffCheckpointsRequest, cancel: Cancellation) -> pb.DiffCheckpointsResponse:
        paths = convert.request_paths(request.paths, request.raw_paths)
        page = self.checkpoints.diff_page(request.base_checkpoint_id, request.target_checkpoint_id, paths,
                                          request.text_diffs, request.page_size, request.page_token, cancel)
        texts = self.contents.text_diffs(page.base_id, page.target_id, page.changes) if request.text_diffs else {}
        listed, cut = convert.changes(page.changes, texts)  # a page also ends at 16 MiB
        more = cut + page.after
        token = (self.checkpoints.diff_token_after(page.base_id, page.target_id, paths, request.text_diffs,
                                                   page.changes[len(listed) - 1], more) if more else "")
        return pb.DiffCheckpointsResponse(changes=listed, changes_omitted=more, next_page_token=token)

    def Rollback(self, request: pb.RollbackRequest, context: grpc.ServicerContext):
        return self._rollback(request, _cancelled_when_ended(context))

    def _rollback(self, request: pb.RollbackRequest, cancel: Cancellation) -> pb.RollbackResponse:
        scope = convert.from_proto_enum(convert.SCOPES, request.scope, "scope") or Scope.FILES_AND_STATE
        result = self.checkpoints.rollback(RollbackRequest(
            plan_id=request.plan_id,
            checkpoint_id=request.checkpoint_id,
            scope=scope,
            paths=convert.request_paths(request.paths, request.raw_paths),
            dry_run=request.dry_run,
            request_id=request.request_id,
            current_state=request.current_state,
            allow_nested_workspaces=request.allow_nested_workspaces,
        ), cancel)
        listed, omitted = convert.changes(result.changes)
        response = pb.RollbackResponse(changes=listed, changes_omitted=omitted, state=result.state,
                                       dry_run=result.dry_run,
                                       nested_workspaces=[convert.nested_workspace(n) for n in result.nested])
        if result.safety is not None:
            response.safety_checkpoint.CopyFrom(convert.checkpoint(result.safety))
        return response

    def DeleteCheckpoints(self, request: pb.DeleteCheckpointsRequest, context: grpc.ServicerContext):
        deleted = self.checkpoints.delete_matching(request.plan_id, request.filter)
        listed, omitted = convert.checkpoints(deleted)
        return pb.DeleteCheckpointsResponse(checkpoints=listed, checkpoints_omitted=omitted)

    def PutPendingWrites(self, request: pb.PutPendingWritesRequest, context: grpc.ServicerContext):
        self.checkpoints.put_pending_writes(request.checkpoint_id, [
            PendingWrite(w.task_id, w.index, w.channel, w.value_type, w.value, w.task_path) for w in request.writes])
        return pb.PutPendingWritesResponse()

    def ListPendingWrites(self, request: pb.ListPendingWritesRequest, context: grpc.ServicerContext):
        return pb.ListPendingWritesResponse(writes=[
            pb.PendingWrite(task_id=w.task_id, index=w.index, channel=w.channel, value_type=w.value_type,
                            value=w.value, task_path=w.task_path)
            for w in self.checkpoints.pending_writes(request.checkpoint_id)])

    def ListPlans(self, request: pb.ListPlansRequest, context: grpc.ServicerContext):
        found, token = self.plans.list(request.page_size, request.page_token, request.filter)
        return pb.ListPlansResponse(plans=[convert.plan(p) for p in found], next_page_token=token)

    def GetPlan(self, request: pb.GetPlanRequest, context: grpc.ServicerContext):
        return pb.GetPlanResponse(plan=convert.plan(self.plans.get(request.plan_id)))

    def _file_chunks(self, request: pb.ReadCheckpointFileRequest) -> Iterator[pb.ReadCheckpointFileResponse]:
        """Looks the file up at once (errors fail the call); the chunks come as iterated."""
        path = convert.request_paths((), (request.raw_path,))[0] if request.raw_path else request.path
        entry, chunks = self.contents.open_file(request.checkpoint_id, path)
        first = pb.ReadCheckpointFileResponse(entry_type=convert.ENTRY_TYPES[entry.kind], size_bytes=entry.size,
                                              mode=entry.mode)

        def stream() -> Iterator[pb.ReadCheckpointFileResponse]:
            first.data = next(chunks, b"")
            yield first
            for chunk in chunks:
                yield pb.ReadCheckpointFileResponse(data=chunk)

        return stream()

    def _archive_chunks(self, request: pb.ExportCheckpointRequest) -> Iterator[pb.ExportCheckpointResponse]:
        archive = self.contents.export(request.checkpoint_id)
        return (pb.ExportCheckpointResponse(data=chunk) for chunk in _coalesce(archive))

    def ListCheckpointFiles(self, request: pb.ListCheckpointFilesRequest, context: grpc.ServicerContext):
        path = convert.request_paths((), (request.raw_path,))[0] if request.raw_path else request.path
        found, token = self.contents.list_files(request.checkpoint_id, path, request.recursive, request.page_size,
                                                request.page_token)
        return pb.ListCheckpointFilesResponse(files=[convert.checkpoint_file(p, e) for p, e in found],
                                              next_page_token=token)

    def ReadCheckpointFile(self, request: pb.ReadCheckpointFileRequest, context: grpc.ServicerContext):
        yield from self._file_chunks(request)

    def ExportCheckpoint(self, request: pb.ExportCheckpointRequest, context: grpc.ServicerContext):
        yield from self._archive_chunks(request)


def _coalesce(pieces: Iterator[bytes], size: int = 64 * 1024) -> Iterator[bytes]:
    """Small pieces (tar headers, padding) joined into messages of up to ``size`` bytes."""
    pending = bytearray()
    for piece in pieces:
        if len(pending) + len(piece) > size and pending:
            yield bytes(pending)
            pending.clear()
        pending += piece
        while len(pending) >= size:
            yield bytes(pending[:size])
            del pending[:size]
    if pending:
        yield bytes(pending)


class AsyncCheckpointServicer(CheckpointServicer):
    """CheckpointService for the asyncio server: CreateCheckpoint is a coroutine (a state-only
    create is served on the event loop, see ``Checkpoints.create_async``). The other methods that
    take a plan's lock run in ``executor`` without waiting there for a busy plan (``PlanLocks.run``);
    Get and List (and the pending writes' two calls, which touch no workspace) are plain
    functions, which the server runs in ``executor``.

    Those plan calls (which may read a workspace, and so hang on it) take at most ``plan_threads``
    of the executor's threads at once; more wait for one on the loop. Stuck captures can so never
    take the threads that Get, List and the config service need."""

    def __init__(self, checkpoints: Checkpoints, executor: Executor, plan_threads: int) -> None:
        super().__init__(checkpoints)
        self.executor = executor
        self._plan_threads = asyncio.Semaphore(plan_threads)

    async def _in_thread(self, function: Callable[..., T], *arguments: object) -> T:
        """``function`` in one of the plan calls' threads. The thread is counted until the
        function returns, also when the caller gave up on it (a stuck capture keeps its thread)."""
        await self._plan_threads.acquire()
        loop = asyncio.get_running_loop()
        try:
            running = self.executor.submit(function, *arguments)
        except BaseException:
            self._plan_threads.release()
            raise
        running.add_done_callback(lambda _done: _call_soon(loop, self._plan_threads.release))
        return await asyncio.wrap_future(running)

    def _for_plan(self, function: Callable[..., T], *arguments: object, plan_id: str = "") -> Awaitable[T]:
        return self.checkpoints.plan_locks.run(self._in_thread, function, *arguments, plan_id=plan_id)

    async def CreateCheckpoint(self, request: pb.CreateCheckpointRequest, context: grpc.aio.ServicerContext):
        created = await self.checkpoints.create_async(_create_request(request), self._in_thread)
        return pb.CreateCheckpointResponse(checkpoint=convert.checkpoint(created))

    async def DeleteCheckpoint(self, request: pb.DeleteCheckpointRequest, context: grpc.aio.ServicerContext):
        return await self._for_plan(super().DeleteCheckpoint, request, context)

    async def DiffCheckpoints(self, request: pb.DiffCheckpointsRequest, context: grpc.aio.ServicerContext):
        cancel = Cancellation()
        with _cancelled_if_given_up(context, cancel):
            return await self._for_plan(self._diff, request, cancel)

    async def Rollback(self, request: pb.RollbackRequest, context: grpc.aio.ServicerContext):
        cancel = Cancellation()
        with _cancelled_if_given_up(context, cancel):
            return await self._for_plan(self._rollback, request, cancel, plan_id=request.plan_id)

    async def _stream(self, make: Callable[[], Iterator[T]]) -> AsyncIterator[T]:
        """Yields ``make()``'s items, each read in ``executor``: no thread waits on a slow reader."""
        items = await self._in_thread(make)
        done = object()
        while (item := await self._in_thread(next, items, done)) is not done:
            yield item

    async def ReadCheckpointFile(self, request: pb.ReadCheckpointFileRequest, context: grpc.aio.ServicerContext):
        async for response in self._stream(lambda: self._file_chunks(request)):
            yield response

    async def ExportCheckpoint(self, request: pb.ExportCheckpointRequest, context: grpc.aio.ServicerContext):
        async for response in self._stream(lambda: self._archive_chunks(request)):
            yield response
    async def DeleteCheckpoints(self, request: pb.DeleteCheckpointsRequest, context: grpc.aio.ServicerContext):
        # Each plan in turn under its lock; a busy plan is waited for on the loop, as by DeleteCheckpoint,
        # so calls for a stuck plan never hold the threads other plans need.
        wanted, plans = await self._in_thread(self.checkpoints.plans_matching, request.plan_id, request.filter)
        deleted = []
        for plan in plans:
            deleted += await self.checkpoints.plan_locks.run(
                self._in_thread, self.checkpoints.delete_in_plan, plan, wanted, plan_id=plan)
        listed, omitted = convert.checkpoints(deleted)
        return pb.DeleteCheckpointsResponse(checkpoints=listed, checkpoints_omitted=omitted)


@contextlib.contextmanager
def _cancelled_if_given_up(context: grpc.aio.ServicerContext, cancel: Cancellation) -> Iterator[None]:
    """Sets ``cancel`` when the handler is cancelled (the caller gave up, or the server stops)
    while it awaits work in a thread: that work stops at its next check instead of running on."""
    try:
        yield
    except asyncio.CancelledError:
        cancel.cancel(why_ended(context))
        raise


def _cancelled_when_ended(context: grpc.ServicerContext | None) -> Cancellation:
    """For a sync server's handler: a token set once the call has ended (its termination callback
    runs after a handler that returned, and as soon as a caller gives up on one still working)."""
    add_callback = getattr(context, "add_callback", None)
    if add_callback is None:  # called directly, with no call around it
        return NEVER
    cancel = Cancellation()

    def ended() -> None:
        cancel.cancel(why_ended(context))

    if not add_callback(ended):  # the call has ended already
        ended()
    return cancel


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], object]) -> None:
    """``callback`` on ``loop`` from any thread; nothing once the loop is closed (the server stopped)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback)


def _create_request(request: pb.CreateCheckpointRequest) -> CreateRequest:
    return CreateRequest(
        plan_id=request.plan_id,
        trigger=convert.from_proto_enum(convert.TRIGGERS, request.trigger, "trigger"),
        phase=convert.from_proto_enum(convert.PHASES, request.phase, "phase"),
        source_tool=request.source_tool,
        labels=dict(request.labels),
        description=request.description,
        state=request.state,
        workspace_root=request.workspace_root,
        request_id=request.request_id,
    )
