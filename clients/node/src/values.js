'use strict';
/**
 * Conversions between plain JavaScript values and the well-known types the contract uses
 * (google.protobuf.Value for config values, google.protobuf.Timestamp for times), in the shapes
 * proto-loader produces with the client's LOADER_OPTIONS (camelCase, oneofs named by `kind`).
 */

/** A JSON-like JavaScript value -> google.protobuf.Value. */
function toValue(value) {
  if (value === null) return { nullValue: 'NULL_VALUE' };
  if (Array.isArray(value)) return { listValue: { values: value.map(toValue) } };
  switch (typeof value) {
    case 'string':
      return { stringValue: value };
    case 'boolean':
      return { boolValue: value };
    case 'number':
      if (!Number.isFinite(value)) throw new RangeError(`a config value must be finite, got ${value}`);
      return { numberValue: value };
    case 'object':
      return {
        structValue: { fields: Object.fromEntries(Object.entries(value).map(([k, v]) => [k, toValue(v)])) },
      };
    default:
      throw new TypeError(`cannot send a ${typeof value} as a google.protobuf.Value`);
  }
}

/** google.protobuf.Value -> a JSON-like JavaScript value; an unset Value is undefined. */
function fromValue(value) {
  if (!value) return undefined;
  switch (value.kind) {
    case 'nullValue':
      return null;
    case 'numberValue':
      return value.numberValue;
    case 'stringValue':
      return value.stringValue;
    case 'boolValue':
      return value.boolValue;
    case 'structValue':
      return Object.fromEntries(Object.entries(value.structValue.fields ?? {}).map(([k, v]) => [k, fromValue(v)]));
    case 'listValue':
      return (value.listValue.values ?? []).map(fromValue);
    case undefined:
      return undefined;
    default:
      throw new RangeError(`unknown google.protobuf.Value kind ${JSON.stringify(value.kind)}`);
  }
}

/** google.protobuf.Timestamp -> Date (millisecond precision); an unset Timestamp is null. */
function timestampToDate(timestamp) {
  if (!timestamp) return null;
  return new Date(Number(timestamp.seconds) * 1000 + Math.floor(Number(timestamp.nanos) / 1e6));
}

module.exports = { fromValue, timestampToDate, toValue };
