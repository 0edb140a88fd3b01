'use strict';
/** Conversions to and from google.protobuf.Value and Timestamp, and the contract's vocabularies. */

const assert = require('node:assert/strict');
const { test } = require('node:test');
const { fromValue, timestampToDate, toValue } = require('../src');
const { loadContract } = require('../src/contract');

test('plain values round-trip through google.protobuf.Value on the wire', () => {
  const { service } = loadContract().ConfigService;
  const overTheWire = (value) => {
    const bytes = service.SetConfig.requestSerialize({ key: 'k', value: toValue(value) });
    return fromValue(service.SetConfig.requestDeserialize(bytes).value);
  };
  const samples = [null, true, false, 0, 1.5, 'refuse', [], ['before_tool_execute', 'on_error'], { a: [1, { b: null }] }];
  for (const sample of samples) assert.deepEqual(overTheWire(sample), sample);
  assert.deepEqual(toValue(['x']), { listValue: { values: [{ stringValue: 'x' }] } });
});

test('values JSON cannot carry are refused', () => {
  assert.throws(() => toValue(undefined), TypeError);
  assert.throws(() => toValue(Number.NaN), RangeError);
  assert.throws(() => toValue(() => 1), TypeError);
  assert.throws(() => fromValue({ kind: 'bytesValue' }), RangeError);
});

test('timestamps become Dates; unset stays null', () => {
  assert.equal(timestampToDate({ seconds: 1700000000, nanos: 123_999_999 }).toISOString(), '2023-11-14T22:13:20.123Z');
  assert.equal(timestampToDate(null), null);
});

test('the vocabularies are the contract enums in short form, unknown names refused', () => {
  const { vocabulary } = loadContract();
  assert.deepEqual(vocabulary.names('Trigger'), ['before_tool_execute', 'after_tool_execute', 'on_subplan_spawn', 'on_error', 'manual', 'rollback']);
  assert.deepEqual(vocabulary.names('Phase'), ['before_tool_execute', 'after_tool_execute', 'execute', 'on_error', 'manual', 'rollback_safety']);
  assert.equal(vocabulary.toWire('Trigger', 'on_subplan_spawn'), 'TRIGGER_ON_SUBPLAN_SPAWN');
  assert.equal(vocabulary.fromWire('Phase', 'PHASE_EXECUTE'), 'execute');
  assert.equal(vocabulary.fromWire('Phase', 'PHASE_UNSPECIFIED'), null);
  assert.equal(vocabulary.fromWire('Phase', 42), 42, 'a value from a newer server is not mistaken for a known one');
  assert.throws(() => vocabulary.toWire('Trigger', 'TRIGGER_MANUAL'), RangeError);
  assert.throws(() => vocabulary.toWire('Colour', 'red'), /checkpoint.v1 has no enum Colour/);
});
