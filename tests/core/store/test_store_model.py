"""Model-based stateful test of the content store alone: a hypothesis state machine keeps up to three
batches open at once and drives them, and the store under them, through random programs, checking
every step against a model of what the store must hold.

The steps: puts (``put_bytes``, ``put_fd``, ``put_records``, ``reuse`` then a put) of contents drawn
from a small family of related ones (versions of three "files" made by small edits, older versions
again, near copies of another file's version, duplicates of what another open batch wrote, tiny
objects, objects over COMPRESS_LIMIT), each with ``similar`` the previous version, an unrelated or
uncommitted digest, the object's own digest, or none; commits, aborts and "crashes" (a batch dropped
without a commit, as a process dying: ``Batch._forget``) of any open batch in any order; puts and
commits of other batches run *inside* a put (hooked where the batch has found the object missing,
where it looks for a base by content, or just before it publishes what it wrote) or inside a commit
(after its sync, before its objects join the store); deletions under ``collecting()`` (the open
batches end first, as a collection waits for the captures in flight) with or without
``compact_all()``; and closing and reopening the store, the open batches dying with it.

The model: every object whose batch committed (or that was stored when a batch ``reuse``-d it), less
those deleted since; which objects an aborted or crashed batch wrote (a reopened store may index
their durable records: then they must read back and are stored from then on). After every step:
every object of the model reads back byte for byte and ``has`` is exactly the model; an object an
open batch wrote reads back; a deleted object is not ``has`` and reads back as itself or not at all;
``damage()`` is empty; every committed delta's chain of bases (walked through ``_committed``) ends
in a whole object without a cycle, is no longer than the depth recorded in its record (what bounds a
chain's growth, to MAX_DELTA_DEPTH), and its base knows it as a dependent (what deleting the base
rewrites first). After reopening, the same.

It found four defects, mended since; the tests at the end are their minimal reproductions (the
first, two objects each other's delta base, is in ``test_perf_paths_attacked``): an object two open
batches wrote that was unreadable once one of them ended; a record a commit left staged; a reopened
store indexing a delta written after the committed record of an object (chains deeper than their
records said).

Seeded and replayable: the seed is CHECKPOINTD_STORE_MODEL_SEED (a fixed default, so CI runs the
same programs every time); a failure prints the failing program and a ``@reproduce_failure`` line.
Replay it with

    CHECKPOINTD_STORE_MODEL_SEED=<seed> .venv/bin/pytest tests/core/store/test_store_model.py -k <test>
    CHECKPOINTD_STORE_MODEL_REPRODUCE='<version> <blob>' .venv/bin/pytest tests/core/store/test_store_model.py

CHECKPOINTD_STORE_MODEL_EXAMPLES and CHECKPOINTD_STORE_MODEL_STEPS override the sizes;
CHECKPOINTD_STORE_MODEL_NO_SHRINK=1 reports the first failing program as found.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, reproduce_failure, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from checkpointd.core.kernel.errors import DataLoss
from checkpointd.core.store.content_store import MAX_CHAIN_LINKS, MAX_DELTA_DEPTH, Batch, ContentStore
from checkpointd.core.store.packs import DELTAS
from checkpointd.core.workspace.readworker import COMPRESS_LIMIT, RECORD, pack_body

SEED = int(os.environ.get("CHECKPOINTD_STORE_MODEL_SEED", "20261203"))
MAX_OPEN = 3
FILES = ("alpha", "beta", "gamma")

# -- the family of contents -----------------------------------------------------------------------


def _first_version(name: str, generation: int = 0) -> bytes:
    """A source-like file of ~60 lines (long enough lines to be found by content)."""
    return b"".join(b"def %s_%d(argument, other=None):  # generation %d\n    return %s_compute(argument, %d)\n"
                    % (name.encode(), i, generation, name.encode(), i * 7919 % 1000) for i in range(30))


def _edit(data: bytes, rng: random.Random) -> bytes:
    """A small edit: one line replaced, inserted, removed, or one appended."""
    lines = data.split(b"\n")
    at = rng.randrange(len(lines))
    how = rng.randrange(4)
    new = b"    edited_%d = compute(%d)  # a small edit" % (rng.randrange(10**6), rng.randrange(100))
    if how == 0:
        lines[at] = new
    elif how == 1:
        lines.insert(at, new)
    elif how == 2 and len(lines) > 3:
        del lines[at]
    else:
        lines.append(new)
    return b"\n".join(lines)


#: Over COMPRESS_LIMIT (stored loose): a few variants of one, edited at the end.
_LARGE = b"".join(b"%08d a line of a large generated file, stored loose\n" % i
                  for i in range(COMPRESS_LIMIT // 50 + 2))
assert len(_LARGE) > COMPRESS_LIMIT


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


#: What a put stores: a new version of a file (an edit), an older version again, a near copy of
#: another file's version, a duplicate of what another open batch (or anyone) wrote, the content
#: the interrupted put is writing or a near copy of it (inner steps only), a tiny object, a large one.
CONTENT_KINDS = ("edit", "edit", "edit", "old", "copy", "copy", "dup", "dup", "same", "same", "near", "near",
                 "tiny", "large")
SIMILAR = ("prev", "prev", "prev", "none", "none", "other", "missing", "self")
METHODS = ("bytes", "bytes", "bytes", "fd", "records", "reuse")
HOOKS = ("known", "candidates", "candidates", "publish")

#: Inner steps mostly write what the interrupted put writes, or a near copy of it.
INNER_KINDS = ("same", "same", "same", "near", "near", "near", "dup", "edit", "copy", "tiny", "large")

contents = st.tuples(st.sampled_from(CONTENT_KINDS), st.integers(0, 7), st.integers(0, 2**20))
inner_contents = st.tuples(st.sampled_from(INNER_KINDS), st.integers(0, 7), st.integers(0, 2**20))
picks = st.integers(0, 7)
inner_steps = st.one_of(
    st.tuples(st.just("put"), picks, inner_contents, st.sampled_from(SIMILAR), st.sampled_from(METHODS)),
    st.tuples(st.just("put_commit"), inner_contents, st.sampled_from(SIMILAR)),
    st.tuples(st.just("put_commit"), inner_contents, st.sampled_from(SIMILAR)),
    st.tuples(st.just("commit"), picks),
    st.tuples(st.just("abort"), picks),
    st.tuples(st.just("crash"), picks),
    st.tuples(st.just("open")),
)


@dataclass
class OpenBatch:
    number: int
    batch: Batch
    #: What it wrote or reused: digest -> content (stored once it commits).
    written: dict[str, bytes] = field(default_factory=dict)


class StoreMachine(RuleBasedStateMachine):
    """See the module docstring. ``workdir`` is set by the test (a directory for the stores)."""

    workdir: Path = Path(tempfile.gettempdir())

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="store-", dir=self.workdir))
        self.scratch = Path(tempfile.mkdtemp(prefix="fd-", dir=self.workdir))
        self.store = ContentStore(self.root / "store")
        #: Every content ever put, by digest.
        self.contents: dict[str, bytes] = {}
        self.versions: dict[str, list[bytes]] = {name: [] for name in FILES}
        #: The model: stored objects.
        self.committed: dict[str, bytes] = {}
        #: Written by a batch that aborted or crashed (a reopened store may index them).
        self.maybe: set[str] = set()
        #: Deleted and not stored since.
        self.deleted: set[str] = set()
        self.open: dict[int, OpenBatch] = {}
        self.numbers = 0
        #: The put being interrupted by inner steps: (its batch's number, its content).
        self.interrupted: tuple[int, bytes] | None = None
        self.stats: Counter[str] = Counter()

    def teardown(self) -> None:
        with contextlib.suppress(Exception):
            self.store.close()
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.scratch, ignore_errors=True)
        self.stats["examples"] += 1
        StoreMachine.totals.update(self.stats)

    totals: Counter[str] = Counter()

    # -- steps (shared by rules and inner steps) ----------------------------------------------------

    def _resolve(self, spec: tuple[str, int, int], similar_how: str) -> tuple[bytes, str]:
        """The content ``spec`` draws and the ``similar`` to put it with."""
        kind, pick, number = spec
        rng = random.Random(number)
        name = FILES[pick % len(FILES)]
        versions = self.versions[name]
        previous = b""
        if kind in ("same", "near") and self.interrupted is not None:
            data = self.interrupted[1]
            if kind == "near":
                previous = data
                data = data + b"# a near copy of it, %d\n" % (number % 3)
        elif kind == "dup" and self.contents:
            pending = [d for b in self.open.values() for d in b.written]
            pool = pending if pending and number % 4 else sorted(self.contents)
            data = self.contents[pool[number % len(pool)]]
        elif kind == "old" and versions:
            data = versions[number % len(versions)]
            previous = versions[-1]
        elif kind == "copy" and any(self.versions.values()):
            others = [v for other in FILES if other != name for v in self.versions[other]] or versions
            data = others[number % len(others)] + b"# copied to %s (%d)\n" % (name.encode(), number % 5)
            versions.append(data)
        elif kind == "tiny":
            data = b"tiny %d\n" % (number % 6)
        elif kind == "large":
            data = _LARGE + b"variant %d\n" % (number % 3)
            if number % 2:
                previous = data
                data = data + b"edited %d\n" % (number % 4)
        elif versions:
            previous = versions[-1 - number % min(3, len(versions))]
            data = _edit(previous, rng)
            versions.append(data)
        else:
            data = _first_version(name, number % 2)
            versions.append(data)
        digest = _digest(data)
        self.contents[digest] = data
        if similar_how == "prev":
            similar = _digest(previous) if previous else ""
        elif similar_how == "other" and self.committed:
            similar = sorted(self.committed)[number % len(self.committed)]
        elif similar_how == "missing":
            gone = sorted(set(self.contents) - set(self.committed)) or ["ab" * 32]
            similar = gone[number % len(gone)]
        elif similar_how == "self":
            similar = digest
        else:
            similar = ""
        return data, similar

    def _open_batch(self, transient: bool = False) -> OpenBatch | None:
        """A new batch, unless MAX_OPEN are open (one more for a ``transient`` one, which commits
        at once: another capture from start to end)."""
        if len(self.open) >= MAX_OPEN + transient:
            return None
        self.numbers += 1
        opened = OpenBatch(self.numbers, self.store.batch())
        self.open[opened.number] = opened
        self.stats["batches opened"] += 1
        return opened

    def _pick(self, pick: int, exclude: int | None = None) -> OpenBatch | None:
        numbers = sorted(n for n in self.open if n != exclude)
        return self.open[numbers[pick % len(numbers)]] if numbers else None

    def _put(self, opened: OpenBatch, spec, similar_how: str, method: str,
             resolved: tuple[bytes, str] | None = None) -> str:
        data, similar = resolved or self._resolve(spec, similar_how)
        digest = _digest(data)
        batch = opened.batch
        if method == "fd":
            path = self.scratch / f"{digest}-{len(os.listdir(self.scratch))}"
            path.write_bytes(data)
            fd = os.open(path, os.O_RDONLY)
            try:
                assert batch.put_fd(fd, len(data), similar) == (digest, len(data))
            finally:
                os.close(fd)
                path.unlink()
        elif method == "records" and len(data) <= COMPRESS_LIMIT:
            kind, body = pack_body(data)
            batch.put_records([(digest, RECORD.pack(bytes.fromhex(digest), kind, len(body)) + body)])
        elif method == "reuse":
            known = digest in self.committed or digest in opened.written
            assert batch.reuse(digest) is known, f"reuse({digest}) is not {known}"
            if not known:
                assert batch.put_bytes(data, similar) == digest
        else:
            assert batch.put_bytes(data, similar) == digest
        opened.written[digest] = data
        self.stats[f"puts by {method}"] += 1
        if len(data) > COMPRESS_LIMIT:
            self.stats["large objects put"] += 1
        return digest

    def _commit(self, opened: OpenBatch) -> None:
        del self.open[opened.number]
        opened.batch.commit()
        self.committed.update(opened.written)
        self.deleted -= opened.written.keys()
        self.stats["commits"] += 1

    def _drop(self, opened: OpenBatch, how: str) -> None:
        del self.open[opened.number]
        if how == "abort":
            opened.batch.abort()
        else:
            opened.batch._forget()  # the process dies before the commit: nothing more of this batch runs
        self.maybe |= opened.written.keys()
        self.stats["aborts" if how == "abort" else "crashes"] += 1

    def _inner(self, step: tuple, outer: int) -> None:
        """One step of another batch (or, for a put, of another thread of the same one) run in the
        middle of batch ``outer``'s put or commit."""
        what = step[0]
        self.stats["inner steps"] += 1
        if what == "open":
            self._open_batch()
        elif what == "put_commit":
            opened = self._open_batch(transient=True)
            if opened is not None:
                self._put(opened, step[1], step[2], "bytes")
                self._commit(opened)
        elif what == "put":
            opened = self._pick(step[1]) if step[1] % 3 else None
            opened = opened or self._open_batch() or self._pick(step[1])
            if opened is not None:
                self._put(opened, *step[2:])
        else:
            opened = self._pick(step[1], exclude=outer)
            if opened is not None:
                if what == "commit":
                    self._commit(opened)
                else:
                    self._drop(opened, what)

    @contextlib.contextmanager
    def _hooked_put(self, opened: OpenBatch, hook: str, steps: list[tuple]):
        """Arms ``hook`` so that ``steps`` run once inside the next put of ``opened``; they run after
        it if the put never got there (an object already known, one not searched for)."""
        store, batch, ran = self.store, opened.batch, []

        def run() -> None:
            if not ran:
                ran.append(True)
                for step in steps:
                    self._inner(step, opened.number)

        if hook == "known":
            real_known = batch._known

            def known(digest: str) -> bool:
                found = real_known(digest)
                if not found:
                    run()  # found missing: others write and commit it meanwhile
                return found

            batch._known = known
        elif hook == "candidates":
            real_candidates = store._similar.candidates

            def candidates(found, exclude=""):
                run()  # while this batch compresses the object and looks for a base
                return real_candidates(found, exclude)

            store._similar.candidates = candidates
        else:
            real_publish_all = batch._publish_all

            def publish_all(written):
                run()  # written to the pack, not yet known to the batch
                return real_publish_all(written)

            batch._publish_all = publish_all
        try:
            yield
        finally:
            for name in ("_known", "_publish_all"):
                batch.__dict__.pop(name, None)
            store._similar.__dict__.pop("candidates", None)
        if ran:
            self.stats[f"puts interrupted at {hook}"] += 1
        else:
            run()

    def _settle(self) -> None:
        """A collection waits for the captures in flight: each open batch commits."""
        for number in sorted(self.open):
            self._commit(self.open[number])

    # -- rules --------------------------------------------------------------------------------------

    @initialize()
    def first_batch(self) -> None:
        self._open_batch()

    @rule()
    def open_batch(self) -> None:
        self._open_batch()

    @rule(pick=picks, spec=contents, similar=st.sampled_from(SIMILAR), method=st.sampled_from(METHODS))
    def put(self, pick, spec, similar, method) -> None:
        opened = self._pick(pick) or self._open_batch()
        self._put(opened, spec, similar, method)

    @rule(pick=picks, spec=contents, similar=st.sampled_from(SIMILAR), method=st.sampled_from(METHODS),
          hook=st.sampled_from(HOOKS), steps=st.lists(inner_steps, min_size=1, max_size=4))
    def put_interrupted(self, pick, spec, similar, method, hook, steps) -> None:
        """A put during which other batches put, commit, abort or crash (two captures of one new
        content at the same moment, a near copy of it stored meanwhile)."""
        opened = self._pick(pick) or self._open_batch()
        resolved = self._resolve(spec, similar)
        self.interrupted = (opened.number, resolved[0])
        try:
            with self._hooked_put(opened, hook, steps):
                self._put(opened, spec, similar, method, resolved)
        finally:
            self.interrupted = None

    @rule(pick=picks)
    def commit(self, pick) -> None:
        opened = self._pick(pick)
        if opened is not None:
            self._commit(opened)

    @rule(pick=picks, steps=st.lists(inner_steps, min_size=1, max_size=3))
    def commit_interrupted(self, pick, steps) -> None:
        """A commit whose objects are durable but not yet in the store while other batches run."""
        opened = self._pick(pick)
        if opened is None:
            return
        real = opened.batch._make_durable
        interrupted = next(iter(opened.written.values()), b"")

        def make_durable() -> None:
            real()
            self.interrupted = (opened.number, interrupted)
            try:
                for step in steps:
                    self._inner(step, opened.number)
            finally:
                self.interrupted = None

        opened.batch._make_durable = make_durable
        self._commit(opened)
        self.stats["commits interrupted"] += 1

    @rule(pick=picks, how=st.sampled_from(("abort", "crash")))
    def drop(self, pick, how) -> None:
        opened = self._pick(pick)
        if opened is not None:
            self._drop(opened, how)

    @rule(picks_=st.lists(st.integers(0, 2**16), min_size=1, max_size=3), compact=st.booleans())
    def collect(self, picks_, compact) -> None:
        """Deletes some stored objects (once in a while one that is not stored), then may compact."""
        self._settle()
        self.stats["collections"] += 1
        stored = sorted(self.committed)
        with self.store.collecting():
            for pick in picks_:
                if not stored or pick % 11 == 0:
                    unknown = sorted(self.contents.keys() - self.committed.keys()) or ["cd" * 32]
                    self.store.delete(unknown[pick % len(unknown)])
                    continue
                digest = stored[pick % len(stored)]
                self.store.delete(digest)
                del self.committed[digest]
                self.maybe.discard(digest)
                self.deleted.add(digest)
                stored.remove(digest)
                self.stats["deletions"] += 1
            if compact:
                self.store.compact_all()
                self.stats["compactions"] += 1

    @rule()
    def compact(self) -> None:
        self._settle()
        with self.store.collecting():
            self.store.compact_all()
        self.stats["compactions"] += 1

    @rule(crash=st.booleans())
    def reopen(self, crash) -> None:
        """Closes the store (its open batches die with the process) and opens it again."""
        if not crash:
            self._settle()
        for number in sorted(self.open):
            opened = self.open.pop(number)
            self.maybe |= opened.written.keys()
            self.stats["batches dying with the store"] += 1
        depths = {digest: location.depth for digest, location in self.store._committed.items()}
        self.store.close()
        self.store = ContentStore(self.root / "store")
        self.stats["reopens"] += 1
        for digest, depth in depths.items():
            location = self.store._committed.get(digest)
            assert location is None or location.depth <= depth, (
                f"{digest} indexed {location.depth} deltas deep on reopening, committed {depth} deep")
        extra = set(self.store._committed) - self.committed.keys()
        assert extra <= self.maybe, f"stored after reopening, never committed: {sorted(extra - self.maybe)}"
        missing = self.committed.keys() - set(self.store._committed)
        assert not missing, f"committed, lost on reopening: {sorted(missing)}"
        for digest in extra:  # records of batches that never committed, durable: stored from now on
            assert self.store.read_bytes(digest) == self.contents[digest]
            self.committed[digest] = self.contents[digest]
            self.deleted.discard(digest)
            self.stats["uncommitted objects indexed on reopening"] += 1

    # -- invariants ---------------------------------------------------------------------------------

    @invariant()
    def stored_objects_read_back(self) -> None:
        store = self.store
        assert set(store._committed) == self.committed.keys(), (
            f"has() differs from the model: extra {sorted(set(store._committed) - self.committed.keys())}, "
            f"missing {sorted(self.committed.keys() - set(store._committed))}")
        for digest, data in self.committed.items():
            assert store.has(digest)
            try:
                assert store.read_bytes(digest) == data
            except DataLoss as lost:
                raise AssertionError(f"committed object {digest} is unreadable: {lost}") from lost
        assert store.damage() == []

    @invariant()
    def open_batches_read_their_objects(self) -> None:
        for opened in self.open.values():
            for digest, data in opened.written.items():
                assert self.store.read_bytes(digest) == data

    @invariant()
    def deleted_objects_are_gone_or_themselves(self) -> None:
        written = {d for opened in self.open.values() for d in opened.written}
        for digest in self.deleted - self.committed.keys():
            assert not self.store.has(digest)
            if digest in written:
                continue
            with contextlib.suppress(DataLoss):
                assert self.store.read_bytes(digest) == self.contents[digest]

    @invariant()
    def delta_chains_are_bounded_and_known_to_their_bases(self) -> None:
        committed = self.store._committed
        for digest, location in committed.items():
            if location.kind not in DELTAS:
                continue
            assert digest in self.store._dependents.get(location.base, ()), (
                f"{digest} is a delta of {location.base}, which does not list it as a dependent")
            chain = [digest]
            link = location
            while link.kind in DELTAS:
                assert link.base not in chain, f"a cycle of deltas: {chain + [link.base]}"
                chain.append(link.base)
                assert len(chain) <= MAX_CHAIN_LINKS
                link = committed[link.base]
            links = len(chain) - 1
            assert location.depth <= MAX_DELTA_DEPTH
            assert links <= location.depth, f"{digest}: {links} deltas deep, recorded {location.depth} deep: {chain}"


def run_machine(workdir: Path, examples: int, steps: int) -> Counter[str]:
    machine = type("Machine", (StoreMachine,), {"workdir": workdir})
    StoreMachine.totals = Counter()
    machine = seed(SEED)(machine)
    replay = os.environ.get("CHECKPOINTD_STORE_MODEL_REPRODUCE", "")
    if replay:
        version, blob = replay.split(" ", 1)
        machine = reproduce_failure(version, blob.encode())(machine)
    phases = [Phase.explicit, Phase.reuse, Phase.generate]
    if not os.environ.get("CHECKPOINTD_STORE_MODEL_NO_SHRINK"):
        phases.append(Phase.shrink)
    try:
        run_state_machine_as_test(machine, settings=settings(
            max_examples=int(os.environ.get("CHECKPOINTD_STORE_MODEL_EXAMPLES", examples)),
            stateful_step_count=int(os.environ.get("CHECKPOINTD_STORE_MODEL_STEPS", steps)),
            deadline=None, database=None, print_blob=True, phases=phases,
            suppress_health_check=list(HealthCheck)))
    finally:
        totals = StoreMachine.totals
        print(f"store model (seed {SEED}):", ", ".join(f"{k}: {v}" for k, v in sorted(totals.items())))
    return totals


def _reached(totals: Counter[str]) -> None:
    """The machine reached what it is meant to test (with the fixed seed it does)."""
    if "CHECKPOINTD_STORE_MODEL_REPRODUCE" in os.environ:
        return
    for what in ("commits", "aborts", "crashes", "deletions", "compactions", "reopens", "inner steps",
                 "puts interrupted at candidates", "puts interrupted at known", "puts interrupted at publish",
                 "commits interrupted", "large objects put", "puts by fd", "puts by records", "puts by reuse",
                 "uncommitted objects indexed on reopening"):
        assert totals[what] > 0, f"no {what} in this run: {dict(totals)}"


def test_store_model(tmp_path) -> None:
    _reached(run_machine(tmp_path, examples=300, steps=40))


@pytest.mark.slow
@pytest.mark.timeout(1200)  # ~4 min on a quiet 2-core machine; the suite's 300 s default is for hangs
def test_store_model_long(tmp_path) -> None:
    _reached(run_machine(tmp_path, examples=1000, steps=60))


# -- defects the machine found, reproduced deterministically --------------------------------------


def _whole_record(data: bytes) -> tuple[str, bytes]:
    """``data`` as a reader process encodes it (``put_records``): a whole record, never a delta."""
    kind, body = pack_body(data)
    return _digest(data), RECORD.pack(bytes.fromhex(_digest(data)), kind, len(body)) + body


def _chain_depth(store: ContentStore, digest: str) -> int:
    link, links = store._committed[digest], 0
    while link.kind in DELTAS:
        links += 1
        link = store._committed[link.base]
    return links


@pytest.mark.parametrize("large", [False, True], ids=["packed", "loose"])
def test_an_object_two_open_batches_wrote_stays_readable_when_one_of_them_aborts(tmp_path, large):
    """Two diffs of the same files (each a batch that is read back and aborted): both write the same
    new tree node; the first one ends and aborts; the second one reads its tree back."""
    store = ContentStore(tmp_path)
    data = _LARGE + b"written twice\n" if large else _first_version("alpha") + b"written twice\n"
    first, second = store.batch(), store.batch()
    digest = first.put_bytes(data)
    assert second.put_bytes(data) == digest
    first.abort()
    try:
        assert store.read_bytes(digest) == data, "the second batch's object reads back"
    finally:
        second.commit()
        assert store.read_bytes(digest) == data
        store.close()


def _racing_a_whole_commit(store: ContentStore, data: bytes) -> Batch:
    """A batch that, once it finds an object missing, sees another capture of ``data`` commit it
    whole before it writes it (two captures of one new content at once)."""
    late = store.batch()
    real_known = late._known

    def known(wanted: str) -> bool:
        found = real_known(wanted)
        if not found:
            with store.batch() as reader:
                reader.put_records([_whole_record(data)])
        return found

    late._known = known
    return late


def test_a_batch_whose_object_was_committed_meanwhile_leaves_nothing_staged(tmp_path):
    store = ContentStore(tmp_path)
    base_data = _first_version("stale")
    data = base_data + b"# a new version\n"
    with store.batch() as batch:
        base = batch.put_bytes(base_data)
    late = _racing_a_whole_commit(store, data)
    digest = late.put_bytes(data, similar=base)
    late.commit()
    assert store.read_bytes(digest) == data and store._committed[digest].kind not in DELTAS
    stale = store._staged.first(digest)
    with store.collecting():
        store.delete(digest)
        store.delete(base)
        store.compact_all()
    again = store.batch()
    again.put_bytes(data)
    try:
        assert stale is None, f"left staged: {stale}"
        assert store.read_bytes(digest) == data
    finally:
        again.abort()
        store.close()


def _commit_whole_after(store: ContentStore, data: bytes, base: str, how: str) -> None:
    """Two batches capture ``data`` at once; the one that writes it as a delta of ``base`` records
    it after the other's whole record, then ends ``how``; the store holds the whole record."""
    digest = _digest(data)
    if how == "whole-committed-last":
        reader = store.batch()
        reader.put_records([_whole_record(data)])  # a reader process's whole record, written first
        with store.batch() as batch:
            batch.put_bytes(data, similar=base)
        assert store._committed[digest].depth == MAX_DELTA_DEPTH
        reader.commit()  # a whole record replaces a committed delta (a chain ending there is shorter)
    else:
        late = _racing_a_whole_commit(store, data)
        late.put_bytes(data, similar=base)
        assert late._pending[digest].depth == MAX_DELTA_DEPTH
        late._forget() if how == "crashed" else late.abort()
    assert store._committed[digest].kind not in DELTAS


@pytest.mark.parametrize("how", ["crashed", "aborted", "whole-committed-last"])
def test_a_late_delta_of_an_object_committed_meanwhile_never_deepens_its_dependents_on_reopen(tmp_path, how):
    """Six files, each 16 versions (a chain of 15 deltas over a whole first version, as ``_delta``
    allows). The first version of each file after the first one is an edit of the previous file's
    last version (a copy), captured by two batches at once (``_commit_whole_after``): the store holds
    it whole, the pack has a delta of it 16 deep after that record. Before the restart every chain is
    at most 15 deep; after it, the last version of the last file is 95 deltas deep, and reading it
    is DataLoss ("a base more than 64 deltas deep")."""
    store = ContentStore(tmp_path)
    last: list[str] = []
    contents: dict[str, bytes] = {}
    data = _first_version("delta")
    for file in range(6):
        if file:
            data = data.replace(b"generation 0", b"generation %d" % file, 1)
            _commit_whole_after(store, data, last[-1], how)
        previous = ""
        for version in range(MAX_DELTA_DEPTH):
            if version:  # one line replaced by a new one: a delta of the version before
                lines = data.split(b"\n")
                lines[version * 3] = b"    edited_%d_%d = compute(%d)  # an edit" % (file, version, version)
                data = b"\n".join(lines)
            with store.batch() as batch:
                previous = batch.put_bytes(data, similar=previous)
            contents[previous] = data
        last.append(previous)
    assert max(_chain_depth(store, digest) for digest in contents) == MAX_DELTA_DEPTH - 1
    store.close()
    reopened = ContentStore(tmp_path)
    try:
        deepest = max(_chain_depth(reopened, digest) for digest in contents)
        assert deepest <= MAX_DELTA_DEPTH, f"a chain {deepest} deltas deep after reopening"
        assert all(reopened.read_bytes(digest) == data for digest, data in contents.items())
    finally:
        reopened.close()
