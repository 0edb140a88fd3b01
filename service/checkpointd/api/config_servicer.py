"""ConfigService: proto in, config store call, proto out."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc

from checkpoint.v1 import config_service_pb2 as pb
from checkpoint.v1 import config_service_pb2_grpc as pb_grpc
from checkpointd.api import convert
from checkpointd.core import validation
from checkpointd.core.config import REGISTRY, ConfigStore, lookup_key

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
        if request.clear:
            effective = self.config.clear(request.key, plan_id)
        else:
            lookup_key(request.key)
            effective = self.config.set(request.key, convert.value_to_python(request.value, request.key), plan_id)
        return pb.SetConfigResponse(entry=convert.config_entry(effective))

    def WatchConfig(self, request: pb.WatchConfigRequest, context: grpc.ServicerContext) -> Iterator:
        plan_id = validation.plan_id(request.plan_id, required=False)
        keys = sorted({lookup_key(k).name for k in request.keys} or REGISTRY)
        sent: dict[str, object] = {}
        version = self.config.version
        while context.is_active() and not self.stopping():
            for key, effective in self.config.resolve_many(keys, plan_id).items():
                if sent.get(key, sent) != (effective.value, effective.source):
                    sent[key] = (effective.value, effective.source)
                    yield pb.WatchConfigResponse(entry=convert.config_entry(effective))
            version = self.config.wait_for_change(version, WATCH_POLL_SECONDS)
