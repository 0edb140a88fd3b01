"""The Python distributions as a user gets them, each in a fresh venv, used for real.

- checkpointd-client's wheel alone, at the lowest grpcio / grpcio-status / protobuf /
  googleapis-common-protos its metadata allows, talks to a real server (the dev venv's) and pulls
  in nothing of the server.
- checkpointd's wheel (with the client wheel beside it) runs `checkpointd --help` and a
  `checkpointd serve` that answers health.
- `pip install git+file://<this repository>@HEAD`: the committed state, cloned by pip and built
  in isolated build environments (no `make`), imports and runs.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

from ulid import ULID

from tests.conftest import RunningServer
from tests.helpers import skip_unless_ci
from tests.packaging.conftest import REPO, VERSION, clean_env, run

CLIENT_PROJECT = tomllib.loads((REPO / "clients" / "python" / "pyproject.toml").read_text())
SERVER_ONLY = {"checkpointd", "sqlalchemy", "sqlmodel", "alembic", "psycopg", "psycopg-binary", "zstandard", "uvloop",
               "rich"}

CLIENT_SCRIPT = """
import json, pathlib, sys
from checkpointd_client import Checkpointd, CheckpointdRpcError

target, workspace, plan_id = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
notes = workspace / "notes.txt"
with Checkpointd(target, watch_config=False) as checkpointd:
    notes.write_text("v1")
    first = checkpointd.checkpoints.create_checkpoint(plan_id, workspace_root=workspace)
    notes.write_text("v2")
    changed = [change.path for change in checkpointd.checkpoints.diff_checkpoints(first.checkpoint_id)]
    checkpointd.checkpoints.rollback(plan_id, first.checkpoint_id)
    try:
        checkpointd.checkpoints.get_checkpoint(str(first.checkpoint_id)[:-2] + "ZZ")
        reason = None
    except CheckpointdRpcError as error:
        reason = error.reason
import checkpointd_client, checkpoint.v1.checkpoint_service_pb2 as contract
print(json.dumps({"changed": changed, "restored": notes.read_text(), "reason": reason,
                  "modules": [checkpointd_client.__file__, contract.__file__]}))
"""


def floors_constraints(path: Path) -> Path:
    """A constraints file pinning each `NAME>=X` dependency of checkpointd-client at X."""
    pins = [re.sub(r"\s*>=\s*", "==", dependency) for dependency in CLIENT_PROJECT["project"]["dependencies"]]
    assert all("==" in pin for pin in pins), f"every client dependency has a floor: {pins}"
    path.write_text("\n".join(pins) + "\n")
    return path


def installed(venv, cwd: Path) -> dict[str, str]:
    code = ("import importlib.metadata as m, json;"
            "print(json.dumps({d.metadata['Name'].lower(): d.version for d in m.distributions()}))")
    return json.loads(venv.python_output(code, cwd=cwd))


def test_client_wheel_alone_at_its_floors_talks_to_a_real_server(dist, new_venv, tmp_path, checkpointd_server):
    (wheel,) = dist.glob(f"checkpointd_client-{VERSION}-py3-none-any.whl")
    venv = new_venv("client")
    venv.install(wheel, constraints=floors_constraints(tmp_path / "floors.txt"))

    versions = installed(venv, tmp_path)
    floors = dict(pin.split("==") for pin in floors_constraints(tmp_path / "floors.txt").read_text().split())
    assert {name: versions.get(name) for name in floors} == floors
    assert versions["checkpointd-client"] == VERSION
    assert not SERVER_ONLY & versions.keys(), versions

    workspace = checkpointd_server.new_workspace()
    report = json.loads(venv.python_output(CLIENT_SCRIPT, checkpointd_server.tcp_target, workspace, str(ULID()),
                                           cwd=tmp_path).splitlines()[-1])
    assert report["changed"] == ["notes.txt"]
    assert report["restored"] == "v1"
    assert report["reason"] == "CHECKPOINT_NOT_FOUND"
    assert all(module.startswith(str(venv.path)) for module in report["modules"]), report["modules"]
    server_import = subprocess.run([venv.python, "-I", "-c", "import checkpointd"], cwd=tmp_path, env=clean_env(),
                                   capture_output=True, text=True)
    assert "No module named 'checkpointd'" in server_import.stderr


class VenvServer(RunningServer):
    """`checkpointd serve` from another venv's console script, on the server's own defaults."""

    def __init__(self, base: Path, binary: Path) -> None:
        super().__init__(base, extra_args=())
        self.binary = binary

    def command(self) -> list[str]:
        return [str(self.binary), *super().command()[1:]]


def test_server_wheel_serves_and_answers_health(dist, new_venv, tmp_path, short_tmp):
    (wheel,) = dist.glob(f"checkpointd-{VERSION}-py3-none-any.whl")
    venv = new_venv("server")
    venv.install(wheel, find_links=[dist])

    requires = venv.python_output("import importlib.metadata as m; print(*m.requires('checkpointd'), sep='\\n')",
                                  cwd=tmp_path).split("\n")
    assert f"checkpointd-client=={VERSION}" in requires, "a published wheel pins the client, never a path"
    assert "usage: checkpointd" in run([venv.bin("checkpointd"), "--help"], cwd=tmp_path, env=clean_env())

    server = VenvServer(short_tmp / "venv-server", venv.bin("checkpointd"))
    server.start()
    try:
        health = run([venv.bin("checkpointd"), "health", "--target", server.tcp_target, "--timeout", "5"],
                     cwd=tmp_path, env=clean_env())
        assert "SERVING" in health
    finally:
        assert server.stop() == 0, server.log()


def test_pip_install_of_the_committed_repository_from_a_git_url(dist, new_venv, tmp_path):
    if shutil.which("git") is None or not (REPO / ".git").exists():
        skip_unless_ci("needs git and a git checkout of the repository")
    head = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    venv = new_venv("git")
    build_requirements = [r for project in (REPO / "pyproject.toml", REPO / "clients" / "python" / "pyproject.toml")
                          for r in tomllib.loads(project.read_text())["build-system"]["requires"]]
    # To fill the wheelhouse, dist's wheels stand for the runtime dependencies (pip builds checkpointd
    # and checkpointd-client themselves from its clone) and the build requirements are a group of
    # their own (grpcio-tools holds protobuf below the newest).
    venv.install(f"git+file://{REPO}@{head.stdout.strip()}",
                 downloads=[[f"--find-links={dist}", *dist.glob("*.whl")], build_requirements])

    report = venv.python_output(
        "import checkpointd_client, checkpoint.v1.config_service_pb2_grpc, checkpointd.cli, importlib.metadata as m;"
        "print(m.version('checkpointd'), m.version('checkpointd-client'), checkpointd_client.__file__)", cwd=tmp_path)
    assert report.split()[:2] == [VERSION, VERSION]
    assert report.split()[2].startswith(str(venv.path))
    assert "usage: checkpointd" in run([venv.bin("checkpointd"), "--help"], cwd=tmp_path, env=clean_env())
