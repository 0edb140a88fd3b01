"""Generated workspaces (files, symlinks, directories, read-only ones, modes, kinds flipped at
two levels), rolled back each of several ways (clean, raced, killed at a fault point and finished,
an undo killed and finished, a full disk): the durability oracle (``durability_oracle``) finds every change
synced before the rollback lets go of it (seeded: the same examples every run)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.core.restore.durability_oracle import DurabilityOracle, Layout, make_writable
from tests.core.restore.test_every_workspace_change_of_a_rollback_is_synced_before_its_entry_goes import run
from tests.core.restore.test_rollback_write_path_attacked import Plan

#: Each path's parent comes before it.
PATHS = ("a", "b", "d", "d/a", "d/e", "d/e/a")
WAYS = ("clean", "raced", "killed at the 2nd change", "killed with the 1st file at its temporary name",
        "killed renamed into place, unsynced", "killed applied, entry not removed",
        "a kill leaving a directory's window open", "undo killed at its 1st change", "undo killed at its 2nd change",
        "disk full from the 2nd file on")

node = st.one_of(
    st.none(),
    st.tuples(st.just("file"), st.sampled_from([b"x\n", b"y\n", b"longer content\n"]),
              st.sampled_from([0o644, 0o600, 0o755])),
    st.tuples(st.just("link"), st.sampled_from(["a", "elsewhere"])),
    st.tuples(st.just("dir"), st.sampled_from([0o755, 0o750, 0o555])),
)


@st.composite
def layouts(draw) -> Layout:
    layout: Layout = {}
    for path in PATHS:
        parent = path.rpartition("/")[0]
        if parent and layout.get(parent, ("",))[0] != "dir":
            continue
        spec = draw(node)
        if spec is not None:
            layout[path] = spec
    return layout


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(target=layouts(), current=layouts(), way=st.sampled_from(WAYS), scoped=st.booleans())
def test_any_workspace_rolled_back_any_way_has_every_change_synced_before_the_rollback_lets_go(
        target: Layout, current: Layout, way: str, scoped: bool) -> None:
    paths = ("d",) if scoped else ()
    with tempfile.TemporaryDirectory() as base, pytest.MonkeyPatch.context() as mp:
        plan = Plan(Path(base))
        try:
            oracle = DurabilityOracle(str(plan.root)).install(mp, plan.engine)
            expected = run(plan, oracle, target, current, paths, way)
            oracle.assert_durable()
            if way == "clean" or way.startswith(("killed ", "a kill")):
                state = plan.state()
                assert {p: v for p, v in state.items() if not paths or p.startswith(paths)} == \
                    {p: v for p, v in expected.items() if not paths or p.startswith(paths)}
        finally:
            make_writable(str(plan.root))
            plan.close()
