"""ConfigService: proto in, config store call, proto out."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Executor

import grpc

from checkpoint.v1 import config_service_pb2 as pb
from checkpoint.v1 import config_service_pb2_grpc as pb_grpc
from checkpointd.api import convert
from checkpointd.core.config.registry import REGISTRY, ConfigStore, Effective, lookup_key
from checkpointd.core.kernel import validation

#: How often a watcher re-reads the database, to see changes made by other replicas.
WATCH_POLL_SECONDS = 1.0


class ConfigServicer(pb_grpc.ConfigServiceServicer):
    def __init__(self, config: ConfigStore, stopping: Callable[[], bool]) -> None:
        self.config = config
        self.stopping = stopping

    def GetConfig(self, request: pb.GetConfigRequest, context: grpc.ServicerContext):
        plan_id = validation.plan_id(request.plan_id, required=False)
        return pb.GetConfigResponse(entry=convert.config_entry(self.config.resolve(request.key, plan_id)))

    def ListConfig(self, request: pb.ListConfigRequest, context: grpc.ServicerContext):
        plan_id = validation.plan_id(request.plan_id, required=False)
        resolved = self.config.resolve_many(sorted(REGISTRY), plan_id)
        return pb.ListConfigResponse(entries=[convert.config_entry(resolved[k]) for k in sorted(resolved)])

    def SetConfig(self, request: pb.SetConfigRequest, context: grpc.ServicerContext):
        plan_id = validation.plan_id(request.plan_id, required=False)
        validation.max_length(request.etag, validation.MAX_ETAG, "etag")
        etag = request.etag
        if request.clear:
            effective = self.config.clear(request.key, plan_id, etag)
        else:
            lookup_key(request.key)
            effective = self.config.set(request.key, convert.value_to_python(request.value, request.key), plan_id,
                                        etag)
        return pb.SetConfigResponse(entry=convert.config_entry(effective))

    def WatchConfig(self, request: pb.WatchConfigRequest, context: grpc.ServicerContext) -> Iterator:
        plan_id, keys = _watched(request)
        sent: dict[str, object] = {}
        version = self.config.version
        while context.is_active() and not self.stopping():
            yield from _news(self.config.resolve_many(keys, plan_id), sent)
            version = self.config.wait_for_change(version, WATCH_POLL_SECONDS)


class AsyncConfigServicer(ConfigServicer):
    """ConfigService for the asyncio server: WatchConfig is a coroutine that holds no thread
    while it waits for a change (its reads run in ``executor``) and ends when its caller goes;
    the other methods are plain functions, which the server runs in ``executor``."""

    def __init__(self, config: ConfigStore, stopping: Callable[[], bool], executor: Executor) -> None:
        super().__init__(config, stopping)
        self.executor = executor

    async def WatchConfig(self, request: pb.WatchConfigRequest,
                          context: grpc.aio.ServicerContext) -> AsyncIterator[pb.WatchConfigResponse]:
        plan_id, keys = _watched(request)
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the stream is over
                loop.call_soon_threadsafe(changed.set)

        remove = self.config.on_change(wake)
        sent: dict[str, object] = {}
        try:
            while not self.stopping():
                changed.clear()
                resolved = await loop.run_in_executor(self.executor, self.config.resolve_many, keys, plan_id)
                for response in _news(resolved, sent):
                    yield response
                # Re-read on timeout too, which picks up changes made by other replicas.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), WATCH_POLL_SECONDS)
        finally:
            remove()


def _watched(request: pb.WatchConfigRequest) -> tuple[str, list[str]]:
    """The plan and the keys a watch asks for, validated."""
    plan_id = validation.plan_id(request.plan_id, required=False)
    return plan_id, sorted({lookup_key(k).name for k in request.keys} or REGISTRY)


def _news(resolved: dict[str, Effective], sent: dict[str, object]) -> Iterator[pb.WatchConfigResponse]:
    """An entry for each key whose value, source or etag (a set to the same value moves it)
    differs from what the watch sent last: a watcher always holds the etag to change it by."""
    for key, effective in resolved.items():
        if sent.get(key, sent) != (effective.value, effective.source, effective.etag):
            sent[key] = (effective.value, effective.source, effective.etag)
            yield pb.WatchConfigResponse(entry=convert.config_entry(effective))
