'use strict';
/**
 * The tool-runner wrapper against a real checkpointd: before/after checkpoints for write tools
 * only, switches read from core.checkpoints.auto_create_on, and on_unavailable with the server
 * really stopped.
 */

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { after, before, describe, test } = require('node:test');
const {
  CheckpointUnavailableError,
  CheckpointdClient,
  ToolCheckpointInterceptor,
  ToolRunner,
  registerLocalFileTools,
} = require('../src');
const { newUlid, startServer } = require('./helpers/server');

/** Collects warnings instead of printing them, so a test can assert on them. */
function recordingLogger() {
  const warnings = [];
  return { warnings, warn: (message) => warnings.push(message) };
}

async function phases(client, planId) {
  const { checkpoints } = await client.listCheckpoints(planId);
  return checkpoints.map((c) => c.phase).reverse();
}

describe('tool runner with checkpoints', () => {
  let server;
  let client;
  before(async () => {
    server = await startServer();
    client = new CheckpointdClient(server.tcpTarget);
  });
  after(async () => {
    client?.close();
    await server?.cleanup();
  });

  function runner(options = {}) {
    return registerLocalFileTools(new ToolRunner({ client, logger: recordingLogger(), ...options }));
  }

  test('a write tool gets a before and an after checkpoint that capture the real files', async () => {
    const planId = newUlid();
    const workspaceRoot = server.newWorkspace();
    fs.writeFileSync(path.join(workspaceRoot, 'plan.md'), 'draft 1');

    const result = await runner().execute('local/write-file', { path: 'plan.md', content: 'draft 2' }, { planId, workspaceRoot });
    assert.deepEqual(result, { path: 'plan.md', bytesWritten: 7 });

    const { checkpoints } = await client.listCheckpoints(planId);
    const [afterCp, beforeCp] = checkpoints;
    assert.equal(checkpoints.length, 2);
    assert.equal(beforeCp.phase, 'before_tool_execute');
    assert.equal(beforeCp.trigger, 'before_tool_execute');
    assert.equal(afterCp.phase, 'after_tool_execute');
    for (const checkpoint of checkpoints) assert.equal(checkpoint.sourceTool, 'local/write-file');

    const changes = await client.diffCheckpoints(beforeCp.checkpointId, { targetCheckpointId: afterCp.checkpointId });
    assert.deepEqual(changes.map((c) => [c.path, c.kind]), [['plan.md', 'modified']]);
    await client.rollback(planId, beforeCp.checkpointId);
    assert.equal(fs.readFileSync(path.join(workspaceRoot, 'plan.md'), 'utf8'), 'draft 1');
  });

  test('a read-only tool gets no checkpoint', async () => {
    const planId = newUlid();
    const workspaceRoot = server.newWorkspace();
    fs.writeFileSync(path.join(workspaceRoot, 'a.txt'), 'content');
    const result = await runner().execute('local/read-file', { path: 'a.txt' }, { planId, workspaceRoot });
    assert.equal(result.content, 'content');
    assert.deepEqual(await phases(client, planId), []);
  });

  test('a tool that does not declare itself read-only counts as a write tool', async () => {
    const planId = newUlid();
    const tools = new ToolRunner({ client }).register('custom/undeclared', { run: () => 'ran' });
    assert.equal(await tools.execute('custom/undeclared', {}, { planId }), 'ran');
    assert.deepEqual(await phases(client, planId), ['before_tool_execute', 'after_tool_execute']);
  });

  test('a failed tool gets no after checkpoint and its own error is passed on', async () => {
    const planId = newUlid();
    const failure = new Error('disk on fire');
    const tools = new ToolRunner({ client }).register('custom/fails', { run: () => { throw failure; } });
    await assert.rejects(tools.execute('custom/fails', {}, { planId }), (error) => error === failure);
    assert.deepEqual(await phases(client, planId), ['before_tool_execute']);
  });

  for (const trigger of ['before_tool_execute', 'after_tool_execute']) {
    const other = trigger === 'before_tool_execute' ? 'after_tool_execute' : 'before_tool_execute';

    test(`${trigger} switched off in core.checkpoints.auto_create_on for the plan`, async () => {
      const planId = newUlid();
      const workspaceRoot = server.newWorkspace();
      await client.setConfig('core.checkpoints.auto_create_on', [other, 'on_error'], { planId });
      await runner().execute('local/write-file', { path: 'x.txt', content: 'x' }, { planId, workspaceRoot });
      assert.deepEqual(await phases(client, planId), [other]);
    });

    test(`${trigger} switched off locally`, async () => {
      const planId = newUlid();
      const workspaceRoot = server.newWorkspace();
      await runner({ disabledTriggers: [trigger] }).execute('local/write-file', { path: 'x.txt', content: 'x' }, { planId, workspaceRoot });
      assert.deepEqual(await phases(client, planId), [other]);
    });
  }

  test('a config change applies to the next tool call', async () => {
    const planId = newUlid();
    const tools = runner();
    const workspaceRoot = server.newWorkspace();
    await tools.execute('local/write-file', { path: 'x.txt', content: '1' }, { planId, workspaceRoot });
    await client.setConfig('core.checkpoints.auto_create_on', [], { planId });
    await tools.execute('local/write-file', { path: 'x.txt', content: '2' }, { planId, workspaceRoot });
    assert.deepEqual(await phases(client, planId), ['before_tool_execute', 'after_tool_execute']);
  });

  test('unknown trigger names and unknown tools are refused', async () => {
    assert.throws(() => new ToolRunner({ client, disabledTriggers: ['before_tool_exec'] }), /unknown trigger "before_tool_exec"/);
    assert.throws(() => new ToolRunner({ client, disabledTriggers: ['manual'] }), RangeError);
    assert.throws(() => new ToolCheckpointInterceptor({ client: null, disabledTriggers: ['bogus'] }), RangeError);
    await assert.rejects(runner().execute('local/delete-everything', {}, { planId: newUlid() }), /unknown tool "local\/delete-everything"/);
  });

  test('no client or no plan_id: the tool runs and nothing is raised', async () => {
    const workspaceRoot = server.newWorkspace();
    const unwired = registerLocalFileTools(new ToolRunner({ client: null }));
    await unwired.execute('local/write-file', { path: 'a.txt', content: 'a' }, { planId: newUlid(), workspaceRoot });
    const planless = runner();
    await planless.execute('local/write-file', { path: 'b.txt', content: 'b' }, { workspaceRoot });
    assert.deepEqual(fs.readdirSync(workspaceRoot).sort(), ['a.txt', 'b.txt']);
  });

  test('errors other than unavailability stop the write', async () => {
    const planId = newUlid();
    let ran = false;
    const tools = new ToolRunner({ client }).register('custom/write', { run: () => { ran = true; } });
    await assert.rejects(
      tools.execute('custom/write', {}, { planId, workspaceRoot: '/definitely/not/allowed' }),
      (error) => ['INVALID_WORKSPACE_ROOT', 'WORKSPACE_ROOT_NOT_ALLOWED'].includes(error.reason),
    );
    assert.equal(ran, false);
  });
});

describe('tool runner when checkpointd is down', () => {
  let server;
  let client;
  before(async () => {
    server = await startServer();
    client = new CheckpointdClient(server.unixTarget, { deadlineMs: 3000 });
  });
  after(async () => {
    client?.close();
    await server?.cleanup();
  });

  test('"proceed" runs the tool with a warning; "refuse" does not run it', async () => {
    const proceedPlan = newUlid();
    const refusePlan = newUlid();
    await client.setConfig('core.checkpoints.on_unavailable', 'refuse', { planId: refusePlan });
    const logger = recordingLogger();
    const workspaceRoot = server.newWorkspace();
    const tools = registerLocalFileTools(new ToolRunner({ client, logger }));
    await tools.execute('local/write-file', { path: 'p.txt', content: '1' }, { planId: proceedPlan, workspaceRoot });
    await tools.execute('local/write-file', { path: 'r.txt', content: '1' }, { planId: refusePlan, workspaceRoot });
    assert.deepEqual(logger.warnings, []);

    await server.stop();

    await tools.execute('local/write-file', { path: 'p.txt', content: '2' }, { planId: proceedPlan, workspaceRoot });
    assert.equal(fs.readFileSync(path.join(workspaceRoot, 'p.txt'), 'utf8'), '2');
    assert.equal(logger.warnings.length, 1);
    assert.match(logger.warnings[0], /running local\/write-file without checkpoints/);

    await assert.rejects(
      tools.execute('local/write-file', { path: 'r.txt', content: '2' }, { planId: refusePlan, workspaceRoot }),
      (error) => error instanceof CheckpointUnavailableError && error.cause.unreachable && error.toolName === 'local/write-file',
    );
    assert.equal(fs.readFileSync(path.join(workspaceRoot, 'r.txt'), 'utf8'), '1', 'the refused write did not happen');

    await server.start();
    assert.deepEqual(await phases(client, refusePlan), ['before_tool_execute', 'after_tool_execute']);
  });

  test('checkpointd going down while the tool runs: the result stands, the missing after-checkpoint is a warning', async () => {
    const planId = newUlid();
    await client.setConfig('core.checkpoints.on_unavailable', 'refuse', { planId });
    const logger = recordingLogger();
    const tools = new ToolRunner({ client, logger }).register('custom/outage', { run: async () => { await server.stop(); return 'written'; } });
    try {
      assert.equal(await tools.execute('custom/outage', {}, { planId }), 'written');
      assert.equal(logger.warnings.length, 1);
      assert.match(logger.warnings[0], /custom\/outage ran without an after_tool_execute checkpoint/);
    } finally {
      await server.start();
    }
    assert.deepEqual(await phases(client, planId), ['before_tool_execute']);
  });

  test('a runner that never reached the server proceeds by default', async () => {
    await server.stop();
    const logger = recordingLogger();
    const fresh = new CheckpointdClient(server.unixTarget, { deadlineMs: 3000 });
    try {
      const workspaceRoot = server.newWorkspace();
      const tools = registerLocalFileTools(new ToolRunner({ client: fresh, logger }));
      await tools.execute('local/write-file', { path: 'a.txt', content: 'a' }, { planId: newUlid(), workspaceRoot });
      assert.equal(fs.readFileSync(path.join(workspaceRoot, 'a.txt'), 'utf8'), 'a');
      assert.equal(logger.warnings.length, 1);
    } finally {
      fresh.close();
      await server.start();
    }
  });
});
