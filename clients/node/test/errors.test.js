'use strict';
/** Errors carry the google.rpc.ErrorInfo reason from the real server; deadlines and vocabularies hold. */

const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { after, before, describe, test } = require('node:test');
const grpc = require('@grpc/grpc-js');
const { CheckpointdClient, CheckpointdError, ERROR_REASONS } = require('../src');
const { decodeErrorInfo } = require('../src/errors');
const { newUlid, startServer } = require('./helpers/server');

/** What Python's googleapis-common-protos serializes for Status{code 5, ErrorInfo CHECKPOINT_NOT_FOUND}. */
const PYTHON_STATUS_HEX =
  '080512126e6f207375636820636865636b706f696e741a7c0a28747970652e676f6f676c65617069732e636f6d2f676f6f676c652e' +
  '7270632e4572726f72496e666f12500a14434845434b504f494e545f4e4f545f464f554e44120b636865636b706f696e74641a2b0a0d' +
  '636865636b706f696e745f6964121a303141525a334e44454b54535634525246465136394735464131';

describe('without a server', () => {
  test('decodes the grpc-status-details-bin trailer another implementation wrote', () => {
    const metadata = new grpc.Metadata();
    metadata.set('grpc-status-details-bin', Buffer.from(PYTHON_STATUS_HEX, 'hex'));
    assert.deepEqual(decodeErrorInfo(metadata), {
      reason: 'CHECKPOINT_NOT_FOUND',
      domain: 'checkpointd',
      metadata: { checkpoint_id: '01ARZ3NDEKTSV4RRFFQ69G5FA1' },
    });
    assert.equal(decodeErrorInfo(new grpc.Metadata()), null);
  });

  test('the reasons come from errors.proto', () => {
    assert.ok(ERROR_REASONS.includes('INVALID_PLAN_ID'));
    assert.ok(ERROR_REASONS.includes('ROLLBACK_CONFLICT'));
    assert.ok(!ERROR_REASONS.some((r) => r.startsWith('ERROR_REASON_') || r === 'UNSPECIFIED'));
  });

  test('unknown enum names are refused before anything is sent', async () => {
    const client = new CheckpointdClient('unix:///nonexistent/checkpointd.sock');
    try {
      await assert.rejects(client.createCheckpoint(newUlid(), { trigger: 'before_tool_exec' }), /unknown Trigger "before_tool_exec"; known: before_tool_execute/);
      await assert.rejects(client.createCheckpoint(newUlid(), { phase: 'BEFORE_TOOL_EXECUTE' }), RangeError);
      await assert.rejects(client.rollback(newUlid(), newUlid(), { scope: 'everything' }), RangeError);
      await assert.rejects(client.getCheckpoint(newUlid(), { view: 'huge' }), RangeError);
    } finally {
      client.close();
    }
  });

  test('a deadline must be positive', () => {
    assert.throws(() => new CheckpointdClient('127.0.0.1:1', { deadlineMs: 0 }), RangeError);
    assert.throws(() => new CheckpointdClient('127.0.0.1:1', { watchDeadlineMs: -5 }), RangeError);
  });

  test('an absent server is UNAVAILABLE within the deadline, marked unreachable', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cpd-none-'));
    const client = new CheckpointdClient(`unix://${path.join(dir, 'nobody.sock')}`, { deadlineMs: 3000 });
    try {
      const error = await client.listConfig().then(() => null, (e) => e);
      assert.ok(error instanceof CheckpointdError, String(error));
      assert.ok(error.unreachable);
      assert.ok(['UNAVAILABLE', 'DEADLINE_EXCEEDED'].includes(error.codeName), error.codeName);
      assert.equal(error.reason, null);
    } finally {
      client.close();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('error reasons from the server', () => {
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

  async function failure(promise) {
    const error = await promise.then(() => null, (e) => e);
    assert.ok(error instanceof CheckpointdError, `expected a CheckpointdError, got ${error}`);
    assert.equal(error.domain, 'checkpointd');
    assert.ok(ERROR_REASONS.includes(error.reason), `reason ${error.reason} is not in errors.proto`);
    return error;
  }

  test('INVALID_PLAN_ID', async () => {
    const error = await failure(client.createCheckpoint('not-a-ulid'));
    assert.equal(error.codeName, 'INVALID_ARGUMENT');
    assert.equal(error.code, grpc.status.INVALID_ARGUMENT);
    assert.equal(error.reason, 'INVALID_PLAN_ID');
    assert.equal(error.metadata.value, 'not-a-ulid');
    assert.equal(error.unreachable, false);
    assert.match(error.message, /^CreateCheckpoint: INVALID_ARGUMENT INVALID_PLAN_ID: /);
  });

  test('CHECKPOINT_NOT_FOUND', async () => {
    const missing = newUlid();
    const error = await failure(client.getCheckpoint(missing));
    assert.equal(error.codeName, 'NOT_FOUND');
    assert.equal(error.reason, 'CHECKPOINT_NOT_FOUND');
    assert.equal(error.metadata.checkpoint_id, missing);
  });

  test('WORKSPACE_ROOT_NOT_ALLOWED', async () => {
    const outside = fs.mkdtempSync(path.join(os.tmpdir(), 'cpd-outside-'));
    try {
      const error = await failure(client.createCheckpoint(newUlid(), { workspaceRoot: outside }));
      assert.equal(error.codeName, 'PERMISSION_DENIED');
      assert.equal(error.reason, 'WORKSPACE_ROOT_NOT_ALLOWED');
    } finally {
      fs.rmSync(outside, { recursive: true, force: true });
    }
  });

  test('CHECKPOINT_PLAN_MISMATCH', async () => {
    const checkpoint = await client.createCheckpoint(newUlid());
    const error = await failure(client.rollback(newUlid(), checkpoint.checkpointId));
    assert.equal(error.codeName, 'FAILED_PRECONDITION');
    assert.equal(error.reason, 'CHECKPOINT_PLAN_MISMATCH');
  });

  test('UNKNOWN_CONFIG_KEY and INVALID_CONFIG_VALUE', async () => {
    const unknown = await failure(client.getConfig('core.checkpoints.no_such_key'));
    assert.equal(unknown.reason, 'UNKNOWN_CONFIG_KEY');
    const invalid = await failure(client.setConfig('core.checkpoints.auto_create_on', ['before_tool_exec'], { planId: newUlid() }));
    assert.equal(invalid.codeName, 'INVALID_ARGUMENT');
    assert.equal(invalid.reason, 'INVALID_CONFIG_VALUE');
  });

  test('INVALID_FILTER', async () => {
    const error = await failure(client.listCheckpoints(newUlid(), { filter: 'color = "blue"' }));
    assert.equal(error.reason, 'INVALID_FILTER');
  });
});
