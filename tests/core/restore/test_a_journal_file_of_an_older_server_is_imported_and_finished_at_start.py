"""A server from before the journal moved into the database kept each unfinished rollback as a
file (``DATA_DIR/rollback-journal/PLAN.json``). The server that starts on its data directory
imports each such file once (engine/recovery.py ``_import_legacy_journal``) and finishes the
rollback before it serves, on SQLite and on PostgreSQL alike; a file it cannot read is dropped
(logged: the safety checkpoint it names stays), never a reason not to start, and the directory
goes with the temporary files such a server left in it; the file of a
rollback whose safety checkpoint never committed changed nothing, and only its temporary files
are removed. In process: the engine's start-up is ``Checkpoints(...)``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest
from ulid import ULID

from checkpointd.core.config.registry import ConfigStore
from checkpointd.core.engine.checkpoints import Checkpoints
from checkpointd.core.engine.requests import CreateRequest, EngineSettings, RollbackRequest, Scope
from checkpointd.core.kernel.faults import Point
from checkpointd.core.metadata.db import Database
from checkpointd.core.restore import restorer as restorer_module
from checkpointd.core.restore.journal import LEGACY_DIRECTORY
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.db_store import DatabaseStore
from checkpointd.core.workspace.workspace import TEMP_PREFIX
from tests.core.restore.test_rollback_write_path_attacked import _Killed, write
from tests.helpers import at_fault_point, checkpoint_files, tree_state


class Server:
    """An engine on one database and data directory; ``start`` again is a restarted server."""

    def __init__(self, base: Path, url: str) -> None:
        self.base, self.url = base, url
        self.workspaces = base / "workspaces"
        self.data_dir = base / "data"
        self.engine: Checkpoints | None = None

    def start(self) -> Checkpoints:
        self.db = Database(self.url)
        self.db.migrate()
        self.store = (ContentStore(self.base / "store") if self.db.is_sqlite
                      else DatabaseStore(self.db, self.base / "db-store-staging"))
        self.engine = Checkpoints(self.db, self.store, ConfigStore(self.db),
                                  EngineSettings(self.data_dir, (str(self.workspaces),), watcher=False))
        return self.engine

    def stop(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.store.close()
            self.db.dispose()
            self.engine = None


@pytest.fixture(params=["sqlite", "postgresql"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    url = f"sqlite:///{tmp_path / 'meta.db'}"
    postgres = None
    if request.param == "postgresql":
        postgres = request.getfixturevalue("postgres")
        url = postgres.create()
    running = Server(tmp_path, url)
    try:
        yield running
    finally:
        running.stop()
        if postgres is not None:
            postgres.drop(url)


def _as_an_older_server_kept_it(server: Server, plan_id: str) -> Path:
    """Moves the plan's journal entry from the database into a file of the older format."""
    entry = server.engine.journal.get(plan_id)
    server.engine.journal.remove(plan_id)
    body = {key: value for key, value in asdict(entry).items()
            if key not in ("last_sequence", "written", "opened", "interim")}
    body.update(version=1, paths=list(entry.paths), directories=list(entry.directories), goal=entry.goal.value)
    return _legacy_file(server, plan_id, json.dumps(body))


def _legacy_file(server: Server, name: str, content: str) -> Path:
    path = server.data_dir / LEGACY_DIRECTORY / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    return path


def test_an_older_servers_journal_file_is_finished_at_start_and_an_unreadable_one_dropped(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = server.start()
    root, plan_id = server.workspaces / "ws", str(ULID())
    for name in ("a", "b", "c"):
        write(root / f"{name}.txt", f"target {name}\n")
    target = engine.create(CreateRequest(plan_id=plan_id, workspace_root=str(root))).row
    for name in ("a", "b", "c"):
        write(root / f"{name}.txt", f"changed {name}\n")
    engine.create(CreateRequest(plan_id=plan_id))

    def die() -> None:
        raise _Killed

    at_fault_point(monkeypatch, restorer_module, Point.RESTORE_CHANGE, {2: die})
    with pytest.raises(_Killed):
        engine.rollback(RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id, scope=Scope.FILES))
    monkeypatch.undo()
    legacy = _as_an_older_server_kept_it(server, plan_id)
    # read first (the files are read in name order): the one after it is still imported
    unreadable = _legacy_file(server, "0" * 26, '{"version": 1, "plan_id": "cut short by a')
    half_written = legacy.with_name(legacy.name + ".tmp")  # the older server's write killed before its rename
    half_written.write_text('{"version": 1, "plan_id": "')
    server.stop()

    engine = server.start()

    assert tree_state(root) == checkpoint_files(engine.trees, server.store, target.tree_digest)
    assert engine.journal.plan_ids() == []
    assert not legacy.exists() and not unreadable.exists() and not half_written.exists()
    assert not legacy.parent.exists()


def test_the_file_of_a_rollback_whose_safety_checkpoint_never_committed_only_loses_its_temporary_files(
        server: Server) -> None:
    engine = server.start()
    root, plan_id = server.workspaces / "ws", str(ULID())
    write(root / "a.txt", "the user's a\n")
    engine.create(CreateRequest(plan_id=plan_id, workspace_root=str(root)))
    tag = "0123456789abcdef" * 2
    left = write(root / f"{TEMP_PREFIX}{tag}-{'f' * 32}", "a temporary file its server left\n")
    users = write(root / f"{TEMP_PREFIX}{'e' * 32}", "another rollback's, or the user's\n")
    legacy = _legacy_file(server, plan_id, json.dumps({
        "version": 1, "plan_id": plan_id, "workspace_root": str(root), "target_checkpoint_id": str(ULID()),
        "safety_checkpoint_id": str(ULID()), "safety_tree": "", "paths": [], "temp_tag": tag,
        "directories": [""], "request_id": "", "goal": "complete"}))
    server.stop()

    engine = server.start()

    assert not left.exists() and users.exists() and not legacy.exists()
    assert (root / "a.txt").read_text() == "the user's a\n"
    assert engine.journal.plan_ids() == []
