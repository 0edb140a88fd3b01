"""Model-based stateful test: a hypothesis state machine drives a real checkpointd (one server on
SQLite and the disk store, or two replicas on one PostgreSQL database with `--store db`) through
random workspace edits and calls, and checks every step against a model of what each
acknowledged checkpoint must hold.

Each example restarts a server with a kill -9 and a race armed (``arm``), then runs
``random_steps(seed)`` rules, eight steps each chosen by a seeded random.Random (hypothesis's own
choice among many rules repeats one for long stretches when it runs as few examples as real servers
allow). The steps (tests/hardening/model_machine.py): workspace edits (write, append, delete, rename, mkdir,
chmod with setuid/setgid/sticky, symlinks, hard links inside the workspace and to files outside
it written through their outside name, type flips, .gitignore edits, same-size same-mtime
rewrites, files over the size limit); CreateCheckpoint (some pinned; the servers store directories of
more than two entries split into parts, as they do directories of thousands, so edits move
directories in and out of that form), DiffCheckpoints against the
live workspace, DeleteCheckpoint, a retention rule, `checkpointd gc` (retention, collection and
compaction of small packs, killed at a compaction point), restart and kill -9, a kill -9 armed at
a fault point of CreateCheckpoint or Rollback (the call is retried with its request_id; on
PostgreSQL through the other replica first), Rollback (full, scoped to a top-level path, dry run)
and a tool writing while a rollback is paused before its first change, and calls given up on
(``give_up``): a Rollback (full or scoped, its own request_id), a CreateCheckpoint or a live
DiffCheckpoints, cancelled a few milliseconds after it is sent or sent with a deadline that short,
sometimes with an edit made while it is in flight, sometimes with a few hundred files rewritten
just before (checkpointed first: the capture given up on has them all to read, and is likely
stopped among them, keeping the base it would have built on). Such a call may end OK, CANCELLED or
DEADLINE_EXCEEDED only; once the plan is free again (a dry-run rollback answers), a rollback either
did not happen (no checkpoint of it, the workspace as it was, or within its scope as it was when an
edit raced it outside) or ran to its end (exactly one safety checkpoint labelled rollback_target,
which its request_id answers with, and the workspace exactly the target), or, where a tool wrote
while it was paused past its commit point, undid what it had changed; a create's request_id
answers with the checkpoint it recorded (modelled when no edit raced it); and the next
CreateCheckpoint, read back byte for byte, holds the workspace exactly.

The model (tests/hardening/model_workspace.py): for every acknowledged checkpoint, the exact tree
(bytes, modes, link texts, types) on disk at acknowledgement, less what the README says a capture
leaves out (its .gitignore's patterns, files over core.snapshot.max_file_size_bytes, which must be
listed in skipped_files). After every step: health answers, no call got INTERNAL or UNKNOWN, and
every acknowledged checkpoint diffed against the newest gives exactly the model's diff (paths,
kinds, types, sizes, modes; content through MODIFIED). After every eight steps, and offline around
every collection, the integrity check (`checkpointd fsck`, AdminService/CheckIntegrity: it reads
the whole store) is clean with no unfinished rollback. A rollback must leave exactly what the model
predicts (or, where the model allows it, ROLLBACK_CONFLICT with nothing changed); a write racing it
is on disk after it (or, when the rollback was killed, in the safety checkpoint its recovery
records first). When each example ends, after a collection, every acknowledged checkpoint is
rolled back to and compared byte for byte.

Seeded and replayable. The seed is CHECKPOINTD_MODEL_SEED (a fixed default, so CI runs the same
examples every time); a failure prints the steps of the failing example and a
`@reproduce_failure(...)` line. Replay it with:

    CHECKPOINTD_MODEL_SEED=<seed> .venv/bin/pytest tests/hardening/test_model.py -k <test> -x
    CHECKPOINTD_MODEL_REPRODUCE='<version> <blob>' .venv/bin/pytest tests/hardening/test_model.py -k <test>

(the blob from the printed `@reproduce_failure('<version>', b'<blob>')`). CHECKPOINTD_MODEL_SHRINK=1
lets hypothesis shrink a failure to a minimal program (minutes: every try drives real servers).
CHECKPOINTD_MODEL_EXAMPLES and CHECKPOINTD_MODEL_STEPS override the sizes.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, reproduce_failure, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.hardening.model_cluster import Cluster
from tests.hardening.model_machine import ModelMachine

SEED = int(os.environ.get("CHECKPOINTD_MODEL_SEED", "20261202"))


def run_machine(cluster: Cluster, examples: int, steps: int, restart_budget: int) -> None:
    machine = type("Machine", (ModelMachine,), {"cluster": cluster, "restart_budget": restart_budget})
    machine = seed(SEED)(machine)
    replay = os.environ.get("CHECKPOINTD_MODEL_REPRODUCE", "")
    if replay:
        version, blob = replay.split(" ", 1)
        machine = reproduce_failure(version, blob.encode())(machine)
    phases = [Phase.explicit, Phase.reuse, Phase.generate]
    if os.environ.get("CHECKPOINTD_MODEL_SHRINK"):
        phases.append(Phase.shrink)
    run_state_machine_as_test(machine, settings=settings(
        max_examples=int(os.environ.get("CHECKPOINTD_MODEL_EXAMPLES", examples)),
        stateful_step_count=int(os.environ.get("CHECKPOINTD_MODEL_STEPS", steps)),
        deadline=None, database=None, print_blob=True, phases=phases,
        suppress_health_check=list(HealthCheck)))
    stats = cluster.stats
    print("model test:", ", ".join(f"{k}: {round(v, 1)}" for k, v in sorted(stats.items())))
    # The machine must have reached what it is meant to test (with the fixed seed it does).
    if "CHECKPOINTD_MODEL_REPRODUCE" not in os.environ:
        for what in ("calls CreateCheckpoint", "rollbacks checked byte for byte", "kills at armed points",
                     "writes racing a rollback", "collections", "checkpoints holding a split directory",
                     "diff pages resumed between two checkpoints", "diffs paged on after another step",
                     "calls given up on", "creates after a give-up read back byte for byte"):
            assert stats[what] > 0, f"no {what} in this run: {dict(stats)}"


@pytest.fixture
def single_server(short_tmp: Path):
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="mdl-", dir=short_tmp)))
    cluster.start_all()
    yield cluster
    cluster.stop_all()


@pytest.fixture
def two_replicas(short_tmp: Path, postgres):
    url = postgres.create()
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="mdr-", dir=short_tmp)), db_url=url, replicas=2)
    try:
        cluster.start_all()
        yield cluster
    finally:
        cluster.stop_all()
        postgres.drop(url)


def test_model_single_server(single_server) -> None:
    run_machine(single_server, examples=2, steps=6, restart_budget=2)


@pytest.mark.postgres
def test_model_two_replicas_on_postgresql(two_replicas) -> None:
    run_machine(two_replicas, examples=2, steps=5, restart_budget=2)


@pytest.mark.slow
def test_model_single_server_long(single_server) -> None:
    run_machine(single_server, examples=6, steps=12, restart_budget=4)
