'use strict';
/**
 * Attacks on the Node ToolRunner's automatic checkpoints (adversarial review).
 *
 * Tests that proved a defect were first marked `todo` and named "DEFECT: ..."; those defects are
 * fixed and the tests are plain tests now, beside the attacks that held.
 * Some need a checkpointd that misbehaves in one precise way: a scripted grpc-js server stands in
 * for it there (ScriptedCheckpointd below); everything else runs against a real server.
 */

const assert = require('node:assert/strict');
const fs = require('node:fs');
const net = require('node:net');
const path = require('node:path');
const { after, before, describe, test } = require('node:test');
const grpc = require('@grpc/grpc-js');
const {
  CheckpointUnavailableError,
  CheckpointdClient,
  CheckpointdError,
  ToolRunner,
  registerLocalFileTools,
} = require('../src');
const { loadContract } = require('../src/contract');
const { toValue } = require('../src/values');
const { newUlid, startServer } = require('./helpers/server');

const AUTO = 'core.checkpoints.auto_create_on';
const ON_UNAVAILABLE = 'core.checkpoints.on_unavailable';
const DEADLINE = 'core.checkpoints.client_deadline_ms';

function recordingLogger() {
  const warnings = [];
  return { warnings, warn: (message) => warnings.push(message) };
}

async function phases(client, planId) {
  const { checkpoints } = await client.listCheckpoints(planId);
  return checkpoints.map((c) => c.phase).reverse();
}

/**
 * A grpc-js server that answers ListConfig with the given values and CreateCheckpoint as
 * `onCreate(callNumber, request, callback)` decides (never calling back = a hung checkpointd).
 */
class ScriptedCheckpointd {
  constructor({ values, onCreate }) {
    this.values = values;
    this.onCreate = onCreate;
    this.creates = [];
    /** Each CreateCheckpoint's deadline as it arrived: how many ms the client gave it. */
    this.createDeadlinesMs = [];
    this.server = new grpc.Server();
    const { CheckpointService, ConfigService } = loadContract();
    const entry = (key) => ({ key, value: toValue(this.values[key]), source: 'CONFIG_SOURCE_GLOBAL' });
    this.server.addService(ConfigService.service, {
      ListConfig: (call, callback) => callback(null, { entries: Object.keys(this.values).sort().map(entry) }),
      GetConfig: (call, callback) => callback(null, { entry: entry(call.request.key) }),
    });
    this.server.addService(CheckpointService.service, {
      CreateCheckpoint: (call, callback) => {
        this.creates.push(call.request);
        this.createDeadlinesMs.push(new Date(call.getDeadline()).getTime() - Date.now());
        this.onCreate(this.creates.length, call.request, callback);
      },
    });
  }

  start() {
    return new Promise((resolve, reject) => {
      this.server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (error, port) => {
        if (error) reject(error);
        else {
          this.target = `127.0.0.1:${port}`;
          resolve(this);
        }
      });
    });
  }

  stop() {
    this.server.forceShutdown();
  }
}

/** A grpc-status-details-bin trailer holding one checkpointd ErrorInfo, as the real server sends. */
function errorInfoTrailer(code, message, reason) {
  const { Status, ErrorInfo } = loadContract().googleRpc;
  const info = ErrorInfo.encode(ErrorInfo.create({ reason, domain: 'checkpointd', metadata: {} })).finish();
  const status = Status.encode(Status.create({
    code, message, details: [{ type_url: 'type.googleapis.com/google.rpc.ErrorInfo', value: info }],
  })).finish();
  const metadata = new grpc.Metadata();
  metadata.set('grpc-status-details-bin', Buffer.from(status));
  return metadata;
}

function checkpointFor(request) {
  return {
    checkpoint: {
      checkpointId: newUlid(),
      planId: request.planId,
      phase: request.trigger.replace('TRIGGER_', 'PHASE_'),
      trigger: request.trigger,
      sourceTool: request.sourceTool,
    },
  };
}

const DEFAULT_VALUES = Object.freeze({
  [AUTO]: ['before_tool_execute', 'after_tool_execute', 'on_subplan_spawn', 'on_error'],
  [ON_UNAVAILABLE]: 'proceed',
  [DEADLINE]: 5000,
});

describe('Node ToolRunner attacked, against a real checkpointd', () => {
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

  test(
    'refuse stops a write tool only through its before checkpoint (only after_tool_execute on, server down)',
    async () => {
      // README (Guarantees): "`refuse` stops a write tool only through its before-checkpoint";
      // the Python interceptor runs the tool here and only warns about the after checkpoint.
      const planId = newUlid();
      const workspaceRoot = server.newWorkspace();
      await client.setConfig(AUTO, ['after_tool_execute'], { planId });
      await client.setConfig(ON_UNAVAILABLE, 'refuse', { planId });
      const logger = recordingLogger();
      const tools = registerLocalFileTools(new ToolRunner({ client, logger }));
      await tools.execute('local/write-file', { path: 'a.txt', content: '1' }, { planId, workspaceRoot });
      assert.deepEqual(await phases(client, planId), ['after_tool_execute']);

      await server.stop();
      try {
        const result = await tools.execute('local/write-file', { path: 'a.txt', content: '2' }, { planId, workspaceRoot });
        assert.equal(result.bytesWritten, 1);
        assert.equal(fs.readFileSync(path.join(workspaceRoot, 'a.txt'), 'utf8'), '2');
        assert.equal(logger.warnings.length, 1);
      } finally {
        await server.start();
      }
    },
  );

  test('an after checkpoint the server refuses (workspace removed by the tool) never hides the result', async () => {
    // tool_runner.js header: "A write that already happened is never undone, so a missing
    // after-checkpoint is always only a warning"; README: "a failed after-checkpoint never hides
    // the tool's result". The after checkpoint is refused INVALID_ARGUMENT and the runner throws it.
    const planId = newUlid();
    const workspaceRoot = server.newWorkspace();
    const tools = new ToolRunner({ client, logger: recordingLogger() }).register('custom/discard-project', {
      run: () => {
        fs.rmSync(workspaceRoot, { recursive: true, force: true });
        return 'discarded';
      },
    });
    assert.equal(await tools.execute('custom/discard-project', {}, { planId, workspaceRoot }), 'discarded');
    assert.deepEqual(await phases(client, planId), ['before_tool_execute']);
  });

  test('before and after checkpoints of one call share a tool_call_id label and a description, as in Python', async () => {
    const planId = newUlid();
    const workspaceRoot = server.newWorkspace();
    await registerLocalFileTools(new ToolRunner({ client })).execute(
      'local/write-file', { path: 'a.txt', content: 'x' }, { planId, workspaceRoot });
    const [afterCp, beforeCp] = (await client.listCheckpoints(planId)).checkpoints;
    assert.ok(beforeCp.labels.tool_call_id, 'the before checkpoint has no tool_call_id label');
    assert.equal(beforeCp.labels.tool_call_id, afterCp.labels.tool_call_id);
    assert.equal(beforeCp.description, 'before_tool_execute local/write-file');
    assert.equal(afterCp.description, 'after_tool_execute local/write-file');
  });

  test('a write tool with a name over 256 characters runs (its source_tool clipped), never refused', async () => {
    const planId = newUlid();
    const name = `mcp__a-very-long-server-name__${'t'.repeat(270)}`;
    const tools = new ToolRunner({ client, logger: recordingLogger() }).register(name, { run: () => 'ran' });
    assert.equal(await tools.execute(name, {}, { planId }), 'ran');
    const { checkpoints } = await client.listCheckpoints(planId);
    assert.equal(checkpoints.length, 2);
  });

  test('a plan override of auto_create_on and its clearing are followed on the next call', async () => {
    const planId = newUlid();
    const workspaceRoot = server.newWorkspace();
    const tools = registerLocalFileTools(new ToolRunner({ client }));
    await client.setConfig(AUTO, ['after_tool_execute'], { planId });
    await tools.execute('local/write-file', { path: 'a.txt', content: '1' }, { planId, workspaceRoot });
    await client.setConfig(AUTO, null, { planId, clear: true });
    await tools.execute('local/write-file', { path: 'a.txt', content: '2' }, { planId, workspaceRoot });
    assert.deepEqual(await phases(client, planId), ['after_tool_execute', 'before_tool_execute', 'after_tool_execute']);
  });

  test('ten concurrent write tools in one plan: every before/after present, each after holds its own write', async () => {
    const planId = newUlid();
    const workspaceRoot = server.newWorkspace();
    const tools = new ToolRunner({ client });
    for (let i = 0; i < 10; i += 1) {
      tools.register(`custom/write-${i}`, {
        run: () => fs.promises.writeFile(path.join(workspaceRoot, `f${i}.txt`), String(i)),
      });
    }
    await Promise.all([...Array(10).keys()].map((i) => tools.execute(`custom/write-${i}`, {}, { planId, workspaceRoot })));
    const checkpoints = [];
    for await (const cp of client.iterateCheckpoints(planId)) checkpoints.push(cp);
    assert.equal(checkpoints.length, 20);
    assert.deepEqual(checkpoints.map((c) => c.sequence).sort((a, b) => a - b), [...Array(20).keys()].map((i) => i + 1));
    for (let i = 0; i < 10; i += 1) {
      const mine = checkpoints.filter((c) => c.sourceTool === `custom/write-${i}`);
      assert.deepEqual(mine.map((c) => c.phase).sort(), ['after_tool_execute', 'before_tool_execute']);
      const afterCp = mine.find((c) => c.phase === 'after_tool_execute');
      const beforeCp = mine.find((c) => c.phase === 'before_tool_execute');
      const files = async (cp) => new Set((await client.listFiles(cp.checkpointId, { recursive: true })).files.map((f) => f.path));
      assert.ok((await files(afterCp)).has(`f${i}.txt`));
      assert.ok(!(await files(beforeCp)).has(`f${i}.txt`));
    }
  });

  test('local trigger switches refuse names that only look like a trigger', () => {
    for (const name of ['Before_Tool_Execute', 'before_tool_execute ', 'BEFORE_TOOL_EXECUTE', 'before\u200btool_execute', '']) {
      assert.throws(() => new ToolRunner({ client, disabledTriggers: [name] }), RangeError, JSON.stringify(name));
    }
  });

  test('the server refuses trigger lists the client could not parse, with INVALID_CONFIG_VALUE', async () => {
    const planId = newUlid();
    for (const value of [['Before_Tool_Execute'], ['on_error', 'on_error'], 'on_error', [['on_error']], [1], null, {}]) {
      await assert.rejects(client.setConfig(AUTO, value, { planId }), (error) =>
        error instanceof CheckpointdError && error.codeName === 'INVALID_ARGUMENT' && error.reason === 'INVALID_CONFIG_VALUE');
    }
    assert.equal((await client.getConfig(AUTO, { planId })).source, 'default');
  });
});

describe('Node ToolRunner attacked, against a scripted checkpointd', () => {
  test('core.checkpoints.client_deadline_ms bounds each checkpoint call, as in Python', async () => {
    // The key's description: "Deadline in milliseconds that clients put on each checkpoint call".
    // tool_runner.js never reads it; the client's own deadlineMs (5 s by default) applies instead.
    const scripted = await new ScriptedCheckpointd({
      values: { ...DEFAULT_VALUES, [DEADLINE]: 300 },
      onCreate: () => {}, // hung
    }).start();
    const client = new CheckpointdClient(scripted.target);
    try {
      const logger = recordingLogger();
      const tools = new ToolRunner({ client, logger }).register('custom/write', { run: () => 'ran' });
      assert.equal(await tools.execute('custom/write', {}, { planId: newUlid() }), 'ran');
      // What the client asked for, not how long anything took: no call may be given more than 300 ms.
      assert.ok(scripted.createDeadlinesMs.length > 0);
      for (const remainingMs of scripted.createDeadlinesMs) {
        assert.ok(remainingMs <= 300, `a checkpoint call was given ${remainingMs} ms; the configured deadline is 300 ms`);
      }
    } finally {
      client.close();
      scripted.stop();
    }
  });

  test('a store-full RESOURCE_EXHAUSTED is handled by on_unavailable as in Python (proceed runs the tool)', async () => {
    // Both clients count checkpointd's store-full answer (RESOURCE_EXHAUSTED with ErrorInfo reason
    // STORAGE_EXHAUSTED, as the real server sends it) as "cannot record right now"
    // (policy.is_unavailable, errors.js `unreachable`).
    const scripted = await new ScriptedCheckpointd({
      values: DEFAULT_VALUES,
      onCreate: (n, request, callback) => callback({
        code: grpc.status.RESOURCE_EXHAUSTED,
        details: 'content store is full: No space left on device',
        metadata: errorInfoTrailer(grpc.status.RESOURCE_EXHAUSTED, 'content store is full', 'STORAGE_EXHAUSTED'),
      }),
    }).start();
    const client = new CheckpointdClient(scripted.target);
    try {
      const logger = recordingLogger();
      const tools = new ToolRunner({ client, logger }).register('custom/write', { run: () => 'ran' });
      assert.equal(await tools.execute('custom/write', {}, { planId: newUlid() }), 'ran');
      assert.ok(logger.warnings.length >= 1);
    } finally {
      client.close();
      scripted.stop();
    }
  });

  test('a before checkpoint lost to a deadline does not stop the after checkpoint from being attempted', async () => {
    // Python tries the after checkpoint whatever happened to the before one (two warnings when
    // both fail); Node returns straight after running the tool, so a one-off stall loses both.
    const scripted = await new ScriptedCheckpointd({
      values: DEFAULT_VALUES,
      onCreate: (n, request, callback) => {
        if (n > 1) callback(null, checkpointFor(request)); // only the first call stalls
      },
    }).start();
    const client = new CheckpointdClient(scripted.target, { deadlineMs: 500 });
    try {
      const tools = new ToolRunner({ client, logger: recordingLogger() }).register('custom/write', { run: () => 'ran' });
      assert.equal(await tools.execute('custom/write', {}, { planId: newUlid() }), 'ran');
      assert.deepEqual(scripted.creates.map((r) => r.trigger), ['TRIGGER_BEFORE_TOOL_EXECUTE', 'TRIGGER_AFTER_TOOL_EXECUTE']);
    } finally {
      client.close();
      scripted.stop();
    }
  });

  test('a RESOURCE_EXHAUSTED without checkpointd\'s STORAGE_EXHAUSTED reason (an oversized request) stops the tool under proceed, as in Python', async () => {
    // gRPC's own answer to a message over the server's limit carries no ErrorInfo: the request is
    // wrong, not checkpointd unavailable, so the before checkpoint's refusal stops the write tool.
    const scripted = await new ScriptedCheckpointd({
      values: DEFAULT_VALUES,
      onCreate: (n, request, callback) => callback({
        code: grpc.status.RESOURCE_EXHAUSTED, details: 'Received message larger than max (40000000 vs. 33554432)',
      }),
    }).start();
    const client = new CheckpointdClient(scripted.target);
    try {
      let ran = false;
      const tools = new ToolRunner({ client, logger: recordingLogger() }).register('custom/write', { run: () => { ran = true; } });
      await assert.rejects(tools.execute('custom/write', {}, { planId: newUlid() }), (error) =>
        error instanceof CheckpointdError && error.codeName === 'RESOURCE_EXHAUSTED' && !error.unreachable);
      assert.equal(ran, false);
    } finally {
      client.close();
      scripted.stop();
    }
  });

  test('refuse stops a write tool through its before checkpoint lost to client_deadline_ms; the after one is still tried under proceed', async () => {
    for (const mode of ['refuse', 'proceed']) {
      const scripted = await new ScriptedCheckpointd({
        values: { ...DEFAULT_VALUES, [ON_UNAVAILABLE]: mode, [DEADLINE]: 200 },
        onCreate: (n, request, callback) => {
          if (n > 1) callback(null, checkpointFor(request)); // only the before checkpoint stalls
        },
      }).start();
      const client = new CheckpointdClient(scripted.target);
      try {
        let ran = false;
        const logger = recordingLogger();
        const tools = new ToolRunner({ client, logger }).register('custom/write', { run: () => { ran = true; return 'ran'; } });
        const planId = newUlid();
        if (mode === 'refuse') {
          await assert.rejects(tools.execute('custom/write', {}, { planId }), (error) =>
            error instanceof CheckpointUnavailableError && error.trigger === 'before_tool_execute');
          assert.equal(ran, false);
          assert.equal(scripted.creates.length, 1);
        } else {
          assert.equal(await tools.execute('custom/write', {}, { planId }), 'ran');
          assert.equal(logger.warnings.length, 1);
          assert.deepEqual(scripted.creates.map((r) => r.trigger), ['TRIGGER_BEFORE_TOOL_EXECUTE', 'TRIGGER_AFTER_TOOL_EXECUTE']);
          assert.equal(scripted.creates[0].labels.tool_call_id, scripted.creates[1].labels.tool_call_id);
        }
      } finally {
        client.close();
        scripted.stop();
      }
    }
  });

  test('a read-only tool never contacts checkpointd (so never waits on a hung one)', async () => {
    let connections = 0;
    const hung = net.createServer(() => { connections += 1; });
    await new Promise((resolve) => hung.listen(0, '127.0.0.1', resolve));
    const client = new CheckpointdClient(`127.0.0.1:${hung.address().port}`);
    try {
      const tools = new ToolRunner({ client }).register('custom/read', { readOnly: true, run: () => 'read' });
      assert.equal(await tools.execute('custom/read', {}, { planId: newUlid() }), 'read');
      assert.equal(connections, 0, 'a read-only tool call contacted checkpointd');
    } finally {
      client.close();
      hung.close();
    }
  });

  test('a refused value in ListConfig stops the write tool loudly (closed vocabulary)', async () => {
    const scripted = await new ScriptedCheckpointd({
      values: { ...DEFAULT_VALUES, [AUTO]: ['before_tool_execute', 'on_teleport'] },
      onCreate: (n, request, callback) => callback(null, checkpointFor(request)),
    }).start();
    const client = new CheckpointdClient(scripted.target);
    try {
      let ran = false;
      const tools = new ToolRunner({ client }).register('custom/write', { run: () => { ran = true; } });
      await assert.rejects(tools.execute('custom/write', {}, { planId: newUlid() }), /unknown trigger "on_teleport"/);
      assert.equal(ran, false);
      assert.equal(scripted.creates.length, 0);
    } finally {
      client.close();
      scripted.stop();
    }
  });
});
