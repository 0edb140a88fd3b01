'use strict';
/** create / get / list / diff / rollback against a real checkpointd, over TCP and a unix socket. */

const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const { pipeline } = require('node:stream/promises');
const { after, before, describe, test } = require('node:test');
const { CheckpointdClient } = require('../src');
const { newUlid, startServer } = require('./helpers/server');

let server;
before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.cleanup();
});

function write(root, relative, content) {
  fs.mkdirSync(path.dirname(path.join(root, relative)), { recursive: true });
  fs.writeFileSync(path.join(root, relative), content);
}

for (const transport of ['tcp', 'unix']) {
  describe(`checkpoints over ${transport}`, () => {
    let client;
    before(() => {
      client = new CheckpointdClient(transport === 'tcp' ? server.tcpTarget : server.unixTarget);
    });
    after(() => client.close());

    test('a state larger than gRPC\'s default 4 MiB receive limit reads back whole', async () => {
      const planId = newUlid();
      const state = Buffer.alloc(6 * 1024 * 1024);
      for (let i = 0; i < state.length; i += 4096) state.writeUInt32BE(i, i);
      const created = await client.createCheckpoint(planId, { state });
      const full = await client.getCheckpoint(created.checkpointId, { view: 'full' });
      assert.ok(full.state.equals(state), 'the state read back is the one recorded');
    });

    test('create, get and list record the workspace and state', async () => {
      const planId = newUlid();
      const workspace = server.newWorkspace();
      write(workspace, 'notes.txt', 'hello');
      write(workspace, 'src/app.js', 'console.log(1);\n');

      const first = await client.createCheckpoint(planId, {
        workspaceRoot: workspace,
        labels: { step: 'one' },
        description: 'first',
        state: Buffer.from('{"step":1}'),
      });
      assert.equal(first.planId, planId);
      assert.equal(first.sequence, 1);
      assert.equal(first.trigger, 'manual');
      assert.equal(first.phase, 'manual');
      assert.equal(first.hasFiles, true);
      assert.equal(first.fileCount, 2);
      assert.equal(first.totalSizeBytes, 5 + 16);
      assert.equal(first.stateSizeBytes, 10);
      assert.deepEqual(first.labels, { step: 'one' });
      assert.ok(first.createTime instanceof Date && !Number.isNaN(first.createTime.getTime()));
      assert.match(first.treeDigest, /^sha256:[0-9a-f]{64}$/);

      const second = await client.createCheckpoint(planId, { trigger: 'before_tool_execute', sourceTool: 'local/write-file' });
      assert.equal(second.sequence, 2);
      assert.equal(second.phase, 'before_tool_execute');
      assert.equal(second.workspaceRoot, workspace);
      assert.equal(second.treeDigest, first.treeDigest, 'an unchanged tree has the same digest');

      const basic = await client.getCheckpoint(first.checkpointId);
      assert.equal(basic.state.length, 0);
      const full = await client.getCheckpoint(first.checkpointId, { view: 'full' });
      assert.equal(full.state.toString(), '{"step":1}');

      const page = await client.listCheckpoints(planId);
      assert.deepEqual(page.checkpoints.map((c) => c.checkpointId), [second.checkpointId, first.checkpointId]);
      assert.equal(page.nextPageToken, '');
      const filtered = await client.listCheckpoints(planId, { filter: 'phase = "before_tool_execute"' });
      assert.deepEqual(filtered.checkpoints.map((c) => c.checkpointId), [second.checkpointId]);
    });

    test('pages through a plan with iterateCheckpoints', async () => {
      const planId = newUlid();
      const created = [];
      for (let i = 0; i < 5; i += 1) created.push((await client.createCheckpoint(planId, { labels: { i: String(i) } })).checkpointId);
      const firstPage = await client.listCheckpoints(planId, { pageSize: 2 });
      assert.equal(firstPage.checkpoints.length, 2);
      assert.notEqual(firstPage.nextPageToken, '');
      const all = [];
      for await (const checkpoint of client.iterateCheckpoints(planId, { pageSize: 2 })) all.push(checkpoint.checkpointId);
      assert.deepEqual(all, created.reverse());
    });

    test('a repeated request_id creates nothing new', async () => {
      const planId = newUlid();
      const requestId = `node-${newUlid()}`;
      const once = await client.createCheckpoint(planId, { requestId, description: 'x' });
      const again = await client.createCheckpoint(planId, { requestId, description: 'x' });
      assert.equal(again.checkpointId, once.checkpointId);
      assert.equal((await client.listCheckpoints(planId)).checkpoints.length, 1);
    });

    test('diff reports added, modified and deleted paths, between checkpoints and against the live tree', async () => {
      const planId = newUlid();
      const workspace = server.newWorkspace();
      write(workspace, 'keep.txt', 'same');
      write(workspace, 'change.txt', 'old');
      write(workspace, 'remove.txt', 'bye');
      const base = await client.createCheckpoint(planId, { workspaceRoot: workspace });
      write(workspace, 'change.txt', 'new content');
      fs.rmSync(path.join(workspace, 'remove.txt'));
      write(workspace, 'added.txt', 'hi');
      const target = await client.createCheckpoint(planId);

      const changes = await client.diffCheckpoints(base.checkpointId, { targetCheckpointId: target.checkpointId });
      const byPath = Object.fromEntries(changes.map((c) => [c.path, c]));
      assert.deepEqual(changes.map((c) => c.path), ['added.txt', 'change.txt', 'remove.txt']);
      assert.equal(changes.omitted, 0);
      assert.equal(byPath['added.txt'].kind, 'added');
      assert.equal(byPath['added.txt'].baseType, null);
      assert.equal(byPath['added.txt'].targetType, 'file');
      assert.equal(byPath['change.txt'].kind, 'modified');
      assert.equal(byPath['change.txt'].baseSizeBytes, 3);
      assert.equal(byPath['change.txt'].targetSizeBytes, 11);
      assert.equal(byPath['remove.txt'].kind, 'deleted');

      write(workspace, 'live.txt', 'only live');
      const live = await client.diffCheckpoints(target.checkpointId);
      assert.deepEqual(live.map((c) => [c.path, c.kind]), [['live.txt', 'added']]);
      const limited = await client.diffCheckpoints(base.checkpointId, { targetCheckpointId: target.checkpointId, paths: ['change.txt'] });
      assert.deepEqual(limited.map((c) => c.path), ['change.txt']);

      // A page at a time: every page by default, or only the first with what is left counted.
      const paged = await client.diffCheckpoints(base.checkpointId, { targetCheckpointId: target.checkpointId, pageSize: 1 });
      assert.deepEqual(paged.map((c) => c.path), ['added.txt', 'change.txt', 'remove.txt']);
      assert.equal(paged.omitted, 0);
      const first = await client.diffCheckpoints(base.checkpointId, {
        targetCheckpointId: target.checkpointId, pageSize: 2, allPages: false,
      });
      assert.deepEqual(first.map((c) => c.path), ['added.txt', 'change.txt']);
      assert.equal(first.omitted, 1);
    });

    test('rollback restores the files and state, after a dry run that changes nothing', async () => {
      const planId = newUlid();
      const workspace = server.newWorkspace();
      write(workspace, 'a.txt', 'version 1');
      write(workspace, 'dir/b.txt', 'bee');
      const good = await client.createCheckpoint(planId, { workspaceRoot: workspace, state: Buffer.from('state-1') });
      write(workspace, 'a.txt', 'version 2, broken');
      fs.rmSync(path.join(workspace, 'dir'), { recursive: true });
      write(workspace, 'junk.txt', 'junk');
      await client.createCheckpoint(planId, { state: Buffer.from('state-2') });

      const preview = await client.rollback(planId, good.checkpointId, { dryRun: true });
      assert.equal(preview.dryRun, true);
      assert.equal(preview.safetyCheckpoint, null);
      assert.deepEqual(preview.changes.map((c) => [c.path, c.kind]).sort(), [
        ['a.txt', 'modified'], ['dir', 'added'], ['dir/b.txt', 'added'], ['junk.txt', 'deleted'],
      ]);
      assert.equal(fs.readFileSync(path.join(workspace, 'a.txt'), 'utf8'), 'version 2, broken');

      const done = await client.rollback(planId, good.checkpointId);
      assert.equal(done.dryRun, false);
      assert.equal(done.changesOmitted, 0);
      assert.equal(done.safetyCheckpoint.skippedFilesOmitted, 0);
      assert.equal(done.state.toString(), 'state-1');
      assert.equal(fs.readFileSync(path.join(workspace, 'a.txt'), 'utf8'), 'version 1');
      assert.equal(fs.readFileSync(path.join(workspace, 'dir', 'b.txt'), 'utf8'), 'bee');
      assert.equal(fs.existsSync(path.join(workspace, 'junk.txt')), false);

      const safety = done.safetyCheckpoint;
      assert.equal(safety.trigger, 'rollback');
      assert.equal(safety.phase, 'rollback_safety');
      assert.equal(safety.rollbackTargetCheckpointId, good.checkpointId);
      await client.rollback(planId, safety.checkpointId, { scope: 'files' });
      assert.equal(fs.readFileSync(path.join(workspace, 'a.txt'), 'utf8'), 'version 2, broken', 'the rollback was undone');
      assert.equal(fs.readFileSync(path.join(workspace, 'junk.txt'), 'utf8'), 'junk');
    });

    test('a name that is not UTF-8 comes back as rawPath and can be restored by it alone', async () => {
      const planId = newUlid();
      const workspace = server.newWorkspace();
      const latin1 = Buffer.from([0x63, 0x61, 0x66, 0xe9, 0x2e, 0x74, 0x78, 0x74]); // "café.txt" in Latin-1
      const latin1File = Buffer.concat([Buffer.from(`${workspace}/`), latin1]);
      fs.writeFileSync(latin1File, 'v1');
      write(workspace, 'other.txt', 'v1');
      const base = await client.createCheckpoint(planId, { workspaceRoot: workspace });
      fs.writeFileSync(latin1File, 'v2');
      write(workspace, 'other.txt', 'v2');

      const [change] = await client.diffCheckpoints(base.checkpointId, { rawPaths: [latin1] });
      assert.equal(change.path, 'caf\\xe9.txt');
      assert.deepEqual(Buffer.from(change.rawPath), latin1);
      const done = await client.rollback(planId, base.checkpointId, { rawPaths: [change.rawPath] });
      assert.deepEqual(done.changes.map((c) => c.path), ['caf\\xe9.txt']);
      assert.equal(fs.readFileSync(latin1File, 'utf8'), 'v1');
      assert.equal(fs.readFileSync(path.join(workspace, 'other.txt'), 'utf8'), 'v2');
    });

    test('a skipped file whose name is not UTF-8 comes back with its rawPath', async () => {
      const planId = newUlid();
      const workspace = server.newWorkspace();
      const latin1 = Buffer.from([0x63, 0x61, 0x66, 0xe9, 0x2e, 0x62, 0x69, 0x6e]); // "café.bin" in Latin-1
      fs.writeFileSync(Buffer.concat([Buffer.from(`${workspace}/`), latin1]), 'y'.repeat(100));
      await client.setConfig('core.snapshot.max_file_size_bytes', 10, { planId });
      const checkpoint = await client.createCheckpoint(planId, { workspaceRoot: workspace });
      assert.deepEqual(checkpoint.skippedFiles.map((s) => [s.path, Buffer.from(s.rawPath), s.reason]),
        [['caf\\xe9.bin', latin1, 'FILE_TOO_LARGE']]);
    });

    test('delete removes one checkpoint only', async () => {
      const planId = newUlid();
      const first = await client.createCheckpoint(planId);
      const second = await client.createCheckpoint(planId);
      await client.deleteCheckpoint(first.checkpointId);
      const left = await client.listCheckpoints(planId);
      assert.deepEqual(left.checkpoints.map((c) => c.checkpointId), [second.checkpointId]);
    });

    test('pending writes: first regular value kept, last special one, in order, gone with the checkpoint', async () => {
      const planId = newUlid();
      const { checkpointId } = await client.createCheckpoint(planId);
      const write = (taskId, index, channel, value) => ({ taskId, index, channel, valueType: 'text',
        value: Buffer.from(value), taskPath: '' });
      await client.putPendingWrites(checkpointId, [write('t', 0, 'a', 'first'), write('t', -1, '__error__', 'e1')]);
      await client.putPendingWrites(checkpointId, [write('t', 0, 'a', 'second'), write('t', -1, '__error__', 'e2')]);
      const listed = await client.listPendingWrites(checkpointId);
      assert.deepEqual(listed.map((w) => [w.index, w.channel, Buffer.from(w.value).toString()]),
        [[-1, '__error__', 'e2'], [0, 'a', 'first']]);
      await client.deleteCheckpoints({ planId });
      await assert.rejects(client.listPendingWrites(checkpointId), (error) => error.reason === 'CHECKPOINT_NOT_FOUND');
    });

    test('deleteCheckpoints deletes what a label filter selects across plans, and nothing else', async () => {
      const run = newUlid();
      const [one, two] = [newUlid(), newUlid()];
      const doomed = [await client.createCheckpoint(one, { labels: { run } }),
        await client.createCheckpoint(two, { labels: { run } })];
      const kept = await client.createCheckpoint(one);
      const deleted = await client.deleteCheckpoints({ filter: `labels.run = "${run}"` });
      assert.deepEqual(deleted.map((c) => c.checkpointId).sort(), doomed.map((c) => c.checkpointId).sort());
      assert.deepEqual((await client.listCheckpoints(one)).checkpoints.map((c) => c.checkpointId), [kept.checkpointId]);
      assert.deepEqual((await client.listCheckpoints(two)).checkpoints, []);
    });
  });
}

describe('plans, file contents and text diffs', () => {
  let client;
  before(() => {
    client = new CheckpointdClient(server.tcpTarget);
  });
  after(() => client.close());

  test('listPlans and getPlan find a plan by its workspace', async () => {
    const workspace = server.newWorkspace();
    write(workspace, 'a.txt', 'one\n');
    const planId = newUlid();
    const first = await client.createCheckpoint(planId, { workspaceRoot: workspace });
    const plan = await client.getPlan(planId);
    assert.equal(plan.workspaceRoot, workspace);
    assert.equal(plan.checkpointCount, 1);
    assert.equal(plan.newestCheckpointId, first.checkpointId);
    assert.ok(plan.updateTime instanceof Date);
    const found = [];
    for await (const p of client.iteratePlans({ filter: `workspace_root = "${workspace}"`, pageSize: 1 })) found.push(p.planId);
    assert.deepEqual(found, [planId]);
    await assert.rejects(client.getPlan(newUlid()), (error) => error.reason === 'PLAN_NOT_FOUND');
  });

  test('readFile returns the bytes as they were; a text diff shows the lines', async () => {
    const workspace = server.newWorkspace();
    write(workspace, 'a.txt', 'one\ntwo\n');
    const planId = newUlid();
    const base = await client.createCheckpoint(planId, { workspaceRoot: workspace });
    write(workspace, 'a.txt', 'one\n2\n');
    assert.equal((await client.readFile(base.checkpointId, 'a.txt')).toString(), 'one\ntwo\n');
    await assert.rejects(client.readFile(base.checkpointId, 'missing'), (error) => error.reason === 'PATH_NOT_FOUND');
    const [change] = await client.diffCheckpoints(base.checkpointId, { textDiffs: true });
    assert.equal(change.textDiffStatus, 'text');
    assert.equal(change.textDiff, '--- a/a.txt\n+++ b/a.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+2\n');
  });

  test('listFiles lists a directory as it was, page by page; exportCheckpoint streams a tar of it', async () => {
    const workspace = server.newWorkspace();
    write(workspace, 'a.txt', 'one\n');
    fs.mkdirSync(path.join(workspace, 'dir'));
    write(workspace, 'dir/b.sh', '#!/bin/sh\n');
    fs.chmodSync(path.join(workspace, 'dir', 'b.sh'), 0o755);
    fs.symlinkSync('a.txt', path.join(workspace, 'link'));
    const planId = newUlid();
    const cp = await client.createCheckpoint(planId, { workspaceRoot: workspace });
    fs.rmSync(path.join(workspace, 'dir'), { recursive: true });

    const top = await client.listFiles(cp.checkpointId);
    assert.deepEqual(top.files.map((f) => [f.path, f.entryType]), [['a.txt', 'file'], ['dir', 'directory'], ['link', 'symlink']]);
    assert.equal(top.files[2].symlinkTarget, 'a.txt');
    const everything = [];
    for await (const f of client.iterateFiles(cp.checkpointId, { recursive: true, pageSize: 1 })) everything.push(f);
    assert.deepEqual(everything.map((f) => f.path), ['a.txt', 'dir', 'dir/b.sh', 'link']);
    assert.equal(everything[2].mode, 0o755);
    assert.equal(everything[2].sizeBytes, 10);
    await assert.rejects(client.listFiles(cp.checkpointId, { path: 'a.txt' }), (error) => error.reason === 'NOT_A_DIRECTORY');

    const archive = path.join(server.newWorkspace(), 'x.tar');
    await pipeline(client.exportCheckpoint(cp.checkpointId), fs.createWriteStream(archive));
    const listing = execFileSync('tar', ['-tvf', archive], { encoding: 'utf8' });
    assert.match(listing, /^-rwxr-xr-x .* dir\/b\.sh$/m);
    assert.match(listing, /^l.* link -> a\.txt$/m);
    assert.equal(execFileSync('tar', ['-xOf', archive, 'dir/b.sh'], { encoding: 'utf8' }), '#!/bin/sh\n');
    await assert.rejects(pipeline(client.exportCheckpoint(newUlid()), fs.createWriteStream(`${archive}.2`)),
      (error) => error.reason === 'CHECKPOINT_NOT_FOUND');
  });
});
