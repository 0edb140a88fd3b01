'use strict';
/** ConfigService get / list / set / watch through the Node client against a real checkpointd. */

const assert = require('node:assert/strict');
const { after, before, describe, test } = require('node:test');
const { AUTO_TRIGGERS, CheckpointdClient } = require('../src');
const { newUlid, startServer } = require('./helpers/server');

const AUTO_CREATE_ON = 'core.checkpoints.auto_create_on';

describe('config', () => {
  let server;
  let client;
  before(async () => {
    server = await startServer();
    client = new CheckpointdClient(server.unixTarget);
  });
  after(async () => {
    client?.close();
    await server?.cleanup();
  });

  test('auto_create_on defaults to the four automatic triggers', async () => {
    const entry = await client.getConfig(AUTO_CREATE_ON);
    assert.equal(entry.key, AUTO_CREATE_ON);
    assert.deepEqual([...entry.value].sort(), [...AUTO_TRIGGERS].sort());
    assert.equal(entry.source, 'default');
    assert.deepEqual(entry.value, entry.defaultValue);
    assert.equal(entry.updateTime, null);
  });

  test('list shows every registered key, sorted', async () => {
    const keys = (await client.listConfig()).map((e) => e.key);
    for (const key of [AUTO_CREATE_ON, 'core.checkpoints.on_unavailable', 'core.checkpoints.client_deadline_ms']) {
      assert.ok(keys.includes(key), `${key} missing from ${keys}`);
    }
    assert.deepEqual(keys, [...keys].sort());
  });

  test('a plan override wins for that plan only and can be cleared', async () => {
    const planId = newUlid();
    const set = await client.setConfig(AUTO_CREATE_ON, ['on_error'], { planId });
    assert.deepEqual(set.value, ['on_error']);
    assert.equal(set.source, 'plan');
    assert.ok(set.updateTime instanceof Date);
    assert.deepEqual((await client.getConfig(AUTO_CREATE_ON, { planId })).value, ['on_error']);
    assert.equal((await client.getConfig(AUTO_CREATE_ON, { planId: newUlid() })).source, 'default');
    await client.setConfig(AUTO_CREATE_ON, null, { planId, clear: true });
    assert.equal((await client.getConfig(AUTO_CREATE_ON, { planId })).source, 'default');
  });

  test('numbers and strings round-trip as typed values', async () => {
    const planId = newUlid();
    assert.equal((await client.setConfig('core.checkpoints.client_deadline_ms', 1234, { planId })).value, 1234);
    assert.equal((await client.setConfig('core.checkpoints.on_unavailable', 'refuse', { planId })).value, 'refuse');
  });

  test('watch yields the current value first, then each change, until cancelled', async () => {
    const planId = newUlid();
    const watch = client.watchConfig([AUTO_CREATE_ON], { planId, deadlineMs: 60_000 });
    const seen = [];
    for await (const entry of watch) {
      seen.push(entry);
      if (seen.length === 1) {
        await client.setConfig(AUTO_CREATE_ON, ['before_tool_execute'], { planId });
      } else if (seen.length === 2) {
        watch.cancel();
      }
    }
    assert.equal(seen.length, 2);
    assert.equal(seen[0].source, 'default');
    assert.deepEqual(seen[1].value, ['before_tool_execute']);
    assert.equal(seen[1].source, 'plan');
    assert.equal(seen[1].planId, planId);
  });

  test('a watch on an unknown key fails with UNKNOWN_CONFIG_KEY', async () => {
    const watch = client.watchConfig(['core.nope'], { deadlineMs: 10_000 });
    await assert.rejects(async () => {
      for await (const entry of watch) assert.fail(`unexpected entry ${entry.key}`);
    }, (error) => error.reason === 'UNKNOWN_CONFIG_KEY');
  });
});
