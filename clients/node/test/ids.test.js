'use strict';
/** newPlanId(): a fresh ULID that a real checkpointd accepts as a plan id. */

const assert = require('node:assert/strict');
const { after, before, test } = require('node:test');
const { setTimeout: sleep } = require('node:timers/promises');
const { CheckpointdClient, CheckpointdError, newPlanId } = require('../src');
const { startServer } = require('./helpers/server');

const CROCKFORD = '0123456789ABCDEFGHJKMNPQRSTVWXYZ';

/** The ULID's first 10 characters: milliseconds since the epoch. */
function timestampOf(id) {
  return [...id.slice(0, 10)].reduce((ms, c) => ms * 32 + CROCKFORD.indexOf(c), 0);
}

let server;
before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.cleanup();
});

test('a plan id is 26 Crockford base32 characters, the first 0-7, the time first', async () => {
  const before = Date.now();
  const ids = Array.from({ length: 200 }, () => newPlanId());
  const later = (await sleep(2), newPlanId());
  for (const id of ids) {
    assert.match(id, /^[0-7][0-9A-HJKMNP-TV-Z]{25}$/);
    assert.ok(timestampOf(id) >= before && timestampOf(id) <= Date.now(), id);
  }
  assert.equal(new Set(ids).size, ids.length, 'ids repeat');
  assert.ok(ids.every((id) => id < later), 'an id made later sorts after the earlier ones');
});

test('the server takes a new plan id, and its refusal of a made-up one says how to make one', async () => {
  const client = new CheckpointdClient(server.tcpTarget);
  try {
    const planId = newPlanId();
    const created = await client.createCheckpoint(planId, { workspaceRoot: server.newWorkspace() });
    assert.equal(created.planId, planId);
    const refused = await client.listCheckpoints('my-plan').catch((error) => error);
    assert.ok(refused instanceof CheckpointdError, String(refused));
    assert.equal(refused.reason, 'INVALID_PLAN_ID');
    assert.match(refused.message, /is 7 characters long; a ULID has 26/);
    assert.match(refused.message, /newPlanId\(\)/);
  } finally {
    client.close();
  }
});
