"""Every code block of the READMEs is either run by a test or marked, in the markdown, as not
meant to run (tests/readme_blocks.py describes the markers)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.readme_blocks import READMES, REPO, blocks


def requested_blocks() -> set[tuple[str, str]]:
    """Every readme_block("FILE", "NAME") call with literal arguments in the test suite, and the
    pairs of the one test that takes them from a list."""
    from tests.clients.test_client_readme import EXAMPLES

    found: set[tuple[str, str]] = set(EXAMPLES)
    for path in (REPO / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "readme_block"
                    and len(node.args) == 2 and all(isinstance(a, ast.Constant) for a in node.args)):
                found.add((node.args[0].value, node.args[1].value))
    return found


@pytest.mark.parametrize("readme", READMES)
def test_every_block_is_run_by_a_test_or_marked_as_not_meant_to_run(readme: str) -> None:
    requested = requested_blocks()
    found = blocks(readme)
    assert found, f"{readme} has no code block"
    for block in found:
        assert block.test or block.not_run, (
            f"{block.where}: a ```{block.language} block with neither <!-- readme-test: NAME --> (and a test that "
            "calls readme_block for it) nor <!-- not-run: WHY --> on the line before it")
        if block.test:
            assert (readme, block.test) in requested, f"{block.where}: no test runs readme-test: {block.test}"
    names = [block.test for block in found if block.test]
    assert len(names) == len(set(names)), f"{readme}: a readme-test name is used twice: {names}"


def test_every_block_a_test_asks_for_exists() -> None:
    marked = {(readme, block.test) for readme in READMES for block in blocks(readme) if block.test}
    missing = {(readme, name) for readme, name in requested_blocks() if readme in READMES} - marked
    assert not missing, f"tests ask for blocks no README marks: {sorted(missing)}"


def test_the_readme_links_the_performance_page() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "(docs/PERFORMANCE.md)" in readme and Path(REPO / "docs" / "PERFORMANCE.md").exists()
