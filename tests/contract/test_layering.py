"""The layering ARCHITECTURE.md describes, read from the import statements (ast, nothing is
imported): the domain core imports nothing from gRPC or from the layers above it, each core
package imports only the packages below it, and no two modules import each other, however
indirectly. Each rule is also run on a small tree with a planted violation, so it can fail."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVICE = REPO / "service"
CLIENT = REPO / "clients" / "python"
CORE = "checkpointd.core"

#: The core's packages, lowest first: a package may import itself and the packages before it.
LAYERS = ("kernel", "workspace", "metadata", "store", "capture", "config", "restore", "maintenance", "engine")
#: Top-level modules the core must never import (the transport, the generated code, the client).
FORBIDDEN_IN_CORE = ("grpc", "grpc_status", "grpc_health", "grpc_reflection", "google.rpc", "checkpoint",
                     "checkpointd_client")


def modules(root: Path, package: str) -> dict[str, Path]:
    """Dotted name -> file, for every module of ``package`` found under ``root``."""
    found = {}
    for path in sorted((root / package.replace(".", "/")).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import in the module, at any depth (a function's and
    a TYPE_CHECKING block's too). ``from package import name`` counts as an import of the
    submodule when ``name`` is one."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield (sub if sub in known else base), node.lineno


def graph(roots: dict[Path, str]) -> dict[str, dict[str, int]]:
    """Module -> {project module it imports: line}, for the packages in ``roots`` (dir -> package)."""
    found: dict[str, Path] = {}
    for root, package in roots.items():
        found.update(modules(root, package))
    known = set(found)
    edges: dict[str, dict[str, int]] = {}
    for name, path in found.items():
        edges[name] = {}
        for target, line in imports(name, path, known):
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges[name].setdefault(target, line)
    return edges


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if module.startswith(CORE + ".") and len(parts) > 2 else None


def core_violations(root: Path) -> list[str]:
    """Imports of the core that break the layering: gRPC or generated code, anything of
    checkpointd outside the core, a package above its own."""
    problems = []
    known = set(modules(root, "checkpointd"))
    for name, path in modules(root, CORE).items():
        own = layer_of(name)
        if own is not None and own not in LAYERS:
            problems.append(f"{name}: package {own!r} is not in LAYERS")
            continue
        for target, line in imports(name, path, known):
            where = f"{path.relative_to(root)}:{line}"
            if any(target == f or target.startswith(f + ".") for f in FORBIDDEN_IN_CORE):
                problems.append(f"{where} imports {target} (the core knows nothing of gRPC or the client)")
            elif target.startswith("checkpointd.") and not (target == CORE or target.startswith(CORE + ".")):
                problems.append(f"{where} imports {target}, above the core")
            elif own is not None and layer_of(target) in LAYERS and \
                    LAYERS.index(layer_of(target)) > LAYERS.index(own):
                problems.append(f"{where} imports {target}: {own} is below {layer_of(target)}")
    return problems


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The import cycles: one per strongly connected component of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        # Tarjan's algorithm, iterative (a deep import chain must not hit the recursion limit).
        work = [(start, iter(sorted(edges.get(start, {}))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for name in sorted(edges):
        if name not in index:
            visit(name)
    return found


def describe(cycle: list[str], edges: dict[str, dict[str, int]]) -> str:
    members = set(cycle)
    return "; ".join(f"{a} -> {b} (line {line})" for a in cycle for b, line in sorted(edges[a].items())
                     if b in members)


def test_the_core_imports_no_grpc_and_no_package_above_its_own() -> None:
    assert core_violations(SERVICE) == []


def test_no_module_of_the_server_or_the_python_client_imports_itself_through_others() -> None:
    edges = graph({SERVICE: "checkpointd", CLIENT: "checkpointd_client"})
    assert [describe(c, edges) for c in cycles(edges)] == []


def test_every_core_package_says_what_it_owns_and_may_import() -> None:
    for layer in LAYERS:
        init = SERVICE / "checkpointd" / "core" / layer / "__init__.py"
        docstring = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert "May import" in docstring, f"{init.relative_to(REPO)}: say what the package may import"
    on_disk = {p.name for p in (SERVICE / "checkpointd" / "core").iterdir() if (p / "__init__.py").exists()}
    assert on_disk == set(LAYERS), "every core package has its place in LAYERS"


# -- the rules catch what they are meant to ---------------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for relative, text in {"checkpointd/__init__.py": "", "checkpointd/core/__init__.py": "",
                           "checkpointd/core/kernel/__init__.py": "", "checkpointd/core/kernel/errors.py": "",
                           "checkpointd/core/engine/__init__.py": "", "checkpointd/core/engine/create.py": "",
                           "checkpointd/server.py": "", **files}.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize(("planted", "reported"), [
    ("import grpc\n", "imports grpc"),
    ("from google.rpc import status_pb2\n", "imports google.rpc"),
    ("def f():\n    from checkpoint.v1 import checkpoint_service_pb2\n", "imports checkpoint.v1"),
    ("from checkpointd.core.engine import create\n", "kernel is below engine"),
    ("from ..engine.create import x\n", "kernel is below engine"),
    ("from checkpointd import server\n", "above the core"),
])
def test_a_planted_layering_violation_is_reported(tmp_path: Path, planted: str, reported: str) -> None:
    root = _tree(tmp_path, {"checkpointd/core/kernel/faults.py": planted})
    problems = core_violations(root)
    assert len(problems) == 1 and reported in problems[0], problems


def test_a_planted_import_cycle_is_reported_even_through_a_function_or_type_checking_import(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "checkpointd/core/engine/a.py": "from checkpointd.core.engine import b\n",
        "checkpointd/core/engine/b.py": "def f():\n    from checkpointd.core.engine.c import x\n",
        "checkpointd/core/engine/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n",
    })
    edges = graph({root: "checkpointd"})
    assert cycles(edges) == [["checkpointd.core.engine.a", "checkpointd.core.engine.b", "checkpointd.core.engine.c"]]
    assert core_violations(root) == []
