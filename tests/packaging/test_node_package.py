"""The Node client as a user gets it: `npm pack`, the tarball installed into a scratch project far
from this repository, then `require` and `import` of @checkpointd/client talking to a real server.
The package must carry its .proto files (a scratch project has no ../../protos to fall back on),
and packing must leave the checkout as it was (no copy of the contract left behind)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from ulid import ULID

from tests.helpers import skip_unless_ci
from tests.packaging.conftest import REPO, VERSION, clean_env, run

NODE_DIR = REPO / "clients" / "node"

REQUIRE_SCRIPT = """
const fs = require('node:fs');
const path = require('node:path');
const { CheckpointdClient, CheckpointdError } = require('@checkpointd/client');

(async () => {
  const [target, workspaceRoot, planId] = process.argv.slice(2);
  const client = new CheckpointdClient(target);
  const notes = path.join(workspaceRoot, 'notes.txt');
  fs.writeFileSync(notes, 'v1');
  const first = await client.createCheckpoint(planId, { workspaceRoot });
  fs.writeFileSync(notes, 'v2');
  const changed = (await client.diffCheckpoints(first.checkpointId)).map((change) => change.path);
  await client.rollback(planId, first.checkpointId);
  const reason = await client.getCheckpoint(first.checkpointId.slice(0, -2) + 'ZZ').then(
    () => null, (error) => (error instanceof CheckpointdError ? error.reason : String(error)));
  client.close();
  console.log(JSON.stringify({ changed, restored: fs.readFileSync(notes, 'utf8'), reason,
                               resolved: require.resolve('@checkpointd/client') }));
})().catch((error) => { console.error(error); process.exitCode = 1; });
"""

IMPORT_SCRIPT = """
import { CheckpointdClient, ERROR_REASONS } from '@checkpointd/client';
import pkg from '@checkpointd/client/package.json' with { type: 'json' };
console.log(JSON.stringify({ client: typeof CheckpointdClient, reasons: ERROR_REASONS.length, version: pkg.version }));
"""


def test_npm_tarball_installs_and_talks_to_a_real_server(tmp_path: Path, checkpointd_server):
    if shutil.which("npm") is None or shutil.which("node") is None:
        skip_unless_ci("needs node and npm")
    packed = tmp_path / "packed"
    packed.mkdir()
    run(["npm", "pack", "--pack-destination", packed], cwd=NODE_DIR)
    assert not (NODE_DIR / "protos" / "checkpoint").exists(), "postpack removes the contract's copy"
    (tarball,) = packed.glob("*.tgz")
    listing = subprocess.run(["tar", "tzf", tarball], capture_output=True, text=True, check=True).stdout.split()
    assert {f"package/protos/checkpoint/v1/{p.name}" for p in (REPO / "protos" / "checkpoint" / "v1").glob("*.proto")} \
        <= set(listing)
    assert not [name for name in listing if name.startswith("package/test/")]

    project = tmp_path / "scratch"
    project.mkdir()
    (project / "package.json").write_text(json.dumps({"name": "scratch", "private": True}))
    run(["npm", "install", "--prefer-offline", "--no-audit", "--no-fund", tarball], cwd=project, env=clean_env())
    installed = json.loads((project / "node_modules" / "@checkpointd" / "client" / "package.json").read_text())
    assert installed["version"] == VERSION
    assert "private" not in installed

    workspace = checkpointd_server.new_workspace()
    (project / "try.js").write_text(REQUIRE_SCRIPT)
    output = run(["node", "try.js", checkpointd_server.tcp_target, workspace, str(ULID())],
                 cwd=project, env=clean_env())
    report = json.loads(output.strip().splitlines()[-1])
    assert report["changed"] == ["notes.txt"]
    assert report["restored"] == "v1"
    assert report["reason"] == "CHECKPOINT_NOT_FOUND"
    assert report["resolved"].startswith(str(project / "node_modules"))

    (project / "try.mjs").write_text(IMPORT_SCRIPT)
    imported = json.loads(run(["node", "try.mjs"], cwd=project, env=clean_env()).strip().splitlines()[-1])
    assert imported["client"] == "function" and imported["reasons"] > 0 and imported["version"] == VERSION
