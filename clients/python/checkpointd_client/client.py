"""Typed clients over the generated checkpoint.v1 stubs.

Every call carries a deadline. Retries happen only inside gRPC, only for UNAVAILABLE, driven by
the channel's service config; mutating calls carry a request_id generated once per call, so a
retried attempt is recognised by the server as the same request and never records twice.
"""

from __future__ import annotations

import json
import os
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TypeVar

import grpc
from google.protobuf import struct_pb2

from checkpoint.v1 import (
    checkpoint_service_pb2,
    checkpoint_service_pb2_grpc,
    config_service_pb2,
    config_service_pb2_grpc,
)
from checkpointd_client.errors import CheckpointdRpcError
from checkpointd_client.vocabulary import AutoTrigger, parse_phase

DEFAULT_DEADLINE_S = 5.0
# A WatchConfig stream is re-opened when this deadline ends; the first messages re-sync the values.
DEFAULT_WATCH_DEADLINE_S = 300.0
RETRY_MAX_ATTEMPTS = 4
#: Deadline of a whole ReadCheckpointFile or ExportCheckpoint stream (a large tree takes a while).
DEFAULT_STREAM_DEADLINE_S = 600.0
RECONNECT_BACKOFF_MS = (100, 1000)
#: Largest response accepted: the server's send limit (its responses carry up to 16 MiB of state,
#: pages of records and change lists), where gRPC's default of 4 MiB would make some acknowledged
#: checkpoints unreadable.
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
#: The server's limits on one PutPendingWrites call: writes, and their values' bytes in total.
MAX_WRITES_PER_CALL = 1000
MAX_WRITE_BYTES_PER_CALL = 16 * 1024 * 1024

JsonValue = None | bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"]
Checkpoint = checkpoint_service_pb2.Checkpoint
FileChange = checkpoint_service_pb2.FileChange
RollbackResponse = checkpoint_service_pb2.RollbackResponse
Plan = checkpoint_service_pb2.Plan
CheckpointFile = checkpoint_service_pb2.CheckpointFile
RollbackScope = checkpoint_service_pb2.RollbackScope.ValueType
ConfigEntry = config_service_pb2.ConfigEntry

_Response = TypeVar("_Response")


def retry_service_config(max_attempts: int = RETRY_MAX_ATTEMPTS) -> str:
    """The gRPC service config that retries unary calls on UNAVAILABLE and nothing else.

    WatchConfig is left out on purpose: the config watcher re-opens its own stream, and gRPC's
    retry layer on a server stream was seen to hang across a server restart (the stream neither
    ended nor honoured cancel()).
    """
    return json.dumps(
        {
            "methodConfig": [
                {
                    "name": [
                        {"service": "checkpoint.v1.CheckpointService"},
                        {"service": "checkpoint.v1.ConfigService", "method": "GetConfig"},
                        {"service": "checkpoint.v1.ConfigService", "method": "ListConfig"},
                        {"service": "checkpoint.v1.ConfigService", "method": "SetConfig"},
                    ],
                    "retryPolicy": {
                        "maxAttempts": max_attempts,
                        "initialBackoff": "0.1s",
                        "maxBackoff": "1s",
                        "backoffMultiplier": 2,
                        "retryableStatusCodes": ["UNAVAILABLE"],
                    },
                }
            ]
        }
    )


#: Schemes gRPC resolves by itself (its name-resolution syntax), besides plain HOST:PORT.
_RESOLVER_SCHEMES = ("dns:", "ipv4:", "ipv6:")
_DROP_THE_SCHEME = "drop the scheme: use HOST:PORT or unix:///path"


def validate_target(target: str) -> str:
    """Accept "host:port" or "unix:///absolute/path" (and gRPC's own unix:/abs, unix-abstract:NAME,
    dns:[//AUTHORITY/]HOST:PORT, ipv4:ADDR:PORT[,...] and ipv6:[ADDR]:PORT[,...]); refuse anything
    else before dialing, saying what to write instead: gRPC would take a URL such as
    http://host:port for a host name and fail each call with a resolver error."""
    if target.startswith("/"):
        raise ValueError(f"target {target!r} is a path: a unix socket is dialed as unix://{target}")
    if target.startswith("unix:"):
        path = target.removeprefix("unix://") if target.startswith("unix://") else target.removeprefix("unix:")
        if not path.startswith("/"):
            raise ValueError(f"unix target must be unix:///absolute/path, got {target!r}")
        return target
    if target.startswith("unix-abstract:"):
        if target == "unix-abstract:":
            raise ValueError(f"unix-abstract target must name the socket (unix-abstract:NAME), got {target!r}")
        return target
    addresses = [target]
    if target.startswith(_RESOLVER_SCHEMES):
        scheme, _, rest = target.partition(":")
        if scheme == "dns" and rest.startswith("//"):
            rest = rest[2:].partition("/")[2]  # the DNS server (authority) before the name
        addresses = rest.split(",") if scheme != "dns" else [rest]
    for address in addresses:
        _validate_host_port(target, address)
    return target


def _validate_host_port(target: str, address: str) -> None:
    if "/" in address:
        scheme, url, rest = target.partition("://")
        host_port = rest.partition("/")[0] if url and scheme.isalpha() else ""
        here = f" (here: {host_port})" if ":" in host_port else ""
        raise ValueError(f"target {target!r} is not a gRPC target: {_DROP_THE_SCHEME}{here}")
    host, separator, port = address.rpartition(":")
    if not separator or not host or not port.isdigit():
        raise ValueError(f"target must be host:port or unix:///absolute/path, got {target!r}")
    if not 0 < int(port) < 65536:
        raise ValueError(f"target {target!r}: a port is a number from 1 to 65535")


#: The target each channel open_channel made was opened to: named in the hint of a call nothing answered.
_CHANNEL_TARGETS: weakref.WeakKeyDictionary[grpc.Channel, str] = weakref.WeakKeyDictionary()


def channel_target(channel: grpc.Channel) -> str | None:
    """The target of a channel made by open_channel; None for a channel made otherwise."""
    try:
        return _CHANNEL_TARGETS.get(channel)
    except TypeError:  # a channel object that cannot be weakly referenced
        return None


def open_channel(
    target: str,
    *,
    credentials: grpc.ChannelCredentials | None = None,
    server_name: str | None = None,
    max_attempts: int = RETRY_MAX_ATTEMPTS,
) -> grpc.Channel:
    """A channel to checkpointd with the UNAVAILABLE-only retry policy.

    Plaintext unless ``credentials`` are given (``grpc.ssl_channel_credentials``: the CA that
    signed the server's certificate, and a client certificate where the server requires one).
    ``server_name`` is the name to check the server's certificate against when it differs from
    the dialed host. Unix sockets are always served in plaintext (their file permissions guard
    them), so TLS options on a unix target are refused rather than left to fail the handshake.
    """
    target = validate_target(target)
    if credentials is None and server_name is not None:
        raise ValueError("server_name applies to TLS only: pass credentials too")
    if credentials is not None and target.startswith("unix:"):
        raise ValueError(f"checkpointd serves unix sockets in plaintext; connect to {target} without credentials")
    options: list[tuple[str, object]] = [
        ("grpc.enable_retries", 1),
        ("grpc.service_config", retry_service_config(max_attempts)),
        # checkpointd is a nearby sidecar: after a restart, reconnect within a second rather
        # than gRPC's default exponential backoff of up to two minutes.
        ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
        ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[1]),
        ("grpc.max_receive_message_length", MAX_RESPONSE_BYTES),
    ]
    if credentials is None:
        channel = grpc.insecure_channel(target, options=options)
    else:
        if server_name is not None:
            options.append(("grpc.ssl_target_name_override", server_name))
        channel = grpc.secure_channel(target, credentials, options=options)
    _CHANNEL_TARGETS[channel] = target
    return channel


def _write_batches(
        writes: Sequence[checkpoint_service_pb2.PendingWrite]) -> Iterator[list[checkpoint_service_pb2.PendingWrite]]:
    """``writes`` in runs the server takes in one PutPendingWrites call (one write alone always
    makes a run: one over the byte limit is the server's to refuse)."""
    run: list[checkpoint_service_pb2.PendingWrite] = []
    size = 0
    for write in writes:
        if run and (len(run) == MAX_WRITES_PER_CALL or size + len(write.value) > MAX_WRITE_BYTES_PER_CALL):
            yield run
            run, size = [], 0
        run.append(write)
        size += len(write.value)
    if run or not writes:
        yield run


def new_request_id() -> str:
    """An idempotency key for one logical mutating call (AIP-155)."""
    return str(uuid.uuid4())


ListedItem = TypeVar("ListedItem")


class Listed(list[ListedItem]):
    """What an answer lists, and `omitted`: how many more there were than it lists (an answer is
    kept within gRPC's message size: a diff's page lists up to 16 MiB of changes, the next page the
    rest; a rollback up to 16 MiB of what it changed, ask again with `paths`; a bulk deletion up to
    32 MiB of the checkpoints it deleted)."""

    def __init__(self, items: Iterable[ListedItem] = (), *, omitted: int = 0) -> None:
        super().__init__(items)
        self.omitted = omitted


#: A diff's changes (``Listed``).
FileChanges = Listed


class _RpcCaller:
    """Applies the deadline and bearer token to each call and translates gRPC errors."""

    def __init__(self, deadline_s: float, token: str | None, target: str | None = None) -> None:
        if deadline_s <= 0:
            raise ValueError(f"deadline_s must be positive, got {deadline_s}")
        self.deadline_s = deadline_s
        self.target = target
        self.metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()

    def unary(
        self, name: str, method: Callable[..., _Response], request: object, timeout: float | None
    ) -> _Response:
        try:
            return method(request, timeout=timeout or self.deadline_s, metadata=self.metadata)
        except grpc.RpcError as error:
            raise CheckpointdRpcError.from_grpc(name, error, target=self.target) from None

    def stream(
        self, name: str, method: Callable[..., Iterable[_Response]], request: object, timeout: float | None
    ) -> Iterator[_Response]:
        """A server stream's messages; its deadline covers the whole stream."""
        try:
            yield from method(request, timeout=timeout or max(self.deadline_s, DEFAULT_STREAM_DEADLINE_S),
                              metadata=self.metadata)
        except grpc.RpcError as error:
            raise CheckpointdRpcError.from_grpc(name, error, target=self.target) from None


class CheckpointClient:
    """CheckpointService calls returning the proto messages of the contract."""

    def __init__(
        self, channel: grpc.Channel, *, deadline_s: float = DEFAULT_DEADLINE_S, token: str | None = None
    ) -> None:
        self._stub = checkpoint_service_pb2_grpc.CheckpointServiceStub(channel)
        self._rpc = _RpcCaller(deadline_s, token, channel_target(channel))

    def create_checkpoint(
        self,
        plan_id: str,
        *,
        trigger: AutoTrigger | None = None,
        phase: str | None = None,
        source_tool: str = "",
        labels: Mapping[str, str] | None = None,
        description: str = "",
        state: bytes = b"",
        workspace_root: str | os.PathLike[str] | None = None,
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> Checkpoint:
        """Record a checkpoint. `trigger=None` is a manual checkpoint; only those may name a `phase`.

        An automatic trigger always sends the phase it implies.
        """
        if trigger is None:
            trigger_value = checkpoint_service_pb2.TRIGGER_MANUAL
            phase_value = parse_phase(phase) if phase else checkpoint_service_pb2.PHASE_MANUAL
        else:
            if phase is not None:
                raise ValueError(f"phase is implied by trigger {trigger.value}; do not pass one")
            trigger_value, phase_value = trigger.proto, trigger.phase
        request = checkpoint_service_pb2.CreateCheckpointRequest(
            plan_id=plan_id,
            phase=phase_value,
            trigger=trigger_value,
            source_tool=source_tool,
            labels=dict(labels or {}),
            description=description,
            state=state,
            workspace_root=os.fspath(workspace_root) if workspace_root is not None else "",
            request_id=request_id or new_request_id(),
        )
        return self._rpc.unary("CreateCheckpoint", self._stub.CreateCheckpoint, request, timeout).checkpoint

    def get_checkpoint(self, checkpoint_id: str, *, full: bool = False, timeout: float | None = None) -> Checkpoint:
        """One checkpoint; `full=True` includes the state bytes."""
        view = checkpoint_service_pb2.CHECKPOINT_VIEW_FULL if full else checkpoint_service_pb2.CHECKPOINT_VIEW_BASIC
        request = checkpoint_service_pb2.GetCheckpointRequest(checkpoint_id=checkpoint_id, view=view)
        return self._rpc.unary("GetCheckpoint", self._stub.GetCheckpoint, request, timeout).checkpoint

    def list_checkpoints(
        self, plan_id: str, *, filter_expr: str = "", page_size: int = 0, timeout: float | None = None
    ) -> list[Checkpoint]:
        """Every checkpoint of a plan matching the AIP-160 filter, newest first (all pages)."""
        checkpoints: list[Checkpoint] = []
        page_token = ""
        while True:
            request = checkpoint_service_pb2.ListCheckpointsRequest(
                plan_id=plan_id, page_size=page_size, page_token=page_token, filter=filter_expr
            )
            response = self._rpc.unary("ListCheckpoints", self._stub.ListCheckpoints, request, timeout)
            checkpoints.extend(response.checkpoints)
            page_token = response.next_page_token
            if not page_token:
                return checkpoints

    def delete_checkpoint(self, checkpoint_id: str, *, timeout: float | None = None) -> None:
        request = checkpoint_service_pb2.DeleteCheckpointRequest(checkpoint_id=checkpoint_id)
        self._rpc.unary("DeleteCheckpoint", self._stub.DeleteCheckpoint, request, timeout)

    def delete_checkpoints(
        self, *, plan_id: str = "", filter_expr: str = "", timeout: float | None = None
    ) -> Listed[Checkpoint]:
        """Delete every checkpoint the AIP-160 filter selects, in one plan or (no plan_id) in every
        plan; returns those deleted, without state (up to 32 MiB of them; `.omitted` counts the rest)."""
        request = checkpoint_service_pb2.DeleteCheckpointsRequest(plan_id=plan_id, filter=filter_expr)
        response = self._rpc.unary("DeleteCheckpoints", self._stub.DeleteCheckpoints, request, timeout)
        return Listed(response.checkpoints, omitted=response.checkpoints_omitted)

    def put_pending_writes(
        self, checkpoint_id: str, writes: Sequence[checkpoint_service_pb2.PendingWrite], *, timeout: float | None = None
    ) -> None:
        """Record writes that follow a checkpoint; a repeated (task_id, index) keeps its first value
        when the index is 0 or more and takes the new one when it is negative. Sent in as many calls
        as the server's limits per call need (a task may write more than those): should one fail,
        calling again with the same writes finishes the job, as the calls are idempotent."""
        for part in _write_batches(writes):
            request = checkpoint_service_pb2.PutPendingWritesRequest(checkpoint_id=checkpoint_id, writes=part)
            self._rpc.unary("PutPendingWrites", self._stub.PutPendingWrites, request, timeout)

    def list_pending_writes(
        self, checkpoint_id: str, *, timeout: float | None = None
    ) -> list[checkpoint_service_pb2.PendingWrite]:
        """A checkpoint's pending writes, ordered by task_path, task_id, then index."""
        request = checkpoint_service_pb2.ListPendingWritesRequest(checkpoint_id=checkpoint_id)
        return list(self._rpc.unary("ListPendingWrites", self._stub.ListPendingWrites, request, timeout).writes)

    def diff_checkpoints(
        self,
        base_checkpoint_id: str,
        target_checkpoint_id: str = "",
        *,
        paths: Sequence[str | bytes] = (),
        text_diffs: bool = False,
        all_pages: bool = True,
        page_size: int = 0,
        timeout: float | None = None,
    ) -> FileChanges:
        """Paths that differ; an empty target means the plan's live workspace. A path given as
        bytes may be one that is not valid UTF-8 (a `FileChange.raw_path`). `text_diffs=True`
        adds each changed text file's unified diff (`FileChange.text_diff`; see `format_patch`).
        Every page (each a call with `timeout`), unless `all_pages=False`: then only the first,
        of at most `page_size` changes (0: as many as fit in 16 MiB), and `.omitted` counts the
        rest. Against the live workspace each page is a new look at it (see the proto)."""
        text_paths, raw_paths = _split_paths(paths)
        changes = FileChanges()
        page_token = ""
        while True:
            request = checkpoint_service_pb2.DiffCheckpointsRequest(
                base_checkpoint_id=base_checkpoint_id,
                target_checkpoint_id=target_checkpoint_id,
                paths=text_paths,
                raw_paths=raw_paths,
                text_diffs=text_diffs,
                page_size=page_size,
                page_token=page_token,
            )
            response = self._rpc.unary("DiffCheckpoints", self._stub.DiffCheckpoints, request, timeout)
            changes.extend(response.changes)
            changes.omitted = response.changes_omitted
            page_token = response.next_page_token
            if not page_token or not all_pages:
                return changes

    def rollback(
        self,
        plan_id: str,
        checkpoint_id: str,
        *,
        scope: RollbackScope = checkpoint_service_pb2.ROLLBACK_SCOPE_FILES_AND_STATE,
        paths: Sequence[str | bytes] = (),
        dry_run: bool = False,
        current_state: bytes = b"",
        allow_nested_workspaces: bool = False,
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> RollbackResponse:
        """Restore files and/or state; the server records a safety checkpoint first. `paths`
        limits the files restored; one given as bytes may be a name that is not valid UTF-8.
        A rollback that would change files inside another plan's workspace is refused
        (NESTED_WORKSPACE) unless `allow_nested_workspaces=True`."""
        text_paths, raw_paths = _split_paths(paths)
        request = checkpoint_service_pb2.RollbackRequest(
            plan_id=plan_id,
            checkpoint_id=checkpoint_id,
            scope=scope,
            paths=text_paths,
            raw_paths=raw_paths,
            dry_run=dry_run,
            current_state=current_state,
            allow_nested_workspaces=allow_nested_workspaces,
            request_id=request_id or new_request_id(),
        )
        return self._rpc.unary("Rollback", self._stub.Rollback, request, timeout)

    def list_plans(self, *, filter_expr: str = "", page_size: int = 0, timeout: float | None = None) -> list[Plan]:
        """Every plan matching the AIP-160 filter (all pages), newest plan id first. Filter fields:
        `workspace_root = "/dir"`, `workspace_root : "/dir"` (at or under), `update_time > "RFC 3339"` and
        `labels.KEY = "VALUE"` (one of the plan's checkpoints has that label)."""
        plans: list[Plan] = []
        page_token = ""
        while True:
            request = checkpoint_service_pb2.ListPlansRequest(
                page_size=page_size, page_token=page_token, filter=filter_expr
            )
            response = self._rpc.unary("ListPlans", self._stub.ListPlans, request, timeout)
            plans.extend(response.plans)
            page_token = response.next_page_token
            if not page_token:
                return plans

    def get_plan(self, plan_id: str, *, timeout: float | None = None) -> Plan:
        """One plan, with its checkpoint count, newest checkpoint and total size."""
        request = checkpoint_service_pb2.GetPlanRequest(plan_id=plan_id)
        return self._rpc.unary("GetPlan", self._stub.GetPlan, request, timeout).plan

    def read_file(self, checkpoint_id: str, path: str | bytes, *, timeout: float | None = None) -> Iterator[bytes]:
        """A file's content as it was in a checkpoint (a symlink's: its target text), in chunks.
        Errors (no such path, a directory) are raised by the first `next()`."""
        text_paths, raw_paths = _split_paths([path])
        request = checkpoint_service_pb2.ReadCheckpointFileRequest(
            checkpoint_id=checkpoint_id, path=text_paths[0] if text_paths else "",
            raw_path=raw_paths[0] if raw_paths else b""
        )
        for response in self._rpc.stream("ReadCheckpointFile", self._stub.ReadCheckpointFile, request, timeout):
            if response.data:
                yield response.data

    def list_files(self, checkpoint_id: str, path: str | bytes = "", *, recursive: bool = False, page_size: int = 0,
                   timeout: float | None = None) -> list[CheckpointFile]:
        """Every entry (all pages) of a directory as it was in a checkpoint ("" = the workspace
        root; with `recursive`, its whole subtree), a directory before what it holds."""
        text_paths, raw_paths = _split_paths([path])
        files: list[CheckpointFile] = []
        page_token = ""
        while True:
            request = checkpoint_service_pb2.ListCheckpointFilesRequest(
                checkpoint_id=checkpoint_id, path=text_paths[0] if text_paths else "",
                raw_path=raw_paths[0] if raw_paths else b"", recursive=recursive, page_size=page_size,
                page_token=page_token,
            )
            response = self._rpc.unary("ListCheckpointFiles", self._stub.ListCheckpointFiles, request, timeout)
            files.extend(response.files)
            page_token = response.next_page_token
            if not page_token:
                return files

    def export_checkpoint(self, checkpoint_id: str, *, timeout: float | None = None) -> Iterator[bytes]:
        """A checkpoint's whole tree as the successive bytes of a (pax) tar archive."""
        request = checkpoint_service_pb2.ExportCheckpointRequest(checkpoint_id=checkpoint_id)
        for response in self._rpc.stream("ExportCheckpoint", self._stub.ExportCheckpoint, request, timeout):
            yield response.data


def _split_paths(paths: Sequence[str | bytes]) -> tuple[list[str], list[bytes]]:
    """Text paths for `paths`, byte paths (names that may not be UTF-8) for `raw_paths`. A str
    holding surrogates (how `os.fsdecode` and `sys.argv` carry such names) travels as its bytes."""
    if isinstance(paths, str | bytes):
        raise TypeError("paths must be a sequence of paths, not a single path")
    text_paths: list[str] = []
    raw_paths: list[bytes] = []
    for path in paths:
        if isinstance(path, bytes):
            raw_paths.append(path)
        elif isinstance(path, str):
            try:
                path.encode("utf-8")
                text_paths.append(path)
            except UnicodeEncodeError:
                raw_paths.append(path.encode("utf-8", "surrogateescape"))
        else:
            # Dropping it would widen a rollback to paths the caller did not name.
            raise TypeError(f"a path must be str or bytes (workspace-relative), got {type(path).__name__}")
    return text_paths, raw_paths


def to_value(value: JsonValue) -> struct_pb2.Value:
    """A JSON-shaped Python value as google.protobuf.Value."""
    message = struct_pb2.Value()
    match value:
        case None:
            message.null_value = struct_pb2.NULL_VALUE
        case bool():
            message.bool_value = value
        case int() | float():
            message.number_value = value
        case str():
            message.string_value = value
        case list():
            message.list_value.values.extend(to_value(item) for item in value)
        case dict():
            for key, item in value.items():
                message.struct_value.fields[key].CopyFrom(to_value(item))
        case _:
            raise TypeError(f"not a JSON value: {value!r}")
    return message


def from_value(message: struct_pb2.Value) -> JsonValue:
    """google.protobuf.Value as a plain Python value (numbers come back as float)."""
    kind = message.WhichOneof("kind")
    match kind:
        case None | "null_value":
            return None
        case "bool_value":
            return message.bool_value
        case "number_value":
            return message.number_value
        case "string_value":
            return message.string_value
        case "list_value":
            return [from_value(item) for item in message.list_value.values]
        case "struct_value":
            return {key: from_value(item) for key, item in message.struct_value.fields.items()}
        case _:
            raise TypeError(f"unknown google.protobuf.Value kind {kind!r}")


class ConfigWatch:
    """An open WatchConfig stream: iterate for entries, `cancel()` to end it from another thread."""

    def __init__(self, call: grpc.Call, *, target: str | None = None) -> None:
        self._call = call
        self._target = target

    def __iter__(self) -> Iterator[ConfigEntry]:
        try:
            for response in self._call:
                yield response.entry
        except grpc.RpcError as error:
            raise CheckpointdRpcError.from_grpc("WatchConfig", error, target=self._target) from None

    def cancel(self) -> None:
        self._call.cancel()


class ConfigClient:
    """ConfigService calls; values cross the wire as google.protobuf.Value."""

    def __init__(
        self, channel: grpc.Channel, *, deadline_s: float = DEFAULT_DEADLINE_S, token: str | None = None
    ) -> None:
        self._stub = config_service_pb2_grpc.ConfigServiceStub(channel)
        self._rpc = _RpcCaller(deadline_s, token, channel_target(channel))

    def get_config(self, key: str, *, plan_id: str = "", timeout: float | None = None) -> ConfigEntry:
        """The effective entry of one key (plan override, else global, else default)."""
        request = config_service_pb2.GetConfigRequest(key=key, plan_id=plan_id)
        return self._rpc.unary("GetConfig", self._stub.GetConfig, request, timeout).entry

    def list_config(self, *, plan_id: str = "", timeout: float | None = None) -> list[ConfigEntry]:
        request = config_service_pb2.ListConfigRequest(plan_id=plan_id)
        return list(self._rpc.unary("ListConfig", self._stub.ListConfig, request, timeout).entries)

    def set_config(
        self, key: str, value: JsonValue, *, plan_id: str = "", etag: str = "", timeout: float | None = None
    ) -> ConfigEntry:
        """Set the global value (or the plan's override) of a key; returns the resulting entry.
        With ``etag`` (an entry's, read at the same plan_id) only if the value has not changed
        since: else grpc ABORTED / ETAG_MISMATCH, and nothing is changed."""
        request = config_service_pb2.SetConfigRequest(key=key, value=to_value(value), plan_id=plan_id, etag=etag)
        return self._rpc.unary("SetConfig", self._stub.SetConfig, request, timeout).entry

    def clear_config(
        self, key: str, *, plan_id: str = "", etag: str = "", timeout: float | None = None
    ) -> ConfigEntry:
        """Remove the value at this scope so the next scope (global, then default) applies
        (with ``etag``: as ``set_config``)."""
        request = config_service_pb2.SetConfigRequest(key=key, plan_id=plan_id, clear=True, etag=etag)
        return self._rpc.unary("SetConfig", self._stub.SetConfig, request, timeout).entry

    def watch_config(
        self, keys: Iterable[str] = (), *, plan_id: str = "", timeout: float = DEFAULT_WATCH_DEADLINE_S
    ) -> ConfigWatch:
        """Open a WatchConfig stream; it ends (DEADLINE_EXCEEDED) after `timeout` seconds."""
        request = config_service_pb2.WatchConfigRequest(keys=list(keys), plan_id=plan_id)
        call = self._stub.WatchConfig(request, timeout=timeout, metadata=self._rpc.metadata)
        return ConfigWatch(call, target=self._rpc.target)

