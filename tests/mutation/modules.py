"""`make mutants`: cosmic-ray over the core modules, with a mutation score per module.

Why cosmic-ray: our tests start real `checkpointd serve` subprocesses, so the mutant must be in
the source file that a new process imports. cosmic-ray writes each mutant into the file on disk
and runs any test command; mutmut 3 instead imports mutants through trampolines inside the test
process and maps tests to mutants by what that process executes, so it would see no test reach
the server's code at all. cosmic-ray runs here in a scratch copy of the tree (PYTHONPATH points
every process at it; see critical.py), so the working tree is never touched.

Mutants that cannot change behaviour are left out by rule (operators on type annotations, on
docstrings and log calls; operators whose mutants are rarely meaningful: see OPERATORS) and by
the checked-in list equivalent.toml (file, operator, the mutated line, and why).

    python -m tests.mutation.modules [--module NAME ...] [--jobs N] [--sample N] [--count]

Runs with the cosmic-ray installed in .venv-mutants (`make mutants` sets it up); the tests run
with the project's .venv. Writes build/mutation/<module>.json and prints the scores.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tests.mutation.critical import REPO, Scratch

MODULES = Path(__file__).with_name("modules.toml")
EQUIVALENT = Path(__file__).with_name("equivalent.toml")
REPORTS = REPO / "build" / "mutation"
TEST_TIMEOUT_S = 180
#: The operators kept (regular expressions on cosmic-ray's names). Left out: the shifts, powers,
#: bit operators and most arithmetic swaps (near-always crashes or equivalents in this code),
#: decorators, and `x op y` -> `x is y` style comparisons (crashes or trivially caught).
OPERATORS = [
    r"core/NumberReplacer",
    r"core/AddNot",
    r"core/ReplaceUnaryOperator_Delete_Not",
    r"core/ReplaceTrueWithFalse",
    r"core/ReplaceFalseWithTrue",
    r"core/ReplaceAndWithOr",
    r"core/ReplaceOrWithAnd",
    r"core/ZeroIterationForLoop",
    r"core/ReplaceContinueWithBreak",
    r"core/ReplaceBreakWithContinue",
    r"core/ExceptionReplacer",
    r"core/ReplaceComparisonOperator_(Eq_NotEq|NotEq_Eq|Is_IsNot|IsNot_Is|Lt_LtE|LtE_Lt|Gt_GtE|GtE_Gt|Lt_Gt|Gt_Lt)",
    r"core/ReplaceComparisonOperator_(LtE_GtE|GtE_LtE)",
    r"core/ReplaceBinaryOperator_(Add_Sub|Sub_Add|Mul_Div|Div_Mul|FloorDiv_Mul|Mod_FloorDiv)",
    r"core/ReplaceBinaryOperator_(BitOr_BitAnd|BitAnd_BitOr)",
    r"core/ReplaceUnaryOperator_USub_UAdd",
]
_KEPT = re.compile("|".join(f"(?:{o})$" for o in OPERATORS))
_LOG_CALL = re.compile(r"^\s*(log|logger)\.(debug|info|warning|error|exception|log)\(")


@dataclass(frozen=True)
class Module:
    name: str
    files: tuple[str, ...]
    pytest: tuple[str, ...]
    functions: tuple[str, ...] = ()


def load_modules() -> list[Module]:
    with open(MODULES, "rb") as f:
        raw = tomllib.load(f)["module"]
    return [Module(m["name"], tuple(m["files"]), tuple(m["pytest"]), tuple(m.get("functions", ()))) for m in raw]


def load_equivalent() -> dict[tuple[str, str, str, str], str]:
    """(file, operator, stripped source line, stripped line before it or "") -> why the mutant
    cannot change behaviour."""
    if not EQUIVALENT.exists():
        return {}
    with open(EQUIVALENT, "rb") as f:
        raw = tomllib.load(f).get("equivalent", [])
    return {(e["file"], e["operator"], e["line"].strip(), e.get("previous", "").strip()): e["reason"] for e in raw}


class _Spans(ast.NodeVisitor):
    """Line spans of annotations, docstrings and (qualified) function bodies in one file."""

    def __init__(self) -> None:
        self.excluded: list[tuple[int, int, int, int]] = []
        self.functions: dict[str, tuple[int, int]] = {}
        self._scope: list[str] = []

    def _exclude(self, node: ast.AST | None) -> None:
        if node is not None:
            self.excluded.append((node.lineno, node.col_offset, node.end_lineno, node.end_col_offset))

    def _docstring(self, body: list[ast.stmt]) -> None:
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            self._exclude(body[0])

    def visit_Module(self, node: ast.Module) -> None:  # noqa: N802 - ast visitor name
        self._docstring(node.body)
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:  # noqa: N802
        self._docstring(node.body)
        self._scope.append(node.name)
        self.generic_visit(node)
        self._scope.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:  # noqa: N802
        self.functions[".".join([*self._scope, node.name])] = (node.lineno, node.end_lineno)
        self._docstring(node.body)
        arguments = node.args
        for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg,
                    arguments.kwarg]:
            if arg is not None:
                self._exclude(arg.annotation)
        self._exclude(node.returns)
        self._scope.append(node.name)
        self.generic_visit(node)
        self._scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # noqa: N815

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:  # noqa: N802
        self._exclude(node.annotation)
        self.generic_visit(node)


def _inside(position: tuple[int, int], span: tuple[int, int, int, int]) -> bool:
    line, col = position
    start_line, start_col, end_line, end_col = span
    return (start_line, start_col) <= (line, col) < (end_line, end_col)


def skip_reason(module: Module, spans: dict[str, _Spans], sources: dict[str, list[str]],
                equivalent: dict[tuple[str, str, str, str], str], mutation) -> str | None:
    """Why a mutant is not run (None: it is run and counted)."""
    file = str(mutation.module_path)
    operator = mutation.operator_name
    if not _KEPT.match(operator):
        return "operator not used"
    line_text = sources[file][mutation.start_pos[0] - 1]
    if any(_inside(mutation.start_pos, span) for span in spans[file].excluded):
        return "annotation or docstring"
    if _LOG_CALL.match(line_text):
        return "log call"
    if module.functions:
        wanted = [spans[file].functions[name] for name in module.functions if name in spans[file].functions]
        if not any(start <= mutation.start_pos[0] <= end for start, end in wanted):
            return "outside the module's functions"
    previous = sources[file][mutation.start_pos[0] - 2].strip() if mutation.start_pos[0] > 1 else ""
    reason = equivalent.get((file, operator, line_text.strip(), previous)) or equivalent.get(
        (file, operator, line_text.strip(), ""))
    if reason is not None:
        return f"equivalent: {reason}"
    return None


def run_module(module: Module, parent: Path, cosmic_ray: Path, lock: threading.Lock, count_only: bool = False,
               sample: int = 1) -> dict:
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult

    started = time.monotonic()
    scratch = Scratch.make(parent, module.name)
    scratch.check_imports()
    python = REPO / ".venv" / "bin" / "python"
    command = " ".join([str(python), "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *module.pytest])
    config = scratch.root / "cosmic-ray.toml"
    paths = ", ".join(json.dumps(f) for f in module.files)
    config.write_text(f'[cosmic-ray]\nmodule-path = [{paths}]\ntimeout = {TEST_TIMEOUT_S}.0\nexcluded-modules = []\n'
                      f'test-command = {json.dumps(command)}\n[cosmic-ray.distributor]\nname = "local"\n')
    session = scratch.root / "session.sqlite"
    subprocess.run([str(cosmic_ray), "init", str(config), str(session)], cwd=scratch.root, env=scratch.env,
                   check=True, capture_output=True)
    sources = {f: (scratch.root / f).read_text().splitlines() for f in module.files}
    spans: dict[str, _Spans] = {}
    for file in module.files:
        spans[file] = _Spans()
        spans[file].visit(ast.parse((scratch.root / file).read_text()))
    equivalent = load_equivalent()
    skipped: dict[str, int] = {}
    with use_db(str(session), WorkDB.Mode.open) as db:
        for item in db.pending_work_items:
            reason = skip_reason(module, spans, sources, equivalent, item.mutations[0])
            if reason is not None:
                key = "equivalent" if reason.startswith("equivalent") else reason
                skipped[key] = skipped.get(key, 0) + 1
                db.set_result(item.job_id, WorkResult(output=reason, worker_outcome=WorkerOutcome.SKIPPED))
        if sample > 1:  # every Nth counted mutant, in source order: a sample, reported as one
            counted = sorted(db.pending_work_items, key=lambda i: (str(i.mutations[0].module_path),
                                                                   tuple(i.mutations[0].start_pos),
                                                                   i.mutations[0].operator_name,
                                                                   i.mutations[0].occurrence))
            for index, item in enumerate(counted):
                if index % sample:
                    skipped["not in the sample"] = skipped.get("not in the sample", 0) + 1
                    db.set_result(item.job_id, WorkResult(output="not in the sample",
                                                          worker_outcome=WorkerOutcome.SKIPPED))
        to_run = len(db.pending_work_items)
    with lock:
        print(f"{module.name}: {to_run} mutants to run ({sum(skipped.values())} left out: {skipped})", flush=True)
    if count_only:
        return {"module": module.name, "to_run": to_run, "left_out": skipped}
    baseline = subprocess.run(command.split(), cwd=scratch.root, env=scratch.env, capture_output=True, text=True)
    if baseline.returncode != 0:
        raise SystemExit(f"{module.name}: the tests fail on the unmutated code:\n{baseline.stdout[-3000:]}")
    subprocess.run([str(cosmic_ray), "exec", str(config), str(session)], cwd=scratch.root, env=scratch.env,
                   check=True, capture_output=True)
    killed, survived, incompetent = 0, [], 0
    with use_db(str(session), WorkDB.Mode.open) as db:
        for item, result in db.completed_work_items:
            if result.worker_outcome is WorkerOutcome.SKIPPED:
                continue
            mutation = item.mutations[0]
            if result.worker_outcome is not WorkerOutcome.NORMAL or result.test_outcome is TestOutcome.INCOMPETENT:
                incompetent += 1
            elif result.test_outcome is TestOutcome.SURVIVED:
                file = str(mutation.module_path)
                survived.append({"file": file, "line": mutation.start_pos[0], "operator": mutation.operator_name,
                                 "source": sources[file][mutation.start_pos[0] - 1].strip(),
                                 "diff": result.diff or ""})
            else:
                killed += 1
    scored = killed + len(survived)
    report = {"module": module.name, "files": list(module.files), "tests": list(module.pytest),
              "killed": killed, "survived": len(survived), "incompetent": incompetent, "left_out": skipped,
              "sample": f"every {sample}th mutant" if sample > 1 else "all",
              "score": round(100 * killed / scored, 1) if scored else None,
              "seconds": round(time.monotonic() - started), "survivors": sorted(survived, key=lambda s: s["line"])}
    REPORTS.mkdir(parents=True, exist_ok=True)
    (REPORTS / f"{module.name}.json").write_text(json.dumps(report, indent=2))
    with lock:
        print(f"{module.name}: {report['score']}% killed ({killed} of {scored}; {incompetent} incompetent) "
              f"in {report['seconds']} s", flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", nargs="*", default=[], help="only these modules")
    parser.add_argument("--jobs", type=int, default=2, help="modules run side by side")
    parser.add_argument("--count", action="store_true", help="only count the mutants each module would run")
    parser.add_argument("--sample", type=int, default=1, metavar="N",
                        help="run every Nth mutant only (in source order), for a module too long to run whole")
    args = parser.parse_args(argv)
    cosmic_ray = Path(sys.executable).with_name("cosmic-ray")
    if not cosmic_ray.exists():
        raise SystemExit(f"{cosmic_ray} is missing: run `make mutants` (it installs cosmic-ray in .venv-mutants)")
    modules = load_modules()
    if args.module:
        unknown = set(args.module) - {m.name for m in modules}
        if unknown:
            raise SystemExit(f"unknown modules: {sorted(unknown)}; known: {[m.name for m in modules]}")
        modules = [m for m in modules if m.name in args.module]
    parent = Path(tempfile.mkdtemp(prefix="cpd-cosmic-ray-"))
    lock = threading.Lock()
    try:
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            reports = list(pool.map(
                lambda m: run_module(m, parent, cosmic_ray, lock, args.count, args.sample), modules))
    finally:
        shutil.rmtree(parent, ignore_errors=True)
    if args.count:
        return 0
    print("\n| module | killed | survived | score | time |\n|---|---|---|---|---|")
    for report in reports:
        print(f"| {report['module']} | {report['killed']} | {report['survived']} | {report['score']}% | "
              f"{report['seconds'] // 60} min |")
    for report in reports:
        for survivor in report["survivors"]:
            print(f"survived: {survivor['file']}:{survivor['line']} {survivor['operator']}: {survivor['source']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
